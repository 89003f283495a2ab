"""Step time and MFU of a layout: compute at an achievable fraction of peak plus exposed communication.

One step = (m + (p-1)/v) micro-batch slots on the slowest pipeline stage (the last term is the 1F1B /
interleaved bubble, (p-1)/(m·v+p-1) of the step; ZB-V fills most of it with weight-gradient work) + the
data-parallel traffic that compute cannot hide.
Per micro-batch slot: forward+backward FLOPs of the stage (+ one more forward under full recomputation;
selective recomputation reruns only memory-bound ops, timed by HBM bandwidth), the
tensor-parallel collectives over NVLink (with sequence parallel: an all-gather and a reduce-scatter
around attention and around the MLP, each way, so 8 per layer, 12 with recomputation) and the pipeline
send/receive over the inter-node network. Bandwidths are ring bandwidths: (n-1)/n of the message crosses
each GPU's link.

MFU counts model FLOPs only (6N + 12·L·H·Q·T per token, ``ModelConfig.flops_per_token``), as the trainer
reports it, so recomputation lowers MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalogue import GPU
from infra.layout import Layout, ModelShape


@dataclass(frozen=True)
class TimingAssumptions:
    """Efficiency factors; ``compute`` None takes the GPU's calibrated ``compute_efficiency``."""

    compute: float | None = None  # fraction of dense peak reached by the math when nothing waits on the network
    network: float = 0.80  # fraction of nominal link bandwidth NCCL collectives reach
    tp_overlap: float = 0.0  # share of TP collectives hidden behind compute (async TP needs torch.compile)
    dp_overlap: float = 0.90  # share of the compute window FSDP traffic can hide behind
    pp_overlap: float = 0.50  # share of pipeline send/receive hidden behind compute

    def __post_init__(self) -> None:
        for name in ("compute", "network"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("tp_overlap", "dp_overlap", "pp_overlap"):
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
    tokens_per_step: float
    model_flops_per_step: float
    world: int
    peak_flops: float

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.pp_comm + self.bubble + self.dp_comm

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.total

    @property
    def mfu(self) -> float:
        return self.model_flops_per_step / (self.total * self.world * self.peak_flops)

    def parts(self) -> dict[str, float]:
        return {"compute": self.compute, "recompute": self.recompute, "tp_comm": self.tp_comm,
                "pp_comm": self.pp_comm, "pp_bubble": self.bubble, "dp_comm": self.dp_comm}


PART_LABELS = {"compute": "compute on the slowest stage", "recompute": "activation recomputation",
               "tp_comm": "exposed tensor-parallel collectives", "pp_comm": "exposed pipeline send/receive",
               "pp_bubble": "pipeline bubble", "dp_comm": "exposed FSDP/data-parallel traffic"}


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _hidden(comm: float, window: float, units: int, overlap: float) -> float:
    """Exposed part of ``comm`` prefetched layer by layer behind ``window`` of compute: the first unit is
    never hidden."""
    return max(comm - overlap * window, comm / max(units, 1)) if comm > 0 else 0.0


def _selective_recompute_bytes(shape: ModelShape, tp: int) -> float:
    """HBM bytes per token and layer to rerun the two norms, rotary, the residual add, SiLU and the product:
    (4h + 2(2h + 2kv) + 6h + 4h + 10f)/t read and written."""
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    return (18 * h + 4 * kv + 10 * f) / tp


def _bubble_share(shape: ModelShape, layout: Layout) -> float:
    """Share of a stage's slot left idle per bubble slot: all of it for 1F1B and interleaving; for ZB-V
    (Qi et al. 2024, "Zero Bubble Pipeline Parallelism") weight-gradient work W fills the bubble, leaving
    (T_F + T_B − 2·T_W) / (T_F + T_B + T_W). Attention's backward is all input-gradient work; full
    recomputation adds a forward to T_B."""
    if layout.pp_schedule != "ZBVZeroBubble":
        return 1.0
    c = shape.cfg
    linear, attention = 6 * shape.layer_params, 12 * c.n_heads * c.head_dim * shape.seq_len
    f, b, w = (linear + attention) / 3, linear / 3 + 2 * attention / 3, linear / 3
    if layout.activation_checkpoint == "full":
        b += f
    return max(f + b - 2 * w, 0.0) / (f + b + w)


def step_time(shape: ModelShape, layout: Layout, gpu: GPU, global_seqs: int,
              a: TimingAssumptions = TimingAssumptions()) -> StepTime:
    cfg, s = shape.cfg, shape.seq_len
    split = layout.split(shape)
    m = layout.microbatches(global_seqs)
    tokens = layout.micro_batch * s
    rate = gpu.peak_flops * (a.compute if a.compute is not None else gpu.compute_efficiency)
    nvlink = gpu.nvlink_gbps * 1e9 * a.network
    nic = gpu.internode_gbps * 1e9 * a.network

    layers = split.max_layers
    compute = tokens * split.max_flops / layout.tp / rate
    recompute, recomputed = 0.0, 0
    if layout.activation_checkpoint == "full":  # the whole forward again, collectives included
        recomputed = layers
        recompute = tokens * layers * shape.layer_flops / 3 / layout.tp / rate
    elif layout.activation_checkpoint == "selective":  # memory-bound ops only: HBM traffic, no FLOPs
        recompute = tokens * layers * _selective_recompute_bytes(shape, layout.tp) / (gpu.hbm_tbps * 1e12)

    activation = tokens * cfg.dim * 2  # bytes of one full (unsharded) bf16 activation
    tp_collectives = 8 * layers + 4 * recomputed
    tp = tp_collectives * _ring(layout.tp) * activation / nvlink * (1 - a.tp_overlap)
    pp = (2 * layout.virtual_stages * activation / layout.tp / nic * (1 - a.pp_overlap)) if layout.pp > 1 else 0.0
    slot = compute + recompute + tp + pp

    # Data-parallel traffic per rank, ring collectives over the shard group, then across replicas (HSDP).
    params = split.max_params / layout.tp
    shard_bw = nvlink if layout.tp * layout.dp_shard <= gpu.gpus_per_node else nic
    gather = 2 * params * _ring(layout.dp_shard) / shard_bw  # one all-gather of bf16 parameters
    scatter = 4 * params * _ring(layout.dp_shard) / shard_bw  # one reduce-scatter of fp32 gradients
    scatter += 2 * 4 * params / layout.dp_shard * _ring(layout.dp_replicate) / nic  # HSDP all-reduce
    fwd_window, bwd_window = compute / 3, compute * 2 / 3 + recompute
    if layout.zero == 3:  # gather before forward and again before backward, scatter every micro-batch
        dp = m * (_hidden(gather, fwd_window, layers, a.dp_overlap)
                  + _hidden(gather + scatter, bwd_window, layers, a.dp_overlap))
    elif layout.zero == 2:  # parameters kept from forward to backward
        dp = m * (_hidden(gather, fwd_window, layers, a.dp_overlap)
                  + _hidden(scatter, bwd_window, layers, a.dp_overlap))
    else:  # pipelining: gather in the first forward, scatter in the last backward
        dp = _hidden(gather, fwd_window, layers, a.dp_overlap) + _hidden(scatter, bwd_window, layers, a.dp_overlap)

    return StepTime(compute=m * compute, recompute=m * recompute, tp_comm=m * tp, pp_comm=m * pp,
                    bubble=(layout.pp - 1) / layout.virtual_stages * slot * _bubble_share(shape, layout), dp_comm=dp,
                    tokens_per_step=global_seqs * s, model_flops_per_step=global_seqs * s * shape.flops_per_token,
                    world=layout.world, peak_flops=gpu.peak_flops)
