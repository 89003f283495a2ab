"""Tables printed at the end of each command: what ran, what was reused, what was dropped and why."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tasks.counters import REASONS
from tasks.eval.baselines import COMPRESSORS, below


def _reasons(stats: dict, limit: int = 4) -> str:
    """The largest drop/failure reasons, e.g. 'lang_not_kept 130, gopher_short_doc 41 (+3 more)'."""
    items = sorted(((k.split(".", 1)[1], v) for k, v in stats.items()
                    if k.startswith(REASONS) and v), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v:g}" for k, v in items[:limit])
    return text + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def _kind(stage: dict) -> str:
    """The stage's base name: ``ingest[web]`` → ``ingest``."""
    return stage["stage"].split("[", 1)[0]


def _in_out(stage: dict) -> tuple[str, str]:
    """The stage's ``in`` and ``out`` counters (the vocabulary of ``tasks.counters.Stats``)."""
    stats = stage.get("stats", {})
    return tuple(f"{stats[k]:,}" if isinstance(stats.get(k), (int, float)) else "" for k in ("in", "out"))


def render_funnel(stage: dict, console: Console) -> None:
    """Documents left after each step, and why the others went."""
    table = Table(title=f"{escape(stage['stage'])} funnel")
    table.add_column("step")
    table.add_column("documents", justify="right")
    for name, count in stage["funnel"]:
        dropped = name.startswith(REASONS)
        table.add_row(f"  {name}" if dropped else name, f"−{count:,}" if dropped else f"{count:,}")
    console.print(table)


def render_stage(stage: dict, console: Console) -> None:
    if stage.get("funnel"):
        render_funnel(stage, console)
    table = Table(title=f"smelt {stage['stage']}")
    for col in ("status", "in", "out", "drop reasons", "seconds", "output"):
        table.add_column(col)
    records_in, records_out = _in_out(stage)
    table.add_row("reused" if stage["reused"] else "computed", records_in, records_out,
                  _reasons(stage["stats"]), f"{stage['seconds']:.1f}", stage["url"])
    console.print(table)


def render_train(stage: dict, console: Console) -> None:
    s = stage["summary"]
    console.print(f"train: {'reused' if stage['reused'] else 'trained'} {s['steps']} steps, "
                  f"{s['tokens']:,} tokens, loss {s['first_loss']:.3f} → {s['last_loss']:.3f}; "
                  f"checkpoint {stage['checkpoint']}")


def _eval_result(stage: dict) -> str:
    """The mixture-weighted figures, then each validation split's (a mixture can hide a split that got worse)."""
    st = stage["stats"]
    text = f"val loss {st['val_loss']:.3f}, perplexity {st['perplexity']:.1f}, bits/byte {st['bits_per_byte']:.3f}"
    splits = stage.get("splits") or {}
    if len(splits) > 1:
        text += "; " + ", ".join(f"{name} {s['val_loss']:.3f} / {s['bits_per_byte']:.3f}"
                                 for name, s in sorted(splits.items())) + " (loss / bits/byte)"
    return text


def _versus(model: float, baseline: float) -> str:
    """'36% below' or '7% above': the model's bits per byte against a compressor's."""
    gain = below(model, baseline)
    return f"{abs(gain):.0%} {'below' if gain >= 0 else 'above'}"


def compression_table(stage: dict) -> Table | None:
    """Per split (and the mixture-weighted total): the model's bits per byte beside xz, zstd and zlib
    on exactly the bytes it scored. None for an evaluation made before the baselines were measured."""
    rows = sorted((stage.get("splits") or {}).items())
    if stage.get("total") and len(rows) > 1:
        rows.append(("total", stage["total"]))
    if not rows or any("baselines" not in figures for _, figures in rows):
        return None
    table = Table(title=f"bits per byte on the held-out text at step {stage['step']} (lower is better)")
    for col in ("split", "model", *(label for label, _ in COMPRESSORS.values()), "model vs xz -9e", "val loss",
                "perplexity", "bytes"):
        table.add_column(col, justify="left" if col == "split" else "right")
    for name, f in rows:
        table.add_row(name, f"{f['bits_per_byte']:.3f}", *(f"{f['baselines'][key]:.3f}" for key in COMPRESSORS),
                      _versus(f["bits_per_byte"], f["baselines"]["xz"]), f"{f['val_loss']:.3f}",
                      f"{f['perplexity']:.1f}", f"{f['bytes_scored']:,}" if "bytes_scored" in f else "")
    return table


