"""Step time and MFU of a layout: compute at an achievable fraction of peak plus exposed communication.

One step = (m + (p-1)/v) micro-batch slots on the slowest pipeline stage (the last term is the 1F1B /
interleaved bubble, (p-1)/(m·v+p-1) of the step; ZB-V's is simulated from torch's order, in which
weight-gradient work fills part of it, ``infra.pipeline_order``) + the data-parallel traffic that compute
cannot hide.
Per micro-batch slot: forward+backward FLOPs of the stage (GEMMs at ``compute`` × peak, attention's kernels
at ``attention`` × that rate, scaled by their measured speed, see ``attention_seconds``; + one more forward
under full recomputation, attention's included, but w2's GEMM where the recomputation is compiled with the
block (``compiled_recompute``); selective recomputation reruns memory-bound ops and the matmuls its policy does
not keep, ``SELECTIVE_POLICIES``), the memory-bound ops themselves at HBM bandwidth
(norms, residual adds, rotary, SwiGLU, the loss), the linear GEMMs' traffic on top of their math
(``_gemm_activation_bytes``: what makes a TP shard of a small model slower per FLOP), the tensor-parallel
collectives over NVLink (with sequence parallel: an all-gather and a reduce-scatter around attention and around
the MLP, each way, so 8 per layer, 12 with recomputation (11 compiled), 10 under a selective policy that keeps no
all-gather output, ``SELECTIVE_POLICIES``) and the pipeline send/receive (NVLink between stages on one node, else the
NIC). Bandwidths are ring bandwidths: (n-1)/n of the message crosses each GPU's link; a group spread over
nodes with k members per node uses k NICs at once.

MFU counts model FLOPs only (6N + 12·L·H·Q·T per token, ``ModelConfig.flops_per_token``), as the trainer
reports it, so recomputation lowers MFU. It is always against the dense bf16 peak, FP8 runs included.

FP8 (Transformer Engine, torchao float8): the linear layers' forward and backward GEMMs run
``fp8_speedup`` times faster than in bf16 (the datasheet says 2×; the achieved ratio is fitted in
infra/validation.py), except a GEMM too narrow to gain (``fp8_gainless_gemm``, torchao's bound). Attention (the
score and value matmuls and softmax), the norms, the embedding, the output projection and the optimizer stay in
bf16/fp32. The casts cost HBM traffic: each linear input
(forward) and output gradient (backward) is read for its amax, read again and written as FP8 plus an
FP8 transpose (6 bytes per element; under TP, full width for the tensors a rank gathers, ``_fp8_cast_bytes``),
and each weight is cast once per micro-batch. The sequence-parallel all-gathers carry FP8 (1 byte) in
Transformer Engine and under torchao's float8 TP plans (``fp8_tp_gathers``, the validation stacks): the inputs
of q/k/v and w1/w3 forward, the output gradients of wo and w2 backward; smelt's trainer gathers bf16.

Context parallel (ring attention, as Transformer Engine and torch's context_parallel run it): each rank
holds seq_len/cp tokens of every sequence, load-balanced for the causal mask, and passes its K and V around
the ring: (cp−1) chunks forward, K, V and their gradients backward. The exchange hides behind the
attention compute of the same layer (``cp_overlap``); what does not fit is exposed. torch's allgather rotater
(``cp_rotate``, torchtitan's default in December 2024) instead gathers every chunk at once behind the local
block only, forward and again backward, and passes the fp32 K/V gradients around the ring; a model that
repeats K/V to the query heads before attention (``cp_kv_repeated``) moves H heads, not the KV heads. torch's
ring also folds each step into fp32 buffers on the compute stream (``cp_fp32_merge``). Weights are replicated
over the cp ranks, so gradients reduce over dp_shard × cp.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

from infra.catalogue import GPU
from infra.layout import Layout, ModelShape
from infra.pipeline_order import zbv_bubble


# Fitted by infra/validation.py (infra/stacks.py's FITTED; tests/infra/test_validation.py keeps these equal): torchao float8's
# GEMM speed-up on H100 (the PyTorch path smelt's trainer would take) and attention's rate relative to the
# GEMMs' (FlashAttention-2 at 16K; see attention_seconds).
FP8_SPEEDUP = 1.7587
ATTENTION_RATE = 0.4306
# The share of the tensor-parallel collectives' time that PyTorch's async TP hides, fitted on torchtitan's 70B
# with and without it; smelt's trainer runs none.
ASYNC_TP_HIDDEN = 0.2554
# torchao's float8 tensorwise GEMMs gain nothing over bf16 when the linear has at most 4,096 inputs and at most
# 1,024 outputs: the bound of its auto filter (torchao/float8/float8_linear_utils.py, _auto_filter_for_tensorwise,
# "dims below these thresholds may result in worse performance"), drawn from its per-shape H100 microbenchmarks.
# Under TP it is the rank's shard that runs: Llama 3 8B's k and v (4,096 → 1,024) at any tp, q too at tp 8.
FP8_GAINLESS_GEMM = (4096, 1024)

# Attention kernels on an H100 SXM5, head dim 128, bf16, TFLOP/s by the sequence length of the call (512 … 16K):
# forward with the causal mask, forward without, backward without (FlashAttention-3 paper, Shah et al. 2024,
# arXiv 2407.08608, Figures 5 and 6). FlashAttention-2 is what torch SDPA's flash backend and flash-attn 2 run
# (torchtitan keeps SDPA on the flash backend on H100, pytorch/torchtitan#1196); cuDNN's fused attention is what
# Transformer Engine picks on Hopper ("Select FusedAttention on sm90 ... for performance" in its backend
# selection since 2024). The causal backward is taken at the forward's causal / non-causal ratio.
KERNEL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_KERNELS = {
    "fa2": ((191, 260, 298, 319, 333, 335), (309, 350, 362, 368, 370, 370), (214, 260, 291, 310, 318, 322)),
    "cudnn": ((315, 410, 484, 518, 529, 539), (497, 574, 617, 609, 600, 595), (305, 408, 465, 499, 518, 516)),
}


# Selective recomputation policies. smelt's trainer keeps every matmul's and every collective's output and
# reruns only memory-bound ops. torchtitan's per-op policy (``_save_list`` in parallelize_llama.py at 9dec370
# and 820504e) keeps every other matmul's output, q, v, w1 and w2 of a block's seven, and no all-gather's;
# compiled, the backward reruns what it needs of the rest: k (attention's input), w3 (SwiGLU's product) and, at
# tp 1, wo (the residual sum the next norm saved; under TP it is rebuilt from the kept reduce-scatter output),
# and under TP the sequence-parallel all-gathers before q/k/v and w1/w3.
SELECTIVE_POLICIES = ("smelt", "torchtitan-op")


@dataclass(frozen=True)
class TimingAssumptions:
    """Efficiency factors; ``compute`` None takes the GPU's calibrated ``compute_efficiency``."""

    compute: float | None = None  # fraction of dense peak reached by the math when nothing waits on the network
    network: float = 0.80  # fraction of nominal link bandwidth NCCL collectives reach
    tp_overlap: float = 0.0  # share of TP collectives hidden behind compute (async TP needs torch.compile)
    dp_overlap: float = 0.90  # share of the compute window FSDP traffic can hide behind
    pp_overlap: float = 0.50  # share of pipeline send/receive hidden behind compute
    cp_overlap: float = 0.90  # share of a layer's attention compute the ring exchange can hide behind
    cp_rotate: str = "ring"  # ring (chunk by chunk) | allgather (torch's all-at-once rotater)
    cp_kv_repeated: bool = False  # K/V repeated to the query heads before attention (GQA unused)
    cp_fp32_merge: bool = False  # torch's ring attention: each step merged into fp32 buffers on the compute stream
    # full recomputation compiled with the block (torch.compile over the checkpoint): the backward reruns all but
    # the block's last matmul, w2, and under TP its reduce-scatter (tests/infra/test_selective_policy.py)
    compiled_recompute: bool = False
    fp8_speedup: float = FP8_SPEEDUP  # FP8 linear GEMM rate / bf16 GEMM rate
    # (inputs, outputs) at or below which an FP8 GEMM runs at the bf16 rate; None: every FP8 GEMM gains
    fp8_gainless_gemm: tuple[int, int] | None = FP8_GAINLESS_GEMM
    gather_bytes: float = 2.0  # bytes per parameter FSDP all-gathers: bf16, or 1 with float8 all-gather
    fp8_tp_gathers: bool = False  # FP8 runs' sequence-parallel all-gathers carry FP8 (TE, torchao's TP plans)
    attention: float = ATTENTION_RATE  # attention's rate (its kernels' FLOPs) relative to the GEMMs', FA2 at 16K
    attention_kernel: str = "fa2"  # fa2 (torch SDPA's flash backend, flash-attn 2) | cudnn (Transformer Engine)
    layer_overhead_s: float = 0.0  # seconds per layer and pass that do not scale with tokens (backward: 2)
    loss_bytes: float = 12.0  # HBM bytes the loss moves per logit, forward and backward
    tp_overlap_kind: str = "torch"  # te (Transformer Engine userbuffers) | torch (PyTorch async TP)
    async_tp_hidden: float = ASYNC_TP_HIDDEN  # share of the TP collectives' time torch's async TP hides
    # What selective recomputation reruns besides the memory-bound ops (SELECTIVE_POLICIES)
    selective_policy: str = "smelt"

    def __post_init__(self) -> None:
        if not 1 <= self.fp8_speedup <= 4:
            raise ValueError(f"fp8_speedup must be in [1, 4], got {self.fp8_speedup}")
        if not 0 < self.attention <= 2:
            raise ValueError(f"attention must be in (0, 2], got {self.attention}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention_kernel must be one of {', '.join(ATTENTION_KERNELS)}, "
                             f"got {self.attention_kernel!r}")
        if self.selective_policy not in SELECTIVE_POLICIES:
            raise ValueError(f"selective_policy must be one of {', '.join(SELECTIVE_POLICIES)}, "
                             f"got {self.selective_policy!r}")
        if self.cp_rotate not in ("ring", "allgather"):
            raise ValueError(f"cp_rotate must be ring or allgather, got {self.cp_rotate!r}")
        if self.tp_overlap_kind not in ("te", "torch"):
            raise ValueError(f"tp_overlap_kind must be te or torch, got {self.tp_overlap_kind!r}")
        if not 0 <= self.layer_overhead_s < 1:
            raise ValueError(f"layer_overhead_s must be in [0, 1), got {self.layer_overhead_s}")
        for name in ("compute", "network"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("tp_overlap", "dp_overlap", "pp_overlap", "cp_overlap", "async_tp_hidden"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"overlap {name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step, split by where the time goes."""

    compute: float
    recompute: float
    tp_comm: float
    pp_comm: float
    bubble: float
    dp_comm: float
    cp_comm: float
    tokens_per_step: float
    model_flops_per_step: float
    world: int
    peak_flops: float

    TIMES = ("compute", "recompute", "tp_comm", "pp_comm", "cp_comm", "bubble", "dp_comm")  # the parts of a step

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in self.TIMES)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.total

    @property
    def mfu(self) -> float:
        return self.model_flops_per_step / (self.total * self.world * self.peak_flops)

    def scaled(self, factor: float) -> StepTime:
        """The same step with every part ``factor`` times as long: what the plan becomes if the planner is off
        by that much (the sensitivity table's planner-error rows)."""
        return dataclasses.replace(self, **{name: getattr(self, name) * factor for name in self.TIMES})

    def parts(self) -> dict[str, float]:
        """Each part of the step by the name ``PART_LABELS`` gives it (the bubble is the pipeline's)."""
        return {"pp_bubble" if name == "bubble" else name: getattr(self, name) for name in self.TIMES}


PART_LABELS = {"compute": "compute on the slowest stage", "recompute": "activation recomputation",
               "tp_comm": "exposed tensor-parallel collectives", "pp_comm": "exposed pipeline send/receive",
               "cp_comm": "exposed ring-attention exchange", "pp_bubble": "pipeline bubble",
               "dp_comm": "exposed FSDP/data-parallel traffic"}


def _compute_rate(gpu: GPU, a: TimingAssumptions) -> float:
    """FLOP/s the GEMMs reach: the peak at ``a.compute``, or at the GPU's calibrated efficiency."""
    return gpu.peak_flops * (a.compute if a.compute is not None else gpu.compute_efficiency)


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


# NCCL's ring cost model (src/graph/tuning.cc, NVIDIA/nccl at b647562): per protocol, microseconds of latency
# per call, per step inside a node (NVLink) and per step across nodes (the network), and the share of the link
# bandwidth it reaches; NCCL runs each call on the cheaper protocol (both are enabled on NVLink systems from
# Volta on).
NCCL_RING_PROTOCOLS = ((14.0, 1.9, 4.0, 0.92),  # LL128
                       (8.4, 3.4, 14.0, 1.0))  # Simple


def _ring_collective(transfer_s: float, size: int, nodes: int) -> float:
    """Seconds of one ring all-gather or reduce-scatter over ``size`` ranks on ``nodes`` nodes whose bandwidth
    term is ``transfer_s``: size − 1 steps, nodes − 1 of them across nodes, on the protocol NCCL would pick."""
    if size <= 1:
        return 0.0
    return min((base + (size - nodes) * intra + (nodes - 1) * net) * 1e-6 + transfer_s / share
               for base, intra, net, share in NCCL_RING_PROTOCOLS)


def _hidden(comm: float, window: float, units: int, overlap: float) -> float:
    """Exposed part of ``comm`` prefetched layer by layer behind ``window`` of compute: the first unit is
    never hidden."""
    return max(comm - overlap * window, comm / max(units, 1)) if comm > 0 else 0.0


def selective_reruns(policy: str, shape: ModelShape, tp: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """What a block's backward reruns under a selective policy besides its memory-bound ops
    (``SELECTIVE_POLICIES``): the (inputs, outputs) of its matmuls, and its sequence-parallel all-gathers.
    torchtitan's: k and w3, wo without TP, and under TP the two gathers (tests/infra/test_selective_policy.py)."""
    if policy == "smelt":
        return (), 0
    c = shape.cfg
    reruns = ((c.dim, c.n_kv_heads * c.head_dim), (c.dim, c.ffn_hidden))
    return (reruns, 2) if tp > 1 else ((*reruns, (c.n_heads * c.head_dim, c.dim)), 0)


def _selective_recompute_bytes(shape: ModelShape, tp: int) -> float:
    """HBM bytes per token and layer to rerun the two norms, rotary, the residual add, SiLU and the product:
    (4h + 2(2h + 2kv) + 6h + 4h + 10f)/t read and written."""
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    return (18 * h + 4 * kv + 10 * f) / tp


def _bubble(shape: ModelShape, layout: Layout, microbatches: int, slot: float) -> float:
    """Seconds a step's pipeline leaves idle. 1F1B and interleaving: (pp − 1)/v slots. ZB-V: its order as
    torch runs it (``infra.pipeline_order``), simulated with a stage's forward F, input-gradient B and
    weight-gradient W in proportion to their FLOPs: attention's backward is all input-gradient work, and
    full recomputation adds a forward to B. The zero-bubble paper's (pp − 1)(F + B − 2W) is less than torch's
    order leaves (about (pp − 1)·B)."""
    if layout.pp == 1:
        return 0.0
    if layout.pp_schedule != "ZBVZeroBubble":
        return (layout.pp - 1) / layout.virtual_stages * slot
    c = shape.cfg
    linear, attention = 6 * shape.layer_params, 12 * c.n_heads * c.head_dim * shape.seq_len
    f, b, w = (linear + attention) / 3, linear / 3 + 2 * attention / 3, linear / 3
    if layout.activation_checkpoint == "full":
        b += f
    chunk = f + b + w  # a micro-batch's slot is both chunks' F + B + W
    return zbv_bubble(layout.pp, microbatches, f / chunk, b / chunk, w / chunk) * slot / 2


def _members_per_node(gpu: GPU, inner: int, size: int) -> int:
    """How many of a group of ``size`` ranks spaced ``inner`` ranks apart in the mesh share a node."""
    return size if inner * size <= gpu.gpus_per_node else max(1, min(size, gpu.gpus_per_node // inner))


def _group_bandwidth(gpu: GPU, inner: int, size: int, nvlink: float, nic: float) -> float:
    """Per-rank ring bandwidth of a group of ``size`` ranks spaced ``inner`` ranks apart in the mesh. Inside a
    node it is NVLink; across nodes NCCL runs one ring per NIC, so the k group members on a node share
    k NICs and the group moves k × the per-GPU NIC bandwidth, up to NVLink's (nccl-tests' bus bandwidth on
    8-NIC nodes is close to the node's aggregate NIC bandwidth)."""
    per_node = _members_per_node(gpu, inner, size)
    return nvlink if per_node == size else min(nvlink, per_node * nic)


def _pp_links(gpu: GPU, layout: Layout, nvlink: float, nic: float) -> float:
    """Seconds per byte of one send forward plus one backward on the slowest pipeline rank. Stages sit
    world/pp ranks apart (pp is the outermost mesh dimension), so k = gpus_per_node·pp/world consecutive stages
    share a node: with k ≥ 2 a rank at a node's edge sends one way over NVLink and the other over the NIC; with
    every stage in one node (and no interleaving wrap-around to the first) both go over NVLink."""
    per_node = gpu.gpus_per_node * layout.pp // layout.world
    if per_node >= layout.pp:
        return 2 / nvlink
    return 1 / nvlink + 1 / nic if per_node >= 2 else 2 / nic


def _elementwise_bytes(shape: ModelShape, tp: int) -> float:
    """HBM bytes per token and layer of the memory-bound ops, forward and backward: two RMSNorms (10h each),
    two residual adds (12h each), rotary on q and k (8(h + kv)), SwiGLU's SiLU and product (16f)."""
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    return (52 * h + 8 * kv + 16 * f) / tp


def _operand_bytes(fp8: bool) -> int:
    """Bytes per element a linear GEMM reads of its inputs: FP8 or bf16 (its results are written in bf16)."""
    return 1 if fp8 else 2


def _gemm_bytes_per_element(fp8: bool) -> int:
    """HBM bytes the three GEMMs of a linear layer (forward, input gradient, weight gradient) move per element
    of its input, its output and its weight: each is read by two of them (b bytes: 2 in bf16, 1 in FP8), and
    its gradient (for the output, the output itself) is written by the third in bf16 (2 bytes)."""
    return 2 * _operand_bytes(fp8) + 2


def _linears(shape: ModelShape) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """A block's linear layers as (inputs, outputs) per token: the column-parallel ones, q, k, v, w1 (and w3),
    whose outputs TP shards, and the row-parallel ones, wo and w2, whose inputs it shards."""
    c = shape.cfg
    h, q, kv, f = c.dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    mlp_in, mlp_out = ((h, 4 * h),), (4 * h, h)  # a GPT block's GELU MLP (ModelShape.gelu_mlp)
    if not shape.gelu_mlp:
        mlp_in, mlp_out = ((h, f), (h, f)), (f, h)
    return ((h, q), (h, kv), (h, kv), *mlp_in), ((q, h), mlp_out)


def _gemm_speedup(inputs: float, outputs: float, fp8: bool, a: TimingAssumptions) -> float:
    """How much faster than bf16 one GEMM with this many inputs and outputs on the rank runs: 1 in bf16, and in
    FP8 none at or below ``fp8_gainless_gemm``, where the GEMM is too narrow to run faster."""
    bound = a.fp8_gainless_gemm
    small = bound is not None and inputs <= bound[0] and outputs <= bound[1]
    return a.fp8_speedup if fp8 and not small else 1.0


def rank_linears(shape: ModelShape, tp: int) -> list[tuple[str, int, int]]:
    """A block's linear layers as one tensor-parallel rank runs them, (name, inputs, outputs): a
    column-parallel shard keeps its inputs whole, a row-parallel one its outputs."""
    column, row = _linears(shape)
    names = ("q", "k", "v", "w1") if shape.gelu_mlp else ("q", "k", "v", "w1", "w3")
    return ([(name, i, o // tp) for name, (i, o) in zip(names, column)]
            + [(name, i // tp, o) for name, (i, o) in zip(("wo", "w2"), row)])


def _fp8_linear_speedup(shape: ModelShape, tp: int, a: TimingAssumptions) -> float:
    """The FP8 speed-up of a block's linear math: its GEMMs' rates weighted by their FLOPs, each GEMM at the
    shape it has on the rank (``rank_linears``)."""
    gemms = [(i, o) for _, i, o in rank_linears(shape, tp)]
    return sum(i * o for i, o in gemms) / sum(i * o / _gemm_speedup(i, o, True, a) for i, o in gemms)


def linear_seconds(inputs: int, outputs: int, tokens: int, gpu: GPU, fp8: bool, a: TimingAssumptions) -> float:
    """Seconds of one linear layer on its own, forward and backward on ``tokens`` rows, by the terms ``step_time``
    charges a block's linears: the three GEMMs' math at the compute rate (FP8's speed-up unless too narrow,
    ``_gemm_speedup``), their activation and weight traffic (``_gemm_bytes_per_element``) and, in FP8, the casts
    of its input and output gradient (6 bytes per element each, as ``_fp8_cast_bytes`` counts a tensor the rank
    casts whole) and of its weight. In a block, q, k and v (and w1 and w3) share one cast of their input; alone,
    each linear casts its own. What bench/fp8_linears.py sets against a measured linear."""
    rate, hbm = _compute_rate(gpu, a), gpu.hbm_tbps * 1e12
    seconds = (6 * tokens * inputs * outputs / (rate * _gemm_speedup(inputs, outputs, fp8, a))
               + _gemm_bytes_per_element(fp8) * (tokens * (inputs + outputs) + inputs * outputs) / hbm)
    if fp8:
        seconds += 6 * (tokens * (inputs + outputs) + inputs * outputs) / hbm
    return seconds


def _forward_gemm_s(inputs: float, outputs: float, rate: float, hbm: float, fp8: bool,
                    a: TimingAssumptions) -> float:
    """Seconds per token of one GEMM's forward on the rank, run again by recomputation: its math at its rate,
    its input read (FP8 or bf16) and its bf16 output written."""
    return (2 * inputs * outputs / (rate * _gemm_speedup(inputs, outputs, fp8, a))
            + (_operand_bytes(fp8) * inputs + 2 * outputs) / hbm)


def _gemm_activation_bytes(shape: ModelShape, tp: int, fp8: bool) -> float:
    """HBM bytes per token and layer the linear GEMMs move for their activations, forward and backward,
    taken as time added to their math (no overlap), which is what makes narrow shards slow: a GEMM with i
    inputs and o outputs per token on this rank reads its input and writes its output (forward), reads the
    output gradient and writes the input gradient (input-gradient GEMM), and reads both again (weight
    gradient): (2b + 2)(i + o) bytes against 6·i·o FLOPs, b the operand bytes (2 bf16, 1 FP8; results are
    written in bf16). Under TP the full-width side of each shard is not divided: a column-parallel GEMM reads
    the whole gathered hidden state, a row-parallel one writes whole partial sums. The weights' own traffic,
    the same (2b + 2) bytes per parameter, is paid once per micro-batch (``step_time``)."""
    column, row = _linears(shape)
    per_token = sum(i + o / tp for i, o in column) + sum(i / tp + o for i, o in row)
    return _gemm_bytes_per_element(fp8) * per_token


def _fp8_cast_bytes(shape: ModelShape, tp: int, fp8_gathers: bool) -> float:
    """HBM bytes per token and layer for FP8 casts: linear inputs q/k/v, wo, w1/w3, w2 (3h + f) forward and
    the output gradients (h + 2kv), h, 2f, h backward. A tensor this rank holds sharded is cast and transposed
    in one pass, 6 bytes per element (see the module docstring). Under TP four of them are full width where the
    GEMM reads them: the inputs of q/k/v and w1/w3 after the sequence-parallel all-gather, the output gradients
    of wo and w2 after the backward one. With FP8 gathers (Transformer Engine's grad_output_preprocess, torchao's
    Float8ColwiseParallel / Float8RowwiseParallel) each is cast on its shard (5 bytes) and the gathered FP8
    tensor transposed for the weight-gradient GEMM (read and written, 2 bytes); with bf16 gathers the whole
    gathered tensor is cast (6 bytes)."""
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    sharded = (h + f + h + 2 * kv + 2 * f) / tp  # wo and w2 inputs, the column-parallel output gradients
    gathered = 4 * h  # cast whole, unless an FP8 gather let it be cast on its shard (nothing is gathered at tp 1)
    return 6 * sharded + (5 * gathered / tp + 2 * gathered if fp8_gathers and tp > 1 else 6 * gathered)


def attention_seconds(shape: ModelShape, layout: Layout, gpu: GPU, a: TimingAssumptions) -> tuple[float, float]:
    """Seconds per token and layer on one rank for causal attention's forward and backward kernels. The
    forward does 2·H·Q·T FLOPs per token (half the square), the backward 2.5 times that (FlashAttention's
    counts). They run at ``attention`` × the GEMM rate, scaled by the kernel's measured rate at the sequence
    length each call sees (seq_len / cp) over FlashAttention-2's causal forward at 16K: so a TE stack's cuDNN
    kernel runs 1.6× faster than FlashAttention-2, a 2K call 11% slower than a 16K one, and the backward
    slower than the forward."""
    c = shape.cfg
    length = shape.seq_len // layout.cp
    i = max(bisect.bisect_right(KERNEL_LENGTHS, length) - 1, 0)  # the longest measured length not above it
    causal, full, backward = (table[i] for table in ATTENTION_KERNELS[a.attention_kernel])
    rate = _compute_rate(gpu, a) * a.attention
    reference = ATTENTION_KERNELS["fa2"][0][-1]
    forward_flops = 2 * c.n_heads * c.head_dim * shape.seq_len / layout.tp
    return (forward_flops / (rate * causal / reference),
            2.5 * forward_flops / (rate * backward * causal / full / reference))


def step_time(shape: ModelShape, layout: Layout, gpu: GPU, global_seqs: int,
              a: TimingAssumptions = TimingAssumptions()) -> StepTime:
    cfg, s = shape.cfg, shape.seq_len
    split = layout.split(shape)
    m = layout.microbatches(global_seqs)
    tokens = layout.micro_batch * s // layout.cp  # per rank and micro-batch
    rate = _compute_rate(gpu, a)
    nvlink = gpu.nvlink_gbps * 1e9 * a.network
    nic = gpu.internode_gbps * 1e9 * a.network
    hbm = gpu.hbm_tbps * 1e12
    fp8 = layout.precision == "fp8"

    # Seconds per token on one rank: a layer's linear GEMMs (FP8 or bf16) and attention (bf16), the output.
    linear_flops = shape.layer_flops - shape.attention_flops
    attention_fwd_s, attention_bwd_s = attention_seconds(shape, layout, gpu, a)
    attention_s = attention_fwd_s + attention_bwd_s
    layer_s = (linear_flops / layout.tp / (rate * (_fp8_linear_speedup(shape, layout.tp, a) if fp8 else 1.0))
               + attention_s
               + (_elementwise_bytes(shape, layout.tp) + _gemm_activation_bytes(shape, layout.tp, fp8)) / hbm)
    if fp8:
        layer_s += _fp8_cast_bytes(shape, layout.tp, a.fp8_tp_gathers) / hbm
    # the logits matmul, then the loss reads and writes the logits (bf16 and fp32 softmax, forward and back)
    output_s = shape.output_flops / layout.tp / rate + a.loss_bytes * cfg.vocab_size / layout.tp / hbm
    per_rank = split.per_rank or (split.max_layers,)
    loads = [n * layer_s + (output_s if r == split.output_rank else 0.0) for r, n in enumerate(per_rank)]
    layers = split.max_layers
    compute = tokens * max(loads) + 3 * a.layer_overhead_s * layers  # forward once, backward twice
    if fp8:  # weights cast to FP8 once per micro-batch
        compute += 6 * layers * shape.layer_params / layout.tp / hbm
    # the GEMMs' weights: read by the forward and the input-gradient GEMM, their gradient written, per micro-batch
    compute += _gemm_bytes_per_element(fp8) * layers * shape.layer_params / layout.tp / hbm

    recompute, recomputed, regathered = 0.0, 0, 0
    if layout.activation_checkpoint == "full":  # the whole forward again, collectives included
        recomputed = layers
        recompute = tokens * layers * ((layer_s - attention_s) / 3 + attention_fwd_s) + a.layer_overhead_s * layers
        if a.compiled_recompute:  # but w2's forward GEMM (row-parallel): the block's output is not needed
            _, i, o = rank_linears(shape, layout.tp)[-1]
            recompute -= tokens * layers * _forward_gemm_s(i, o, rate, hbm, fp8, a)
    elif layout.activation_checkpoint == "selective":  # memory-bound ops, and the policy's matmuls
        matmuls, gathers = selective_reruns(a.selective_policy, shape, layout.tp)
        # the rerun forwards (column-parallel, or at tp 1): full-width inputs, sharded outputs
        recompute = tokens * layers * (_selective_recompute_bytes(shape, layout.tp) / hbm
                                       + sum(_forward_gemm_s(i, o / layout.tp, rate, hbm, fp8, a)
                                             for i, o in matmuls))
        regathered = gathers * layers

    cp_kv_heads = cfg.n_heads if a.cp_kv_repeated else cfg.n_kv_heads  # the K/V heads ring attention moves
    if layout.cp > 1 and a.cp_fp32_merge:
        # torch's ring attention (_templated_ring_attention and its backward) folds every ring step after the
        # first into fp32 buffers on the compute stream: the forward merges the step's bf16 output into the fp32
        # running output, the backward adds the step's dq, dk and dv to fp32 accumulators (dk and dv are those the
        # ring passes on). Fused, each reads the fp32 buffer and the bf16 step result and writes the buffer: 10
        # bytes per element. The last rank runs every step on its whole query. Transformer Engine instead
        # corrects on a side stream, behind the next step's attention.
        q = cfg.n_heads * cfg.head_dim / layout.tp
        kv = cp_kv_heads * cfg.head_dim / layout.tp
        merge = tokens * layers * (layout.cp - 1) * 10 / hbm
        compute += merge * (q + q + 2 * kv)  # the forward's merges and the backward's accumulations
        if layout.activation_checkpoint == "full":
            recompute += merge * q

    activation = tokens * cfg.dim * 2  # bytes of one full (unsharded) bf16 activation on this rank
    rerun_scatters = 1 if a.compiled_recompute else 2  # per recomputed layer: after wo (and w2, uncompiled)
    tp_collectives = 8 * layers + (2 + rerun_scatters) * recomputed + regathered
    if fp8 and a.fp8_tp_gathers:  # the all-gathers carry FP8: inputs of q/k/v and w1/w3, gradients of wo and w2
        tp_collectives -= (4 * layers + 2 * recomputed + regathered) / 2
    collective = _ring_collective(_ring(layout.tp) * activation / nvlink, layout.tp, 1)
    tp_comm = tp_collectives * collective
    tp = _hidden(tp_comm, compute + recompute, layers, a.tp_overlap)
    if a.tp_overlap > 0 and layout.tp > 1:
        # Overlap splits a reduce-scatter's GEMM into chunks and sends each chunk's result while the next one
        # runs, so the last chunk's share is never hidden. Transformer Engine's userbuffers (initialize_ub
        # defaults) pipeline only the forward proj/fc2 outputs, in 4 splits (the all-gathers run as a ring
        # exchange behind the local shard's GEMM; the backward reduce-scatters overlap the wgrad GEMMs in bulk);
        # PyTorch's async TP fuses every matmul + reduce-scatter, forward and backward, in tp chunks, and hides
        # only part of the collectives' time: torchtitan's runs with and without it gain about half of what
        # hiding them all behind the compute window would give (``async_tp_hidden``).
        if a.tp_overlap_kind == "te":
            tp = max(tp, (2 * layers + 2 * recomputed) * collective / 4)
        else:
            tp = max(tp_comm * (1 - a.async_tp_hidden),
                     (4 * layers + rerun_scatters * recomputed) * collective / layout.tp)
    pp = (layout.virtual_stages * activation / layout.tp * _pp_links(gpu, layout, nvlink, nic) * (1 - a.pp_overlap)
          if layout.pp > 1 else 0.0)

    cp = 0.0
    if layout.cp > 1:  # ring attention: K and V chunks forward; K, V and their gradients backward
        link = _group_bandwidth(gpu, layout.tp, layout.cp, nvlink, nic)
        ring_fwd = (layout.cp - 1) * tokens * 2 * cp_kv_heads * cfg.head_dim / layout.tp * 2 / link  # K, V in bf16
        if a.cp_rotate == "allgather":  # behind the local block only; fp32 gradients around the ring
            forward = max(ring_fwd - tokens * attention_fwd_s / layout.cp, 0.0)
            backward = (max(ring_fwd - tokens * attention_bwd_s / layout.cp, 0.0)
                        + max(2 * ring_fwd - a.cp_overlap * tokens * attention_bwd_s, 0.0))
        else:
            forward = max(ring_fwd - a.cp_overlap * tokens * attention_fwd_s, 0.0)
            backward = max(2 * ring_fwd - a.cp_overlap * tokens * attention_bwd_s, 0.0)
        cp = layers * (forward * (2 if layout.activation_checkpoint == "full" else 1) + backward)
    slot = compute + recompute + tp + pp + cp

    # Data-parallel traffic per rank, ring collectives over the shard group (dp_shard × cp), then across
    # replicas (HSDP).
    params = split.max_params / layout.tp
    shards = layout.state_shards
    shard_bw = _group_bandwidth(gpu, layout.tp, shards, nvlink, nic)
    replica_bw = _group_bandwidth(gpu, layout.tp * shards, layout.dp_replicate, nvlink, nic)
    shard_nodes = shards // _members_per_node(gpu, layout.tp, shards)
    replica_nodes = layout.dp_replicate // _members_per_node(gpu, layout.tp * shards, layout.dp_replicate)
    # one all-gather of the parameters, one reduce-scatter of fp32 gradients (and the HSDP all-reduce, two ring
    # passes), each a call per layer
    gather = layers * _ring_collective(a.gather_bytes * params * _ring(shards) / shard_bw / layers, shards,
                                       shard_nodes)
    scatter = layers * _ring_collective(4 * params * _ring(shards) / shard_bw / layers, shards, shard_nodes)
    scatter += 2 * layers * _ring_collective(4 * params / shards * _ring(layout.dp_replicate) / replica_bw / layers,
                                             layout.dp_replicate, replica_nodes)
    fwd_window, bwd_window = compute / 3, compute * 2 / 3 + recompute
    if layout.pp > 1 or layout.zero < 2:  # gather in the first forward, scatter in the last backward
        dp = _hidden(gather, fwd_window, layers, a.dp_overlap) + _hidden(scatter, bwd_window, layers, a.dp_overlap)
    elif layout.zero == 3:  # gather before forward and again before backward, scatter every micro-batch
        dp = m * (_hidden(gather, fwd_window, layers, a.dp_overlap)
                  + _hidden(gather + scatter, bwd_window, layers, a.dp_overlap))
    else:  # ZeRO-2: parameters kept from forward to backward
        dp = m * (_hidden(gather, fwd_window, layers, a.dp_overlap)
                  + _hidden(scatter, bwd_window, layers, a.dp_overlap))

    return StepTime(compute=m * compute, recompute=m * recompute, tp_comm=m * tp, pp_comm=m * pp, cp_comm=m * cp,
                    bubble=_bubble(shape, layout, m, slot), dp_comm=dp,
                    tokens_per_step=global_seqs * s, model_flops_per_step=global_seqs * s * shape.flops_per_token,
                    world=layout.world, peak_flops=gpu.peak_flops)
