"""The planner's memory model against what smelt's own trainer holds: the activation bytes per layer and
token one block keeps for its backward (bf16, each recomputation mode as the trainer applies it, without
and with tensor parallelism: two gloo ranks, the trainer's TP plan with sequence parallel), and the model
states FSDP2 and AdamW hold while a pipeline accumulates gradients."""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from infra.layout import ModelShape
from infra.memory import head_activation_bytes, layer_activation_bytes, model_state_bytes
from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.parallelize import apply_ac, apply_fsdp, apply_tp
from tests.tasks.train.ranks import run_ranks

CFG = preset("tiny", vocab_size=64, n_layers=2)  # h = 64, kv = 32, f = 192, 4 heads
TOKENS = 256
MODES = ("none", "selective", "full")


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t._local_tensor if isinstance(t, DTensor) else t
    return t.elem if isinstance(t, AsyncCollectiveTensor) else t  # a collective's output, not waited on yet


def _live_storages() -> dict[int, int]:
    sizes = {}
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: it reads __class__, which deprecated module proxies warn on
        # FakeTensors (a compiled graph's, kept by an earlier test's dynamo cache) have no storage to read
        if issubclass(kind, torch.Tensor) and not issubclass(kind, (DTensor, FakeTensor)) and not obj.is_meta:
            storage = obj.untyped_storage()
            sizes[storage.data_ptr()] = storage.nbytes()
    return sizes


def _model(tp_mesh=None) -> tuple[Transformer, torch.Tensor]:
    """The tiny bf16 model (with the trainer's TP plan on ``tp_mesh``) and a sequence-sharded input."""
    torch.manual_seed(0)
    model = Transformer(CFG).to(torch.bfloat16)
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, loss_parallel=True)
    tp = tp_mesh.size() if tp_mesh is not None else 1
    return model, torch.randn(1, TOKENS // tp, CFG.dim, dtype=torch.bfloat16, requires_grad=True)


def _saved_bytes(model: Transformer, forward) -> int:
    """Bytes of the tensors autograd's saved-tensor hooks receive while ``forward()`` runs, each storage
    once, the model's weights and buffers excluded."""
    skip = {_local(t).untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(saved.values())


def kept_bytes(mode: str, tp_mesh=None) -> int:
    """Bytes one block's forward leaves for its backward on this rank, each storage once, weights and
    buffers excluded. Without recomputation: the tensors autograd's saved-tensor hooks receive. With it,
    the checkpoint keeps its inputs (the block's input) and the selective policy's outputs as Python
    tensors: those that appeared during the forward, and the input."""
    model, x = _model(tp_mesh)
    if mode != "none":
        apply_ac(model, mode)
    block, rope = model.layers["0"], model.rope[:TOKENS]
    if mode == "none":
        return _saved_bytes(model, lambda: block(x, rope))
    gc.collect()
    before = _live_storages()
    out = _local(block(x, rope))
    gc.collect()
    new = {ptr: n for ptr, n in _live_storages().items() if ptr not in before}
    new.pop(out.untyped_storage().data_ptr(), None)
    return sum(new.values()) + x.untyped_storage().nbytes()


def head_kept_bytes(tp_mesh=None) -> int:
    """Bytes the final norm and the output projection save for their backward on this rank, weights excluded."""
    model, x = _model(tp_mesh)
    return _saved_bytes(model, lambda: model.output(model.norm(x)))


def not_counted(mode: str, tp: int) -> float:
    """Bytes per token the planner leaves out: attention's fp32 log-sum-exp per query head on the rank, and
    without recomputation each norm's fp32 scale per row of the rank's sequence shard."""
    return {"none": 4 * CFG.n_heads / tp + 2 * 4 / tp, "selective": 4 * CFG.n_heads / tp, "full": 0.0}[mode]


@pytest.mark.parametrize("mode", MODES)
def test_one_rank_keeps_what_the_planner_counts(mode):
    planned = layer_activation_bytes(ModelShape(CFG, TOKENS), 1, mode)
    assert kept_bytes(mode) / TOKENS == planned + not_counted(mode, 1)


def test_the_head_keeps_what_the_planner_counts():
    # the norm's input and the output projection's (the norm's output); the norm's fp32 scale per row is not counted
    assert head_kept_bytes() / TOKENS == head_activation_bytes(ModelShape(CFG, TOKENS), 1) + 4


def _tp_worker(rank: int, out_dir: str) -> None:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({**{mode: kept_bytes(mode, mesh["tp"]) for mode in MODES}, "head": head_kept_bytes(mesh["tp"])}, f)


@pytest.fixture(scope="module")
def tensor_parallel(tmp_path_factory) -> list[dict[str, int]]:
    out = tmp_path_factory.mktemp("tp")
    run_ranks(2, _tp_worker, str(out))
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("mode", MODES)
def test_tensor_parallel_ranks_keep_what_the_planner_counts(tensor_parallel, mode):
    # none: 4h whole (the all-gathered inputs of the q/k/v and w1/w3 matmuls) + (8h + 4kv + 8f)/tp;
    # selective also keeps the collectives' outputs and the row-parallel matmul outputs before their
    # reduce-scatter, whole
    planned = layer_activation_bytes(ModelShape(CFG, TOKENS), 2, mode)
    for rank in tensor_parallel:
        assert rank[mode] / TOKENS == planned + not_counted(mode, 2)


def test_tensor_parallel_heads_keep_what_the_planner_counts(tensor_parallel):
    # the norm's sequence-sharded input, and the output projection's input gathered over the sequence
    for rank in tensor_parallel:
        assert rank["head"] / TOKENS == head_activation_bytes(ModelShape(CFG, TOKENS), 2) + 4 / 2


def _fsdp_worker(rank: int, out_dir: str) -> None:
    """Two FSDP ranks, bf16 parameters and fp32 gradient reduction as the trainer shards them, AdamW's states
    made by one step; then a micro-batch's backward as torch's pipeline schedules run all but the last:
    no reduce-scatter, parameters kept unsharded. What is alive then is the model states."""
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    gc.collect()
    before = _live_storages()
    torch.manual_seed(0)
    model = Transformer(CFG)
    apply_fsdp(model, mesh, param_dtype=torch.bfloat16, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    tokens = torch.randint(0, CFG.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))

    def backward() -> None:
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()

    backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)
    backward()
    gc.collect()
    others = {t.untyped_storage().data_ptr() for t in (tokens, *model.buffers())}
    held = sum(n for ptr, n in _live_storages().items() if ptr not in before and ptr not in others)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"held": held, "params": sum(p.numel() for p in model.parameters()),
                   "tensors": len(list(model.parameters()))}, f)


def test_fsdp_under_a_pipeline_holds_the_zero_1_states_the_planner_counts(tmp_path):
    # unsharded bf16 parameters (2 bytes) and fp32 gradient accumulators (4), sharded fp32 master and Adam
    # moments (12 / 2 ranks); the planner leaves out Adam's step count, an fp32 scalar per parameter tensor
    run_ranks(2, _fsdp_worker, str(tmp_path))
    for rank in range(2):
        measured = json.loads((tmp_path / f"rank{rank}.json").read_text())
        planned = sum(model_state_bytes(measured["params"], zero=1, shards=2))
        assert measured["held"] == planned + 4 * measured["tensors"]