def samples_table(stage: dict) -> Table | None:
    """Each split's held-out document beginnings and how the model continues them, beside the real text."""
    samples = [(name, s) for name, figures in sorted((stage.get("splits") or {}).items())
               for s in figures.get("samples") or []]
    if not samples:
        return None
    first = samples[0][1]
    table = Table(title="samples", caption=f"prompts: the held-out text's own beginnings; sampled at temperature "
                                           f"{first['temperature']:g}, seed {first['seed']}", show_lines=True)
    table.add_column("split")
    table.add_column("")
    table.add_column("text", overflow="fold")
    for name, s in samples:
        for i, (label, key) in enumerate((("prompt", "prompt"), ("greedy", "greedy"), ("sampled", "sampled"),
                                          ("actual text", "actual"))):
            table.add_row(name if i == 0 else "", label, escape(s[key]))
    return table


def render_eval_details(stage: dict, console: Console) -> None:
    """The compression comparison and the samples, where the evaluation has them."""
    for table in (compression_table(stage), samples_table(stage)):
        if table is not None:
            console.print(table)


def render_eval(stage: dict, console: Console) -> None:
    console.print(f"eval of step {stage['step']}: {_eval_result(stage)} over {stage['stats']['tokens_scored']:,} "
                  f"tokens ({stage['url']})")
    render_eval_details(stage, console)
    for p in stage.get("probes", []):
        console.print(f"  probe {p['prompt']!r} → {p['completion']!r}")


def render_run_summary(summary: dict, console: Console) -> None:
    for stage in summary["stages"]:
        if stage.get("funnel"):
            render_funnel(stage, console)
    table = Table(title=f"smelt run — {summary['root']}")
    for col in ("stage", "status", "in", "out", "drop reasons / result", "seconds"):
        table.add_column(col, overflow="fold")
    for stage in summary["stages"]:
        records_in, records_out = _in_out(stage)
        result = _reasons(stage["stats"])
        if _kind(stage) == "train":
            s = stage["summary"]
            result = f"{s['steps']} steps, {s['tokens']:,} tokens, loss {s['first_loss']:.3f} → {s['last_loss']:.3f}"
            if s.get("resumed_from"):
                result += f", resumed from step {s['resumed_from']}"
            if isinstance(s.get("goodput"), dict) and "goodput" in s["goodput"]:
                result += f", goodput {s['goodput']['goodput']:.0%}"
        elif _kind(stage) == "eval":
            result = _eval_result(stage)
        elif _kind(stage) == "tokenizer":
            result = f"vocab {stage['meta'].get('vocab_size', '?')}"
        elif _kind(stage) == "tokenize":
            result = f"{stage['rows']:,} tokens, {stage['stats'].get('tokens.val', 0):,} held out for validation"
        table.add_row(escape(stage["stage"]), "reused" if stage["reused"] else "computed", records_in, records_out,
                      escape(result), f"{stage['seconds']:.1f}")
    console.print(table)
    for stage in summary["stages"]:
        if _kind(stage) == "eval":
            render_eval_details(stage, console)
    mixture = ", ".join(f"{name} {weight:g}" for name, weight in summary.get("mixture", {}).items())
    console.print(f"training mixture: {mixture}")
    train = next(s for s in summary["stages"] if s["stage"] == "train")
    console.print(f"checkpoint: {train['checkpoint']}")
    console.print(f"outputs under {summary['root']}; wall time {summary['wall_seconds']:.1f} s")
