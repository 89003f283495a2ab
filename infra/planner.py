"""Capacity plan: search the layouts that fit, rank them by time to train, and give a verdict.

``plan(PlanInputs(...))`` answers "will this model, on this many GPUs, train on this many tokens before
the deadline and within the budget?" with the chosen layout, the runners-up and why they lose, the memory
and time breakdowns, the failure/checkpoint figures and a sensitivity table. Pure arithmetic: no torch.
``verify(plan)`` holds the memory figures to smelt's trainer: it builds and steps the busiest ranks of each
proposed layout on fake tensors, each in a process of its own (tasks/train/simulate_world.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from infra.catalogue import CATALOGUE, GPU
from infra.layout import AC_MODES, PRECISIONS, TRAINER_SCHEDULES, Layout, ModelShape, Rejection, check_shape, \
    even_interleavings, trainer_gaps
from infra.memory import GB, MemoryAssumptions, MemoryBreakdown, memory_per_rank, rank_memory
from infra.models import model_config
from infra.recovery import RECOVERY_MODES, describe
from infra.recovery_figures import USED as RECOVERY_FIGURES
from infra.replica_figures import USED as REPLICA_FIGURES
from infra.replica_recovery import REPLICA_GROUP_COUNTS, StepOverhead, step_overhead
from infra.reliability import LLAMA3_MTBF_GPU_HOURS, FailureAssumptions, Reliability, cluster_mtbf_s, plan_reliability
from infra.timing import PART_LABELS, StepTime, TimingAssumptions, step_time
from tasks.model_config import ModelConfig

logger = logging.getLogger(__name__)

TP_DEGREES = (1, 2, 4, 8)
PP_DEGREES = (1, 2, 4, 8, 16, 32, 64)
MICRO_BATCHES = (1, 2, 4, 8)
GLOO_LOOPBACK_GBPS = 1.0  # bench/replica_overhead.py allreduce_gbps, 0.8-1.0 here: the sensitivity row's gloo rate


@dataclass(frozen=True)
class PlanInputs:
    """The question (model, tokens, cluster, deadline, budget) and every assumption behind the answer."""

    model: str = "70b"
    tokens: float = 15e12
    gpus: int = 4096
    gpu: GPU = CATALOGUE["h100"]
    days: float = 60.0
    budget: float = 11e6
    seq_len: int = 8192
    global_batch_tokens: float = 2**24  # 16M tokens = 2,048 × 8,192, Llama 3's batch
    vocab_size: int = 0  # 0: the preset's
    model_sets: tuple[tuple[str, int | bool], ...] = ()  # ModelConfig field overrides (infra/models.py)
    hf_config: Path | None = None  # a Hugging Face config.json instead of the preset
    precision: str = "bf16"  # bf16 | fp8 (linear GEMMs in FP8; MFU still against the bf16 peak)
    pp_schedules: tuple[str, ...] = tuple(TRAINER_SCHEDULES)  # pipeline schedules the search may use
    timing: TimingAssumptions = field(default_factory=TimingAssumptions)
    memory: MemoryAssumptions = field(default_factory=MemoryAssumptions)
    failures: FailureAssumptions = field(default_factory=FailureAssumptions)
    # whose software runs the layouts: smelt's trainer, or a validation stack (infra.stacks.STACKS), whose
    # timing and memory models ``timing`` and ``memory`` then carry and whose layouts need not be the trainer's
    stack: str = "smelt"
    zero_stages: tuple[int, ...] = ()  # the ZeRO stages the search may use; (): the trainer's (infra/layout.py)
    model_parallel: bool = True  # the search may use tensor and pipeline parallelism

    @property
    def smelt_trainer(self) -> bool:
        return self.stack == "smelt"

    def __post_init__(self) -> None:
        if self.gpus <= 0 or self.gpus % self.gpu.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} must be a positive multiple of {self.gpu.gpus_per_node} "
                             f"(GPUs per {self.gpu.label} node)")
        for name in ("tokens", "days", "budget", "global_batch_tokens", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        unknown = [name for name in self.pp_schedules if name not in TRAINER_SCHEDULES]
        if unknown or not self.pp_schedules:
            raise ValueError(f"unknown pipeline schedule {unknown[0] if unknown else ''!r}; choose from "
                             f"{', '.join(TRAINER_SCHEDULES)}")
        if self.global_seqs < 1:
            raise ValueError(f"--global-batch-tokens {self.global_batch_tokens:g} is less than one sequence of "
                             f"--seq-len {self.seq_len}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        cfg = self.model_config()  # unknown preset, bad shape or missing vocabulary fail here, before the search
        if self.smelt_trainer and self.seq_len > cfg.max_seq_len:  # the trainer refuses it (check_model_fits)
            raise ValueError(f"--seq-len {self.seq_len} exceeds the model's max_seq_len {cfg.max_seq_len}; "
                             "smelt's trainer refuses longer sequences; use a shorter --seq-len")

    def model_config(self) -> ModelConfig:
        return model_config(self.model, dict(self.model_sets), self.hf_config, self.vocab_size)

    @property
    def global_seqs(self) -> int:
        return round(self.global_batch_tokens / self.seq_len)

    @cached_property
    def shape(self) -> ModelShape:
        return ModelShape(self.model_config(), self.seq_len)


@dataclass(frozen=True)
class Candidate:
    """One layout that fits, with its time, failure figures and the run's totals."""

    layout: Layout
    memory: MemoryBreakdown
    step: StepTime
    reliability: Reliability
    wall_s: float
    price_per_hour: float

    @property
    def days(self) -> float:
        return self.wall_s / 86400

    @property
    def gpu_hours(self) -> float:
        return self.wall_s / 3600 * (self.layout.world + self.reliability.spare_gpus)

    @property
    def cost(self) -> float:
        return self.gpu_hours * self.price_per_hour


