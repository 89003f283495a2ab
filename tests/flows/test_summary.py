"""The run summary reads every stage's counters through one vocabulary (in, out, dropped.*, failed.*), and
shows the model's bits per byte beside the compressors' and samples of what it writes."""

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


def _evaluated(**extra) -> dict:
    base = {"web": {"xz": 2.4, "zstd": 2.5, "zlib": 2.6}, "code": {"xz": 2.0, "zstd": 2.1, "zlib": 2.2}}
    splits = {"web": {"val_loss": 3.6, "perplexity": 36.6, "bits_per_byte": 1.5, "bytes_scored": 74040,
                      "baselines": base["web"],
                      "samples": [{"prompt": "Suspend the execution", "greedy": " of the loop", "sampled": " of a task",
                                   "actual": " of coroutine", "temperature": 0.8, "seed": 0}]},
              "code": {"val_loss": 3.0, "perplexity": 20.1, "bits_per_byte": 1.7, "bytes_scored": 136501,
                       "baselines": base["code"],
                       "samples": [{"prompt": "def main(", "greedy": "self):", "sampled": "argv):", "actual": "):",
                                    "temperature": 0.8, "seed": 0}]}}
    total = {"val_loss": 3.48, "perplexity": 32.5, "bits_per_byte": 1.54,
             "baselines": {"xz": 2.32, "zstd": 2.42, "zlib": 2.52}}
    return _stage("eval", {"val_loss": 3.48, "perplexity": 32.5, "bits_per_byte": 1.54, "tokens_scored": 900},
                  step=300, splits=splits, total=total, **extra)


def _rows(text: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for line in text.splitlines() if line.count("│") >= 9
            for cells in [[c.strip() for c in line.split("│")[1:-1]]]}


def test_each_split_shows_its_bits_per_byte_beside_xz_zstd_and_zlib_on_the_same_bytes():
    for text in (_text(render_eval, _evaluated()),
                 _text(render_run_summary, {"root": "file:///r", "mixture": {"web": 0.8, "code": 0.2},
                                            "wall_seconds": 1.0, "stages": [
                                                _stage("train", {}, summary={"steps": 300, "tokens": 64, "first_loss": 8.0,
                                                                            "last_loss": 3.0},
                                                       checkpoint="file:///r/train/step-300"), _evaluated()]})):
        assert "xz -9e" in text and "zstd -19" in text and "zlib -9" in text
        rows = _rows(text)
        assert rows["web"][:5] == ["1.500", "2.400", "2.500", "2.600", "38% below"]
        assert rows["code"][:5] == ["1.700", "2.000", "2.100", "2.200", "15% below"]
        assert rows["total"][:5] == ["1.540", "2.320", "2.420", "2.520", "34% below"]


def test_a_model_worse_than_xz_reads_above_it():
    stage = _evaluated()
    stage["splits"]["code"]["bits_per_byte"] = 2.6
    assert _rows(_text(render_eval, stage))["code"][4] == "30% above"


def test_the_samples_show_each_splits_prompt_greedy_and_sampled_continuations_and_the_real_text():
    text = _text(render_eval, _evaluated())
    assert "temperature 0.8, seed 0" in " ".join(text.split())
    for expected in ("Suspend the execution", " of the loop", " of a task", " of coroutine", "def main(", "self):",
                     "argv):"):
        assert expected.strip() in text
    lines = [line for line in text.splitlines() if "│" in line]
    labels = [line.split("│")[2].strip() for line in lines if line.count("│") == 4]
    assert labels.count("greedy") == 2 and labels.count("sampled") == 2 and labels.count("actual text") == 2


def test_an_evaluation_without_baselines_still_renders():
    stage = _evaluated()
    for split in stage["splits"].values():
        del split["baselines"], split["samples"]
    text = _text(render_eval, stage)
    assert "val loss 3.480" in text and "xz -9e" not in text
