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

Pipeline stages follow tasks/train/pipeline.py: 1F1B (one stage per rank), Interleaved1F1B (two,
round-robin) or ZBVZeroBubble (two, folded: rank 0 holds the first and the last stage); layers split
as evenly as possible with the remainder on earlier stages, embeddings on the first stage and the output
projection on the last. ``balanced_stages`` instead moves layers off the rank holding the output
projection and allows more virtual stages, as Llama 3 did; only the calibration against Llama 3 uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from tasks.train.config import ModelConfig, ParallelConfig

AC_MODES = ("none", "selective", "full")
TRAINER_SCHEDULES = {"1F1B": 1, "Interleaved1F1B": 2, "ZBVZeroBubble": 2}  # schedule → stages per rank


@dataclass(frozen=True)
class Layout:
    """One candidate parallel layout; ``virtual_stages`` is the number of stages each pipeline rank runs."""

    tp: int
    pp: int
    dp_replicate: int
    dp_shard: int
    zero: int
    micro_batch: int
    activation_checkpoint: str = "none"  # none | selective | full, as tasks/train/parallelize.py applies them
    pp_schedule: str = "1F1B"  # 1F1B | Interleaved1F1B | ZBVZeroBubble
    virtual_stages: int = 1
    balanced_stages: bool = False  # Llama 3-style stage balancing (calibration only, see module doc)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def name(self) -> str:
        dp = f"fsdp{self.dp_shard}" if self.dp_replicate == 1 else f"hsdp{self.dp_replicate}x{self.dp_shard}"
        pp = f"pp{self.pp}" + ("zbv" if self.pp_schedule == "ZBVZeroBubble" else
                               f"v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        name = f"tp{self.tp}·{pp}·{dp}·zero{self.zero}·mb{self.micro_batch}·ac-{self.activation_checkpoint}"
        return name + ("·balanced" if self.balanced_stages else "")

    def split(self, shape: ModelShape) -> StageSplit:
        folded = self.pp_schedule == "ZBVZeroBubble"
        return split_stages(shape, self.pp, self.virtual_stages, self.balanced_stages, folded)

    def microbatches(self, global_seqs: int) -> int:
        """Micro-batches per data-parallel rank per step (gradient accumulation × pipeline fill)."""
        return global_seqs // (self.dp * self.micro_batch)

    def trainer_overrides(self, global_seqs: int, seq_len: int) -> dict[str, object]:
        """``section.key`` settings that make the trainer run this layout (``smelt train --set ...``).
        Under pp one schedule call takes the rank's whole batch (data.micro_batch = 0), cut into
        ``pp_microbatches``; without pp, data.micro_batch sets the gradient accumulation."""
        pc = self.to_parallel_config(global_seqs)
        out: dict[str, object] = {f"parallel.{k}": getattr(pc, k) for k in
                                  ("tp", "pp", "dp_shard", "dp_replicate", "pp_schedule", "pp_microbatches",
                                   "zero2", "activation_checkpoint")}
        out.update({"data.global_batch": global_seqs, "data.seq_len": seq_len,
                    "data.micro_batch": 0 if self.pp > 1 else self.micro_batch})
        return out

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
    splits: dict = field(default_factory=dict, compare=False, repr=False)  # split_stages cache

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
    """Layers per pipeline rank. ``max_flops`` (FLOPs per token of the busiest rank) sets the pipeline's
    pace; rank 0 holds the most micro-batches in flight; ``output_rank`` holds the output projection."""

    first_layers: int
    last_layers: int  # on the output rank
    max_layers: int
    max_flops: float
    first_params: int
    last_params: int
    output_on_first: bool

    @property
    def max_params(self) -> int:
        return max(self.first_params, self.last_params)


def split_stages(shape: ModelShape, pp: int, virtual_stages: int = 1, balanced: bool = False,
                 folded: bool = False) -> StageSplit:
    """How ``n_layers`` land on ``pp`` ranks (see the module docstring for the two ways)."""
    key = (pp, virtual_stages, balanced, folded)
    if key not in shape.splits:
        shape.splits[key] = (_balanced_split(shape, pp) if balanced
                             else _even_split(shape, pp, virtual_stages, folded))
    return shape.splits[key]


def _stage_split(shape: ModelShape, per_rank: list[int], output_rank: int) -> StageSplit:
    lp, lf = shape.layer_params, shape.layer_flops
    loads = [n * lf for n in per_rank]
    loads[output_rank] += shape.output_flops
    params = [n * lp for n in per_rank]
    params[0] += shape.embedding_params
    params[output_rank] += shape.output_params
    return StageSplit(first_layers=per_rank[0], last_layers=per_rank[output_rank], max_layers=max(per_rank),
                      max_flops=max(loads), first_params=params[0], last_params=params[output_rank],
                      output_on_first=output_rank == 0)


def _even_split(shape: ModelShape, pp: int, virtual_stages: int, folded: bool) -> StageSplit:
    """tasks/train/pipeline.py's layer_split over pp·v stages; rank r runs stages r, r+pp, … ("loop") or
    r and 2pp−1−r ("v", folded)."""
    stages = pp * virtual_stages
    base, extra = divmod(shape.cfg.n_layers, stages)
    layers = [base + (1 if s < extra else 0) for s in range(stages)]
    if folded:
        return _stage_split(shape, [layers[r] + layers[stages - 1 - r] for r in range(pp)], output_rank=0)
    return _stage_split(shape, [sum(layers[r::pp]) for r in range(pp)], output_rank=pp - 1)


def _balanced_split(shape: ModelShape, pp: int) -> StageSplit:
    """Fewer layers on the rank holding the output projection, so the busiest rank is as light as possible."""
    n, lf, of = shape.cfg.n_layers, shape.layer_flops, shape.output_flops
    if pp == 1:
        return _stage_split(shape, [n], output_rank=0)
    best = None
    for last in range(0, math.ceil(n / pp) + 1):
        others = math.ceil((n - last) / (pp - 1))
        load = max(others * lf, last * lf + of)
        if best is None or load < best[0]:
            best = (load, others, last)
    _, others, last = best
    return _stage_split(shape, [others] * (pp - 1) + [last], output_rank=pp - 1)


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
    if shape.seq_len % layout.tp:
        return Rejection("layout.seq_indivisible",
                         f"seq_len={shape.seq_len} is not divisible by tp={layout.tp} (sequence parallel)")
    if layout.pp > 1 and cfg.tie_embeddings:
        return Rejection("layout.tied_embeddings_with_pp", "tied embeddings cannot be split across pipeline stages")
    if layout.pp * layout.virtual_stages > cfg.n_layers:
        return Rejection("layout.pp_exceeds_layers",
                         f"{layout.pp * layout.virtual_stages} pipeline stages > {cfg.n_layers} layers")
    if not layout.balanced_stages and TRAINER_SCHEDULES.get(layout.pp_schedule) != layout.virtual_stages:
        return Rejection("layout.schedule_unsupported",
                         f"the trainer has no {layout.pp_schedule} schedule with {layout.virtual_stages} "
                         f"stages per rank; it runs {TRAINER_SCHEDULES}")
    if global_seqs % (layout.dp * layout.micro_batch):
        return Rejection("layout.batch_indivisible",
                         f"global batch of {global_seqs} sequences is not divisible by "
                         f"dp={layout.dp} × micro_batch={layout.micro_batch}")
    m = layout.microbatches(global_seqs)
    if layout.virtual_stages > 1 and m < layout.pp:
        return Rejection("layout.interleave_needs_microbatches",
                         f"{layout.pp_schedule} needs ≥ pp={layout.pp} micro-batches, has {m}")
    return None
