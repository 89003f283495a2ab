"""The run summary reads every stage's counters through one vocabulary (in, out, dropped.*, failed.*)."""

from rich.console import Console

from flows.summary import render_eval, render_run_summary, render_stage
from tasks.counters import funnel, merge_steps


def _stage(name: str, stats: dict, **extra) -> dict:
    return {"stage": name, "reused": False, "seconds": 1.0, "rows": 0, "url": f"file:///r/{name}", "meta": {},
            "stats": stats, **extra}


def _text(render, *args) -> str:
    console = Console(record=True, width=200)
    render(*args, console)
    return console.export_text()


def test_every_stage_shows_its_in_and_out_and_its_largest_reasons():
    ingest_stats = merge_steps({
        "read": {"in": 1200, "out": 1150, "dropped.read_non_html": 50},
        "lang": {"in": 1150, "out": 900, "dropped.lang_not_kept": 250},
    })
    stages = [
        _stage("ingest[web]", ingest_stats, funnel=funnel(ingest_stats)),
        _stage("dedup[web]", {"in": 900, "out": 870, "dropped.exact_duplicate": 30}),
        _stage("tokenize[web]", {"in": 870, "out": 869, "dropped.empty_text": 1, "tokens.val": 5000}, rows=123456),
        _stage("train", {}, summary={"steps": 60, "tokens": 122880, "first_loss": 8.3, "last_loss": 5.1},
               checkpoint="file:///r/train/step-60"),
    ]
    text = _text(render_run_summary, {"root": "file:///r", "stages": stages, "mixture": {"web": 1.0},
                                      "wall_seconds": 9.0})

    assert "1,200" in text and "1,150" in text and "−250" in text  # the ingest funnel
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:]] for line in text.splitlines()
            if line.count("│") > 5 and "[" in line}
    assert rows["ingest[web]"][1:3] == ["1,200", "900"]
    assert rows["ingest[web]"][3] == "lang_not_kept 250, read_non_html 50"
    assert rows["dedup[web]"][1:4] == ["900", "870", "exact_duplicate 30"]
    assert rows["tokenize[web]"][1:3] == ["870", "869"] and "123,456 tokens" in rows["tokenize[web]"][3]


def test_a_single_stage_table_reads_the_same_counters():
    text = _text(render_stage, _stage("dedup", {"in": 10, "out": 6, "dropped.near_duplicate": 4}))
    assert "10" in text and "6" in text and "near_duplicate 4" in text


def test_the_eval_row_shows_every_validation_split_beside_the_mixture():
    splits = {"web": {"val_loss": 4.5, "bits_per_byte": 1.25}, "code": {"val_loss": 2.75, "bits_per_byte": 0.5}}
    stage = _stage("eval", {"val_loss": 4.0, "perplexity": 54.6, "bits_per_byte": 1.1, "tokens_scored": 900},
                   step=8, splits=splits)
    text = _text(render_eval, stage)
    assert "val loss 4.000" in text and "code 2.750 / 0.500, web 4.500 / 1.250" in text
    train = _stage("train", {}, summary={"steps": 8, "tokens": 64, "first_loss": 8.0, "last_loss": 5.0},
                   checkpoint="file:///r/train/step-8")
    table = _text(render_run_summary, {"root": "file:///r", "stages": [train, stage], "mixture": {"web": 0.5, "code": 0.5},
                                       "wall_seconds": 1.0})
    assert "code 2.750" in table and "web 4.500" in table
