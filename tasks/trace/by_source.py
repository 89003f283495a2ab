"""Loss by data source, quality-score bucket and language, per evaluation interval (issue 42, item 6).

Every recorded sequence of the final trajectory is attributed to the document under its window's middle token
(a window usually lies within one or two documents); its mean loss then counts toward that document's source
(``web``, ``code``), classifier quality bucket (``none`` where no classifier ran) and language. Intervals end at
the steps the eval flow scores: every ``checkpoint.interval_steps`` of the run's ``train_config.json`` (retention
may have removed most of those checkpoints since), else its committed checkpoints; and at the final step.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np

from tasks import checkpoint_reader, storage
from tasks.trace.documents import Documents
from tasks.trace.losses import read_losses
from tasks.trace.run import Run, open_run

QUALITY_EDGES = (0.2, 0.4, 0.6, 0.8)
REPORT, PLOT = "loss_by_source.json", "loss_by_source.png"


def _bucket(score: float | None) -> str:
    if score is None or math.isnan(score):
        return "none"
    k = int(np.searchsorted(QUALITY_EDGES, score, side="right"))
    lo = 0.0 if k == 0 else QUALITY_EDGES[k - 1]
    hi = 1.0 if k == len(QUALITY_EDGES) else QUALITY_EDGES[k]
    return f"{lo:.1f}-{hi:.1f}"


def _document_fields(docs: Documents, k: int) -> tuple[np.ndarray, list[str], list[str], list[str]]:
    """Stream start of every document of dataset ``k`` and its source, quality bucket and language."""
    stream = docs.stream(k)
    starts, source, quality, lang = [], [], [], []
    for i in range(len(stream.shards)):
        table = stream.lineage(i, ["token_start", "source", "quality_score", "lang"])
        starts.append(int(stream.starts[i]) + table.column("token_start").to_numpy())
        source += [s or "unknown" for s in table.column("source").to_pylist()]
        quality += [_bucket(q) for q in table.column("quality_score").to_pylist()]
        lang += [s or "unknown" for s in table.column("lang").to_pylist()]
    return np.concatenate(starts) if starts else np.zeros(0, np.int64), source, quality, lang


def interval_ends(run: Run, every: int | None = None) -> list[int]:
    """The last step of each evaluation interval (module docstring); ``every`` overrides the run's interval."""
    if every is None:
        fs, path = storage.filesystem(storage.join(run.url, "train_config.json"))
        if fs.exists(path):
            every = json.loads(fs.cat_file(path)).get("checkpoint", {}).get("interval_steps") or None
    if every:
        ends = set(range(every, run.final_step + 1, every))
    else:
        ends = {c["step"] for c in checkpoint_reader.list_committed(run.url, checksums=False) if c["step"] <= run.final_step}
    return sorted(ends | {run.final_step})


def loss_by_source(run: Run, every: int | None = None) -> list[dict]:
    """Rows ``{first_step, last_step, by, group, sequences, mean_loss}`` (module docstring)."""
    losses = read_losses(run.url)
    kept = {step: record["samples"] for step, record in run.steps.items() if record.get("samples")}
    if not len(losses["step"]) or not kept:
        return []
    lo = np.asarray([kept.get(int(s), (0, 0))[0] for s in losses["step"]])
    hi = np.asarray([kept.get(int(s), (0, 0))[1] for s in losses["step"]])
    on_trajectory = (losses["sample"] >= lo) & (losses["sample"] < hi)
    step, sample, loss = (losses[name][on_trajectory] for name in ("step", "sample", "loss"))
    docs = Documents(run.lineage)
    which, window = docs.sources(sample)
    middle = window * docs.seq_len + docs.seq_len // 2
    labels = {"source": np.empty(len(sample), dtype=object), "quality": np.empty(len(sample), dtype=object),
              "lang": np.empty(len(sample), dtype=object)}
    for k in range(len(docs.names)):
        at = np.flatnonzero(which == k)
        if not at.size:
            continue
        starts, source, quality, lang = _document_fields(docs, k)
        doc = np.searchsorted(starts, middle[at], side="right") - 1
        for name, values in (("source", source), ("quality", quality), ("lang", lang)):
            labels[name][at] = np.asarray(values, dtype=object)[doc]
    rows, first = [], 1
    for end in interval_ends(run, every):
        in_interval = (step >= first) & (step <= end)
        for name, values in labels.items():
            for group in sorted(set(values[in_interval].tolist())):
                at = in_interval & (values == group)
                rows.append({"first_step": first, "last_step": end, "by": name, "group": group,
                             "sequences": int(at.sum()), "mean_loss": round(float(loss[at].mean()), 4)})
        first = end + 1
    return rows


def plot(rows: list[dict], title: str) -> bytes:
    """Mean loss per interval end, one panel per grouping, one line per group (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, by in zip(axes, ("source", "quality", "lang")):
        for group in sorted({r["group"] for r in rows if r["by"] == by}):
            points = [(r["last_step"], r["mean_loss"]) for r in rows if r["by"] == by and r["group"] == group]
            ax.plot(*zip(*points), marker="o", label=group)
        ax.set_title(f"by {by}")
        ax.set_xlabel("step (interval end)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean sequence loss")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=90)
    plt.close(fig)
    return out.getvalue()


def write_report(run_url: str, every: int | None = None) -> tuple[list[dict], str]:
    """Compute the table, write it and its plot into the run folder; returns (rows, the plot's URL)."""
    run = open_run(run_url)
    rows = loss_by_source(run, every)
    with storage.atomic_write(storage.join(run.url, REPORT), "w") as f:
        f.write(json.dumps(rows, indent=1))
    plot_url = storage.join(run.url, PLOT)
    with storage.atomic_write(plot_url) as f:
        f.write(plot(rows, f"loss by source, quality and language: {run.url}"))
    return rows, plot_url