@dataclass(frozen=True)
class Rejections:
    """Counts per reason, with the example closest to fitting."""

    counts: dict[str, int]
    examples: dict[str, str]


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    best: Candidate | None
    runners_up: list[tuple[Candidate, str]]
    rejections: Rejections
    evaluated: int
    given: bool = False  # the layout was given (--layout), not searched

    @property
    def fits(self) -> bool:
        return self.best is not None

    @property
    def meets_deadline(self) -> bool:
        return self.fits and self.best.days <= self.inputs.days

    @property
    def within_budget(self) -> bool:
        return self.fits and self.best.cost <= self.inputs.budget

    @property
    def feasible(self) -> bool:
        return self.meets_deadline and self.within_budget

    @property
    def break_even_price(self) -> float | None:
        """Highest price per GPU-hour that keeps this plan within budget."""
        return self.inputs.budget / self.best.gpu_hours if self.fits else None

    def reasons(self) -> list[str]:
        """One sentence per failed condition (empty when feasible)."""
        i = self.inputs
        if not self.fits:
            top = max(self.rejections.counts, key=self.rejections.counts.get)
            return [f"no layout fits on {i.gpus} × {i.gpu.label}; closest: {self.rejections.examples[top]}"]
        out = []
        if not self.meets_deadline:
            out.append(f"needs {self.best.days:.1f} days, deadline is {i.days:g}")
        if not self.within_budget:
            out.append(f"costs ${self.best.cost / 1e6:.2f}M, budget is ${i.budget / 1e6:.2f}M "
                       f"(break-even price ${self.break_even_price:.2f}/GPU-hour)")
        return out


