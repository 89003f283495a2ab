"""A picture of a run: training loss per step with the evaluated checkpoints' validation loss."""

from __future__ import annotations

import io

from tasks import datasets, jsonlog


def read_metrics(run_dir: str) -> list[dict]:
    """Per-step records of ``<run_dir>/metrics.jsonl``; a step redone after a restart keeps its last record."""
    by_step = {record["step"]: record for record in jsonlog.read(run_dir, "metrics.jsonl")}
    return [by_step[s] for s in sorted(by_step)]


def plot_losses(metrics: list[dict], evaluations: list[tuple[int, float]], title: str) -> bytes:
    """PNG bytes: train loss against step, and validation loss at each evaluated step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], label="train loss", lw=1.5)
    if evaluations:
        ax.scatter(*zip(*evaluations), color="crimson", zorder=3, label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
