"""Elastic resume (docs/design.md §4): a run stopped on one world size and layout and resumed on another
trains on exactly the same global batches, and its losses stay within 1e-4 relative of a run that
was never interrupted (CPU, gloo, fp32).

The reference trains steps 1..8 on one process. Each case trains steps 1..4 on one layout (stopping
with a checkpoint at step 4), then a second launch on another world size and layout resumes from
it: DCP reshards model and optimizer state, the loader continues at sample 4 × global batch.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from tasks.config import from_dict, merge_overrides
from tasks.train.config import TrainConfig
from tasks.train.trainer import Trainer
from tests.tasks.train.ranks import one_thread, run_ranks
from tests.tasks.train.token_corpus import RESUME_RUN

pytestmark = pytest.mark.slow

STEPS, STOP = 8, 4
GLOBAL_BATCH = RESUME_RUN["data"]["global_batch"]
# No periodic saves: the checkpoint at step 4 is the one every launch forces at its last step.
BASE = {**RESUME_RUN, "steps": STEPS, "checkpoint": {"interval_steps": 0, "async_mode": "thread"}}
DP_SHARD_2 = ["parallel.dp_shard=2"]
DP_SHARD_2_TP_2 = ["parallel.dp_shard=2", "parallel.tp=2"]
PP_2_DP_SHARD_2 = ["parallel.pp=2", "parallel.dp_shard=2"]


def config(overrides: list[str]) -> TrainConfig:
    return from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), overrides))


def train_recording_batches(cfg: TrainConfig, corpus: str, run_dir: str, stop_after: int | None) -> dict:
    """One launch of the Trainer (resuming from run_dir's newest checkpoint if any) that also records
    the global sample index and this rank's inputs of every batch the loader hands out."""
    trainer = Trainer(cfg, {"corpus": corpus}, run_dir)
    loader, batches = trainer.loader, []
    next_batch = loader.next_batch

    def recording_next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        start = loader.samples_consumed
        inputs, targets = next_batch()
        batches.append((start, inputs.clone()))
        return inputs, targets

    loader.next_batch = recording_next_batch
    result = {"samples_at_start": loader.samples_consumed, "dp_rank": trainer.dims.dp_rank,
              "dp_size": trainer.dims.dp_size, "batches": batches}
    try:
        result["summary"] = trainer.train(stop_after=stop_after)
    finally:
        trainer.close()
    result["samples_at_end"] = loader.samples_consumed
    return result


def _rank_launch(rank: int, overrides: list[str], corpus: str, run_dir: str, stop_after: int | None, out: str) -> None:
    result = train_recording_batches(config(overrides), corpus, run_dir, stop_after)
    torch.save(result, f"{out}.rank{rank}.pt")


def launch(world: int, overrides: list[str], corpus: str, run_dir, stop_after: int | None = None) -> list[dict]:
    """One launch on ``world`` ranks; each rank's result."""
    out = os.path.join(str(run_dir), f"launch-{world}-{stop_after}")
    run_ranks(world, _rank_launch, overrides, corpus, str(run_dir), stop_after, out)
    return [torch.load(f"{out}.rank{rank}.pt") for rank in range(world)]


def global_batches(ranks: list[dict]) -> list[tuple[int, torch.Tensor]]:
    """(first sample, inputs of the whole global batch) per step, joined over the data-parallel ranks
    (ranks that share a data-parallel index, across TP or PP, must have read the same slice)."""
    by_dp: dict[int, list] = {}
    for result in ranks:
        seen = by_dp.setdefault(result["dp_rank"], result["batches"])
        assert [start for start, _ in seen] == [start for start, _ in result["batches"]]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(seen, result["batches"]))
    assert sorted(by_dp) == list(range(ranks[0]["dp_size"]))
    steps = zip(*(by_dp[d] for d in sorted(by_dp)))
    return [(parts[0][0], torch.cat([inputs for _, inputs in parts])) for parts in steps]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict:
    """Steps 1..8 uninterrupted on one process."""
    with one_thread():
        return train_recording_batches(config([]), corpus, str(tmp_path_factory.mktemp("reference")), None)


def assert_continues_the_reference(first: list[dict], resumed: list[dict], reference: dict) -> None:
    ref_losses = torch.tensor(reference["summary"]["losses"])
    for result in first:
        assert result["summary"]["resumed_from"] is None and result["summary"]["steps"] == STOP
        torch.testing.assert_close(torch.tensor(result["summary"]["losses"]), ref_losses[:STOP], rtol=1e-4, atol=0)
    for result in resumed:
        summary = result["summary"]
        assert summary["resumed_from"] == STOP and summary["first_step"] == STOP + 1
        assert result["samples_at_start"] == STOP * GLOBAL_BATCH
        assert result["samples_at_end"] == reference["samples_at_end"] == STEPS * GLOBAL_BATCH
        assert summary["tokens"] == reference["summary"]["tokens"]
        torch.testing.assert_close(torch.tensor(summary["losses"]), ref_losses[STOP:], rtol=1e-4, atol=0)
    ref_batches = reference["batches"][STOP:]
    batches = global_batches(resumed)
    assert [start for start, _ in batches] == [start for start, _ in ref_batches] == [
        step * GLOBAL_BATCH for step in range(STOP, STEPS)]
    for (_, inputs), (_, ref_inputs) in zip(batches, ref_batches):
        assert torch.equal(inputs, ref_inputs)


def test_the_reference_learns(reference):
    losses = reference["summary"]["losses"]
    assert len(losses) == STEPS and losses[-1] < losses[0] - 0.1


def test_four_ranks_fsdp_tp_resume_on_two_ranks_fsdp_with_the_same_data_and_losses(corpus, reference, tmp_path):
    first = launch(4, DP_SHARD_2_TP_2, corpus, tmp_path, stop_after=STOP)
    resumed = launch(2, DP_SHARD_2, corpus, tmp_path)
    assert first[0]["summary"]["layout"] != resumed[0]["summary"]["layout"]
    assert_continues_the_reference(first, resumed, reference)


def test_two_ranks_fsdp_resume_on_four_ranks_pipeline_fsdp_with_the_same_data_and_losses(corpus, reference, tmp_path):
    first = launch(2, DP_SHARD_2, corpus, tmp_path, stop_after=STOP)
    resumed = launch(4, PP_2_DP_SHARD_2, corpus, tmp_path)
    assert first[0]["summary"]["layout"] != resumed[0]["summary"]["layout"]
    assert_continues_the_reference(first, resumed, reference)