def candidate_layouts(shape: ModelShape, gpus: int, gpus_per_node: int,
                      pp_schedules: tuple[str, ...] = tuple(TRAINER_SCHEDULES), precision: str = "bf16",
                      zero_stages: tuple[int, ...] = (), model_parallel: bool = True, deep_interleaving: bool = False,
                      replica_groups: tuple[int, ...] = ()):
    """Every layout the trainer can express on ``gpus`` GPUs (see infra/layout.py for the ZeRO rules), or, with
    ``zero_stages``, without ``model_parallel`` or with ``deep_interleaving``, those another system offers.
    ``replica_groups``: also each of these numbers of ``dp_replicate`` groups (replica-group recovery).
    ``deep_interleaving``: Interleaved1F1B also with every deeper number of stages per rank that splits the layers
    evenly (Megatron-Core's virtual pipeline size, torchtitan's layers per stage), not only the trainer's two."""
    cfg = shape.cfg
    for tp in TP_DEGREES if model_parallel else (1,):
        for pp in PP_DEGREES if model_parallel else (1,):
            if gpus % (tp * pp) or pp > cfg.n_layers:
                continue
            dp = gpus // (tp * pp)
            schedules = [(n, TRAINER_SCHEDULES[n]) for n in pp_schedules] if pp > 1 else [("1F1B", 1)]
            if deep_interleaving and pp > 1 and "Interleaved1F1B" in pp_schedules:
                schedules += [("Interleaved1F1B", v) for v in even_interleavings(cfg.n_layers, pp)
                              if v > TRAINER_SCHEDULES["Interleaved1F1B"]]
            shard_sizes = {dp} | {s for s in (gpus_per_node // tp * 2**i for i in range(3))
                                  if 2 <= s < dp and dp % s == 0}
            shard_sizes |= {dp // g for g in replica_groups if dp % g == 0}
            for dp_shard in sorted(shard_sizes):
                for zero in zero_stages or ((2, 3) if pp == 1 else (1,)):
                    for ac in AC_MODES:
                        for mb in MICRO_BATCHES:
                            for schedule, v in schedules:
                                yield Layout(tp=tp, pp=pp, dp_replicate=dp // dp_shard, dp_shard=dp_shard,
                                             zero=zero, micro_batch=mb, activation_checkpoint=ac,
                                             pp_schedule=schedule, virtual_stages=v, precision=precision)


def evaluate(inputs: PlanInputs, layout: Layout, trainer_only: bool = True,
             step_scale: float = 1.0) -> Candidate | Rejection:
    """Memory, time and failures of one layout, or why it cannot run (``trainer_only=False``: a given layout
    that smelt's trainer need not be able to run, e.g. another system's published run). ``step_scale``
    stretches the predicted step, checkpoint interval and goodput following it (the planner-error rows)."""
    shape, gpu = inputs.shape, inputs.gpu
    rejection = check_shape(layout, shape, gpu.gpus_per_node, inputs.global_seqs, trainer_only)
    replicas = inputs.failures.recovery == "replicas"
    if not rejection and replicas:
        rejection = replica_rejection(layout, trainer_only)
    if rejection:
        return rejection
    microbatches = layout.microbatches(inputs.global_seqs)
    memory = memory_per_rank(shape, layout, gpu, microbatches, inputs.memory)
    rejection = memory.rejection(layout)
    if rejection:
        return rejection
    overhead = None
    if replicas:
        step, overhead = replica_step(inputs, layout)
        step = step.scaled(step_scale)
    else:
        step = step_time(shape, layout, gpu, inputs.global_seqs, inputs.timing).scaled(step_scale)
    reliability = plan_reliability(layout.world, shape.cfg.num_params(), layout, gpu, step.total, inputs.failures,
                                   microbatches=microbatches, overhead=overhead)
    train_s = inputs.tokens / step.tokens_per_s
    return Candidate(layout=layout, memory=memory, step=step, reliability=reliability,
                     wall_s=train_s / reliability.goodput, price_per_hour=gpu.price_per_hour)


def replica_rejection(layout: Layout, trainer_only: bool) -> Rejection | None:
    """Why replica-group recovery cannot run this layout: it needs groups, and smelt's groups no pipeline."""
    if layout.dp_replicate < 2:
        return Rejection("recovery.replicas_need_groups", f"{layout.name}: replica-group recovery needs "
                         "dp_replicate ≥ 2 groups (an hsdp layout)", 1.0)
    if trainer_only and layout.pp > 1:
        return Rejection("recovery.replicas_no_pipeline", f"{layout.name}: smelt's replica groups run no pipeline "
                         "parallelism (tasks/train/replica_group.py)", float(layout.pp))
    return None


def replica_step(inputs: PlanInputs, layout: Layout) -> tuple[StepTime, StepOverhead]:
    """The step of ``dp_replicate`` torchft replica groups: one group's own step (its FSDP/TP traffic, no HSDP
    all-reduce: torchft's Manager does it instead, after the backward pass) plus the protocol's overhead, counted
    as exposed data-parallel traffic; tokens and FLOPs are the whole job's."""
    groups = layout.dp_replicate
    group = dataclasses.replace(layout, dp_replicate=1)
    step = step_time(inputs.shape, group, inputs.gpu, inputs.global_seqs // groups, inputs.timing)
    link = inputs.failures.replica_allreduce_gbps or inputs.gpu.internode_gbps
    grad_params = inputs.shape.cfg.num_params() / (layout.tp * layout.pp * layout.state_shards)
    overhead = step_overhead(grad_params, groups, link)
    return dataclasses.replace(step, dp_comm=step.dp_comm + overhead.total,
                               tokens_per_step=step.tokens_per_step * groups,
                               model_flops_per_step=step.model_flops_per_step * groups,
                               world=step.world * groups), overhead


def _why_slower(candidate: Candidate, best: Candidate) -> str:
    """The step-time part that grew the most, in words."""
    slower = candidate.wall_s / best.wall_s - 1
    deltas = {k: v - best.step.parts()[k] for k, v in candidate.step.parts().items()}
    part = max(deltas, key=deltas.get)
    if deltas[part] <= 1e-9:
        extra = (candidate.memory.total - best.memory.total) / GB
        return f"{slower:+.1%} time; same step time, {extra:+.1f} GB per GPU"
    return f"{slower:+.1%} time: {deltas[part]:+.2f} s/step {PART_LABELS[part]}"


def plan(inputs: PlanInputs, layout: Layout | None = None) -> Plan:
    """Evaluate every candidate layout; the fastest (then the leanest in memory) wins. With ``layout``,
    score exactly that one (it may use what smelt's trainer lacks: CP, FP8, deeper interleaving)."""
    gpu = inputs.gpu
    fitting: list[Candidate] = []
    counts: dict[str, int] = {}
    closest: dict[str, tuple[float, str]] = {}
    evaluated = 0
    given = layout is not None
    layouts = ([layout] if given else
               candidate_layouts(inputs.shape, inputs.gpus, gpu.gpus_per_node, inputs.pp_schedules, inputs.precision,
                                 inputs.zero_stages, inputs.model_parallel,
                                 deep_interleaving=not inputs.smelt_trainer,
                                 replica_groups=REPLICA_GROUP_COUNTS if inputs.failures.recovery == "replicas" else ()))
    for candidate_layout in layouts:
        evaluated += 1
        result = evaluate(inputs, candidate_layout, trainer_only=inputs.smelt_trainer and not given)
        if isinstance(result, Candidate):
            fitting.append(result)
            continue
        counts[result.reason] = counts.get(result.reason, 0) + 1
        if result.reason not in closest or result.excess < closest[result.reason][0]:
            closest[result.reason] = (result.excess, result.message)
    if not evaluated:
        counts["layout.none_possible"] = 1
        closest["layout.none_possible"] = (0.0, f"no tp·pp degree divides {inputs.gpus} GPUs")
    fitting.sort(key=lambda c: (c.wall_s, c.memory.total))
    logger.info("planner: %d layouts evaluated, %d fit", evaluated, len(fitting))
    best = fitting[0] if fitting else None
    runners_up, families = [], set()
    if best:
        families.add(_family(best.layout))
        for candidate in fitting[1:]:
            if _family(candidate.layout) in families:
                continue
            families.add(_family(candidate.layout))
            runners_up.append((candidate, _why_slower(candidate, best)))
            if len(runners_up) == 5:
                break
    return Plan(inputs=inputs, best=best, runners_up=runners_up,
                rejections=Rejections(counts, {k: v[1] for k, v in closest.items()}), evaluated=evaluated,
                given=given)


def _family(layout: Layout) -> tuple:
    return layout.tp, layout.pp, layout.pp_schedule, layout.activation_checkpoint


@dataclass(frozen=True)
class SensitivityRow:
    factor: str
    setting: str
    layout: str | None
    days: float | None
    cost: float | None
    feasible: bool


def sensitivity(result: Plan, planner_error: float | None = None) -> list[SensitivityRow]:
    """Days and dollars when one assumption moves; GPU count and schedules re-plan, the others keep the
    chosen layout. ``planner_error`` (the validation table's held-out mean error, ``infra.validation``) adds
    the plan with its step that much shorter and longer: a verdict that flips there is within the planner's
    own error."""
    i = result.inputs
    rows = []

    def row(factor: str, setting: str, inputs: PlanInputs, replan: bool, step_scale: float = 1.0) -> None:
        if replan or not result.best:
            other = plan(inputs)
            best, ok = other.best, other.feasible
        else:
            best = evaluate(inputs, result.best.layout, trainer_only=i.smelt_trainer and not result.given,
                            step_scale=step_scale)
            best = best if isinstance(best, Candidate) else None
            ok = bool(best) and best.days <= inputs.days and best.cost <= inputs.budget
        rows.append(SensitivityRow(factor, setting, best.layout.name if best else None,
                                   best.days if best else None, best.cost if best else None, ok))

    f = i.failures
    for scale in (0.5, 2.0):
        row("MTBF per GPU", f"{f.mtbf_gpu_hours * scale:,.0f} h",
            dataclasses.replace(i, failures=dataclasses.replace(f, mtbf_gpu_hours=f.mtbf_gpu_hours * scale)), False)
    # the seed's "breaks every few hours": 2 h (Meta measured 1.8 h at 16K GPUs) and 3 h, beside Llama 3's rate
    llama_h = cluster_mtbf_s(i.gpus, LLAMA3_MTBF_GPU_HOURS) / 3600
    for hours, per_gpu, note in ((2.0, 2.0 * i.gpus, ""), (3.0, 3.0 * i.gpus, ""),
                                 (llama_h, LLAMA3_MTBF_GPU_HOURS, ", Llama 3's rate")):
        row("cluster MTBF", f"{hours:.1f} h ({per_gpu:,.0f} GPU-h per GPU{note})",
            dataclasses.replace(i, failures=dataclasses.replace(f, mtbf_gpu_hours=per_gpu)), False)
    for scale in (0.5, 2.0):
        row("restart time", f"{f.restart_minutes * scale:g} min",
            dataclasses.replace(i, failures=dataclasses.replace(f, restart_minutes=f.restart_minutes * scale)), False)
    if f.recovery == "in-process":  # its restart is mostly the process group's rebuild
        for scale in (0.5, 2.0):
            row("process-group init", f"{f.process_group_init_s * scale:g} s",
                dataclasses.replace(i, failures=dataclasses.replace(
                    f, process_group_init_s=f.process_group_init_s * scale)), False)
    if f.recovery == "replicas":  # its one assumption, and its all-reduce at gloo's rate measured here
        for scale in (0.5, 2.0):
            row("replica-group rebuild (assumed)", f"{f.replica_reconfigure_s * scale:g} s",
                dataclasses.replace(i, failures=dataclasses.replace(
                    f, replica_reconfigure_s=f.replica_reconfigure_s * scale)), False)
        row("cross-group all-reduce", f"{GLOO_LOOPBACK_GBPS:g} GB/s (gloo, loopback)",
            dataclasses.replace(i, failures=dataclasses.replace(f, replica_allreduce_gbps=GLOO_LOOPBACK_GBPS)), False)
    for scale in (0.8, 1.2):
        gpu = dataclasses.replace(i.gpu, price_per_hour=i.gpu.price_per_hour * scale)
        row("price", f"${gpu.price_per_hour:.2f}/GPU-h", dataclasses.replace(i, gpu=gpu), False)
    base = i.timing.compute if i.timing.compute is not None else i.gpu.compute_efficiency
    for scale in (0.9, 1.1):
        value = min(1.0, base * scale)
        row("compute efficiency", f"{value:.2f}",
            dataclasses.replace(i, timing=dataclasses.replace(i.timing, compute=value)), False)
    if planner_error and result.best:
        for sign in (-1, 1):
            row("planner error", f"step {sign * planner_error:+.1%}", i, False, step_scale=1 + sign * planner_error)
    if i.smelt_trainer:  # the same layout with the trainer's blocks compiled, or not
        compiled = not i.timing.compiled_recompute
        row("trainer compiled", f"parallel.compile={str(compiled).lower()}",
            dataclasses.replace(i, timing=dataclasses.replace(i.timing, compiled_recompute=compiled)), False)
    if result.given:  # the rest re-plan, which would replace the layout that was asked about
        return rows
    node = i.gpu.gpus_per_node
    for scale in (0.5, 2.0):
        gpus = max(node, round(i.gpus * scale / node) * node)  # whole nodes
        if gpus != i.gpus:
            row("GPU count", f"{gpus:,}", dataclasses.replace(i, gpus=gpus), True)
    if "ZBVZeroBubble" in i.pp_schedules and len(i.pp_schedules) > 1:  # its bubble model is the least tested
        others = tuple(n for n in i.pp_schedules if n != "ZBVZeroBubble")
        row("pipeline schedules", "without ZBVZeroBubble", dataclasses.replace(i, pp_schedules=others), True)
    return rows


@dataclass(frozen=True)
class ModeRow:
    """The chosen layout under one recovery mode (infra/recovery.py)."""

    mode: str
    in_smelt: bool
    goodput: float
    restart_s: float
    lost_per_failure_s: float
    days: float
    cost: float
    feasible: bool
    layout: str = ""  # the layout the row scores (replicas: the best replica layout when the chosen one has none)


def recovery_modes(result: Plan) -> list[ModeRow]:
    """The chosen layout under every recovery mode, for comparison (storage: smelt before snapshots); replicas on
    the chosen layout if it has replica groups, else on the best layout that has (a second search)."""
    i, rows = result.inputs, []
    if not result.best:
        return rows
    for mode in RECOVERY_MODES:
        inputs = dataclasses.replace(i, failures=dataclasses.replace(i.failures, recovery=mode))
        trainer_only = i.smelt_trainer and not result.given
        c = evaluate(inputs, result.best.layout, trainer_only=trainer_only)
        if mode == "replicas" and not isinstance(c, Candidate) and not result.given:
            c = plan(inputs).best
        if isinstance(c, Candidate):
            r = c.reliability
            rows.append(ModeRow(mode, r.in_smelt, r.goodput, r.restart_s, r.lost_per_failure_s, c.days, c.cost,
                                c.days <= i.days and c.cost <= i.budget, c.layout.name))
    return rows


def recovery_dict(r: Reliability) -> dict:
    """The recovery mode, what a failure costs by reason, and the figures behind it (with their sources)."""
    snap = r.snapshot
    return {
        "mode": r.recovery,
        "label": describe(r.recovery),
        "in_smelt": r.in_smelt,
        "restart_s": round(r.restart_s, 2),
        "lost_per_failure_min": round(r.lost_per_failure_s / 60, 2),
        "deciding": [p.name for p in r.deciding()],
        "lost_per_failure_s": [{"part": p.name, "seconds": round(p.seconds, 3), "source": p.source} for p in r.parts],
        "snapshot": None if snap is None else {
            "interval_s": round(snap.interval_s, 3), "gb_per_rank": round(snap.bytes_per_rank / GB, 3),
            "copy_s": round(snap.copy_s, 4), "replicate_s": round(snap.replicate_s, 4),
            "blocking_s": round(snap.blocking_s, 4), "blocking_share_of_step": round(snap.blocking_s / snap.interval_s, 5),
            "commit_s": round(snap.commit_s, 4), "restore_s": round(snap.restore_s, 4)},
        "disaster_probability": r.disaster_probability,
        "replicas": None if r.replicas is None else replica_dict(r),
        "figures": {name: dataclasses.asdict(fig) for name, fig in RECOVERY_FIGURES.items()},
    }


def replica_dict(r: Reliability) -> dict:
    """Replica groups: the step overhead, the slowdown while a group is away and the figures behind them."""
    c = r.replicas
    return {"groups": c.groups, "microbatches_per_rank": c.microbatches, "step_s": round(c.step_s, 4),
            "step_overhead_s": {"quorum": round(c.overhead.quorum_s, 5), "allreduce": round(c.overhead.allreduce_s, 5),
                                "commit": round(c.overhead.commit_s, 5), "total": round(c.overhead.total, 5),
                                "share_of_step": round(c.overhead.total / c.step_s, 5)},
            "slowdown_while_away": round(c.slowdown, 4), "stall_s": round(c.stall_s, 2), "away_s": round(c.away_s, 2),
            "away_parts_s": {p.name: round(p.seconds, 3) for p in c.away},
            "lost_per_failure_s": round(c.lost_s, 2), "all_groups_lost_probability": c.all_lost_probability,
            "figures": {name: dataclasses.asdict(fig) for name, fig in REPLICA_FIGURES.items()}}


def to_dict(result: Plan, rows: list[SensitivityRow] | None = None, modes: list[ModeRow] | None = None,
            verified: list[dict] | None = None) -> dict:
    """The JSON answer: the verdict keys first, then every breakdown."""
    i, best = result.inputs, result.best
    out = {
        "feasible": result.feasible,
        "layout": best.layout.name if best else None,
        "mfu": round(best.step.mfu, 4) if best else None,
        "days": round(best.days, 2) if best else None,
        "gpu_hours": round(best.gpu_hours) if best else None,
        "cost_usd": round(best.cost) if best else None,
        "checkpoint_interval_min": round(best.reliability.interval_s / 60, 2) if best else None,
        "goodput": round(best.reliability.goodput, 4) if best else None,
        "recovery": describe(i.failures.recovery),
        "reasons": result.reasons(),
        "tokens_per_s_per_gpu": round(best.step.tokens_per_s / best.layout.world, 1) if best else None,
        "mfu_basis": f"model FLOPs (6N + 12·L·H·Q·T) over the dense bf16 peak, {i.gpu.peak_tflops:g} TFLOP/s per "
                     f"{i.gpu.label}, FP8 runs included",
        "peak_memory_gb": round(best.memory.total / GB, 2) if best else None,
        "precision": best.layout.precision if best else i.precision,
        "layout_given": result.given,
        "stack": i.stack,
        "trainer_cannot_run": trainer_gaps(best.layout) if best and i.smelt_trainer else [],
        "inputs": {"model": i.model, "tokens": i.tokens, "gpus": i.gpus, "gpu": i.gpu.name, "days": i.days,
                   "budget": i.budget, "seq_len": i.seq_len, "global_batch_seqs": i.global_seqs,
                   "model_shape": dataclasses.asdict(i.model_config()),
                   "price_per_hour": i.gpu.price_per_hour, "mtbf_gpu_hours": round(i.failures.mtbf_gpu_hours)},
        "rejected": result.rejections.counts,
        "layouts_evaluated": result.evaluated,
    }
    if best:
        r, L = best.reliability, best.layout
        out.update({
            # smelt's trainer settings, for plans of smelt's trainer only
            "parallel": (dataclasses.asdict(L.to_parallel_config(i.global_seqs, i.timing.compiled_recompute))
                         if i.smelt_trainer else None),
            "trainer_overrides": (L.trainer_overrides(i.global_seqs, i.seq_len, i.timing.compiled_recompute)
                                  if i.smelt_trainer else None),
            "micro_batch": L.micro_batch,
            "zero_stage": L.zero,
            "tokens_per_s": round(best.step.tokens_per_s),
            "step_s": round(best.step.total, 3),
            "step_parts_s": {k: round(v, 4) for k, v in best.step.parts().items()},
            "memory_gb": best.memory.as_dict(),
            "cluster_mtbf_h": round(r.mtbf_s / 3600, 2),
            "checkpoint_interval_steps": r.interval_steps,
            "checkpoint_gb": round(r.checkpoint.size_bytes / GB, 1),
            "checkpoint_blocking_s": round(r.checkpoint.blocking_s, 2),
            "checkpoint_commit_s": round(r.checkpoint.commit_s, 2),
            "restart_min": round(r.restart_s / 60, 2),
            "expected_interruptions": round(r.interruptions(best.wall_s), 1),
            "spare_gpus": r.spare_gpus,
            "recovery_model": recovery_dict(r),
            "break_even_price": round(result.break_even_price, 3),
            "runners_up": [{"layout": c.layout.name, "days": round(c.days, 2), "mfu": round(c.step.mfu, 4),
                            "why": why} for c, why in result.runners_up],
        })
    if rows is not None:
        out["sensitivity"] = [dataclasses.asdict(r) for r in rows]
    if modes is not None:
        out["recovery_modes"] = [{**dataclasses.asdict(m), "label": describe(m.mode)} for m in modes]
    if verified is not None:
        out["verify"] = verified
    return out


# -- the plan against the trainer -------------------------------------------------------------------------

VERIFY_TIMEOUT_S = 1800.0  # one rank of one layout; 405B's pipeline rank took about 6 minutes on two shared cores


def verify_ranks(layout: Layout, shape: ModelShape) -> list[tuple[int, int, str]]:
    """(global rank, pipeline rank, role) of the ranks with the most memory: the first pipeline stage's and the
    one holding the output layer (the same rank without a pipeline, or under ZB-V); the rank at the other mesh
    coordinates 0 (the mesh is pp × dp_replicate × dp_shard × tp, tasks/train/parallel_dims.py)."""
    per_pp_rank = layout.world // layout.pp
    output = layout.split(shape).output_rank
    if output == 0:
        return [(0, 0, "first stage, output layer")]
    return [(0, 0, "first stage"), (output * per_pp_rank, output, "output layer")]


def verify_command(inputs: PlanInputs, layout: Layout, rank: int) -> list[str]:
    """``python -m tasks.train.main --dry-run --simulate-world`` for one rank of ``layout`` as the plan trains it."""
    sets = {"model_preset": inputs.model, **{f"model.{k}": v for k, v in inputs.model_sets}}
    if inputs.vocab_size:
        sets["model.vocab_size"] = inputs.vocab_size
    sets.update(layout.trainer_overrides(inputs.global_seqs, inputs.seq_len, inputs.timing.compiled_recompute))
    command = [sys.executable, "-m", "tasks.train.main", "--dry-run", "--simulate-world", str(layout.world),
               "--rank", str(rank)]
    for key, value in sets.items():
        command += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return command


def verify(result: Plan, layouts: int = 0, timeout_s: float = VERIFY_TIMEOUT_S) -> list[dict]:
    """The chosen layout and the runners-up (the first ``layouts`` of them; 0: all), each busiest rank built and
    stepped by smelt's trainer on fake tensors: ``{layout, rank, role, simulated_peak_gb, planned_peak_gb,
    difference, seconds}``, or ``error`` where the trainer cannot build or step it. The planned peak is the plan's
    figure for that rank less its fixed runtime allowance (CUDA context, NCCL, workspaces), which no tensor holds."""
    i = result.inputs
    if not result.best:
        return []
    if i.hf_config is not None or not i.smelt_trainer:
        raise ValueError("--verify checks smelt's trainer on a preset model (no --model-config, --stack smelt)")
    chosen = [result.best.layout] + [c.layout for c, _ in result.runners_up]
    entries = []
    for layout in chosen[:layouts or None]:
        microbatches = layout.microbatches(i.global_seqs)
        for rank, pp_rank, role in verify_ranks(layout, i.shape):
            planned = rank_memory(i.shape, layout, i.gpu, microbatches, pp_rank, i.memory)
            entry = {"layout": layout.name, "rank": rank, "pp_rank": pp_rank, "role": role,
                     "planned_peak_gb": round((planned.total - planned.runtime) / GB, 3)}
            started = time.perf_counter()
            logger.info("verify: %s rank %d (%s)", layout.name, rank, role)
            try:
                done = subprocess.run(verify_command(i, layout, rank), capture_output=True, text=True,
                                      timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                entry.update(error=f"no answer in {timeout_s:g} s", seconds=round(timeout_s, 1))
                entries.append(entry)
                continue
            entry["seconds"] = round(time.perf_counter() - started, 1)
            if done.returncode:
                lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
                entry["error"] = lines[-1] if lines else f"exit status {done.returncode}"
            else:
                simulated = json.loads(done.stdout)["simulated"]
                entry.update(simulated_peak_gb=simulated["peak_gb"], simulated_gb=simulated["by_category_gb"],
                             difference=round(simulated["peak_gb"] / entry["planned_peak_gb"] - 1, 4),
                             cpu_seconds=simulated["cpu_seconds"])
            entries.append(entry)
    return entries
