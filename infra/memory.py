"""Per-rank GPU memory for a layout: model states by ZeRO stage, activations, buffers, headroom.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, §3): mixed-precision Adam holds 2Ψ bf16
parameters, 2Ψ gradients and KΨ = 12Ψ optimizer states (fp32 master, momentum, variance); stage 1 shards
the optimizer states, stage 2 also the gradients, stage 3 also the parameters, over N data-parallel ranks.
The trainer reduces gradients in fp32, so its unsharded gradient buffers cost 4 bytes per parameter
(``grad_bytes``); the paper's 2 reproduces its 7.5B example. Under a pipeline FSDP2 holds exactly the
ZeRO-1 states while gradients accumulate (tests/infra/test_trainer_memory.py).

Activations per layer and token, in bytes (bf16, no dropout, flash attention keeps no score matrix),
Llama block with TP degree t and sequence parallel (tasks/train/parallelize.py):
- no recomputation, what autograd saves:
  all-gathered inputs of the qkv and w1/w3 matmuls, kept whole:              4h
  sequence-sharded norm inputs (2), q, k, v, attention output:               (4h + 2h + 4kv + 2h)/t
  SwiGLU: w1 and w3 outputs, silu output, their product:                     8f/t
- selective (the trainer's policy: keep every matmul, attention and collective output, recompute
  norms, rotary, SiLU, products and adds):
  outputs of wo and w2 before their reduce-scatter, full sequence:           4h
  all-gather outputs (t > 1 only), whole:                                     4h
  block input, q, k, v, attention output, w1 and w3 outputs:                 (2h + 2h + 4kv + 2h + 4f)/t
  reduce-scatter outputs (t > 1 only):                                       4h/t
  (with TP this keeps more than no recomputation: the row-parallel matmul outputs are not sharded)
- full: each layer's sequence-sharded input, 2h/t.
A recomputing layer also holds its recomputed tensors while its backward runs (counted once).
The counting follows Korthikanti et al. 2022 (GPT blocks), adapted to SwiGLU, GQA and torch's saves; for
no recomputation it is what autograd saves in a block of smelt's model, with and without TP
(tests/infra/test_trainer_memory.py), leaving out the fp32 scale per row of each norm and attention's
fp32 log-sum-exp per head.

``saves="megatron"`` counts what Megatron-LM / Transformer Engine keep instead (also used for Meta's
Llama 3 runs, whose layout is Megatron-style): sequence-parallel layers save their *sharded* input and
all-gather it again in the backward, and the fused SwiGLU keeps only its input and output:
  block input, norm output, q, attention output, second block input, norm output: 12h/t
  k, v: 4kv/t; SwiGLU input (w1 and w3 outputs) and output: 6f/t
``saves="torchtitan"`` differs only in its selective policy, which keeps every other matmul output:
(8h + 2kv + 2f)/t. Megatron's "selective" recomputes the attention core, which flash attention already does:
same as none.
Under FP8 (Transformer Engine) the three norm/SwiGLU outputs that feed a linear layer are kept in FP8:
(10h + 4kv + 5f)/t, and each layer keeps the FP8 copy of its weights for the backward (``fp8_weight_bytes``).
Context parallel splits every sequence over cp ranks, so activations scale with seq_len / cp. torch's ring
attention (``torch.distributed.tensor.experimental``, as torchtitan runs it) adds, while a layer's backward
runs, the K and V of the whole sequence (its default rotation all-gathers them) and fp32 buffers: the q, k, v
gradient accumulators, the k, v gradients sent on and received, and the kernel's bf16 q, k, v gradients
(``cp_ring_bytes``), which the rank holds after its loss has freed the logits. torchtitan repeats K and V to
the query heads before attention, so its K and V are as wide as q. Transformer Engine's ring
(``saves="megatron"``) sends one GQA-width chunk at a time: not counted.

The loss holds ``logits_bytes`` per vocabulary entry of its rank's shard. Eager and vocabulary-parallel
(``loss_parallel`` in torch.distributed.tensor.parallel.loss) it holds more than aten's fused kernels: its
log-softmax keeps the fp32 input and the shifted copy while it builds the output, and its backward builds
``(zeros_like(x) + exp(x)) * grad`` next to the saved fp32 output, four fp32 tensors at once
(``loss_parallel_logits_bytes``). The rank with the loss also holds the head's saved inputs
(``head_activation_bytes``) and, where torch's pipeline schedule keeps its stages' outputs until the next step
(``kept_outputs``), every micro-batch's logits (``kept_logits_bytes``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from infra.catalogue import GPU
from infra.layout import AC_MODES, Layout, ModelShape, Rejection, StageSplit

GB = 1e9


@dataclass(frozen=True)
class MemoryAssumptions:
    param_bytes: int = 2  # bf16 working copy
    grad_bytes: int = 4  # fp32 gradient reduction (trainer's mixed precision policy)
    optimizer_bytes: int = 12  # Adam: fp32 master + m + v
    runtime_gb: float = 3.0  # CUDA context, NCCL buffers, cuBLAS workspaces
    headroom: float = 0.10  # fraction of device memory left for allocator fragmentation
    # Per vocab entry in the loss. smelt's trainer (tasks/train/cross_entropy.py) recomputes the fp32 softmax
    # chunk by chunk in the backward: the bf16 logits, the chunks' bf16 gradients and their concatenation,
    # also vocabulary-parallel (bench/loss_memory.py measures 4.8 on CPU, where the logits are freed before
    # the concatenation), plus one chunk's fp32 transients (about 1 GB, not counted). Eager cross entropy
    # holds 12, and 16 vocabulary-parallel; validation stacks set theirs.
    logits_bytes: int = 6
    loss_parallel_logits_bytes: int | None = None  # None: ``logits_bytes`` under TP too
    saves: str = "torch"  # torch (smelt's trainer, llm-foundry) | torchtitan | megatron (Megatron/TE, Llama 3)
    fp8_weight_bytes: int = 1  # Transformer Engine: the FP8 copy of each weight saved for the backward
    fp8_params: bool = False  # FP8 runs keep the layers' weights in FP8 (Megatron's --fp8-param-gather)
    # torch.distributed.pipelining's per-micro-batch receive buffers and kept outputs (``pipeline_buffer_bytes``);
    # Megatron allocates its receive tensors per transfer
    torch_pipelining: bool = True
    # Which stages' forward outputs torch's schedule keeps, every micro-batch's, until the next step (to merge
    # them for ``step``'s return value): "all" before PyTorch #153383 (May 2025), then "last" (the logits);
    # "none" with ``step(return_outputs=False)``, as smelt's trainer calls it (``KEPT_OUTPUTS``)
    kept_outputs: str = "none"
    # Where a stage past the first keeps its inputs' gradients, every micro-batch's, as ``.grad`` of its receive
    # buffers until the next step: "all" schedules before PyTorch #164329 (October 2025), since then "split" (those
    # whose input backward is split from the weights', ZB-V; tests/infra/test_pipeline_inflight.py), or "none"
    kept_input_grads: str = "split"
    # torch 2.13's DTensor has no backward strategy for a vocabulary-sharded embedding (weight Shard(0), as
    # tasks/train/parallelize.py's TP plan shards it): its gradient comes out replicated, the whole vocabulary on
    # every TP rank (``embedding_grad_bytes``; found by tasks/train/simulate_world.py)
    replicated_embedding_grad: bool = True


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
        digits = 1 if round(self.total / GB, 1) > round(self.usable / GB, 1) else 2  # never "72.0 > 72.0"
        return Rejection("memory.exceeds_capacity",
                         f"{layout.name} needs {self.total / GB:.{digits}f} GB per GPU > "
                         f"{self.usable / GB:.{digits}f} GB usable", excess=self.total - self.usable)

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


SAVES = ("torch", "torchtitan", "megatron")


def layer_activation_bytes(shape: ModelShape, tp: int, activation_checkpoint: str, saves: str = "torch",
                           precision: str = "bf16") -> float:
    """Bytes per token one layer keeps for its backward (see the module docstring)."""
    c = shape.cfg
    h, kv, f = c.dim, c.n_kv_heads * c.head_dim, c.ffn_hidden
    if saves not in SAVES:
        raise ValueError(f"saves must be one of {', '.join(SAVES)}, got {saves!r}")
    if saves == "megatron" and activation_checkpoint in ("none", "selective"):
        if precision == "fp8":
            return (10 * h + 4 * kv + 5 * f) / tp
        return (12 * h + 4 * kv + 6 * f) / tp
    if saves == "torchtitan" and activation_checkpoint == "selective":
        # torchtitan's op-level policy keeps every other matmul output (q, v, w1, w2) and attention's:
        # block input, q, attention output, w2 output; v; w1 output
        return (8 * h + 2 * kv + 2 * f) / tp
    # SwiGLU keeps w1 and w3 outputs, SiLU output and product (8f; the matmul outputs alone 4f); a GELU MLP of
    # width F = 3f/2 keeps its fc1 output and GELU output (4F = 6f; the matmul output alone 3f)
    mlp, mlp_matmuls = (6 * f, 3 * f) if shape.gelu_mlp else (8 * f, 4 * f)
    if activation_checkpoint == "none":
        return 4 * h + (8 * h + 4 * kv + mlp) / tp
    if activation_checkpoint == "selective":
        collectives = 4 * h + 4 * h / tp if tp > 1 else 0.0
        return 4 * h + collectives + (6 * h + 4 * kv + mlp_matmuls) / tp
    if activation_checkpoint == "full":
        return 2 * h / tp
    raise ValueError(f"activation_checkpoint must be one of {', '.join(AC_MODES)}, got {activation_checkpoint!r}")


def cp_ring_bytes(shape: ModelShape, layout: Layout, tokens: int, saves: str) -> float:
    """Bytes torch's ring attention holds during one layer's backward on a rank with ``tokens`` tokens."""
    if layout.cp == 1 or saves == "megatron":
        return 0.0
    c = shape.cfg
    q = c.n_heads * c.head_dim / layout.tp
    kv = (c.n_heads if saves == "torchtitan" else c.n_kv_heads) * c.head_dim / layout.tp
    gathered = layout.cp * 2 * kv * 2  # K and V of every rank, bf16
    accumulators = (q + 2 * kv) * 4  # fp32
    exchanged = 2 * (2 * kv * 4)  # k, v gradients sent on and received, fp32
    kernel = (q + 2 * kv) * 2  # the attention backward's own outputs, bf16
    return tokens * (gathered + accumulators + exchanged + kernel)


def head_activation_bytes(shape: ModelShape, tp: int, saves: str = "torch") -> float:
    """Bytes per token the output head keeps for its backward on the rank with the loss: the final norm's
    sequence-sharded input, and its output as the output projection sees it, gathered over tp (Megatron's
    sequence-parallel projection keeps it sharded and gathers it again); bf16."""
    h = shape.cfg.dim
    return 2 * h / tp + (2 * h / tp if saves == "megatron" else 2 * h)


def embedding_grad_bytes(shape: ModelShape, layout: Layout, a: MemoryAssumptions = MemoryAssumptions()) -> float:
    """What the rank holding the embedding keeps for its gradient beyond its share, in smelt's trainer (``saves``
    "torch") under TP and a pipeline: the embedding's backward gives the whole vocabulary's bf16 gradient on every
    TP rank, which FSDP2, accumulating without reducing while the pipeline runs its micro-batches, upcasts to the
    fp32 accumulator of the whole vocabulary until the step ends. Without a pipeline the bf16 gradient lives only
    at the end of the backward, when the activations are gone: not counted."""
    if not a.replicated_embedding_grad or a.saves != "torch" or layout.tp == 1 or layout.pp == 1:
        return 0.0
    whole = shape.embedding_params
    return a.grad_bytes * whole * (1 - 1 / layout.tp) + a.param_bytes * whole


def _stage_activations(shape: ModelShape, layout: Layout, layers: int, tokens: int, saves: str) -> float:
    """One micro-batch's saved activations on a stage of ``layers`` layers, plus the recompute working set."""
    kept = layer_activation_bytes(shape, layout.tp, layout.activation_checkpoint, saves, layout.precision)
    whole = layer_activation_bytes(shape, layout.tp, "none", saves, layout.precision)
    return layers * kept * tokens + max(whole - kept, 0.0) * tokens


