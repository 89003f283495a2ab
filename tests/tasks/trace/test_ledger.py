"""The exactly-once ledger: on records written as a run writes them, and on a two-rank run with a SIGKILLed rank
and a loss-guard rollback."""

from __future__ import annotations

import copy
import json

import pytest

from tasks import jsonlog
from tasks.trace.ledger import ledger
from tasks.trace.run import open_run
from tasks.train.node_launch import launch_training
from tests.tasks.train.token_corpus import TWO_RANKS, make_corpus

BATCH = 4


def write_run(folder, groups: list[tuple[int | None, list[dict]]], skipped: list[dict] = ()) -> str:
    """A run folder whose process groups start from ``resumed_from`` and log ``records`` (step, samples, ...)."""
    (folder / "lineage.json").write_text(json.dumps({"global_batch": BATCH}))
    for group, (resumed_from, records) in enumerate(groups):
        jsonlog.append(str(folder), "events.jsonl", {"event": "start", "group": group, "resumed_from": resumed_from})
        for record in records:
            jsonlog.append(str(folder), "metrics.jsonl", {"group": group, "loss": 1.0, **record})
    for s in skipped:
        jsonlog.append(str(folder), "skipped.jsonl", s)
    return str(folder)


def steps(first: int, last: int, at: int) -> list[dict]:
    """Steps ``first..last`` reading consecutive batches from sample ``at``."""
    return [{"step": s, "samples": [at + (s - first) * BATCH, at + (s - first + 1) * BATCH]} for s in range(first, last + 1)]


def test_redone_rolled_back_and_superseded_steps_count_once_and_skipped_windows_zero(tmp_path):
    skip = {"start": 16, "end": 24, "step": 6, "rolled_back_to": 4, "reason": "loss.spike", "loss": 9.0}
    run = write_run(tmp_path, [
        (None, steps(1, 5, 0)),  # killed after step 5 was logged ...
        (4, [*steps(5, 5, 16), {"step": 6, "samples": [20, 24], "rolled_back_to": 4}, *steps(5, 8, 24)]),
    ], [skip])  # ... resumed from 4, redid 5; step 6 spiked: back to 4, samples [16, 24) skipped
    counts = ledger(open_run(run))
    assert counts["exactly_once"], counts
    assert counts["counts"] == {"0": 8, "1": 32} and counts["samples"] == 40
    assert counts["superseded_steps"] == [5, 6]


def test_a_resume_at_the_wrong_sample_is_caught(tmp_path):
    run = write_run(tmp_path, [(None, steps(1, 4, 0)), (2, steps(3, 6, 4))])  # resumed at step 2's start, not end
    counts = ledger(open_run(run))
    assert not counts["exactly_once"] and counts["trained_more_than_once"] == [[4, 8]]


def test_a_step_logged_by_no_rank_is_inferred_from_its_neighbours(tmp_path):
    records = [r for r in steps(1, 6, 0) if r["step"] != 4]
    counts = ledger(open_run(write_run(tmp_path, [(None, records)])))
    assert counts["exactly_once"] and counts["inferred_steps"] == [4]


TINY = {**TWO_RANKS, "steps": 14}


@pytest.mark.slow
def test_a_run_with_a_killed_rank_and_a_rollback_trains_every_sample_once_except_the_skipped_window(tmp_path):
    corpus = make_corpus(str(tmp_path / "corpus"))
    cfg = copy.deepcopy(TINY)
    cfg["faults"] = {"inject": "kill:rank=1,step=5;nan:step=10"}
    run_dir = tmp_path / "run"
    launch_training(data={"main": corpus}, config=cfg, run_dir=str(run_dir), nproc=2, max_restarts=1, timeout_s=300,
                    log=print)  # default settings: smelt's agent replaces the killed rank
    events = jsonlog.read(str(run_dir), "events.jsonl")
    assert [e["event"] for e in events].count("restore") == 1  # the kill happened and the run resumed
    run = open_run(str(run_dir))
    counts = ledger(run)
    [skipped] = counts["skipped"]
    assert (skipped["step"], skipped["reason"]) == (10, "loss.nan")
    window = skipped["end"] - skipped["start"]
    assert counts["exactly_once"], counts
    assert counts["final_step"] == 14 and counts["counts"] == {"0": window, "1": 14 * 8}
    # both data-parallel ranks recorded their halves of every kept step
    from tasks.trace.losses import of_attempt, read_losses

    losses = read_losses(str(run_dir))
    for step, record in run.steps.items():
        index, _ = of_attempt(losses, step, tuple(record["samples"]))
        assert index.tolist() == list(range(*record["samples"])), step
