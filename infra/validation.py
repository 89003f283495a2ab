"""The planner against published training runs: each row is a run as its authors published it, scored by
``infra.planner.evaluate`` with the layout they ran, next to the throughput they reported.

The runs are ``infra.published_runs``' ``RUNS``, the stacks and fitted constants ``infra.stacks``'; this module scores
and fits. ``python -m infra.validation_report`` (or ``smelt plan --validate``) prints the table and the error
summary; ``--json`` prints one JSON object. infra/README.md discusses the result.

How a row is scored:
- The model shape, GPU, GPU count, sequence length, global batch, precision and every published layout
  degree are used as published. Inputs a source does not publish (the micro-batch size, the virtual
  pipeline stages, the recomputation) are searched: the fastest combination that fits in memory, as the
  planner would pick it. Each row says which inputs were searched.
- A *stack* is the software that ran the run. It sets what the memory model counts (``saves``: torch's
  autograd saves or Megatron/Transformer Engine's) and whether tensor-parallel collectives overlap compute
  (Megatron's ``--tp-comm-overlap``, torchtitan's async TP).
- Throughput published as model TFLOP/s or MFU is turned into tokens/s with smelt's FLOPs per token
  (6N + 12·L·H·Q·T, the count Megatron, NeMo and torchtitan use for dense decoders).
- GPT/MPT blocks (a two-matrix GELU MLP of width 4h) are counted as a SwiGLU of the same parameters and FLOPs
  (width 8h/3, rounded to a multiple of 8), with untied output weights where the FLOPs count includes the
  logits (Megatron's formula does).

Fitted constants (``FITTED``), each solved on one stated row, in this order; every other row is a prediction:
- ``meta``, ``megatron``, ``llm-foundry``, ``torchtitan``: the fraction of the H100/H200 SXM dense bf16 peak a
  stack's GEMM math reaches when nothing waits on the network (kernel quality, fusion, launch overheads);
- ``attention``: attention's rate relative to the GEMMs' for FlashAttention-2 at 16K; other kernels (cuDNN's,
  under Transformer Engine) and call lengths scale by their measured speed (``infra.timing.attention_seconds``);
- ``fp8_te``, ``fp8_torchtitan``: how many times faster the FP8 linear GEMMs run than bf16 ones (datasheet: 2)
  under Transformer Engine and under torchao float8;
- ``fsdp1_layer_ms``: LLM Foundry's fixed cost per layer and pass (forward once, backward twice);
- ``a100``, ``h100-96gb-500w``: that GPU's efficiency relative to an H100 SXM under the same stack.
- ``cudnn_2403``: NeMo 24.03's cuDNN fused attention relative to the cuDNN curve in ``infra.timing``.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from infra.catalogue import gpu as lookup_gpu
from infra.layout import Layout, ModelShape, check_shape, even_interleavings, parse_layout
from infra.memory import GB, memory_per_rank
from infra.published_runs import RUNS, Run
from infra.stacks import FITTED, STACKS, stack_assumptions
from infra.timing import step_time

GIB = 2**30

# The order ``fit()`` solves infra.stacks.FITTED's constants in, each on the published row marked ``fits``.
FIT_ORDER = ("meta", "attention", "megatron", "fp8_te", "llm-foundry", "fsdp1_layer_ms", "a100",
             "torchtitan", "h100-96gb-500w", "fp8_torchtitan", "cudnn_2403", "async_tp")

@dataclass(frozen=True)
class Scored:
    run: Run
    layout: Layout | None
    tokens_per_gpu: float
    memory_gb: float
    fits: bool
    mfu: float

    @property
    def error(self) -> float:
        return self.tokens_per_gpu / self.run.published_tokens_per_gpu() - 1


def _layouts(run: Run, shape: ModelShape) -> list[Layout]:
    """The published layout, with each unpublished input (``run.search``) spread over its options."""
    base = parse_layout(run.layout, run.gpus, run.precision)
    options = {
        "mb": [mb for mb in (1, 2, 4, 8) if run.global_batch % (base.dp * mb) == 0],
        "vp": [1] if base.pp == 1 else even_interleavings(shape.cfg.n_layers, base.pp),
        "ac": ["none", "selective", "full"],
    }
    out = []
    for combo in itertools.product(*(options[k] if k in run.search else [None] for k in ("mb", "vp", "ac"))):
        mb, vp, ac = combo
        layout = base
        if mb is not None:
            layout = dataclasses.replace(layout, micro_batch=mb)
        if vp is not None:
            layout = dataclasses.replace(layout, virtual_stages=vp,
                                         pp_schedule="Interleaved1F1B" if vp > 1 else "1F1B")
        if ac is not None:
            layout = dataclasses.replace(layout, activation_checkpoint=ac)
        out.append(layout)
    return out


def score(run: Run, constants: dict[str, float] = FITTED) -> Scored:
    """Predicted tokens/s per GPU and peak memory for ``run`` with the given constants."""
    stack = STACKS[run.stack]
    shape = ModelShape(run.cfg, run.seq_len, gelu_mlp=run.gelu_mlp)
    device = lookup_gpu(run.gpu)
    # A published run shows that its layout fits the device; the planner's 10% margin is for new runs.
    timing, memory = stack_assumptions(stack, device, constants, tp_overlap=run.tp_overlap,
                                       fp8_all_gather=run.fp8_all_gather, headroom=0.0)
    best: Scored | None = None
    for layout in _layouts(run, shape):
        if check_shape(layout, shape, device.gpus_per_node, run.global_batch, trainer_only=False):
            continue
        mem = memory_per_rank(shape, layout, device, layout.microbatches(run.global_batch), memory)
        step = step_time(shape, layout, device, run.global_batch, timing)
        candidate = Scored(run, layout, step.tokens_per_s / layout.world, mem.total / GB, mem.fits, step.mfu)
        if best is None or (candidate.fits, candidate.tokens_per_gpu) > (best.fits, best.tokens_per_gpu):
            best = candidate
    if best is None:
        rejection = check_shape(_layouts(run, shape)[0], shape, device.gpus_per_node, run.global_batch, False)
        raise ValueError(f"{run.key}: published layout is invalid: {rejection.message}")
    return best


def _bisect(below: Callable[[float], bool], lo: float, hi: float, steps: int) -> tuple[float, float]:
    """Narrow [lo, hi] around the point where ``below`` turns from true to false."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if below(mid) else (lo, mid)
    return lo, hi


