"""How a model is cut across a GPU mesh: the layout dataclass, its validity rules and the stage split.

Vocabulary (matches DESIGN.md §4 and ``tasks.train.config.ParallelConfig``): the mesh is
``pp × dp_replicate × dp_shard × tp`` with tp innermost (inside a node). A *stage* is one pipeline rank's
slice of layers; a *micro-batch* is what one data-parallel rank pushes through the pipeline at once.

ZeRO stage is not a free choice everywhere; it follows what FSDP2 does in the trainer:
- pp = 1: stage 3 (``fully_shard`` default: reshard after forward) or stage 2 (``zero2``: keep parameters
  unsharded from forward to backward). FSDP2 reduce-scatters after every micro-batch.
- pp > 1: torch.distributed.pipelining keeps parameters unsharded and defers the gradient reduce-scatter
  to the last micro-batch (``PipelineStage.backward_maybe_with_nosync``), i.e. ZeRO stage 1 memory and
  one all-gather + one reduce-scatter per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from tasks.train.config import ModelConfig, ParallelConfig

AC_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout:
    """One candidate parallel layout. ``virtual_stages`` > 1 means the interleaved 1F1B schedule."""

    tp: int
    pp: int
    dp_replicate: int
    dp_shard: int
    zero: int
    micro_batch: int
    activation_checkpoint: str = "none"  # none | selective (every other layer) | full
    virtual_stages: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def pp_schedule(self) -> str:
        return "Interleaved1F1B" if self.virtual_stages > 1 else "1F1B"

    @property
    def name(self) -> str:
        dp = f"fsdp{self.dp_shard}" if self.dp_replicate == 1 else f"hsdp{self.dp_replicate}x{self.dp_shard}"
        pp = f"pp{self.pp}" + (f"v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        return f"tp{self.tp}·{pp}·{dp}·zero{self.zero}·mb{self.micro_batch}·ac-{self.activation_checkpoint}"

    def microbatches(self, global_seqs: int) -> int:
        """Micro-batches per data-parallel rank per step (gradient accumulation × pipeline fill)."""
        return global_seqs // (self.dp * self.micro_batch)

    def to_parallel_config(self, global_seqs: int) -> ParallelConfig:
        """The trainer's config for this layout (ZeRO-1 under pp is implied by pipelining, see module doc)."""
        return ParallelConfig(pp=self.pp, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard, tp=self.tp,
                              pp_schedule=self.pp_schedule,
                              pp_microbatches=self.microbatches(global_seqs) if self.pp > 1 else 0,
                              zero2=self.zero == 2, activation_checkpoint=self.activation_checkpoint)


@dataclass(frozen=True)
class ModelShape:
    """Per-layer sizes of a ModelConfig, in parameters and training FLOPs per token."""

    cfg: ModelConfig
    seq_len: int
    splits: dict = field(default_factory=dict, compare=False, repr=False)  # pp → StageSplit, filled lazily

    @cached_property
    def layer_params(self) -> int:
        d, kv = self.cfg.dim, self.cfg.n_kv_heads * self.cfg.head_dim
        return 2 * d * d + 2 * d * kv + 3 * d * self.cfg.ffn_hidden + 2 * d

    @property
    def embedding_params(self) -> int:
        return self.cfg.vocab_size * self.cfg.dim

    @property
    def output_params(self) -> int:
        """Output projection + final norm (the projection is the embedding when tied)."""
        return (0 if self.cfg.tie_embeddings else self.cfg.vocab_size * self.cfg.dim) + self.cfg.dim

    @cached_property
    def flops_per_token(self) -> float:
        """Model FLOPs per token as the trainer counts them for MFU (6N + 12·L·H·Q·T)."""
        return self.cfg.flops_per_token(self.seq_len)

    @cached_property
    def layer_flops(self) -> float:
        c = self.cfg
        return 6 * self.layer_params + 12 * c.n_heads * c.head_dim * self.seq_len

    @cached_property
    def output_flops(self) -> float:
        return self.flops_per_token - self.cfg.n_layers * self.layer_flops


@dataclass(frozen=True)
class StageSplit:
    """Layers on the first and last pipeline stage after balancing the output layer's cost.

    ``max_flops`` is the FLOPs per token of the slowest stage: it sets the pipeline's pace. Llama 3 405B
    balanced the same way (one layer fewer on the stage that holds the output projection).
    """

    first_layers: int
    last_layers: int
    max_flops: float
    first_params: int
    last_params: int

    @property
    def max_params(self) -> int:
        return max(self.first_params, self.last_params)


def split_stages(shape: ModelShape, pp: int) -> StageSplit:
    """Split ``n_layers`` over ``pp`` stages so the slowest stage is as light as possible."""
    if pp not in shape.splits:
        shape.splits[pp] = _split(shape, pp)
    return shape.splits[pp]


def _split(shape: ModelShape, pp: int) -> StageSplit:
    n = shape.cfg.n_layers
    lf, of = shape.layer_flops, shape.output_flops
    if pp == 1:
        params = n * shape.layer_params + shape.embedding_params + shape.output_params
        return StageSplit(n, n, n * lf + of, params, params)
    best = None
    for last in range(0, math.ceil(n / pp) + 1):
        others = math.ceil((n - last) / (pp - 1))
        load = max(others * lf, last * lf + of)
        if best is None or load < best[0]:
            best = (load, others, last)
    load, others, last = best
    return StageSplit(first_layers=others, last_layers=last, max_flops=load,
                      first_params=others * shape.layer_params + shape.embedding_params,
                      last_params=last * shape.layer_params + shape.output_params)


@dataclass(frozen=True)
class Rejection:
    """Why a layout cannot run: a stable namespaced reason, one sentence with the numbers, and how far
    over the limit it is (bytes, for memory) so the closest miss can be shown."""

    reason: str
    message: str
    excess: float = 0.0


def check_shape(layout: Layout, shape: ModelShape, gpus_per_node: int, global_seqs: int) -> Rejection | None:
    """Rules that do not depend on memory or speed: divisibility, node size, schedule constraints."""
    cfg = shape.cfg
    if layout.tp > gpus_per_node:
        return Rejection("layout.tp_exceeds_node", f"tp={layout.tp} spans nodes ({gpus_per_node} GPUs per node)")
    for what, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_hidden", cfg.ffn_hidden),
                       ("vocab_size", cfg.vocab_size)):
        if size % layout.tp:
            return Rejection("layout.tp_indivisible", f"model {what}={size} is not divisible by tp={layout.tp}")
    if layout.pp > cfg.n_layers:
        return Rejection("layout.pp_exceeds_layers", f"pp={layout.pp} > {cfg.n_layers} layers")
    if global_seqs % (layout.dp * layout.micro_batch):
        return Rejection("layout.batch_indivisible",
                         f"global batch of {global_seqs} sequences is not divisible by "
                         f"dp={layout.dp} × micro_batch={layout.micro_batch}")
    m = layout.microbatches(global_seqs)
    if layout.virtual_stages > 1 and m < layout.pp:
        return Rejection("layout.interleave_needs_microbatches",
                         f"interleaved schedule needs ≥ pp={layout.pp} micro-batches, has {m}")
    stage_layers = split_stages(shape, layout.pp).first_layers
    if stage_layers % layout.virtual_stages:
        return Rejection("layout.interleave_uneven", f"{stage_layers} layers per stage do not split into "
                                                     f"{layout.virtual_stages} virtual stages")
    return None
