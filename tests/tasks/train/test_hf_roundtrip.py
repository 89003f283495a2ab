"""Round trip: a trained run exported to a Hugging Face folder, then ``train.init_from`` on another
layout (dp_shard=2 × tp=2 on 4 gloo ranks): each rank loads only its shards, and the first step's
loss equals the exported model's loss on that same batch (fp32, CPU)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from tasks.config import from_dict, merge_overrides
from tasks.train.config import TrainConfig
from tasks.train.data import TokenLoader
from tasks.train.export import export_checkpoint
from tasks.train.hf import load_model
from tasks.train.trainer import Trainer
from tests.tasks.train.ranks import one_thread, run_ranks
from tests.tasks.train.token_corpus import make_corpus

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

BASE = {
    "steps": 20,
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64, "max_seq_len": 64},
    "data": {"seq_len": 16, "global_batch": 8, "prefetch": 0},
    "optim": {"lr": 1e-2, "warmup_steps": 2},
    "checkpoint": {"interval_steps": 0, "async_mode": "off"},
}


def config(overrides: list[str]) -> TrainConfig:
    return from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), overrides))


def _first_step(rank: int, overrides: list[str], corpus: str, run_dir: str, out: str) -> None:
    trainer = Trainer(config(overrides), {"corpus": corpus}, run_dir)
    try:
        record = trainer.train_step(1)
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in trainer.params)
        torch.save({"loss": record["loss"], "local_params": local}, f"{out}.rank{rank}.pt")
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[str, str, float]:
    """(corpus, export folder, the exported model's loss on a fresh run's first global batch)."""
    tmp_path = tmp_path_factory.mktemp("roundtrip")
    corpus = make_corpus(str(tmp_path / "corpus"), tokens=8_000)
    with one_thread():
        trainer = Trainer(config([]), {"corpus": corpus}, str(tmp_path / "run"))
        try:
            trainer.train()
        finally:
            trainer.close()
    export_checkpoint(str(tmp_path / "run"), str(tmp_path / "export"))
    model = load_model(tmp_path / "export")  # plain smelt code, one process
    loader = TokenLoader({"corpus": corpus}, None, split="train", seq_len=16, global_batch=8, dp_rank=0, dp_size=1,
                         seed=config([]).data.seed, prefetch=0)
    try:
        inputs, targets = loader.next_batch()
    finally:
        loader.close()
    with torch.no_grad():
        expected = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).item()
    return corpus, str(tmp_path / "export"), expected


@pytest.mark.parametrize("layout", [["parallel.dp_shard=2", "parallel.tp=2"], ["parallel.pp=2", "parallel.dp_shard=2"]],
                         ids=["dp_shard2_tp2", "pp2_dp_shard2"])
def test_export_then_init_from_on_another_layout_continues_with_the_same_loss(tmp_path, exported, layout):
    corpus, export, expected = exported
    out = str(tmp_path / "first")
    run_ranks(4, _first_step, [*layout, f"init_from={export}"], corpus, str(tmp_path / "continued"), out)
    results = [torch.load(f"{out}.rank{r}.pt") for r in range(4)]
    assert all(abs(r["loss"] - expected) < 1e-5 for r in results), (expected, [r["loss"] for r in results])
    whole = config([]).model_config(vocab_size=256).num_params()
    assert all(r["local_params"] * 3 < whole for r in results)  # each rank holds about a quarter

    # The check can fail: the same layout without init_from starts from random weights, far higher.
    run_ranks(4, _first_step, layout, corpus, str(tmp_path / "fresh"), out)
    assert torch.load(f"{out}.rank0.pt")["loss"] > expected + 1.0


def test_init_from_gives_the_run_the_folders_shape_before_any_rank_starts(exported):
    from tasks.train.trainer import describe_layout

    corpus, export, _ = exported
    cfg = config([f"init_from={export}", "model.dim=64", "model.n_layers=3"])  # the folder's shape wins
    assert cfg.model_for_data(256) == load_model(export).cfg
    assert describe_layout(cfg, world_size=2, vocab_size=256)["model"]["params"] == load_model(export).cfg.num_params()
    with pytest.raises(ValueError, match="vocabulary holds 256"):
        cfg.model_for_data(300)
