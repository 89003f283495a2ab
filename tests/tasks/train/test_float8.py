"""FP8 training (``parallel.float8``): which layers run in FP8, how far their numbers move from full
precision, and that FSDP and tensor parallel give what one process gives (CPU, gloo, torchao's
Float8Linear over torch._scaled_mm; an FP8 matmul is slow on a CPU, so the model is tiny).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from tasks.config import from_dict, merge_overrides
from tasks.llama import Transformer
from tasks.model_config import ModelConfig
from tasks.train.config import TrainConfig
from tasks.train.float8 import apply_float8
from tasks.train.parallel_dims import ParallelDims
from tasks.train.parallelize import check_model_fits
from tasks.train.trainer import Trainer
from tests.tasks.train.ranks import one_thread, run_ranks
from tests.tasks.train.test_parallel_numerics import run_layout
from tests.tasks.train.token_corpus import make_corpus

SHAPE = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 64}
BASE = {"steps": 4, "model": SHAPE, "data": {"seq_len": 16, "global_batch": 8, "prefetch": 0},
        "optim": {"lr": 1e-2, "warmup_steps": 1}, "parallel": {"float8": "tensorwise"}}


def model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=256, max_seq_len=64, **SHAPE))


def test_only_the_blocks_linear_layers_run_in_fp8():
    m = model()
    assert apply_float8(m, "tensorwise") == 7 * SHAPE["n_layers"]  # wq wk wv wo, w1 w2 w3
    fp8 = {name for name, module in m.named_modules() if isinstance(module, Float8Linear)}
    assert fp8 == {f"layers.{i}.{layer}" for i in range(SHAPE["n_layers"])
                   for layer in ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                                 "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")}
    assert type(m.output) is nn.Linear  # the vocabulary-wide matmul stays in full precision
    assert set(m.state_dict()) == set(model().state_dict())  # checkpoints and exports are unchanged


# Measured: logits 1.5% (tensorwise) and 1.8% (rowwise) from full precision, the worst gradient 10% and 8%
# (tensorwise casts gradients to e5m2, two mantissa bits: up to 12.5% per element; rowwise to e4m3).
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_logits_and_gradients_stay_within_fp8_rounding_of_full_precision(recipe):
    full, fp8 = model(), model()
    apply_float8(fp8, recipe)
    tokens = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    logits = {}
    for name, m in (("full", full), ("fp8", fp8)):
        out = m(tokens)
        out.float().square().mean().backward()
        logits[name] = out.detach()
    error = (logits["fp8"] - logits["full"]).norm() / logits["full"].norm()
    assert 1e-3 < error < 0.04, error  # FP8 is in effect (not equal), within e4m3's rounding
    for (name, p), q in zip(full.named_parameters(), fp8.parameters()):
        assert (q.grad - p.grad).norm() / p.grad.norm() < 0.2, name


def test_widths_fp8_matmuls_cannot_take_are_refused_before_training():
    cfg = TrainConfig()
    dims = ParallelDims.from_config(cfg.parallel, 1)
    with torch.device("meta"):
        odd = Transformer(ModelConfig(vocab_size=256, max_seq_len=64, dim=40, n_layers=1, n_heads=4, n_kv_heads=4,
                                      ffn_hidden=64))
    check_model_fits(odd, dims, 16)  # fine without FP8
    with pytest.raises(ValueError, match=r"parallel.float8=tensorwise needs FP8-sized matmuls: model.dim / "
                                         r"parallel.tp = 40 is not a multiple of 16"):
        check_model_fits(odd, dims, 16, "tensorwise")


def config(overrides: list[str]) -> TrainConfig:
    return from_dict(TrainConfig, merge_overrides(copy.deepcopy(BASE), overrides))


def _worker(rank: int, data_url: str, out_dir: str, layouts: dict[str, list[str]]) -> None:
    for name, overrides in layouts.items():
        result = run_layout(config(overrides), data_url, os.path.join(out_dir, name))
        torch.save(result, os.path.join(out_dir, f"{name}.rank{rank}.pt"))


@pytest.mark.slow
def test_fp8_under_fsdp_tensor_and_pipeline_parallel_trains_as_one_process_does(tmp_path):
    """The references accumulate two micro-batches of 4, the rows each of the 2 ranks holds, so
    every FP8 scale (an amax over a whole tensor or row, reduced across shards) sees the same values."""
    corpus = make_corpus(str(tmp_path / "corpus"))
    with one_thread():
        references = {recipe: run_layout(config(["data.micro_batch=4", f"parallel.float8={recipe}"]), corpus,
                                         str(tmp_path / f"reference-{recipe}")) for recipe in ("tensorwise", "rowwise")}
        full_precision = run_layout(config(["parallel.float8=none"]), corpus, str(tmp_path / "fp32"))
    layouts = {"dp_shard=2": ["parallel.dp_shard=2"],
               "tp=2": ["parallel.tp=2", "parallel.dp_shard=1", "data.micro_batch=4"],
               "pp=2": ["parallel.pp=2", "parallel.dp_shard=1"],  # two micro-batches of 4, one per stage
               "dp_shard=2,rowwise": ["parallel.dp_shard=2", "parallel.float8=rowwise"]}
    run_ranks(2, _worker, corpus, str(tmp_path), layouts)
    for name in layouts:
        reference = references["rowwise" if name.endswith("rowwise") else "tensorwise"]
        ranks = [torch.load(tmp_path / f"{name}.rank{r}.pt") for r in range(2)]
        merged = {}
        for result in ranks:
            merged.update(result["grads"])
        assert sorted(merged) == sorted(reference["grads"])
        for key, grad in merged.items():
            torch.testing.assert_close(grad, reference["grads"][key], rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"{name} {key}: {m}")
        torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(reference["losses"]),
                                   rtol=1e-4, atol=0)
    for reference in references.values():  # FP8 changed the numbers, within 2% of fp32
        assert reference["losses"] != full_precision["losses"]
        torch.testing.assert_close(torch.tensor(reference["losses"]), torch.tensor(full_precision["losses"]),
                                   rtol=0.02, atol=0)
    assert references["rowwise"]["losses"] != references["tensorwise"]["losses"]


def test_a_checkpoint_saved_under_fp8_resumes_without_it_with_the_same_weights(tmp_path):
    """Float8Linear keeps its weight in high precision: the checkpoint holds the same tensors either way."""
    corpus = make_corpus(str(tmp_path / "corpus"))
    overrides = ["steps=2", "checkpoint.interval_steps=0"]
    trained = Trainer(config(overrides), {"corpus": corpus}, str(tmp_path / "run"))
    try:
        trained.train()
        saved = {k: v.clone() for k, v in trained.model_parts[0].state_dict().items()}
    finally:
        trained.close()
    resumed = Trainer(config([*overrides, "steps=4", "parallel.float8=none"]), {"corpus": corpus},
                      str(tmp_path / "run"))
    try:
        assert resumed.resumed_from == 2
        assert not any(isinstance(m, Float8Linear) for m in resumed.model_parts[0].modules())
        loaded = resumed.model_parts[0].state_dict()
        assert set(loaded) == set(saved)
        for key, value in saved.items():
            assert torch.equal(loaded[key], value), key
    finally:
        resumed.close()


@pytest.mark.slow
def test_compiled_fp8_blocks_train_as_eager_ones_do(tmp_path):
    """bench/mfu.py and GPU runs compile each block: Float8Linear's casts must trace into the graph."""
    corpus = make_corpus(str(tmp_path / "corpus"))
    with one_thread():
        eager = run_layout(config(["steps=2"]), corpus, str(tmp_path / "eager"))
        compiled = run_layout(config(["steps=2", "parallel.compile=true"]), corpus, str(tmp_path / "compiled"))
    # measured: the same losses, gradients within 5e-7 (relative norm) of eager
    torch.testing.assert_close(torch.tensor(compiled["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    for key, grad in eager["grads"].items():
        torch.testing.assert_close(compiled["grads"][key], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")
