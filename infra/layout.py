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
projection on the last. ``balanced_stages`` instead takes one layer off the first and the last rank and
allows one layer per virtual stage, as Llama 3 did; only the calibration against Llama 3 uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from tasks.model_config import ModelConfig
from tasks.train.config import AC_MODES, ParallelConfig
from tasks.train.config import PP_SCHEDULES as TRAINER_SCHEDULES  # schedule → stages per rank (the trainer's)
PRECISIONS = ("bf16", "fp8")


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
    cp: int = 1  # context parallel: each rank holds seq_len / cp tokens of every sequence (ring attention)
    precision: str = "bf16"  # bf16 | fp8 (the linear layers' GEMMs in FP8, as Transformer Engine / torchao)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def state_shards(self) -> int:
        """Ranks that share one copy of the weights and split its gradients and optimizer states: the
        data-parallel shard group times the context-parallel group (CP ranks hold the same weights)."""
        return self.dp_shard * self.cp

    @property
    def name(self) -> str:
        dp = f"fsdp{self.dp_shard}" if self.dp_replicate == 1 else f"hsdp{self.dp_replicate}x{self.dp_shard}"
        pp = f"pp{self.pp}" + ("zbv" if self.pp_schedule == "ZBVZeroBubble" else
                               f"v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        cp = f"·cp{self.cp}" if self.cp > 1 else ""
        name = f"tp{self.tp}{cp}·{pp}·{dp}·zero{self.zero}·mb{self.micro_batch}·ac-{self.activation_checkpoint}"
        return name + ("·balanced" if self.balanced_stages else "") + ("·fp8" if self.precision == "fp8" else "")

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
    gelu_mlp: bool = False  # a GPT/MPT two-matrix MLP counted as the equal-FLOPs SwiGLU (infra/models.py)

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
        """Training FLOPs per token of the output projection and final norm: the logits matmul runs even
        when it shares the embedding's weights (which ``flops_per_token`` then leaves out of 6N)."""
        return 6 * (self.cfg.vocab_size * self.cfg.dim + self.cfg.dim)

    @cached_property
    def attention_flops(self) -> float:
        """Per layer and token: the score and value matmuls (12·H·Q·T), which stay in bf16 under FP8."""
        c = self.cfg
        return 12 * c.n_heads * c.head_dim * self.seq_len


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
    per_rank: tuple[int, ...] = ()  # layers on each rank
    output_rank: int = 0
    first_chunks: tuple[int, ...] = ()  # layers of each of rank 0's virtual stages, in schedule order

    @property
    def max_params(self) -> int:
        return max(self.first_params, self.last_params)


def split_stages(shape: ModelShape, pp: int, virtual_stages: int = 1, balanced: bool = False,
                 folded: bool = False) -> StageSplit:
    """How ``n_layers`` land on ``pp`` ranks (see the module docstring for the two ways)."""
    key = (pp, virtual_stages, balanced, folded)
    if key not in shape.splits:
        shape.splits[key] = (_balanced_split(shape, pp, virtual_stages) if balanced
                             else _even_split(shape, pp, virtual_stages, folded))
    return shape.splits[key]


def _stage_split(shape: ModelShape, per_rank: list[int], output_rank: int, first_chunks: list[int]) -> StageSplit:
    lp, lf = shape.layer_params, shape.layer_flops
    loads = [n * lf for n in per_rank]
    loads[output_rank] += shape.output_flops
    params = [n * lp for n in per_rank]
    params[0] += shape.embedding_params
    params[output_rank] += shape.output_params
    return StageSplit(first_layers=per_rank[0], last_layers=per_rank[output_rank], max_layers=max(per_rank),
                      max_flops=max(loads), first_params=params[0], last_params=params[output_rank],
                      output_on_first=output_rank == 0, per_rank=tuple(per_rank), output_rank=output_rank,
                      first_chunks=tuple(first_chunks))


def _even_split(shape: ModelShape, pp: int, virtual_stages: int, folded: bool) -> StageSplit:
    """tasks/train/pipeline.py's layer_split over pp·v stages; rank r runs stages r, r+pp, … ("loop") or
    r and 2pp−1−r ("v", folded)."""
    stages = pp * virtual_stages
    base, extra = divmod(shape.cfg.n_layers, stages)
    layers = [base + (1 if s < extra else 0) for s in range(stages)]
    if folded:
        return _stage_split(shape, [layers[r] + layers[stages - 1 - r] for r in range(pp)], output_rank=0,
                            first_chunks=[layers[0], layers[-1]])
    return _stage_split(shape, [sum(layers[r::pp]) for r in range(pp)], output_rank=pp - 1,
                        first_chunks=layers[0::pp])


def _balanced_split(shape: ModelShape, pp: int, virtual_stages: int) -> StageSplit:
    """Llama 3's balancing (paper §3.3.2): the first virtual stage gives up one layer for the embedding and
    the last one for the output projection and loss; the others share the layers evenly, remainder first.
    With one layer per virtual stage, those two hold no layer at all (126 layers on 16 × 8 stages)."""
    stages = pp * virtual_stages
    base, extra = divmod(shape.cfg.n_layers + 2, stages)
    layers = [base + (1 if s < extra else 0) for s in range(stages)]
    layers[0] -= 1
    layers[-1] -= 1
    return _stage_split(shape, [sum(layers[r::pp]) for r in range(pp)], output_rank=pp - 1,
                        first_chunks=layers[0::pp])


@dataclass(frozen=True)
class Rejection:
    """Why a layout cannot run: a stable namespaced reason, one sentence with the numbers, and how far
    over the limit it is (bytes, for memory) so the closest miss can be shown."""

    reason: str
    message: str
    excess: float = 0.0


def trainer_gaps(layout: Layout) -> list[str]:
    """What smelt's trainer cannot run in this layout (a given layout may describe another system's run)."""
    gaps = []
    if layout.cp > 1:
        gaps.append(f"context parallel (cp={layout.cp})")
    if layout.precision != "bf16":
        gaps.append(f"{layout.precision} matmuls")
    if layout.pp > 1 and TRAINER_SCHEDULES.get(layout.pp_schedule) != layout.virtual_stages:
        gaps.append(f"{layout.pp_schedule} with {layout.virtual_stages} stages per rank")
    if layout.pp > 1 and layout.zero != 1:
        gaps.append(f"ZeRO-{layout.zero} under pipelining")
    return gaps


def check_shape(layout: Layout, shape: ModelShape, gpus_per_node: int, global_seqs: int,
                trainer_only: bool = True) -> Rejection | None:
    """Rules that do not depend on memory or speed: divisibility, node size, schedule constraints
    (``trainer_only=False`` drops the rules that only smelt's trainer imposes, to score other systems' runs)."""
    cfg = shape.cfg
    if layout.precision not in PRECISIONS:
        return Rejection("layout.precision_unknown", f"precision {layout.precision!r} is not one of {PRECISIONS}")
    if layout.cp > 1 and shape.seq_len % (2 * layout.cp):
        return Rejection("layout.cp_indivisible",
                         f"seq_len={shape.seq_len} is not divisible by 2·cp={2 * layout.cp} (load-balanced ring)")
    if layout.tp > gpus_per_node:
        return Rejection("layout.tp_exceeds_node", f"tp={layout.tp} spans nodes ({gpus_per_node} GPUs per node)")
    for what, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_hidden", cfg.ffn_hidden),
                       ("vocab_size", cfg.vocab_size)):
        if size % layout.tp:
            return Rejection("layout.tp_indivisible", f"model {what}={size} is not divisible by tp={layout.tp}")
    if (shape.seq_len // layout.cp) % layout.tp:
        return Rejection("layout.seq_indivisible",
                         f"seq_len/cp={shape.seq_len // layout.cp} is not divisible by tp={layout.tp} "
                         f"(sequence parallel)")
    if layout.pp > 1 and cfg.tie_embeddings:
        return Rejection("layout.tied_embeddings_with_pp", "tied embeddings cannot be split across pipeline stages")
    if layout.pp * layout.virtual_stages > cfg.n_layers + (2 if layout.balanced_stages else 0):
        return Rejection("layout.pp_exceeds_layers",
                         f"{layout.pp * layout.virtual_stages} pipeline stages > {cfg.n_layers} layers")
    if (trainer_only and not layout.balanced_stages
            and TRAINER_SCHEDULES.get(layout.pp_schedule) != layout.virtual_stages):
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


LAYOUT_KEYS = ("tp", "pp", "dp", "dp_shard", "cp", "mb", "ac", "schedule", "vp", "zero", "precision", "balanced")
SCHEDULE_ALIASES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "interleaved1f1b": "Interleaved1F1B",
                    "zbv": "ZBVZeroBubble", "zbvzerobubble": "ZBVZeroBubble"}


