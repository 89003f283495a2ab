"""Per-rank GPU memory for a layout: model states by ZeRO stage, activations, buffers, headroom.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, §3): mixed-precision Adam holds 2Ψ bf16
parameters, 2Ψ gradients and KΨ = 12Ψ optimizer states (fp32 master, momentum, variance); stage 1 shards
the optimizer states, stage 2 also the gradients, stage 3 also the parameters, over N data-parallel ranks.
The trainer reduces gradients in fp32, so its unsharded gradient buffers cost 4 bytes per parameter
(``grad_bytes``); the paper's 2 reproduces its 7.5B example.

Activations per layer and token, in bytes (bf16, no dropout, flash attention keeps no score matrix),
Llama block with TP degree t and sequence parallel (DESIGN.md §4):
- all-gathered inputs of the qkv and w1/w3 matmuls, saved whole by autograd:   4h
- sequence-sharded norm inputs (2), q, k, v, attention output:                 (4h + 2h + 4kv + 2h)/t
- SwiGLU: w1 and w3 outputs, silu output, their product:                        8f/t
Full recomputation keeps only each layer's sequence-sharded input (2h/t) plus one layer's full set while
it is recomputed (Korthikanti et al. 2022 count the same way for GPT blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalogue import GPU
from infra.layout import Layout, ModelShape, Rejection, split_stages

GB = 1e9


@dataclass(frozen=True)
class MemoryAssumptions:
    param_bytes: int = 2  # bf16 working copy
    grad_bytes: int = 4  # fp32 gradient reduction (trainer's mixed precision policy)
    optimizer_bytes: int = 12  # Adam: fp32 master + m + v
    runtime_gb: float = 3.0  # CUDA context, NCCL buffers, cuBLAS workspaces
    headroom: float = 0.10  # fraction of device memory left for allocator fragmentation
    logits_bytes: int = 8  # bf16 logits + fp32 softmax/gradient per vocab entry in the loss


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank (as GB in ``as_dict``); ``fits`` compares ``total`` with ``usable``."""

    params: float
    grads: float
    optimizer: float
    fsdp_buffers: float
    activations: float
    logits: float
    runtime: float
    usable: float

    @property
    def total(self) -> float:
        return (self.params + self.grads + self.optimizer + self.fsdp_buffers + self.activations + self.logits
                + self.runtime)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def rejection(self, layout: Layout) -> Rejection | None:
        if self.fits:
            return None
        return Rejection("memory.exceeds_capacity",
                         f"{layout.name} needs {self.total / GB:.1f} GB per GPU > {self.usable / GB:.1f} GB usable",
                         excess=self.total - self.usable)

    def as_dict(self) -> dict[str, float]:
        names = ("params", "grads", "optimizer", "fsdp_buffers", "activations", "logits", "runtime", "total",
                 "usable")
        return {f"{n}_gb": round(getattr(self, n) / GB, 3) for n in names}


def model_state_bytes(params: float, zero: int, shards: int, a: MemoryAssumptions = MemoryAssumptions()
                      ) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer states) in bytes per rank for ZeRO ``zero`` over ``shards`` ranks."""
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero}")
    p = a.param_bytes * params / (shards if zero >= 3 else 1)
    g = a.grad_bytes * params / (shards if zero >= 2 else 1)
    o = a.optimizer_bytes * params / (shards if zero >= 1 else 1)
    return p, g, o


def layer_activation_bytes(shape: ModelShape, tp: int) -> tuple[float, float]:
    """(all saved tensors, layer input only) per token for one layer, bytes."""
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    full = 4 * h + (8 * h + 4 * kv + 8 * f) / tp
    return full, 2 * h / tp


def inflight_microbatches(layout: Layout, microbatches: int) -> float:
    """Micro-batches whose activations the first stage holds at its peak (1F1B warm-up; interleaving adds
    (p-1)/(p·v), Korthikanti et al. 2022 §4.2.3)."""
    if layout.pp == 1:
        return 1.0
    held = min(microbatches, layout.pp)
    if layout.virtual_stages > 1:
        held *= 1 + (layout.pp - 1) / (layout.pp * layout.virtual_stages)
    return held


def memory_per_rank(shape: ModelShape, layout: Layout, gpu: GPU, microbatches: int,
                    a: MemoryAssumptions = MemoryAssumptions()) -> MemoryBreakdown:
    """Peak memory of the busiest rank (first pipeline stage, or the only one)."""
    split = split_stages(shape, layout.pp)
    stage_params = split.max_params / layout.tp
    params, grads, optimizer = model_state_bytes(stage_params, layout.zero, layout.dp_shard, a)

    # FSDP gathers one unit (layer, or the larger embedding/output) at a time, prefetching the next.
    unit = max(shape.layer_params, shape.embedding_params, shape.output_params) / layout.tp
    buffers = {3: unit * (2 * a.param_bytes + a.grad_bytes), 2: unit * a.grad_bytes}.get(layout.zero, 0.0)

    tokens = layout.micro_batch * shape.seq_len
    full, kept = layer_activation_bytes(shape, layout.tp)
    layers = split.first_layers
    recomputed = {"none": 0, "selective": layers // 2, "full": layers}[layout.activation_checkpoint]
    per_microbatch = ((layers - recomputed) * full + recomputed * kept) * tokens
    working = full * tokens if recomputed else 0.0  # the layer being recomputed, once
    first_stage = per_microbatch * inflight_microbatches(layout, microbatches) + working

    logits = tokens * shape.cfg.vocab_size / layout.tp * a.logits_bytes
    last_layers = split.last_layers
    last_recomputed = {"none": 0, "selective": last_layers // 2, "full": last_layers}[layout.activation_checkpoint]
    last_stage = ((last_layers - last_recomputed) * full + last_recomputed * kept) * tokens
    last_stage += full * tokens if last_recomputed else 0.0
    if layout.pp == 1:
        activations, logits_held = first_stage, logits
    elif first_stage >= last_stage + logits:
        activations, logits_held = first_stage, 0.0
    else:
        activations, logits_held = last_stage, logits

    return MemoryBreakdown(params=params, grads=grads, optimizer=optimizer, fsdp_buffers=buffers,
                           activations=activations, logits=logits_held, runtime=a.runtime_gb * GB,
                           usable=gpu.memory_gb * GB * (1 - a.headroom))