def fit(order: tuple[str, ...] = FIT_ORDER, tolerance: float = 1e-4, max_rounds: int = 50,
        fixed: dict[str, float] | None = None) -> dict[str, float]:
    """Solve each constant on its row by bisection (throughput rises with each), the others held. The
    constants interact (attention shares every row, torchtitan's three share two rows each, LLM Foundry's
    efficiency and its FSDP1 layer overhead share the MPT rows), so sweep the order until every fitted row
    is reproduced within ``tolerance``: a fixed number of sweeps can stop short (six left MPT-7B's H100 row
    0.2% off, and every held-out LLM Foundry row with it)."""
    ratios = ("attention", "a100", "h100-96gb-500w", "cudnn_2403")  # start at 1: relative to a reference
    constants = {name: 1.5 if name.startswith("fp8") else 1.0 if name in ratios else 0.5 for name in order}
    constants |= dict(fixed or {})
    rows = {name: next(r for r in RUNS if r.fits == name) for name in order}
    for _ in range(max_rounds):
        for name, run in rows.items():
            lo, hi = ((1.0, 3.0) if name.startswith("fp8") else (0.0, 10.0) if name.endswith("_ms")
                      else (0.0, 1.0) if name == "async_tp" else (0.1, 2.0))
            sign = -1 if name.endswith("_ms") else 1  # throughput falls as the overhead grows
            lo, hi = _bisect(lambda mid: sign * score(run, {**constants, name: mid}).error < 0, lo, hi, 40)
            constants[name] = round((lo + hi) / 2, 4)
        if max(abs(score(run, constants).error) for run in rows.values()) < tolerance:
            return constants
    raise RuntimeError(f"the fit did not reproduce its rows within {tolerance:.0e} in {max_rounds} sweeps")


WORST_BAR = 0.15  # issue 18's bar on the worst held-out row
CP_SWEEPS = ("titan-8b-8-cp", "titan-405b-512-cp")  # torchtitan's Tables 2 and 6: a rank's tokens fixed


def _worst(steps: list[float], cps: list[int], fixed: float, attention: float) -> float:
    return max(abs(t / (fixed + attention * c) - 1) for t, c in zip(steps, cps))


def _balanced_attention(steps: list[float], cps: list[int], fixed: float) -> float:
    """The attention work per unit of cp that best balances the rows' errors with ``fixed`` held: every
    row's predicted throughput rises as it falls, so bisect until the most over- and under-predicted rows
    miss by the same amount."""
    def tilt(a: float) -> float:
        ratios = [t / (fixed + a * c) for t, c in zip(steps, cps)]
        return max(ratios) + min(ratios) - 2
    if fixed > 0 and tilt(0.0) <= 0:
        return 0.0
    lo, hi = _bisect(lambda a: tilt(a) > 0, 0.0, 2 * max(t / c for t, c in zip(steps, cps)), 60)
    return (lo + hi) / 2


