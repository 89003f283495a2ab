"""`smelt plan` and `smelt simulate`: typer-annotated functions that flows/cli.py registers.

Both print rich tables, or exactly one JSON object with ``--json``. Bad inputs (unknown GPU or model,
a GPU count that is not whole nodes) raise ``typer.BadParameter``: one line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.catalogue import gpu as lookup_gpu
from infra.catalogue import parse_overrides
from infra.launch.job import launch_command
from infra.layout import parse_layout, trainer_gaps
from infra.memory import GB, MemoryAssumptions
from infra.models import parse_model_set
from infra.planner import ModeRow, Plan, PlanInputs, SensitivityRow, plan, recovery_modes, sensitivity, to_dict, verify
from infra.recovery import DEFAULT_RECOVERY, NOT_IN_SMELT, NOT_IN_SMELT_REPLICAS, RECOVERY_MODES, describe
from infra.recovery_figures import DETECTION_S, PROCESS_GROUP_INIT_S
from infra.replica_figures import RECONFIGURE_S
from infra.reliability import LLAMA3_MTBF_GPU_HOURS, FailureAssumptions
from infra.simulate import DISTRIBUTIONS, RunModel, percentiles, simulate
from infra.simulate import plot as plot_simulation
from infra.timing import PART_LABELS, TimingAssumptions
from infra.stacks import FITTED, STACKS, stack_assumptions
from infra.validation import summary as validation_summary
from infra.validation import table as validation_table
from infra.validation_report import as_dict as validation_dict
from infra.validation_report import render as render_validation

ModelOpt = Annotated[str, typer.Option(help="Model preset from tasks/model_config.py (tiny … 405b).")]
TokensOpt = Annotated[float, typer.Option(help="Training tokens.")]
GpusOpt = Annotated[int, typer.Option(help="GPUs training at once (whole nodes; spares are added on top).")]
GpuOpt = Annotated[str, typer.Option(help="GPU type: a100, h100, h200, b200.")]
DaysOpt = Annotated[float, typer.Option(help="Deadline in days.")]
BudgetOpt = Annotated[float, typer.Option(help="Budget in dollars.")]
SeqOpt = Annotated[int, typer.Option(help="Sequence length.")]
BatchOpt = Annotated[float, typer.Option(help="Global batch in tokens (16M = 2,048 × 8,192, as Llama 3).")]
VocabOpt = Annotated[int, typer.Option(help="Vocabulary size for presets without one (0: the preset's).")]
PriceOpt = Annotated[Optional[float], typer.Option(help="Dollars per GPU-hour (default: the catalogue's).")]
EffOpt = Annotated[Optional[float], typer.Option(
    "--efficiency", help="Fraction of peak the math reaches (default: the GPU's calibrated value).")]
MtbfOpt = Annotated[float, typer.Option(help="Mean GPU-hours between job-stopping failures, per GPU "
                                             "(default from Llama 3: 419 in 54 days on 16,384 GPUs).")]
RestartOpt = Annotated[float, typer.Option(
    help="Minutes of a full relaunch after a failure: detect, replace the node, restart every rank, rendezvous "
         "(storage and snapshot recovery; in-process only when no spare node is free).")]
RecoveryOpt = Annotated[str, typer.Option(
    help="How the trainer comes back from a failure: storage (relaunch, load the storage checkpoint), snapshot "
         "(relaunch, restore the last step from a peer's memory: what smelt's trainer does), in-process (keep "
         f"the healthy ranks; {NOT_IN_SMELT}), or replicas (dp_replicate torchft groups: only the failed group "
         f"restarts and heals from a peer; {NOT_IN_SMELT_REPLICAS}). infra/recovery.py, infra/replica_recovery.py")]
ReconfigureOpt = Annotated[float, typer.Option(
    "--replica-reconfigure-seconds", help="With --recovery replicas: seconds to rebuild the cross-group process "
                                          "group for a new quorum (an assumption; infra/replica_figures.py).")]
ReplicaLinkOpt = Annotated[float, typer.Option(
    "--replica-allreduce-gbps", help="With --recovery replicas: GB/s of the cross-group all-reduce per rank (0: the "
                                     "GPU's inter-node link, as torchft's ProcessGroupNCCL would reach).")]
DetectionOpt = Annotated[float, typer.Option(
    "--detection-seconds", help="Mean seconds from a failure to the job knowing (infra/recovery_figures.py).")]
PgInitOpt = Annotated[float, typer.Option(
    "--process-group-init-seconds", help="Seconds to build the NCCL process groups again at this scale.")]
PlannedOpt = Annotated[float, typer.Option(help="Planned maintenance restarts per day.")]
StorageOpt = Annotated[float, typer.Option(help="Aggregate checkpoint storage bandwidth, GB/s.")]
GpuSetOpt = Annotated[Optional[list[str]], typer.Option(
    "--gpu-set", help="Override a catalogue field: field=value, e.g. memory_gb=96 (repeatable).")]
SchedulesOpt = Annotated[str, typer.Option(help="Pipeline schedules the search may use, comma-separated.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
LayoutOpt = Annotated[Optional[str], typer.Option(
    help="Score exactly this layout instead of searching, e.g. tp=8,pp=4,dp=64,cp=1,mb=1,ac=selective,schedule=1F1B "
         "(also vp, dp_shard, zero, split).")]
PrecisionOpt = Annotated[str, typer.Option(help="bf16, or fp8: the linear layers' GEMMs in FP8 (TE / torchao).")]
ModelSetOpt = Annotated[Optional[list[str]], typer.Option(
    "--model-set",
    help="Model shape overrides: dim=…,layers=…,heads=…,kv_heads=…,ffn=…,vocab=…,tied=… (repeatable).")]
ModelConfigOpt = Annotated[Optional[Path], typer.Option(
    help="A Hugging Face config.json to take the model shape from (instead of --model).")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile", help="Plan for the trainer with parallel.compile=true: each block compiled, so full "
                      "recomputation does not rerun the block's last matmul (infra/README.md).")]
StackOpt = Annotated[str, typer.Option(
    help="Whose software runs the layouts: smelt (its trainer), or a stack of the validation table "
         "(" + ", ".join(STACKS) + "): that system's timing and memory model with the fitted constants, as it "
              "scores published runs (infra/validation.py).")]
HeadroomOpt = Annotated[float, typer.Option(
    help="Fraction of GPU memory kept free for the allocator's fragmentation (0 judges a layout against the "
         "whole device, as the validation table judges published runs).")]
ValidateOpt = Annotated[bool, typer.Option(
    "--validate", help="Print the planner's error against published runs (infra/validation.py) and exit.")]
VerifyOpt = Annotated[bool, typer.Option(
    "--verify", help="Build and step the busiest ranks (first pipeline stage, output layer) of the chosen layout and "
                     "the runners-up with smelt's trainer on fake tensors, and compare their peak memory with the "
                     "plan's (minutes per rank; tasks/train/simulate_world.py).")]
VerifyLayoutsOpt = Annotated[int, typer.Option(
    help="With --verify: how many layouts to check, the chosen one first (0: it and every runner-up).")]
ALL_SCHEDULES = "1F1B,Interleaved1F1B,ZBVZeroBubble"


def _inputs(model: str, tokens: float, gpus: int, gpu: str, days: float, budget: float, seq_len: int,
            global_batch_tokens: float, vocab_size: int, price: Optional[float], efficiency: Optional[float],
            mtbf_gpu_hours: float, restart_minutes: float, planned_per_day: float, storage_gbps: float,
            gpu_set: Optional[list[str]], pp_schedules: str, precision: str = "bf16",
            model_set: Optional[list[str]] = None, model_config: Optional[Path] = None,
            compile: bool = False, stack: str = "smelt",
            memory_headroom: float = MemoryAssumptions().headroom, recovery: str = DEFAULT_RECOVERY,
            detection_seconds: float = DETECTION_S.value,
            process_group_init_seconds: float = PROCESS_GROUP_INIT_S.value,
            replica_reconfigure_seconds: float = RECONFIGURE_S.value, replica_allreduce_gbps: float = 0.0) -> PlanInputs:
    """Validate the options into PlanInputs; every user mistake becomes typer.BadParameter."""
    try:
        overrides = parse_overrides(gpu_set or [])
        if price is not None:
            overrides["price_per_hour"] = price
        device = lookup_gpu(gpu, **overrides)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--gpu/--gpu-set/--price") from None
    if stack != "smelt" and stack not in STACKS:
        raise typer.BadParameter(f"unknown stack {stack!r}; choose smelt or one of {', '.join(STACKS)}",
                                 param_hint="--stack")
    if recovery not in RECOVERY_MODES:
        raise typer.BadParameter(f"unknown recovery {recovery!r}; choose one of {', '.join(RECOVERY_MODES)}",
                                 param_hint="--recovery")
    if not 0 <= memory_headroom < 1:
        raise typer.BadParameter(f"must be in [0, 1), got {memory_headroom}", param_hint="--memory-headroom")
    if stack != "smelt" and compile:
        raise typer.BadParameter("--compile plans smelt's trainer; a validation stack says itself whether it "
                                 "compiles", param_hint="--compile/--stack")
    try:
        if stack == "smelt":
            timing = TimingAssumptions(compute=efficiency, compiled_recompute=compile)
            memory = MemoryAssumptions(headroom=memory_headroom)
            zero_stages, model_parallel = (), True  # the trainer's (PlanInputs' defaults)
        else:
            timing, memory = stack_assumptions(STACKS[stack], device, headroom=memory_headroom)
            if efficiency is not None:
                timing = dataclasses.replace(timing, compute=efficiency)
            zero_stages, model_parallel = STACKS[stack].zero_stages, STACKS[stack].model_parallel
        schedules = tuple(n.strip() for n in pp_schedules.split(",") if n.strip())
        if not memory.torch_pipelining and "ZBVZeroBubble" in schedules:  # torch.distributed.pipelining's
            schedules = tuple(n for n in schedules if n != "ZBVZeroBubble")
            if not schedules:
                raise typer.BadParameter(f"stack {stack} has no ZBVZeroBubble schedule; choose 1F1B or "
                                         "Interleaved1F1B", param_hint="--pp-schedules")
        failures = FailureAssumptions(mtbf_gpu_hours=mtbf_gpu_hours, restart_minutes=restart_minutes,
                                      planned_per_day=planned_per_day, storage_gbps=storage_gbps, recovery=recovery,
                                      detection_s=detection_seconds, process_group_init_s=process_group_init_seconds,
                                      replica_reconfigure_s=replica_reconfigure_seconds,
                                      replica_allreduce_gbps=replica_allreduce_gbps)
        return PlanInputs(model=model, tokens=tokens, gpus=gpus, gpu=device, days=days, budget=budget,
                          seq_len=seq_len, global_batch_tokens=global_batch_tokens, vocab_size=vocab_size,
                          model_sets=tuple(parse_model_set(model_set or []).items()), hf_config=model_config,
                          precision=precision.lower(),
                          pp_schedules=schedules,
                          timing=timing, memory=memory, failures=failures, stack=stack, zero_stages=zero_stages,
                          model_parallel=model_parallel)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def plan_command(
    model: ModelOpt = "70b", tokens: TokensOpt = 15e12, gpus: GpusOpt = 4096, gpu: GpuOpt = "h100",
    days: DaysOpt = 60, budget: BudgetOpt = 11e6, seq_len: SeqOpt = 8192, global_batch_tokens: BatchOpt = 2**24,
    vocab_size: VocabOpt = 0, price: PriceOpt = None, efficiency: EffOpt = None,
    mtbf_gpu_hours: MtbfOpt = round(LLAMA3_MTBF_GPU_HOURS), restart_minutes: RestartOpt = 10.0,
    planned_per_day: PlannedOpt = 0.0, storage_gbps: StorageOpt = 500.0, gpu_set: GpuSetOpt = None,
    pp_schedules: SchedulesOpt = ALL_SCHEDULES, json_out: JsonOpt = False, layout: LayoutOpt = None,
    precision: PrecisionOpt = "bf16", model_set: ModelSetOpt = None, model_config: ModelConfigOpt = None,
    validate: ValidateOpt = False, compile: CompileOpt = False, stack: StackOpt = "smelt",
    memory_headroom: HeadroomOpt = MemoryAssumptions().headroom, recovery: RecoveryOpt = DEFAULT_RECOVERY,
    detection_seconds: DetectionOpt = DETECTION_S.value, process_group_init_seconds: PgInitOpt = PROCESS_GROUP_INIT_S.value,
    verify_plan: VerifyOpt = False, verify_layouts: VerifyLayoutsOpt = 0,
    replica_reconfigure_seconds: ReconfigureOpt = RECONFIGURE_S.value, replica_allreduce_gbps: ReplicaLinkOpt = 0.0,
) -> None:
    """Pick the fastest 3D layout that fits (or score --layout), and say whether the run meets the deadline
    and the budget."""
    if validate:
        rows = validation_table()
        print(json.dumps(validation_dict(rows)) if json_out else render_validation(rows))
        return
    inputs = _inputs(model, tokens, gpus, gpu, days, budget, seq_len, global_batch_tokens, vocab_size, price,
                     efficiency, mtbf_gpu_hours, restart_minutes, planned_per_day, storage_gbps, gpu_set,
                     pp_schedules, precision, model_set, model_config, compile, stack, memory_headroom, recovery,
                     detection_seconds, process_group_init_seconds, replica_reconfigure_seconds,
                     replica_allreduce_gbps)
    given = None
    if layout:
        try:
            given = parse_layout(layout, gpus, inputs.precision)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--layout") from None
    precision = given.precision if given else inputs.precision
    if not inputs.smelt_trainer and precision == "fp8" and STACKS[stack].fp8_constant not in FITTED:
        fp8_stacks = ", ".join(n for n, st in STACKS.items() if st.fp8_constant in FITTED)
        raise typer.BadParameter(f"stack {stack} has no FP8 speed-up fitted (its published runs are bf16); FP8 "
                                 f"stacks: {fp8_stacks}", param_hint="--precision/--stack")
    result = plan(inputs, given)
    errors = validation_summary(validation_table())  # a stack's own system's held-out mean, or all systems'
    error = (errors["held_out_mean_abs_error"] if inputs.smelt_trainer
             else errors["per_system_mean_abs_error"][STACKS[stack].system_name])
    rows = sensitivity(result, planner_error=error)
    modes = recovery_modes(result)
    verified = None
    if verify_plan:
        if verify_layouts < 0:
            raise typer.BadParameter("must be 0 (all) or more", param_hint="--verify-layouts")
        try:
            verified = verify(result, verify_layouts)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--verify") from None
    if json_out:
        print(json.dumps(to_dict(result, rows, modes, verified)))
        return
    render_plan(result, rows, Console(), modes)
    if verified is not None:
        render_verify(verified, Console())


def simulate_command(
    model: ModelOpt = "70b", tokens: TokensOpt = 15e12, gpus: GpusOpt = 4096, gpu: GpuOpt = "h100",
    days: DaysOpt = 60, budget: BudgetOpt = 11e6, seq_len: SeqOpt = 8192, global_batch_tokens: BatchOpt = 2**24,
    vocab_size: VocabOpt = 0, price: PriceOpt = None, efficiency: EffOpt = None,
    mtbf_gpu_hours: MtbfOpt = round(LLAMA3_MTBF_GPU_HOURS), restart_minutes: RestartOpt = 10.0,
    planned_per_day: PlannedOpt = 0.0, storage_gbps: StorageOpt = 500.0, gpu_set: GpuSetOpt = None,
    pp_schedules: SchedulesOpt = ALL_SCHEDULES,
    runs: Annotated[int, typer.Option(help="Simulated runs.")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same answer).")] = 0,
    distribution: Annotated[str, typer.Option(help="Time between failures: exponential or weibull.")] = "exponential",
    weibull_shape: Annotated[float, typer.Option(help="Weibull shape (< 1: failures cluster).")] = 0.7,
    plot: Annotated[Optional[Path], typer.Option(help="Write histograms of days, cost, interruptions to this PNG.")] = None,
    json_out: JsonOpt = False, recovery: RecoveryOpt = DEFAULT_RECOVERY,
) -> None:
    """Plan, then replay the run many times with random failures: the spread of days, dollars, interruptions."""
    if distribution not in DISTRIBUTIONS:
        raise typer.BadParameter(f"choose one of {', '.join(DISTRIBUTIONS)}", param_hint="--distribution")
    if runs < 1 or weibull_shape <= 0:
        raise typer.BadParameter("--runs must be ≥ 1 and --weibull-shape > 0")
    if recovery == "replicas":
        raise typer.BadParameter("smelt simulate replays whole-job restarts; plan replica groups with smelt plan "
                                 "--recovery replicas", param_hint="--recovery")
    inputs = _inputs(model, tokens, gpus, gpu, days, budget, seq_len, global_batch_tokens, vocab_size, price,
                     efficiency, mtbf_gpu_hours, restart_minutes, planned_per_day, storage_gbps, gpu_set,
                     pp_schedules, recovery=recovery)
    result = plan(inputs)
    summary = simulation_summary(result, runs, seed, distribution, weibull_shape, plot)
    if json_out:
        print(json.dumps(summary))
        return
    render_simulation(result, summary, Console())


def simulation_summary(result: Plan, runs: int, seed: int, distribution: str, weibull_shape: float,
                       plot: Optional[Path]) -> dict:
    """The JSON answer of `smelt simulate`: verdict keys from the median run, then the distributions."""
    out = {k: v for k, v in to_dict(result).items()
           if k in ("layout", "mfu", "checkpoint_interval_min", "inputs", "recovery")}
    best = result.best
    if best is None:
        return {**out, "feasible": False, "days": None, "gpu_hours": None, "cost_usd": None, "goodput": None,
                "reasons": result.reasons()}
    r, i = best.reliability, result.inputs
    train_s = i.tokens / best.step.tokens_per_s
    interval, blocking, commit = r.recovery_point  # snapshot modes: the per-step snapshots (disasters not replayed)
    model = RunModel(work_s=train_s, interval_s=interval, blocking_s=blocking,
                     commit_s=commit, restart_s=r.restart_s, mtbf_s=r.mtbf_s,
                     planned_per_s=r.planned_per_s, distribution=distribution, weibull_shape=weibull_shape)
    sim = simulate(model, runs=runs, seed=seed)
    gpus_paid = best.layout.world + r.spare_gpus
    cost_per_s = gpus_paid * i.gpu.price_per_hour / 3600
    days, cost = sim.wall_s / 86400, sim.wall_s * cost_per_s
    ok = (days <= i.days) & (cost <= i.budget)
    if plot is not None:
        plot_simulation(sim, str(plot), cost_per_s, i.days, i.budget)
    p50 = float(percentiles(sim.wall_s)["p50"])
    return {
        **out,
        "feasible": bool(float(ok.mean()) >= 0.5),
        "days": round(p50 / 86400, 2),
        "gpu_hours": round(p50 / 3600 * gpus_paid),
        "cost_usd": round(p50 * cost_per_s),
        "goodput": round(float(sim.goodput.mean()), 4),
        "p_meets_deadline": round(float((days <= i.days).mean()), 4),
        "p_within_budget": round(float((cost <= i.budget).mean()), 4),
        "p_feasible": round(float(ok.mean()), 4),
        "days_dist": {k: round(v, 2) for k, v in percentiles(days).items()},
        "cost_usd_dist": {k: round(v) for k, v in percentiles(cost).items()},
        "interruptions_dist": {k: round(v, 1) for k, v in percentiles(sim.interruptions.astype(float)).items()},
        "closed_form": {"days": round(best.days, 2), "goodput": round(r.goodput, 4),
                        "interruptions": round(r.interruptions(best.wall_s), 1), "cost_usd": round(best.cost)},
        "runs": runs, "seed": seed, "distribution": distribution,
        "weibull_shape": weibull_shape if distribution == "weibull" else None,
        "plot": str(plot) if plot is not None else None,
    }


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return table


def _money(x: float) -> str:
    return f"${x / 1e6:,.2f}M" if x >= 1e6 else f"${x / 1e3:,.1f}k" if x >= 1e3 else f"${x:,.0f}"


def _count(x: float) -> str:
    """15e12 → '15T', 2e11 → '200B', 5.3e6 → '5.3M'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:,.0f}"


