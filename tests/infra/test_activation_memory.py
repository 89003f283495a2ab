"""The planner's activation bytes per layer and token against what autograd keeps for the backward in one
block of smelt's own model: bf16, no recomputation, without and with tensor parallelism (two gloo ranks,
the trainer's TP plan with sequence parallel)."""

from __future__ import annotations

import json
import os

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from infra.layout import ModelShape
from infra.memory import layer_activation_bytes
from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.parallelize import apply_tp
from tests.tasks.train.ranks import run_ranks

CFG = preset("tiny", vocab_size=64, n_layers=2)  # h = 64, kv = 32, f = 192, 4 heads
TOKENS = 256


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def saved_bytes(tp_mesh=None) -> int:
    """Bytes of the tensors autograd saves in one block's forward on this rank (weights and buffers
    excluded, each storage once)."""
    torch.manual_seed(0)
    model = Transformer(CFG).to(torch.bfloat16)
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, loss_parallel=True)
    tp = tp_mesh.size() if tp_mesh is not None else 1
    x = torch.randn(1, TOKENS // tp, CFG.dim, dtype=torch.bfloat16, requires_grad=True)  # sequence-sharded
    skip = {_local(t).untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.layers["0"](x, model.rope[:TOKENS])
    return sum(saved.values())


def not_counted(tp: int) -> float:
    """Bytes per token the planner leaves out: each norm's fp32 scale per row of the rank's sequence shard,
    and attention's fp32 log-sum-exp per query head on the rank."""
    return 2 * 4 / tp + 4 * CFG.n_heads / tp


def test_one_rank_keeps_what_the_planner_counts():
    planned = layer_activation_bytes(ModelShape(CFG, TOKENS), 1, "none")  # 12h + 4kv + 8f
    assert saved_bytes() / TOKENS == planned + not_counted(1)


def _tp_worker(rank: int, out_dir: str) -> None:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(saved_bytes(mesh["tp"]), f)


def test_tensor_parallel_ranks_keep_what_the_planner_counts(tmp_path):
    # 4h whole (the all-gathered inputs of the q/k/v and w1/w3 matmuls) + (8h + 4kv + 8f)/tp
    run_ranks(2, _tp_worker, str(tmp_path))
    planned = layer_activation_bytes(ModelShape(CFG, TOKENS), 2, "none")
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) / TOKENS == planned + not_counted(2)
