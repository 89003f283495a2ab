"""How a model is cut across a GPU mesh: the layout dataclass, its validity rules and the stage split.

Vocabulary (matches docs/design.md §4 and ``tasks.train.config.ParallelConfig``): the mesh is
``pp × dp_replicate × dp_shard × tp`` with tp innermost (inside a node). A *stage* is one pipeline rank's
slice of layers; a *micro-batch* is what one data-parallel rank pushes through the pipeline at once.

ZeRO stage is not a free choice everywhere; it follows what FSDP2 does in the trainer:
- pp = 1: stage 3 (``fully_shard`` default: reshard after forward) or stage 2 (``zero2``: keep parameters
  unsharded from forward to backward). FSDP2 reduce-scatters after every micro-batch.
- pp > 1: torch.distributed.pipelining keeps parameters unsharded and defers the gradient reduce-scatter
  to the last micro-batch (``PipelineStage.backward_maybe_with_nosync``), i.e. ZeRO stage 1 memory and
  one all-gather + one reduce-scatter per step.

Pipeline stages follow tasks/train/pipeline_parallel.py: 1F1B (one stage per rank), Interleaved1F1B (two,
round-robin) or ZBVZeroBubble (two, folded: rank 0 holds the first and the last stage); layers split
as evenly as possible with the remainder on earlier stages, embeddings on the first stage and the output
projection on the last. Two other splits describe other systems' runs (``stage_split``): ``balanced``
takes one layer off the first and the last rank and allows one layer per virtual stage, as Llama 3 did;
``torchtitan`` gives the first and the last stage the base count and the middle stages the remainder
(``generate_split_points`` in torchtitan's pipelining utilities, December 2024).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from tasks.model_config import ModelConfig
from tasks.train.config import AC_MODES, ParallelConfig
from tasks.train.config import PP_SCHEDULES as TRAINER_SCHEDULES  # schedule → stages per rank (the trainer's)
PRECISIONS = ("bf16", "fp8")
STAGE_SPLITS = ("even", "balanced", "torchtitan")


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
    stage_split: str = "even"  # even (the trainer's) | balanced (Llama 3) | torchtitan, see the module doc
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
        split = "" if self.stage_split == "even" else f"·{self.stage_split}"
        return name + split + ("·fp8" if self.precision == "fp8" else "")

    def split(self, shape: ModelShape) -> StageSplit:
        folded = self.pp_schedule == "ZBVZeroBubble"
        return split_stages(shape, self.pp, self.virtual_stages, self.stage_split, folded)

    def microbatches(self, global_seqs: int) -> int:
        """Micro-batches per data-parallel rank per step (gradient accumulation × pipeline fill)."""
        return global_seqs // (self.dp * self.micro_batch)

    def trainer_overrides(self, global_seqs: int, seq_len: int, compile: bool = False) -> dict[str, object]:
        """``section.key`` settings that make the trainer run this layout (``smelt train --set ...``).
        Under pp one schedule call takes the rank's whole batch (data.micro_batch = 0), cut into
        ``pp_microbatches``; without pp, data.micro_batch sets the gradient accumulation."""
        pc = self.to_parallel_config(global_seqs, compile)
        out: dict[str, object] = {f"parallel.{k}": getattr(pc, k) for k in
                                  ("tp", "pp", "dp_shard", "dp_replicate", "pp_schedule", "pp_microbatches",
                                   "zero2", "activation_checkpoint")}
        if self.precision == "fp8":
            out["parallel.float8"] = pc.float8
        if compile:
            out["parallel.compile"] = True
        out.update({"data.global_batch": global_seqs, "data.seq_len": seq_len,
                    "data.micro_batch": 0 if self.pp > 1 else self.micro_batch})
        return out

    def to_parallel_config(self, global_seqs: int, compile: bool = False) -> ParallelConfig:
        """The trainer's config for this layout (ZeRO-1 under pp is implied by pipelining, see module doc);
        ``compile`` compiles each block (``parallel.compile``)."""
        return ParallelConfig(pp=self.pp, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard, tp=self.tp,
                              pp_schedule=self.pp_schedule,
                              pp_microbatches=self.microbatches(global_seqs) if self.pp > 1 else 0,
                              zero2=self.zero == 2, activation_checkpoint=self.activation_checkpoint,
                              compile=compile, float8="tensorwise" if self.precision == "fp8" else "none")


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
    """Layers per pipeline rank. ``chunks[r]`` lists the layers of rank r's virtual stages in schedule order;
    ``params[r]`` its parameters (embedding on rank 0, output projection on ``output_rank``); ``max_flops``
    (FLOPs per token of the busiest rank) sets the pipeline's pace."""

    chunks: tuple[tuple[int, ...], ...]
    params: tuple[int, ...]
    output_rank: int
    max_flops: float

    @property
    def per_rank(self) -> tuple[int, ...]:
        return tuple(sum(c) for c in self.chunks)

    @property
    def max_layers(self) -> int:
        return max(self.per_rank)

    @property
    def max_params(self) -> int:
        return max(self.params)

    @property
    def output_on_first(self) -> bool:
        return self.output_rank == 0