def render_plan(result: Plan, rows: list[SensitivityRow], console: Console, modes: list[ModeRow] | None = None) -> None:
    i, best = result.inputs, result.best
    console.print(f"[bold]smelt plan[/bold]: {i.model} on {i.gpus:,} × {i.gpu.label}, {_count(i.tokens)} tokens, "
                  f"deadline {i.days:g} days, budget {_money(i.budget)} at ${i.gpu.price_per_hour:.2f}/GPU-hour")
    verdict = "[green]FEASIBLE[/green]" if result.feasible else "[red]NOT FEASIBLE[/red]"
    console.print(f"verdict: {verdict}" + "".join(f"\n  - {reason}" for reason in result.reasons()))
    console.print(f"recovery: {describe(i.failures.recovery)}" + (" (what smelt's trainer does)"
                                                                  if i.failures.recovery == "snapshot" else ""))
    flips = [row for row in rows if row.factor == "planner error" and row.feasible != result.feasible]
    if flips:
        console.print(f"  [yellow]the verdict flips at {', '.join(row.setting for row in flips)}: within the "
                      "planner's held-out mean error (python -m infra.validation_report)[/yellow]")
    if best is None:
        _render_rejections(result, console)
        return
    L, r = best.layout, best.reliability

    t = _table("Verdict", "", "value", "limit")
    t.add_row("days", f"{best.days:.1f}", f"{i.days:g}")
    t.add_row("cost", _money(best.cost), _money(i.budget))
    t.add_row("GPU-hours (incl. spares)", _count(best.gpu_hours), "")
    t.add_row("break-even price", f"${result.break_even_price:.2f}/GPU-h", f"${i.gpu.price_per_hour:.2f}")
    t.add_row("MFU (model FLOPs / dense bf16 peak)", f"{best.step.mfu:.1%}", "")
    per_gpu = best.step.tokens_per_s / best.layout.world
    t.add_row("tokens/s (per GPU)", f"{_count(best.step.tokens_per_s)} ({per_gpu:,.0f})", "")
    t.add_row("step time", f"{best.step.total:.2f} s", "")
    t.add_row("peak memory per GPU", f"{best.memory.total / GB:.1f} GB", f"{best.memory.usable / GB:.1f} GB usable")
    console.print(t)
    gaps = trainer_gaps(best.layout) if i.smelt_trainer else []
    if gaps:
        console.print("smelt's trainer cannot run this layout yet: " + ", ".join(gaps))
    if not i.smelt_trainer:
        console.print(f"scored as {STACKS[i.stack].label} runs it (--stack {i.stack}; infra/stacks.py)")

    t = _table(f"Layout: {L.name}", "", "value")
    m = L.microbatches(i.global_seqs)
    t.add_row("tensor parallel (in node, + sequence parallel)", str(L.tp))
    if L.cp > 1:
        t.add_row("context parallel (ring attention)", f"{L.cp} (seq {i.seq_len:,} → {i.seq_len // L.cp:,} per rank)")
    t.add_row("precision", L.precision + (" (linear GEMMs in FP8)" if L.precision == "fp8" else ""))
    t.add_row("pipeline stages / schedule", f"{L.pp} / {L.pp_schedule}"
              + (f" ({L.virtual_stages} virtual)" if L.virtual_stages > 1 else ""))
    t.add_row("data parallel: shard × replicate", f"{L.dp_shard} × {L.dp_replicate}")
    t.add_row("ZeRO stage", str(L.zero))
    t.add_row("micro-batch × micro-batches per step", f"{L.micro_batch} × {m} (global {i.global_seqs} seqs)")
    t.add_row("activation checkpointing", L.activation_checkpoint)
    console.print(t)
    if i.smelt_trainer:
        overrides = L.trainer_overrides(i.global_seqs, i.seq_len, i.timing.compiled_recompute)
        console.print("trainer: " + " ".join(f"--set {k}={v}" for k, v in overrides.items()), soft_wrap=True)
        per_node = i.gpu.gpus_per_node
        console.print("launch: " + launch_command("slurm", i.gpus // per_node, per_node, per_node,
                                                    {"model_preset": i.model, **overrides}), soft_wrap=True)

    if not result.given:
        t = _table("Runners-up (best of each tp·pp·AC family)", "layout", "days", "MFU", "why it loses")
        for candidate, why in result.runners_up:
            t.add_row(candidate.layout.name, f"{candidate.days:.1f}", f"{candidate.step.mfu:.1%}", why)
        console.print(t)
        _render_rejections(result, console)

    t = _table("Memory per GPU (busiest rank)", "", "GB")
    for key, value in best.memory.as_dict().items():
        t.add_row(key.removesuffix("_gb").replace("_", " "), f"{value:.1f}")
    console.print(t)

    t = _table(f"Step time ({best.step.total:.2f} s, MFU {best.step.mfu:.1%})", "", "s/step", "share")
    for key, value in best.step.parts().items():
        t.add_row(PART_LABELS[key], f"{value:.3f}", f"{value / best.step.total:.1%}")
    console.print(t)

    t = _table(f"Failures and checkpoints (recovery: {describe(r.recovery)})", "", "value")
    t.add_row("cluster MTBF", f"{r.mtbf_s / 3600:.1f} h")
    if r.snapshot is not None:
        snap = r.snapshot
        t.add_row("snapshot (host memory + a peer node)", f"every {snap.interval_s:.2f} s, "
                                                          f"{snap.bytes_per_rank / GB:.2f} GB/rank")
        t.add_row("snapshot copy / acknowledged after", f"{snap.copy_s:.2f} s / {snap.commit_s:.2f} s")
        t.add_row("step blocked by snapshots", f"{snap.blocking_s:.2f} s ({snap.blocking_s / snap.interval_s:.1%})")
        t.add_row("disaster: a node + its replica lost", f"p = {r.disaster_probability:.1e} per failure")
    if r.replicas is not None:
        c = r.replicas
        t.add_row("replica groups (torchft)", f"{c.groups} × {L.world // c.groups:,} GPUs")
        t.add_row("step overhead: quorum + all-reduce + commit",
                  f"{c.overhead.quorum_s * 1e3:.1f} + {c.overhead.allreduce_s * 1e3:.1f} + {c.overhead.commit_s * 1e3:.1f} "
                  f"ms ({c.overhead.total / c.step_s:.2%})")
        t.add_row("step while a group is away", f"× {c.slowdown:.3g} ({c.microbatches} micro-batch(es) per rank)")
        t.add_row("failed group away (detect, relaunch, heal, rejoin)",
                  " + ".join(f"{p.seconds:,.0f}" for p in c.away) + f" = {c.away_s:,.0f} s")
        t.add_row("every group lost (storage restart)", f"p = {r.disaster_probability:.1e} per failure")
    kind = "storage checkpoint interval (Daly" + (")" if r.snapshot is None else " vs disasters)")
    t.add_row("checkpoint size", f"{r.checkpoint.size_bytes / GB:,.0f} GB")
    t.add_row("save blocks / commits after", f"{r.checkpoint.blocking_s:.1f} s / {r.checkpoint.commit_s:.1f} s")
    t.add_row(kind, f"{r.interval_s / 60:,.1f} min = {r.interval_steps:,} steps")
    t.add_row("restart" + (" (the failed group's)" if r.replicas is not None else ""), f"{r.restart_s / 60:.1f} min")
    t.add_row("lost per failure", f"{r.lost_per_failure_s / 60:.1f} min")
    for part in r.parts:
        t.add_row(f"  {part.name}", f"{part.seconds:,.1f} s")
    t.add_row("expected interruptions", f"{r.interruptions(best.wall_s):.0f}")
    t.add_row("goodput", f"{r.goodput:.1%}")
    t.add_row("spare GPUs", f"{r.spare_gpus}")
    console.print(t)
    console.print(f"recovery: {describe(r.recovery)}; decided by " + ", ".join(
        f"{p.name} ({p.seconds:,.0f} s)" for p in r.deciding()) + " per failure (sources: infra/recovery_figures.py"
        + (", infra/replica_figures.py)" if r.replicas is not None else ")"),
        soft_wrap=True)

    if modes:
        t = _table("Recovery modes, same layout (storage: smelt before snapshots)", "mode", "restart min",
                   "lost min", "goodput", "days", "cost", "feasible")
        t.columns[0].no_wrap = False
        for m in modes:
            label = describe(m.mode) + (f" on {m.layout}" if m.layout != L.name else "")
            t.add_row(label + (" (this plan)" if m.mode == r.recovery else ""), f"{m.restart_s / 60:.1f}",
                      f"{m.lost_per_failure_s / 60:.1f}", f"{m.goodput:.1%}", f"{m.days:.1f}", _money(m.cost),
                      "yes" if m.feasible else "no")
        console.print(t)

    t = _table("Sensitivity (GPU count and schedules re-plan; the rest keep the layout)", "factor", "setting", "days",
               "cost", "feasible")
    for row in rows:
        setting = row.setting + (f" → {row.layout}" if row.layout and row.layout != L.name else "")
        t.add_row(row.factor, setting, f"{row.days:.1f}" if row.days else "-",
                  _money(row.cost) if row.cost else "-", "yes" if row.feasible else "no")
    console.print(t)