def parse_layout(text: str, gpus: int, precision: str = "bf16") -> Layout:
    """``tp=8,pp=4,dp=64,cp=1,mb=1,ac=selective,schedule=1F1B`` → Layout. Optional: ``vp`` (stages per rank;
    the schedule's own count by default), ``dp_shard`` (FSDP shard group; all of dp by default, so
    ``dp_replicate = dp / dp_shard``), ``zero`` (1 under pipelining, else 3), ``precision``, ``balanced``.
    ``dp`` defaults to what the other degrees leave of ``gpus``."""
    fields: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in LAYOUT_KEYS:
            raise ValueError(f"--layout {part!r}: use key=value with key one of {', '.join(LAYOUT_KEYS)}")
        fields[key] = value.strip()

    def whole(key: str, default: int) -> int:
        try:
            value = int(fields.get(key, default))
        except ValueError:
            raise ValueError(f"--layout {key}={fields[key]!r} must be a whole number") from None
        if value < 1:
            raise ValueError(f"--layout {key}={value} must be at least 1")
        return value

    tp, pp, cp, mb = whole("tp", 1), whole("pp", 1), whole("cp", 1), whole("mb", 1)
    if gpus % (tp * pp * cp):
        raise ValueError(f"--layout tp·pp·cp = {tp * pp * cp} does not divide --gpus {gpus}")
    dp = whole("dp", gpus // (tp * pp * cp))
    if tp * pp * cp * dp != gpus:
        raise ValueError(f"--layout tp·cp·pp·dp = {tp * cp * pp * dp} GPUs, but --gpus is {gpus}")
    shard = whole("dp_shard", dp)
    if dp % shard:
        raise ValueError(f"--layout dp_shard={shard} does not divide dp={dp}")
    schedule = SCHEDULE_ALIASES.get(fields.get("schedule", "1F1B").lower())
    if schedule is None:
        raise ValueError(f"--layout schedule={fields['schedule']!r}: choose 1F1B, Interleaved1F1B or ZBVZeroBubble")
    vp = whole("vp", TRAINER_SCHEDULES[schedule] if pp > 1 else 1)
    if vp > 1 and schedule == "1F1B":
        schedule = "Interleaved1F1B"
    ac = fields.get("ac", "none").lower()
    if ac not in AC_MODES:
        raise ValueError(f"--layout ac={ac!r}: choose one of {', '.join(AC_MODES)}")
    zero = whole("zero", 1 if pp > 1 else 3) if fields.get("zero") != "0" else 0
    if zero > 3:
        raise ValueError(f"--layout zero={zero}: ZeRO stages are 0, 1, 2 and 3")
    precision = fields.get("precision", precision).lower()
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    return Layout(tp=tp, pp=pp, dp_replicate=dp // shard, dp_shard=shard, zero=zero, micro_batch=mb,
                  activation_checkpoint=ac, pp_schedule=schedule if pp > 1 else "1F1B",
                  virtual_stages=vp if pp > 1 else 1, balanced_stages=fields.get("balanced", "").lower()
                  in ("1", "true", "yes"), cp=cp, precision=precision)
