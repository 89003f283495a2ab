"""The validation table as text, as JSON and as a plot, and its command line: ``python -m infra.validation_report
[--json | --fit] [--plot PNG]`` (``smelt plan --validate`` prints the same table)."""

from __future__ import annotations

import argparse
import json

from infra.memory import GB
from infra.stacks import FITTED, STACKS
from infra.validation import FIT_ORDER, GIB, WORST_BAR, Scored, fit, summary, table


def as_dict(rows: list[Scored]) -> dict:
    return {
        "constants": FITTED, "fit_order": list(FIT_ORDER), "summary": summary(rows),
        "rows": [{
            "key": r.run.key, "system": STACKS[r.run.stack].system_name, "stack": r.run.stack, "source": r.run.source, "model": r.run.model,
            "gpu": r.run.gpu, "gpus": r.run.gpus, "seq_len": r.run.seq_len, "global_batch": r.run.global_batch,
            "precision": r.run.precision, "published_layout": r.run.layout, "searched": list(r.run.search),
            "scored_layout": r.layout.name, "published": r.run.published, "published_unit": r.run.unit,
            "published_tokens_per_gpu": round(r.run.published_tokens_per_gpu(), 1),
            "predicted_tokens_per_gpu": round(r.tokens_per_gpu, 1), "error": round(r.error, 4),
            "predicted_mfu_bf16_peak": round(r.mfu, 4),
            "published_memory_gb": round(r.run.memory_gib * GIB / GB, 1) if r.run.memory_gib else None,
            "predicted_memory_gb": round(r.memory_gb, 1), "fits_memory": r.fits, "fitted": r.run.fits,
        } for r in rows],
    }


def render(rows: list[Scored]) -> str:
    lines = [f"{'run':34} {'GPUs':>6} {'prec':4} {'published':>10} {'smelt':>9} {'error':>7}  "
             f"{'mem pub/smelt GB':>17}  scored layout"]
    for r in rows:
        mem = (f"{r.run.memory_gib * GIB / GB:.1f}/" if r.run.memory_gib else "-/") + f"{r.memory_gb:.1f}"
        mark = f"  (fits {r.run.fits})" if r.run.fits else ""
        lines.append(f"{r.run.key:34} {r.run.gpus:>6} {r.run.precision:4} {r.run.published_tokens_per_gpu():>10.0f} "
                     f"{r.tokens_per_gpu:>9.0f} {r.error:>+7.1%}  {mem:>17}{'' if r.fits else ' !'}  "
                     f"{r.layout.name}{mark}")
    s = summary(rows)
    lines.append(f"held-out rows: {s['held_out']} of {s['rows']} ({len(s['systems'])} systems): mean |error| "
                 f"{s['held_out_mean_abs_error']:.2%}, worst {s['held_out_worst_abs_error']:.1%}; "
                 f"peak memory ({s['memory_rows']} rows): mean {s['memory_mean_abs_error']:.1%}, "
                 f"worst {s['memory_worst_abs_error']:.1%}; tokens/s per GPU, published as tokens/s or "
                 f"converted from TFLOP/s with 6N + 12·L·H·Q·T")
    for prefix, sweep in s["cp_sweeps"].items():
        needs = (f"no fixed work reaches {WORST_BAR:.0%}" if sweep["fixed_for_bar_s"] is None
                 else f"{WORST_BAR:.0%} is reachable" if sweep["floor"] <= WORST_BAR
                 else f"{WORST_BAR:.0%} needs F ≤ {sweep['fixed_for_bar_s']:.2f} s")
        lines.append(f"CP sweep {prefix}*: step = F + a·cp; with smelt's F = {sweep['fixed_s']:.2f} s "
                     f"the best a leaves worst {sweep['floor']:.1%} (smelt {sweep['smelt_worst']:.1%}); {needs}")
    lines.append("constants: " + ", ".join(f"{k} = {v}" for k, v in FITTED.items()))
    return "\n".join(lines)


def plot(rows: list[Scored], path: str) -> None:
    """Each row's throughput error against its published tokens/s per GPU (±5% and ±WORST_BAR marked), and
    counted against published peak memory (±10% shaded); one colour per system, fitted rows hollow; PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = sorted({STACKS[r.run.stack].system_name for r in rows})
    colours = dict(zip(systems, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(12, 5.2))
    for r in rows:
        colour = colours[STACKS[r.run.stack].system_name]
        face = "none" if r.run.fits else colour
        speed.scatter(r.run.published_tokens_per_gpu(), 100 * r.error, s=30, edgecolors=colour, facecolors=face)
        if r.run.memory_gib:
            memory.scatter(r.run.memory_gib * GIB / GB, r.memory_gb, s=30, edgecolors=colour, facecolors=face)
    speed.set_xscale("log")
    speed.axhline(0, color="black", linewidth=1)
    for level, style in ((5, ":"), (100 * WORST_BAR, "--")):
        for sign in (1, -1):
            speed.axhline(sign * level, color="black", linestyle=style, linewidth=1)
    low = min(memory.get_xlim()[0], memory.get_ylim()[0])
    high = max(memory.get_xlim()[1], memory.get_ylim()[1])
    memory.plot([low, high], [low, high], color="black", linewidth=1)
    memory.fill_between([low, high], [0.9 * low, 0.9 * high], [1.1 * low, 1.1 * high], color="0.9", zorder=0)
    memory.set_xlim(low, high)
    memory.set_ylim(low, high)
    s = summary(rows)
    speed.set(xlabel="published tokens/s per GPU", ylabel="smelt's error (%)",
              title=f"throughput: held-out mean {s['held_out_mean_abs_error']:.2%}, "
                    f"worst {s['held_out_worst_abs_error']:.1%}")
    memory.set(xlabel="published peak memory per GPU (GB)", ylabel="smelt's count (GB)",
               title=f"memory: mean {s['memory_mean_abs_error']:.1%}, worst {s['memory_worst_abs_error']:.1%} "
                     "(±10% shaded)")
    for system in systems:
        speed.scatter([], [], color=colours[system], label=system)
    speed.legend(loc="lower left", fontsize=8, title="hollow: fitted row", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The planner against published training runs.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--fit", action="store_true", help="re-solve the fitted constants and print them")
    parser.add_argument("--plot", metavar="PNG", help="also write each row's error against the published figures as a PNG")
    args = parser.parse_args(argv)
    if args.fit:
        print(json.dumps(fit()))
        return
    rows = table()
    print(json.dumps(as_dict(rows)) if args.json else render(rows))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
