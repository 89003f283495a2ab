"""torchtitan's per-op selective recomputation, compiled as its benchmark runs ran it, against what the planner
counts it rerunning (``infra.timing.selective_reruns``): the matmuls that torch's partitioner puts
back into the backward graph of smelt's block, without TP and with each block's output projections followed
by the reduce-scatter that sequence parallel puts there (a one-rank gloo group)."""

from __future__ import annotations

import gc
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from functorch.compile import min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from infra.layout import ModelShape
from infra.timing import selective_reruns
from tasks.llama import Block, rope_tables
from tasks.model_config import ModelConfig

# h 64, kv 32 (2 of 4 heads of 16), f 96: every matmul's output width tells which one it is, but q and wo (64)
CFG = ModelConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab_size=128, max_seq_len=32)
MM = torch.ops.aten.mm.default
SCALED_MM = torch.ops.aten._scaled_mm.default  # what torchao's float8 linears lower to
# The outputs torchtitan's policy keeps (its _save_list at 9dec370 and 820504e, with the CPU flash kernel, the
# one SDPA runs here, beside the CUDA ones it names), except every second matmul of a block.
KEPT = {MM, torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops.aten.max.default}


def _per_op_policy():
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == MM:
            counts[mode] += 1
        keep = func in KEPT and not (func == MM and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _ReduceScattered(torch.nn.Module):
    """A row-parallel projection as sequence parallel runs it: its partial sums reduce-scattered."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return funcol.reduce_scatter_tensor(self.linear(x), "sum", 0, dist.group.WORLD)


def _backward_graph(block: Block, context_fn=None) -> torch.fx.Graph:
    """The backward graph torch.compile builds for ``block`` under checkpoint: the per-op policy, or full
    recomputation (``context_fn`` None) as torchtitan and smelt's trainer compile it, over the checkpoint."""
    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=min_cut_rematerialization_partition)
    rope = rope_tables(CFG.head_dim, CFG.max_seq_len, CFG.rope_theta)
    policy = {} if context_fn is None else {"context_fn": context_fn}
    step = torch.compile(lambda x: checkpoint(block, x, rope, use_reentrant=False, **policy), backend=backend,
                         fullgraph=True)
    torch._dynamo.reset()
    step(torch.randn(2, 16, CFG.dim, requires_grad=True)).sum().backward()
    graph = graphs.pop("backward").graph
    graphs.clear()
    torch._dynamo.reset()  # drop the compiled graphs' fake tensors: later tests scan live storages
    gc.collect()
    return graph


def _rerun_widths(block: Block) -> tuple[int, list[int]]:
    """Matmuls in the compiled backward graph, and the output widths of the forward ones it reruns."""
    graph = _backward_graph(block, _per_op_policy)
    matmuls = [n for n in graph.nodes if n.target in (MM, SCALED_MM)]
    return len(matmuls), sorted(n.meta["val"].shape[-1] for n in matmuls if n.meta.get("recompute") is not None)


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _planned(tp: int) -> list[int]:
    matmuls, _ = selective_reruns("torchtitan-op", ModelShape(CFG, 16), tp)
    return sorted(o for _, o in matmuls)


def test_without_tensor_parallel_the_backward_reruns_k_wo_and_w3():
    torch.manual_seed(0)
    matmuls, reruns = _rerun_widths(Block(CFG))
    assert reruns == [32, 64, 96] == _planned(1)  # wk, wo (the residual the next norm saved), w3
    assert matmuls == 2 * 7 + 3  # each linear's input- and weight-gradient GEMMs, and the reruns


def test_float8_linears_rerun_the_same_matmuls():
    """torchtitan's save list names aten.mm, not the _scaled_mm that float8 linears lower to; the policy still
    sees each float8 linear's mm (torchao dispatches it to _scaled_mm underneath), so FP8 runs rerun what bf16
    runs do, as the planner counts them (``selective_reruns`` ignores the precision)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    block = convert_to_float8_training(Block(CFG), config=Float8LinearConfig())
    matmuls, reruns = _rerun_widths(block)
    assert reruns == [32, 64, 96] == _planned(1)
    assert matmuls == 2 * 7 + 3


def test_after_a_reduce_scatter_wo_is_not_rerun(one_rank):
    torch.manual_seed(0)
    block = Block(CFG)
    block.attention.wo = _ReduceScattered(block.attention.wo)
    block.feed_forward.w2 = _ReduceScattered(block.feed_forward.w2)
    matmuls, reruns = _rerun_widths(block)
    assert reruns == [32, 96] == _planned(8)  # the residual is rebuilt from the kept reduce-scatter output
    assert matmuls == 2 * 7 + 2


def _reruns(graph: torch.fx.Graph, targets) -> list:
    return [n for n in graph.nodes if n.target in targets and n.meta.get("recompute") is not None]


def test_compiled_full_recomputation_reruns_all_but_the_last_matmul_and_its_reduce_scatter(one_rank):
    """Full recomputation compiled over the checkpoint (``TimingAssumptions.compiled_recompute``): the
    partitioner reruns only what the backward needs. The block's output is not needed, so w2 (96 → 64) is not
    rerun; wo is, since the residual sum after attention feeds the second norm's backward; and of the two
    reduce-scatters, only wo's."""
    torch.manual_seed(0)
    graph = _backward_graph(Block(CFG))
    shapes = sorted((tuple(n.args[0].meta["val"].shape)[-1], n.meta["val"].shape[-1]) for n in _reruns(graph, {MM}))
    assert shapes == [(64, 32), (64, 32), (64, 64), (64, 64), (64, 96), (64, 96)]  # k, v, q, wo, w1, w3
    block = Block(CFG)
    block.attention.wo = _ReduceScattered(block.attention.wo)
    block.feed_forward.w2 = _ReduceScattered(block.feed_forward.w2)
    graph = _backward_graph(block)
    assert len(_reruns(graph, {MM})) == 6
    assert len(_reruns(graph, {torch.ops._c10d_functional.reduce_scatter_tensor.default})) == 1
