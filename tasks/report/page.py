"""The run report: one self-contained HTML page read top to bottom (inline CSS and SVG, nothing fetched).

Sections, each ``<section id=…>``: config and layout, loss and evals per split, throughput and MFU,
goodput waterfall, faults, stragglers, checkpoints, data funnel. A section without data says why in
one sentence instead of drawing an empty plot.
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from tasks.report import svg
from tasks.report.timeline import checkpoint_timeline, faults, final_trajectory, straggler_grid

SECTIONS = {"config": "Config and layout", "loss": "Loss and evaluations", "throughput": "Throughput and MFU",
            "goodput": "Goodput", "faults": "Faults and restarts", "stragglers": "Stragglers",
            "checkpoints": "Checkpoints", "funnel": "Data funnel"}
GOODPUT_PARTS = [("productive", "productive_s"), ("checkpoint", "checkpoint_s"), ("init", "init_s"),
                 ("restart", "restart_s"), ("lost", "lost_s"), ("other", "other_s")]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1000px;color:#222}
h1{font-size:22px;margin-bottom:2px} h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.sub{color:#666} table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f5f5f5} td.n{text-align:right;font-variant-numeric:tabular-nums} .empty{color:#777;font-style:italic}
svg.plot{display:block;margin:8px 0;background:#fff} svg .title{font-size:13px;font-weight:600}
svg .tick,svg .legend{font-size:11px;fill:#444} svg .label{font-size:12px;fill:#333}
svg .axis{stroke:#333} svg .grid{stroke:#eee} .drop{fill:#d62728} .step{fill:#1f77b4} .total{fill:#2ca02c}
.part-productive{fill:#2ca02c} .part-checkpoint{fill:#1f77b4} .part-init{fill:#9467bd} .part-restart{fill:#ff7f0e}
.part-lost{fill:#d62728} .part-other{fill:#7f7f7f} .part-wall{fill:#444} pre{background:#f7f7f7;padding:8px;overflow:auto}
"""


