"""One precision path: bf16 compute gives the same losses whatever the layout (CPU, gloo).

bf16 is FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)`` on every layout, at data-parallel
degree 1 too (tasks/train/parallelize.py). Before, one rank, TP-only and PP-only runs used
``torch.autocast``, which keeps the embeddings' output, the residual stream and the norms in fp32:
another model's roundings.

Tolerances, relative (losses are ~5.5):
- ``FIRST_LOSS_RTOL`` 3.5e-7 (4 fp32 ulps): step 1 starts from the same weights, and layouts that keep
  every matmul whole (one rank, dp_shard=2, pp=2) then round the same bf16 values; only the order of
  fp32 sums differs. (Measured 0.0 on this path; the old path put one rank 2.1e-6 from dp_shard=2.)
  TP adds bf16 partial sums across ranks, a rounding of its own: it gets the tolerances below only.
- ``SAME_PATH_RTOL`` 1e-3 over all steps: gradients are rounded to bf16 before FSDP reduces them in
  fp32, so a rank that sums half the batch rounds differently; the optimizer carries that on.
- ``BF16_RTOL`` 3.9e-3 (2^-8, bf16's relative precision) between every bf16 run and fp32.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch.distributed.tensor import DTensor

from tasks.config import from_dict, merge_overrides
from tasks.train import parallelize
from tasks.train.config import TrainConfig
from tasks.train.trainer import Trainer
from tests.tasks.train.ranks import one_thread, run_ranks
from tests.tasks.train.token_corpus import make_corpus

pytestmark = pytest.mark.slow

STEPS = 8
FIRST_LOSS_RTOL = 3.5e-7
SAME_PATH_RTOL = 1e-3
BF16_RTOL = 2**-8
WHOLE_MATMULS = ("dp_shard=2", "pp=2")
BASE = {
    "steps": STEPS,
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8, "prefetch": 0},
    "optim": {"lr": 1e-2, "warmup_steps": 2},
    "parallel": {"mixed_precision": "bf16"},
}
# Two ranks: sharded (FSDP degree 2), and two layouts whose FSDP degree is 1 (once autocast's).
TWO_RANK = {
    "dp_shard=2": ["parallel.dp_shard=2"],
    "tp=2": ["parallel.tp=2", "parallel.dp_shard=1"],
    "pp=2": ["parallel.pp=2", "parallel.dp_shard=1"],
}


def losses(overrides: list[str], data_url: str, run_dir: str) -> list[float]:
    cfg = from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), overrides))
    with Trainer(cfg, {"corpus": data_url}, run_dir) as trainer:
        return trainer.train()["losses"]


def _worker(rank: int, data_url: str, out_dir: str) -> None:
    for name, overrides in TWO_RANK.items():
        result = losses(overrides, data_url, os.path.join(out_dir, name))
        torch.save(result, os.path.join(out_dir, f"{name}.rank{rank}.pt"))


def relative_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def test_bf16_losses_match_across_layouts_and_track_fp32(tmp_path):
    corpus = make_corpus(str(tmp_path / "corpus"))
    with one_thread():
        fp32 = losses(["parallel.mixed_precision=fp32"], corpus, str(tmp_path / "fp32"))
        one_rank = losses([], corpus, str(tmp_path / "bf16-one-rank"))
    run_ranks(2, _worker, corpus, str(tmp_path))
    runs = {"one rank": one_rank}
    for name in TWO_RANK:
        ranks = [torch.load(tmp_path / f"{name}.rank{r}.pt") for r in range(2)]
        assert ranks[0] == ranks[1], f"{name}: the ranks disagree on the loss"
        runs[name] = ranks[0]

    first = {name: relative_gap(run[:1], one_rank[:1]) for name, run in runs.items()}
    gaps = {name: relative_gap(run, one_rank) for name, run in runs.items()}
    to_fp32 = {name: relative_gap(run, fp32) for name, run in runs.items()}
    print(f"bf16 vs bf16 on one rank: step 1 {first}, all steps {gaps}; vs fp32 {to_fp32}")
    assert fp32[-1] < fp32[0] - 0.1  # it learns: the comparison is over a moving loss
    assert one_rank != fp32  # bf16 compute is on: the runs round differently
    for name in WHOLE_MATMULS:
        assert first[name] < FIRST_LOSS_RTOL, f"bf16 {name}: step 1 differs from one rank by {first[name]:.2e}"
    for name in runs:
        assert gaps[name] < SAME_PATH_RTOL, f"bf16 {name} differs from bf16 on one rank by {gaps[name]:.2e}"
        assert to_fp32[name] < BF16_RTOL, f"bf16 {name} strays from fp32 by {to_fp32[name]:.2e}"


def test_a_checkpoint_saved_without_fsdp_resumes_under_fsdp_at_degree_1(tmp_path, monkeypatch):
    """Before this path, one rank saved plain tensors; fully_shard keeps the names, so those checkpoints load."""
    corpus = make_corpus(str(tmp_path / "corpus"))
    fp32 = ["parallel.mixed_precision=fp32", "checkpoint.interval_steps=2", "checkpoint.async_mode=off"]
    cfg = from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), [*fp32, "steps=6"]))
    with monkeypatch.context() as old_layout, one_thread():
        old_layout.setattr(parallelize, "apply_fsdp", lambda *args, **kwargs: None)  # the one-rank layout before
        uninterrupted = losses([*fp32, "steps=6"], corpus, str(tmp_path / "uninterrupted"))
        with Trainer(cfg, {"corpus": corpus}, str(tmp_path / "resumed")) as trainer:
            assert not isinstance(trainer.params[0], DTensor)
            first_part = trainer.train(stop_after=4)["losses"]  # checkpointed at step 4, the schedule still 6 steps
    with one_thread():
        with Trainer(cfg, {"corpus": corpus}, str(tmp_path / "resumed")) as trainer:
            assert trainer.resumed_from == 4 and isinstance(trainer.params[0], DTensor)
            rest = trainer.train()["losses"]
    assert first_part + rest == uninterrupted