def render_verify(entries: list[dict], console: Console) -> None:
    t = _table("Plan against the trainer (one rank built and stepped on fake tensors; GB without the runtime "
               "allowance)", "layout", "rank", "simulated", "planned", "difference", "seconds")
    for e in entries:
        if "error" in e:
            t.add_row(e["layout"], f"{e['rank']} ({e['role']})", "-", f"{e['planned_peak_gb']:.1f}",
                      f"[red]{escape(e['error'])}[/red]", f"{e['seconds']:.0f}")
            continue
        flag = "" if abs(e["difference"]) <= 0.10 else "[red] > 10%[/red]"
        t.add_row(e["layout"], f"{e['rank']} ({e['role']})", f"{e['simulated_peak_gb']:.1f}",
                  f"{e['planned_peak_gb']:.1f}", f"{e['difference']:+.1%}{flag}", f"{e['seconds']:.0f}")
    console.print(t)


def _render_rejections(result: Plan, console: Console) -> None:
    t = _table(f"Rejected layouts ({sum(result.rejections.counts.values())} of {result.evaluated})",
               "reason", "count", "closest example")
    for reason, count in sorted(result.rejections.counts.items(), key=lambda kv: -kv[1]):
        t.add_row(reason, str(count), result.rejections.examples[reason])
    console.print(t)


