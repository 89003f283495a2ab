"""A run across its checkpoints: training loss per step, and every evaluated checkpoint's
validation loss (per split and in total, bits per byte beside the compressors') as a table and a plot."""

from __future__ import annotations

import io

from tasks import branches, contract, jsonlog, storage
from tasks.eval.baselines import COMPRESSORS


def read_metrics(run_dir: str) -> list[dict]:
    """Per-step records of ``<run_dir>/metrics.jsonl``; a step redone after a restart keeps its last record."""
    by_step = {record["step"]: record for record in jsonlog.read(run_dir, "metrics.jsonl")}
    return [by_step[s] for s in sorted(by_step)]


def _branch_of(run_dir: str, records: list[dict], meta: dict) -> int | None:
    """The superseded branch (``--resume-from``, tasks/branches.py) whose checkpoint an evaluation scored: the
    branch holding that step whose checkpoint has the evaluated files; None for the run's own trajectory."""
    from tasks.checkpoint_reader import relative_step  # torch: only runs that branched pay for it
    from tasks.eval.evaluate import checkpoint_identity

    files = (meta.get("identity") or {}).get("files")
    for record in records:
        if files and meta["step"] in record["steps"]:
            url = storage.join(branches.branch_url(run_dir, record), relative_step(meta["step"]))
            if (checkpoint_identity(url) or {}).get("files") == files:
                return record["branch"]
    return None


def run_evaluations(root: str, run_dir: str) -> list[dict]:
    """Meta of every finished evaluation under ``<root>/eval`` of a checkpoint of ``run_dir``, by step
    (for a step evaluated under several eval configs, the newest); an evaluation of a checkpoint now on a
    superseded branch has its ``branch`` (None for the run's own trajectory) and comes after the run's own."""
    fs, path = storage.filesystem(storage.join(storage.normalize_url(root), "eval"))
    run_dir = storage.normalize_url(run_dir)
    records = branches.read(run_dir)
    by_step: dict[tuple[int, int], tuple[str, dict]] = {}
    for manifest_path in fs.glob(f"{path}/*/{contract.MANIFEST}"):
        manifest = contract.Manifest.from_json(fs.cat_file(manifest_path).decode())
        if manifest.kind != "eval" or manifest.meta.get("run") != run_dir:
            continue
        created = manifest.lineage.get("created_at", "")
        meta = {**manifest.meta, "branch": _branch_of(run_dir, records, manifest.meta) if records else None}
        key = (meta["branch"] or 0, meta["step"])
        if key not in by_step or by_step[key][0] <= created:
            by_step[key] = (created, meta)
    return [by_step[k][1] for k in sorted(by_step)]


def results_table(evaluations: list[dict]) -> list[dict]:
    """One row per evaluated checkpoint: step, trained tokens, then loss, perplexity and bits per byte
    of every split and of the mixture-weighted total, and the compressors' bits per byte on the same
    bytes (blank for an evaluation made before they were measured)."""
    rows = []
    for ev in evaluations:
        row = {"step": ev["step"], "tokens": ev.get("tokens")}
        if ev.get("branch") is not None:
            row["branch"] = f"superseded branch {ev['branch']}"
        for name, figures in [*sorted(ev["splits"].items()), ("total", ev["total"])]:
            row[f"{name} val loss"] = round(figures["val_loss"], 4)
            row[f"{name} perplexity"] = round(figures["perplexity"], 2)
            row[f"{name} bits/byte"] = round(figures["bits_per_byte"], 4)
            baselines = figures.get("baselines") or {}
            for key, (label, _) in COMPRESSORS.items():
                row[f"{name} {label} bits/byte"] = round(baselines[key], 4) if key in baselines else None
        rows.append(row)
    return rows


def validation_curves(evaluations: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Split name (and ``total``) → [(step, validation loss)], by step."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for ev in evaluations:
        if ev.get("branch") is not None:
            continue  # the curves follow the run's own trajectory
        for name, figures in [*sorted(ev["splits"].items()), ("total", ev["total"])]:
            curves.setdefault(name, []).append((ev["step"], figures["val_loss"]))
    return curves


def plot_losses(metrics: list[dict], evaluations: dict[str, list[tuple[int, float]]], title: str) -> bytes:
    """PNG bytes: train loss against step, and beside it each split's validation loss against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], label="train loss", lw=1.5)
    for name, points in evaluations.items():
        ax.plot(*zip(*points), marker="o", zorder=3, lw=1.2, ls="-" if name == "total" else "--",
                label=f"validation loss ({name})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