def inflight_forwards(layout: Layout, microbatches: int, rank: int = 0) -> tuple[int, ...]:
    """Forwards of each of ``rank``'s stages (in schedule order) whose backward has not run at its peak, as
    torch's schedules run them (tests/infra/test_pipeline_inflight.py counts them on every rank). 1F1B:
    min(m, pp − rank). Interleaving: Megatron's (and torch's) warm-up runs 2(pp − 1 − rank) + (v − 1)·pp
    forwards before the first backward, in groups of pp micro-batches per stage, then one more: the last rank
    holds pp micro-batches of each stage but its last. ZB-V (rank 0 only, the rank with the loss): 2pp − 1 of
    the first stage and one of the last, the 1F1B peak of pp micro-batches of the rank's layers (Qi et al.
    2024)."""
    if not 0 <= rank < layout.pp:
        raise ValueError(f"rank must be in [0, {layout.pp}), got {rank}")
    if layout.pp == 1:
        return (1,)
    if layout.pp_schedule == "ZBVZeroBubble":
        if rank:
            raise ValueError("ZB-V forwards in flight are counted on rank 0, which holds the loss")
        return (min(microbatches, 2 * layout.pp - 1), 1)
    if layout.virtual_stages == 1:
        return (min(microbatches, layout.pp - rank),)
    v, pp = layout.virtual_stages, layout.pp
    forwards = min(2 * (pp - 1 - rank) + (v - 1) * pp + 1, microbatches * v)
    counts = [0] * v
    for k in range(forwards):
        counts[(k // pp) % v] += 1
    return tuple(counts)


def inflight_microbatches(layout: Layout, microbatches: int, chunks: tuple[int, ...] = (),
                          rank: int = 0) -> float:
    """Micro-batches of a rank's layers whose activations ``rank`` holds at its peak: its ``inflight_forwards``
    weighted by the layers of each stage (``chunks``, in schedule order); on rank 0 uniform interleaved stages
    give pp·(1 + (pp−1)/(pp·v)) (Korthikanti et al. 2022 §4.2.3). Under ZB-V every rank reaches min(m, pp) once
    m ≥ 2pp − 1, and with fewer micro-batches rank pp − 1 still does while rank 0 holds fewer, so min(m, pp)
    is counted."""
    if layout.pp_schedule == "ZBVZeroBubble" and layout.pp > 1:
        return min(microbatches, layout.pp)
    forwards = inflight_forwards(layout, microbatches, rank)
    chunks = chunks if len(chunks) == len(forwards) and sum(chunks) else (1,) * len(forwards)
    return sum(f * c for f, c in zip(forwards, chunks)) / sum(chunks)


KEPT_OUTPUTS = ("none", "last", "all")
KEPT_INPUT_GRADS = ("none", "split", "all")
SPLIT_BACKWARD_SCHEDULES = ("ZBVZeroBubble",)


def _check_option(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}, got {value!r}")


def keeps_input_grads(layout: Layout, kept_input_grads: str) -> bool:
    """Whether this layout's stages past the first keep their inputs' gradients until the next step."""
    _check_option("kept_input_grads", kept_input_grads, KEPT_INPUT_GRADS)
    return kept_input_grads == "all" or (kept_input_grads == "split" and layout.pp_schedule in SPLIT_BACKWARD_SCHEDULES)


def pipeline_buffer_bytes(shape: ModelShape, layout: Layout, microbatches: int, tokens: int,
                          kept_outputs: str = "none", kept_input_grads: str = "none", rank: int = 0) -> float:
    """What torch.distributed.pipelining holds on ``rank`` besides the layers' saved activations, in units of
    the tensor passed between stages (a micro-batch's sequence-sharded bf16 hidden states): each stage
    allocates a receive buffer per micro-batch for the gradient from the next stage and, unless it is the
    first, for the activation from the previous one (``PipelineStage._prepare_forward_infra`` and
    ``_prepare_backward_infra``; an activation in flight is its first layer's saved input, counted there),
    and keeps each forward's output until its backward (``fwd_cache``), or, with ``kept_outputs="all"``, every
    micro-batch's until the next step (``output_chunks``); where ``keeps_input_grads``, a stage past the first
    also keeps each micro-batch's input gradient until then."""
    _check_option("kept_outputs", kept_outputs, KEPT_OUTPUTS)
    input_grads = microbatches if keeps_input_grads(layout, kept_input_grads) else 0
    if layout.pp == 1:
        return 0.0
    stages = layout.pp * layout.virtual_stages
    ids = ((rank, stages - 1 - rank) if layout.pp_schedule == "ZBVZeroBubble"
           else tuple(rank + c * layout.pp for c in range(layout.virtual_stages)))
    count = 0
    for stage, held in zip(ids, inflight_forwards(layout, microbatches, rank)):
        if stage != stages - 1:  # gradient receive buffers, and outputs kept until their backward (or the step's end)
            count += microbatches + (microbatches if kept_outputs == "all" else held)
        if stage != 0:  # activation receive buffers not holding an input in flight, and the inputs' gradients
            count += microbatches - held + input_grads
    return count * _boundary_bytes(shape, layout, tokens)


def kept_logits_bytes(shape: ModelShape, layout: Layout, microbatches: int, tokens: int, kept_outputs: str,
                      logit_bytes: int = 2) -> float:
    """The last stage's outputs torch's schedule keeps until the next step (``kept_outputs`` "last" or "all"):
    every micro-batch's logits, vocabulary-sharded over tp, bf16 unless ``logit_bytes`` says otherwise."""
    _check_option("kept_outputs", kept_outputs, KEPT_OUTPUTS)
    if layout.pp == 1 or kept_outputs == "none":
        return 0.0
    return microbatches * tokens * shape.cfg.vocab_size / layout.tp * logit_bytes


def _boundary_bytes(shape: ModelShape, layout: Layout, tokens: int) -> float:
    """One micro-batch's hidden states as they pass between stages: bf16, sequence-sharded over tp."""
    return tokens * shape.cfg.dim * 2 / layout.tp


def _rank_activations(shape: ModelShape, layout: Layout, split: StageSplit, rank: int, microbatches: int,
                      tokens: int, a: MemoryAssumptions) -> float:
    """What ``rank`` holds at its peak for its layers' backward: the saved activations of its micro-batches in
    flight, the recompute working set once, and torch's pipeline buffers."""
    chunks = split.chunks[rank]
    every = _stage_activations(shape, layout, sum(chunks), tokens, a.saves)
    working = _stage_activations(shape, layout, 0, tokens, a.saves)  # held once, not per micro-batch in flight
    held = (every - working) * inflight_microbatches(layout, microbatches, chunks, rank) + working
    if a.torch_pipelining and layout.pp > 1:
        held += pipeline_buffer_bytes(shape, layout, microbatches, tokens, a.kept_outputs, a.kept_input_grads, rank)
    return held


def memory_per_rank(shape: ModelShape, layout: Layout, gpu: GPU, microbatches: int,
                    a: MemoryAssumptions = MemoryAssumptions()) -> MemoryBreakdown:
    """Peak memory of the busiest rank: the first pipeline stage's or the one with the loss, whichever is more."""
    split = layout.split(shape)
    stage_params = split.max_params / layout.tp
    params, grads, optimizer = model_state_bytes(stage_params, layout.zero, layout.state_shards, a)
    grads += embedding_grad_bytes(shape, layout, a)

    # FSDP gathers one unit (layer, or the larger embedding/output) at a time, prefetching the next.
    unit = max(shape.layer_params, shape.embedding_params, shape.output_params) / layout.tp
    buffers = {3: unit * (2 * a.param_bytes + a.grad_bytes), 2: unit * a.grad_bytes}.get(layout.zero, 0.0)
    if layout.precision == "fp8" and a.saves == "megatron":
        held = split.max_layers if layout.zero < 3 else 2  # ZeRO-3: the gathered layer and the prefetched one
        if a.fp8_params:  # the layers' weights are stored in FP8: a byte per parameter less
            layer_weights = split.max_layers * shape.layer_params / layout.tp
            params -= (a.param_bytes - 1) * layer_weights / (layout.state_shards if layout.zero >= 3 else 1)
        else:  # TE's FP8 copies of the layers' weights (not the vocabulary's)
            buffers += a.fp8_weight_bytes * held * shape.layer_params / layout.tp

    tokens = layout.micro_batch * shape.seq_len // layout.cp
    first_stage = _rank_activations(shape, layout, split, 0, microbatches, tokens, a)
    last_stage = _rank_activations(shape, layout, split, split.output_rank, microbatches, tokens, a)
    per_logit = a.logits_bytes
    if layout.tp > 1 and a.loss_parallel_logits_bytes is not None:
        per_logit = a.loss_parallel_logits_bytes
    loss = tokens * shape.cfg.vocab_size / layout.tp * per_logit
    kept = kept_logits_bytes(shape, layout, microbatches, tokens, a.kept_outputs) if a.torch_pipelining else 0.0
    # The ring's buffers live during a layer's backward, after the loss and the head have freed theirs on the
    # rank with the loss; the kept outputs stay.
    ring = cp_ring_bytes(shape, layout, tokens, a.saves)
    head = tokens * head_activation_bytes(shape, layout.tp, a.saves)
    output_on_first = layout.pp == 1 or split.output_on_first
    activations = (first_stage if output_on_first else last_stage) + head + max(ring - loss - head, 0.0)
    logits_held = loss + kept
    if not output_on_first and first_stage + ring > activations + logits_held:
        activations, logits_held = first_stage + ring, 0.0
    return MemoryBreakdown(params=params, grads=grads, optimizer=optimizer, fsdp_buffers=buffers,
                           activations=activations, logits=logits_held, runtime=a.runtime_gb * GB,
                           usable=gpu.memory_gb * GB * (1 - a.headroom))


def rank_memory(shape: ModelShape, layout: Layout, gpu: GPU, microbatches: int, pp_rank: int,
                a: MemoryAssumptions = MemoryAssumptions()) -> MemoryBreakdown:
    """Peak memory of pipeline rank ``pp_rank``, counted as ``memory_per_rank`` counts the busiest one (which takes
    the larger parameters of any rank with the activations of rank 0 or the output rank): its own parameters, its
    micro-batches in flight, and the loss and the head only where the output layer is."""
    if not 0 <= pp_rank < layout.pp:
        raise ValueError(f"pipeline rank must be in [0, {layout.pp}), got {pp_rank}")
    split = layout.split(shape)
    if layout.pp == 1:
        return memory_per_rank(shape, layout, gpu, microbatches, a)
    busiest = memory_per_rank(shape, layout, gpu, microbatches, a)  # the same FSDP buffers and FP8 copies
    params, grads, optimizer = model_state_bytes(split.params[pp_rank] / layout.tp, layout.zero, layout.state_shards, a)
    if pp_rank == 0:
        grads += embedding_grad_bytes(shape, layout, a)
    tokens = layout.micro_batch * shape.seq_len // layout.cp
    held = _rank_activations(shape, layout, split, pp_rank, microbatches, tokens, a)
    ring = cp_ring_bytes(shape, layout, tokens, a.saves)
    logits_held = 0.0
    if pp_rank == split.output_rank:
        per_logit = a.logits_bytes
        if layout.tp > 1 and a.loss_parallel_logits_bytes is not None:
            per_logit = a.loss_parallel_logits_bytes
        loss = tokens * shape.cfg.vocab_size / layout.tp * per_logit
        head = tokens * head_activation_bytes(shape, layout.tp, a.saves)
        activations = held + head + max(ring - loss - head, 0.0)
        kept = kept_logits_bytes(shape, layout, microbatches, tokens, a.kept_outputs) if a.torch_pipelining else 0.0
        logits_held = loss + kept
    else:
        activations = held + ring
    return dataclasses.replace(busiest, params=params, grads=grads, optimizer=optimizer, activations=activations,
                               logits=logits_held)


def trainer_layout(tp: int, pp: int, dp_replicate: int, dp_shard: int, *, pp_schedule: str, zero2: bool,
                   activation_checkpoint: str, float8: str, micro_batch: int, pp_microbatches: int) -> Layout:
    """The planner's Layout for a trainer config (the inverse of ``Layout.to_parallel_config``): ZeRO-1 under a
    pipeline, 2 with ``zero2``, else 3; a pipeline micro-batch is the trainer's micro-batch cut in
    ``pp_microbatches``."""
    from infra.layout import TRAINER_SCHEDULES

    return Layout(tp=tp, pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard,
                  zero=1 if pp > 1 else 2 if zero2 else 3,
                  micro_batch=micro_batch // pp_microbatches if pp > 1 else micro_batch,
                  activation_checkpoint=activation_checkpoint, pp_schedule=pp_schedule if pp > 1 else "1F1B",
                  virtual_stages=TRAINER_SCHEDULES[pp_schedule] if pp > 1 else 1,
                  precision="bf16" if float8 == "none" else "fp8")


def planned_for_trainer(model_cfg, parallel, dp_shard: int, batch: dict, pp_rank: int, gpu: GPU | None = None,
                        a: MemoryAssumptions = MemoryAssumptions()) -> dict:
    """The planner's figures for one rank of a trainer run (``parallel``: its ParallelConfig with ``dp_shard``
    resolved; ``batch``: its BatchPlan as a dict), as GB, and ``peak_gb``: the total less the fixed ``runtime``
    allowance (CUDA context, NCCL and cuBLAS workspaces), which no tensor holds: what a tensor tracker can see."""
    from infra.catalogue import CATALOGUE

    layout = trainer_layout(parallel.tp, parallel.pp, parallel.dp_replicate, dp_shard,
                            pp_schedule=parallel.pp_schedule, zero2=parallel.zero2,
                            activation_checkpoint=parallel.activation_checkpoint, float8=parallel.float8,
                            micro_batch=batch["micro_batch"], pp_microbatches=batch["pp_microbatches"])
    shape = ModelShape(model_cfg, batch["seq_len"])
    m = rank_memory(shape, layout, gpu or CATALOGUE["h100"], layout.microbatches(batch["global_batch"]), pp_rank, a)
    peak = m.total - m.runtime
    return {"layout": layout.name, **m.as_dict(), "peak_gb": round(peak / GB, 3), "peak_bytes": round(peak)}