def _table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(_cell(v) for v in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="n">{svg.fmt(value) if abs(value) >= 1e4 else f"{value:.4g}"}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{escape('' if value is None else str(value))}</td>"


def _empty(sentence: str) -> str:
    return f'<p class="empty">{escape(sentence)}</p>'


def config_section(data: dict) -> str:
    summary, config = data["summary"], data["config"]
    model = config.get("model", {})
    rows = [("run folder", data["run_dir"]), ("state", "finished" if data["finished"] else "running or stopped"),
            ("layout", summary.get("layout")), ("world size", summary.get("world_size")),
            ("device", summary.get("device")),
            ("model", f"{config.get('model_preset', '')} {', '.join(f'{k}={v}' for k, v in model.items() if v)}"),
            ("parameters", (summary.get("model") or {}).get("params")), ("steps", f"{summary.get('steps')} of "
             f"{config.get('steps')}"), ("tokens", summary.get("tokens")),
            ("batch", json.dumps(summary.get("batch")) if summary.get("batch") else None),
            ("learning rate", (config.get("optim") or {}).get("lr")),
            ("data", ", ".join(f"{k} = {v}" for k, v in data["data"].items()))]
    table = "<table>" + "".join(f"<tr><th>{escape(k)}</th>{_cell(v)}</tr>" for k, v in rows if v is not None) + "</table>"
    return table + f"<details><summary>train_config.json</summary><pre>{escape(json.dumps(config, indent=2))}</pre></details>"


def loss_section(data: dict) -> str:
    trajectory = final_trajectory(data["metrics"])
    evals = data["evaluations"]
    if not trajectory and not evals:
        return _empty("No step has been logged yet.")
    series = [{"name": "train loss", "points": [(r["step"], r["loss"]) for r in trajectory]}]
    splits = sorted({name for e in evals for name in e["splits"]}) + (["total"] if evals else [])

    def figure(e: dict, split: str, key: str) -> float | None:
        figures = e["total"] if split == "total" else e["splits"].get(split)
        return figures.get(key) if figures else None

    series += [{"name": f"val loss ({s})", "points": [(e["step"], figure(e, s, "val_loss")) for e in evals],
                "markers": True, "dashed": s != "total"} for s in splits]
    out = svg.line_chart(series, title="loss per step (train) and per evaluated checkpoint (validation splits)",
                         x_label="step", y_label="loss (nats/token)")
    if evals:
        bpb = [{"name": s, "points": [(e["step"], figure(e, s, "bits_per_byte")) for e in evals], "markers": True}
               for s in splits]
        out += svg.line_chart(bpb, title="bits per byte per validation split", x_label="step", y_label="bits/byte")
        out += _table([{"step": e["step"], **{f"{s} loss": figure(e, s, "val_loss") for s in splits},
                        **{f"{s} bits/byte": figure(e, s, "bits_per_byte") for s in splits}} for e in evals])
    else:
        out += _empty("No checkpoint of this run has been evaluated yet (smelt eval, or the eval deployment).")
    return out


def throughput_section(data: dict) -> str:
    trajectory = final_trajectory(data["metrics"])
    if not trajectory:
        return _empty("No step has been logged yet.")
    out = svg.line_chart([{"name": "tokens/s", "points": [(r["step"], r.get("tokens_per_s")) for r in trajectory]}],
                         title="throughput", x_label="step", y_label="tokens/s")
    out += svg.line_chart([{"name": "MFU (%)", "points": [(r["step"], 100 * r["mfu"]) for r in trajectory
                                                          if r.get("mfu") is not None]},
                           {"name": "peak memory (GiB)", "points": [(r["step"], r.get("peak_mem_gib"))
                                                                    for r in trajectory], "dashed": True}],
                          title="model FLOPs utilisation and peak memory", x_label="step", y_label="% of peak / GiB")
    return out


def goodput_section(data: dict) -> str:
    split = data["goodput"]
    if not split:
        return _empty("No process group has logged a step yet.")
    parts = [(label, float(split.get(key, 0.0))) for label, key in GOODPUT_PARTS]
    head = (f"<p>Goodput <b>{100 * split['goodput']:.1f}%</b> of {split['wall_s']:.1f} s wall time; "
            f"{split.get('restarts', 0)} restart(s), {split.get('rollbacks', 0)} rollback(s), "
            f"{len(split.get('lost_steps', []))} step(s) lost.</p>")
    return head + svg.waterfall(parts, title="where the wall time went (seconds)")


def faults_section(data: dict) -> str:
    found = faults(data["events"], data["metrics"])
    if not found:
        return _empty("No restart and no rollback: the run trained in one go.")
    t0 = min(e["time"] for e in data["events"]) if data["events"] else found[0]["time"]
    steps = [{"name": "step reached", "points": [(r["time"] - t0, r["step"]) for r in data["metrics"]],
              "markers_only": True, "markers": True}]
    steps += [{"name": f"{f['kind']} {i + 1}", "points": [(f["time"] - t0, f["resumed_from"])], "markers": True}
              for i, f in enumerate(found)]
    chart = svg.line_chart(steps, title="steps over wall time, with each restart at the step it resumed from",
                           x_label="seconds since the first launch", y_label="step")
    rows = [{"#": i + 1, "kind": f["kind"], "at (s)": round(f["time"] - t0, 2), "cause": f["cause"],
             "resumed from step": f["resumed_from"], "restored from": f["restored_from"],
             "steps lost": f["steps_lost"], "recovery (s)": f["recovery_s"]} for i, f in enumerate(found)]
    return chart + _table(rows)


def stragglers_section(data: dict) -> str:
    grid = straggler_grid(data["stragglers"])
    if grid is None:
        return _empty("One rank, or no straggler window finished yet: nothing to compare.")
    hosts = grid["hosts"]
    labels = [f"rank {r}" + (f" ({hosts[r]})" if r < len(hosts) else "") for r in grid["ranks"]]
    out = svg.heatmap(labels, [str(s) for s in grid["steps"]], grid["ratio"],
                      title="each rank's step compute over the median of all ranks, per window (red: slower)",
                      spread=max(0.25, grid.get("margin") or 0.25))
    flagged = grid["flagged"]
    return out + (_table(flagged) if flagged else _empty("No rank was flagged as a straggler."))


def checkpoints_section(data: dict) -> str:
    timeline = checkpoint_timeline(data["metrics"], data["checkpoints"])
    if not timeline["blocked"] and not timeline["committed"]:
        return _empty("No checkpoint yet.")
    blocked = max((s for _, s in timeline["blocked"]), default=0.0)
    series = [{"name": "blocked on checkpointing (s)", "points": timeline["blocked"]},
              {"name": "committed, still kept", "points": [(c["step"], blocked) for c in timeline["committed"]],
               "markers": True, "markers_only": True}]
    return (svg.line_chart(series, title="seconds each step was blocked by checkpointing; committed checkpoints",
                           x_label="step", y_label="seconds")
            + _table([{"step": c["step"], "loss": c["loss"], "tokens": c["tokens"]} for c in timeline["committed"]]))


def funnel_section(data: dict) -> str:
    branches = [b for b in data["funnel"] if b["stages"]]
    if not branches:
        return _empty("The run's data records no lineage back to a crawl (a tokens dataset made outside smelt).")
    out = []
    for branch in branches:
        rows = []
        for stage in branch["stages"]:
            for name, count in stage["rows"]:
                if name == "in" and rows:
                    continue  # a stage's input is the previous stage's output
                cls = "drop" if name.startswith(("dropped.", "failed.")) else "total" if name in ("in", "out") else "step"
                label = f"{stage['stage']}: {name}" if name in ("in", "out") else f"  {name}"
                rows.append((label, count, cls))
            if stage["kind"] == "tokens" and "tokens" in stage["stats"]:
                rows.append((f"{stage['stage']}: tokens", stage["stats"]["tokens"], "total"))
        out.append(svg.hbars(rows, title=f"{branch['name']}: records from the crawl to tokens, with drop reasons"))
    return "".join(out)


RENDERERS = {"config": config_section, "loss": loss_section, "throughput": throughput_section,
             "goodput": goodput_section, "faults": faults_section, "stragglers": stragglers_section,
             "checkpoints": checkpoints_section, "funnel": funnel_section}


def render(data: dict) -> str:
    """The page for ``data`` (tasks/report/collect.collect)."""
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(data["generated_at"]))
    body = "".join(f'<section id="{key}"><h2>{escape(title)}</h2>{RENDERERS[key](data)}</section>'
                   for key, title in SECTIONS.items())
    nav = " · ".join(f'<a href="#{k}">{escape(t)}</a>' for k, t in SECTIONS.items())
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>smelt run {escape(data["name"])}'
            f"</title><style>{CSS}</style></head><body><h1>smelt run {escape(data['name'])}</h1>"
            f'<p class="sub">{escape(data["run_dir"])} · generated {escape(generated)}</p><nav>{nav}</nav>{body}'
            "</body></html>")