def cp_sweep_floor(rows: list[Scored], prefix: str, bar: float = WORST_BAR) -> dict:
    """How close a model can come to a published CP sweep that keeps a rank's tokens fixed as cp doubles.

    There a rank's step is fixed work F (linear layers, loss, collectives) plus attention work a·cp. smelt's
    prediction has this form, with F = 2·T(1) − T(2) from its own cp = 1 and 2 step times (F rests on the
    constants fitted on the source's rows without CP). Holding that F, the best a leaves ``floor``: no
    attention cost does better. An exchange exposed per ring step, b·(cp − 1), is (F − b) + (a + b)·cp, so
    it can reach ``bar`` only if b ≥ F − ``fixed_for_bar_s``, the largest F up to smelt's at which the worst
    row could come within ``bar`` (smelt's F where it already can, None where no F can)."""
    sweep = sorted((r for r in rows if r.run.key.startswith(prefix)), key=lambda r: r.layout.cp)
    cps = [r.layout.cp for r in sweep]
    if cps[:2] != [1, 2]:
        raise ValueError(f"{prefix}: a sweep needs its cp = 1 and 2 rows, has cp {cps}")
    tokens = [r.run.global_batch * r.run.seq_len / r.run.gpus for r in sweep]  # per GPU and step
    if len(set(tokens)) != 1 or len({r.layout.micro_batch for r in sweep}) != 1:
        raise ValueError(f"{prefix}: the rows do not keep a rank's tokens fixed")
    published = [t / r.run.published_tokens_per_gpu() for t, r in zip(tokens, sweep)]
    predicted = [t / r.tokens_per_gpu for t, r in zip(tokens, sweep)]
    fixed = 2 * predicted[0] - predicted[1]

    def floor(f: float) -> float:
        return _worst(published, cps, f, _balanced_attention(published, cps, f))

    attention = _balanced_attention(published, cps, fixed)
    worst = _worst(published, cps, fixed, attention)
    if worst <= bar:
        fixed_for_bar = fixed
    elif floor(0.0) > bar:
        fixed_for_bar = None
    else:
        fixed_for_bar = _bisect(lambda f: floor(f) <= bar, 0.0, fixed, 60)[0]
    return {"rows": [r.run.key for r in sweep], "published_step_s": [round(t, 2) for t in published],
            "smelt_step_s": [round(t, 2) for t in predicted], "fixed_s": round(fixed, 3),
            "floor": round(worst, 4), "balanced_attention_s": round(attention, 3),
            "fixed_for_bar_s": None if fixed_for_bar is None else round(fixed_for_bar, 3),
            "smelt_worst": round(max(abs(r.error) for r in sweep), 4)}


def summary(rows: list[Scored]) -> dict:
    """Mean and worst absolute throughput error on the held-out rows (and on the fitted ones, ~0 by
    construction), and the memory error where the source publishes peak memory."""
    held = [abs(r.error) for r in rows if not r.run.fits]
    fitted = [abs(r.error) for r in rows if r.run.fits]
    memory = [abs(r.memory_gb / (r.run.memory_gib * GIB / GB) - 1) for r in rows if r.run.memory_gib]
    system = {r.run.key: STACKS[r.run.stack].system_name for r in rows}
    systems = sorted(set(system.values()))
    return {
        "rows": len(rows), "held_out": len(held), "fitted_rows": len(fitted), "systems": systems,
        "held_out_mean_abs_error": round(statistics.mean(held), 4), "held_out_worst_abs_error": round(max(held), 4),
        "fitted_mean_abs_error": round(statistics.mean(fitted), 4),
        "memory_rows": len(memory), "memory_mean_abs_error": round(statistics.mean(memory), 4) if memory else None,
        "memory_worst_abs_error": round(max(memory), 4) if memory else None,
        "layouts_not_fitting": [r.run.key for r in rows if not r.fits],
        "cp_sweeps": {prefix: cp_sweep_floor(rows, prefix) for prefix in CP_SWEEPS},
        "per_system_mean_abs_error": {s: round(statistics.mean(abs(r.error) for r in rows
                                                               if system[r.run.key] == s and not r.run.fits), 4)
                                      for s in systems},
    }


def table() -> list[Scored]:
    return [score(run) for run in RUNS]