def render_simulation(result: Plan, summary: dict, console: Console) -> None:
    i = result.inputs
    console.print(f"[bold]smelt simulate[/bold]: {i.model} on {i.gpus:,} × {i.gpu.label}, {summary['runs']} runs, "
                  f"{summary['distribution']} failures")
    if result.best is None:
        console.print("[red]no layout fits[/red]: " + "; ".join(summary["reasons"]))
        return
    console.print(f"layout {summary['layout']}, MFU {summary['mfu']:.1%}, recovery {summary['recovery']}, storage "
                  f"checkpoint every {summary['checkpoint_interval_min']:.1f} min")
    t = _table("Distribution over runs", "", "p10", "p50", "p90", "mean", "closed form")
    d, c, n = summary["days_dist"], summary["cost_usd_dist"], summary["interruptions_dist"]
    cf = summary["closed_form"]
    t.add_row("days", *(f"{d[k]:.1f}" for k in ("p10", "p50", "p90", "mean")), f"{cf['days']:.1f}")
    t.add_row("cost", *(_money(c[k]) for k in ("p10", "p50", "p90", "mean")), _money(cf["cost_usd"]))
    t.add_row("interruptions", *(f"{n[k]:.0f}" for k in ("p10", "p50", "p90", "mean")), f"{cf['interruptions']:.0f}")
    console.print(t)
    console.print(f"goodput {summary['goodput']:.1%} (closed form {cf['goodput']:.1%}); "
                  f"P(days ≤ {i.days:g}) = {summary['p_meets_deadline']:.0%}, "
                  f"P(cost ≤ {_money(i.budget)}) = {summary['p_within_budget']:.0%}, "
                  f"both = {summary['p_feasible']:.0%}")
    if summary["plot"]:
        console.print(f"plot written to {summary['plot']}")