def even_interleavings(n_layers: int, pp: int) -> list[int]:
    """The numbers of stages per pipeline rank that split ``n_layers`` evenly over ``pp`` ranks: the interleaving
    depths Megatron-Core (its virtual pipeline size) and torchtitan (its layers per stage) take."""
    return [v for v in range(1, n_layers // pp + 1) if n_layers % (pp * v) == 0]


def split_stages(shape: ModelShape, pp: int, virtual_stages: int = 1, style: str = "even",
                 folded: bool = False) -> StageSplit:
    """How ``n_layers`` land on ``pp`` ranks (see the module docstring for the three ways)."""
    if style not in STAGE_SPLITS:
        raise ValueError(f"stage split must be one of {', '.join(STAGE_SPLITS)}, got {style!r}")
    key = (pp, virtual_stages, style, folded)
    if key not in shape.splits:
        stages = stage_layers(shape.cfg.n_layers, pp * virtual_stages, style)
        if folded:  # rank r runs stages r and 2pp−1−r; rank 0 holds the output projection
            chunks, output_rank = [(stages[r], stages[-1 - r]) for r in range(pp)], 0
        else:  # rank r runs stages r, r+pp, …
            chunks, output_rank = [tuple(stages[r::pp]) for r in range(pp)], pp - 1
        shape.splits[key] = _stage_split(shape, chunks, output_rank)
    return shape.splits[key]


def stage_layers(n_layers: int, stages: int, style: str = "even") -> list[int]:
    """Layers of each pipeline stage, in stage order (see the module docstring)."""
    if style == "balanced":  # Llama 3 (paper §3.3.2); with one layer per stage the first and last hold none
        base, extra = divmod(n_layers + 2, stages)
        layers = [base + (1 if s < extra else 0) for s in range(stages)]
        layers[0] -= 1
        layers[-1] -= 1
        return layers
    base, extra = divmod(n_layers, stages)
    if style == "torchtitan":
        layers = [base] + [base + (1 if s < extra else 0) for s in range(stages - 2)]
        return layers + [n_layers - sum(layers)] if stages > 1 else [n_layers]
    return [base + (1 if s < extra else 0) for s in range(stages)]  # tasks/train/pipeline_parallel.py's layer_split


def _stage_split(shape: ModelShape, chunks: list[tuple[int, ...]], output_rank: int) -> StageSplit:
    per_rank = [sum(c) for c in chunks]
    loads = [n * shape.layer_flops for n in per_rank]
    loads[output_rank] += shape.output_flops
    params = [n * shape.layer_params for n in per_rank]
    params[0] += shape.embedding_params
    params[output_rank] += shape.output_params
    return StageSplit(chunks=tuple(chunks), params=tuple(params), output_rank=output_rank, max_flops=max(loads))


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
    if layout.pp > 1 and TRAINER_SCHEDULES.get(layout.pp_schedule) != layout.virtual_stages:
        gaps.append(f"{layout.pp_schedule} with {layout.virtual_stages} stages per rank")
    if layout.pp > 1 and layout.zero != 1:
        gaps.append(f"ZeRO-{layout.zero} under pipelining")
    if layout.pp > 1 and layout.stage_split != "even":
        gaps.append(f"the {layout.stage_split} stage split")
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
    if layout.pp * layout.virtual_stages > cfg.n_layers + (2 if layout.stage_split == "balanced" else 0):
        return Rejection("layout.pp_exceeds_layers",
                         f"{layout.pp * layout.virtual_stages} pipeline stages > {cfg.n_layers} layers")
    if (trainer_only and layout.stage_split != "balanced"
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


LAYOUT_KEYS = ("tp", "pp", "dp", "dp_shard", "cp", "mb", "ac", "schedule", "vp", "zero", "precision", "split")
SCHEDULE_ALIASES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "interleaved1f1b": "Interleaved1F1B",
                    "zbv": "ZBVZeroBubble", "zbvzerobubble": "ZBVZeroBubble"}


def parse_layout(text: str, gpus: int, precision: str = "bf16") -> Layout:
    """``tp=8,pp=4,dp=64,cp=1,mb=1,ac=selective,schedule=1F1B`` → Layout. Optional: ``vp`` (stages per rank;
    the schedule's own count by default), ``dp_shard`` (FSDP shard group; all of dp by default, so
    ``dp_replicate = dp / dp_shard``), ``zero`` (1 under pipelining, else 3), ``precision``, ``split`` (even,
    balanced or torchtitan).
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
    split = fields.get("split", "even").lower()
    if split not in STAGE_SPLITS:
        raise ValueError(f"--layout split={split!r}: choose one of {', '.join(STAGE_SPLITS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    return Layout(tp=tp, pp=pp, dp_replicate=dp // shard, dp_shard=shard, zero=zero, micro_batch=mb,
                  activation_checkpoint=ac, pp_schedule=schedule if pp > 1 else "1F1B",
                  virtual_stages=vp if pp > 1 else 1, stage_split=split, cp=cp, precision=precision)
