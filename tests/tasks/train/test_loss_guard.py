"""Loss guard: NaN, Inf and robust-z spikes; the skipped-sample list; and, on one process, a NaN rolled
back to the last checkpoint and skipped exactly as a re-run with the same skip list trains."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from tasks.checkpoint_reader import list_committed, load_consolidated
from tasks.config import from_dict, merge_overrides
from tasks.train.config import LossGuardConfig, TrainConfig
from tasks.train.data import TokenLoader
from tasks.train.faults import fault_callbacks
from tasks.train.loss_guard import LossGuard, SkipList, SkippedRange, robust_z, skip_window
from tasks.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/tasks/train/conftest.py

DECREASING = [5.0 - 0.1 * i for i in range(10)]


def guard(**overrides) -> LossGuard:
    return LossGuard(LossGuardConfig(**{"window": 10, "min_history": 5, "z_threshold": 6.0, **overrides}))


def feed(g: LossGuard, losses: list[float]) -> list[str | None]:
    return [g.check(step, loss) for step, loss in enumerate(losses, start=1)]


def test_nan_and_inf_are_rejected_from_the_first_step():
    assert feed(guard(), [float("nan")]) == ["loss.nan"]
    assert feed(guard(), [float("inf")]) == ["loss.inf"]


def test_a_falling_loss_with_noise_is_accepted():
    noisy = [x + (0.05 if i % 2 else -0.05) for i, x in enumerate(DECREASING)]
    assert feed(guard(), noisy) == [None] * 10


def test_a_spike_far_above_the_recent_median_is_rejected_once_history_suffices():
    g = guard()
    assert feed(g, DECREASING[:4] + [9.0]) == [None] * 5  # only 4 losses known before the jump: no test yet
    g = guard()
    assert feed(g, DECREASING[:6])[-1] is None
    assert g.check(7, 9.0) == "loss.spike" and g.last_z > 6
    assert len(g.history) == 6  # a rejected loss does not enter the history


def test_robust_z_ignores_one_outlier_in_the_history():
    history = [2.0, 2.1, 1.9, 2.0, 50.0]
    assert robust_z(2.05, history) < 1 and robust_z(3.0, history) > 6


def test_rolling_back_forgets_the_losses_after_the_checkpoint():
    g = guard()
    feed(g, DECREASING[:6])
    g.forget_after(4)
    assert [s for s, _ in g.history] == [1, 2, 3, 4]


def test_the_skip_window_ends_at_the_offending_batch_and_never_reaches_before_the_checkpoint():
    assert skip_window(end=80, floor=32, skip_batches=2, global_batch=8) == (64, 80)
    assert skip_window(end=40, floor=32, skip_batches=8, global_batch=8) == (32, 40)


def loader_at(corpus: dict[str, str], consumed: int) -> TokenLoader:
    loader = TokenLoader(corpus, None, split="train", seq_len=16, global_batch=8, dp_rank=0, dp_size=1, seed=0,
                         prefetch=0)
    loader.load_state_dict({**loader.state_dict(), "samples_consumed": consumed})
    return loader


def test_the_skip_list_persists_and_moves_a_loader_past_adjacent_ranges(corpus, tmp_path):
    writer = SkipList(str(tmp_path), writer=True)
    writer.add(SkippedRange(16, 24, 3, 2, "loss.nan", float("nan")))
    writer.add(SkippedRange(24, 40, 5, 2, "loss.spike", 9.5))
    reader = SkipList(str(tmp_path), writer=False)  # a restarted rank reads what rank 0 wrote
    assert [(r.start, r.end, r.reason) for r in reader.ranges] == [(16, 24, "loss.nan"), (24, 40, "loss.spike")]
    assert math.isnan(reader.ranges[0].loss)
    with loader_at(corpus, 16) as inside, loader_at(corpus, 8) as before, loader_at(corpus, 40) as reference:
        assert reader.advance(inside) == 24 and inside.samples_consumed == 40
        assert torch.equal(inside.next_batch()[0], reference.next_batch()[0])
        assert reader.advance(before) == 0 and before.samples_consumed == 8
    SkipList(str(tmp_path / "other"), writer=False).add(SkippedRange(0, 8, 1, None, "loss.nan", None))
    assert not (tmp_path / "other" / "skipped.jsonl").exists()  # only the writer rank writes


# -- on one process ----------------------------------------------------------------------------------------

BASE = {
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8, "prefetch": 0},
    "optim": {"lr": 1e-2, "warmup_steps": 1},
    "checkpoint": {"interval_steps": 2, "async_mode": "off"},
    "steps": 7,
}


@pytest.fixture(scope="module")
def corpus(corpus) -> dict[str, str]:  # conftest.py's corpus, by name
    return {"corpus": corpus}


def train(corpus, run_dir, *overrides: str) -> dict:
    cfg = from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), list(overrides)))
    with Trainer(cfg, corpus, str(run_dir), callbacks=fault_callbacks(cfg.faults, str(run_dir), 0)) as trainer:
        return trainer.train()


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_consolidated(list_committed(str(run_dir))[-1]["url"])[0]


def test_a_nan_rolls_back_to_the_last_checkpoint_and_trains_as_a_rerun_that_skips_the_same_samples(corpus, tmp_path):
    summary = train(corpus, tmp_path / "nan", "faults.inject=nan:step=5")
    skipped = {"start": 32, "end": 40, "step": 5, "rolled_back_to": 4, "reason": "loss.nan", "loss": "nan"}
    assert summary["skipped"] == [skipped]
    assert [json.loads(line) for line in (tmp_path / "nan" / "skipped.jsonl").read_text().splitlines()] == [skipped]
    assert summary["steps"] == 7 and all(math.isfinite(x) for x in summary["losses"])
    records = [json.loads(line) for line in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("rolled_back_to")) for r in records] == [
        (1, None), (2, None), (3, None), (4, None), (5, 4), (5, None), (6, None), (7, None)]
    assert summary["goodput"]["rollbacks"] == 1 and summary["goodput"]["lost_steps"] == [5]

    rerun = tmp_path / "rerun"  # no NaN, but the same skip list from the start
    rerun.mkdir()
    (rerun / "skipped.jsonl").write_text(json.dumps(skipped) + "\n")
    again = train(corpus, rerun)
    assert again["losses"] == summary["losses"]
    nan_weights, rerun_weights = final_weights(tmp_path / "nan"), final_weights(rerun)
    assert all(torch.equal(nan_weights[k], rerun_weights[k]) for k in nan_weights)


def test_a_nan_before_any_checkpoint_records_the_skip_and_fails_for_a_restart(corpus, tmp_path):
    with pytest.raises(RuntimeError, match="no checkpoint to roll back to; samples \\[0, 8\\) are recorded"):
        train(corpus, tmp_path, "faults.inject=nan:step=1")
    summary = train(corpus, tmp_path, "steps=2")  # the restart: the NaN fault already fired
    assert summary["skipped"][0]["start"] == 0 and summary["skipped"][0]["rolled_back_to"] is None
    assert summary["tokens"] == 2 * 8 * 16


def test_a_resumed_run_judges_its_next_loss_against_the_final_trajectorys_history(tmp_path):
    """metrics.jsonl holds every attempt: the resumed guard keeps the last record of each step up to the resume
    point, leaves out rejected steps and steps past it, and so sees what an uninterrupted run's guard saw."""
    from tasks.train import goodput
    from tasks.train.trainer import accepted_losses

    run = str(tmp_path)
    for step, loss in [(1, 5.0), (2, 4.0), (3, 3.5), (4, 9.9), (3, 3.4), (4, 3.3), (5, 3.2), (6, 3.1)]:
        goodput.jsonlog.append(run, goodput.METRICS, {"step": step, "loss": loss})
    goodput.jsonlog.append(run, goodput.METRICS, {"step": 7, "loss": 99.0, "rolled_back_to": 4})
    assert accepted_losses(run, 5) == [(1, 5.0), (2, 4.0), (3, 3.4), (4, 3.3), (5, 3.2)]
    guard = LossGuard(LossGuardConfig(window=3, min_history=3))
    guard.remember(accepted_losses(run, 5))
    assert list(guard.history) == [(3, 3.4), (4, 3.3), (5, 3.2)]
