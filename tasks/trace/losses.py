"""Reading the per-sample losses a run recorded (tasks/train/sample_losses.py), for the attempts trace asks about.

Parts are named by their step range, so a question about one step opens only the parts that can hold it.
A (step, sample) written by several attempts keeps the newest part's row; callers then keep only the
samples of the attempt they mean (a kept step's or a rejected one's ``samples`` range), which tells a
redone step (the same samples, the same loss) from one trained on other samples after a rollback.
"""

from __future__ import annotations

import re

import numpy as np

from tasks import storage

FOLDER = "sample_losses"  # tasks.train.sample_losses.FOLDER (not imported: that module imports torch)
_PART = re.compile(r"part-(\d+)-(\d+)-r(\d+)-(\d+)\.parquet$")


def _parts(run_url: str) -> list[tuple[int, int, int, str]]:
    """(first step, last step, written ns, path) of every part, oldest first."""
    fs, path = storage.filesystem(storage.join(run_url, FOLDER))
    if not fs.exists(path):
        return []
    out = []
    for name in fs.ls(path, detail=False):
        m = _PART.search(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), int(m.group(4)), name))
    return sorted(out, key=lambda p: p[2])


def read_losses(run_url: str, first: int | None = None, last: int | None = None) -> dict[str, np.ndarray]:
    """Columns ``step``, ``sample``, ``loss`` of steps ``[first, last]`` (all when None), one row per
    (step, sample), the newest write winning, sorted by step then sample."""
    import pyarrow.parquet as pq

    fs, _ = storage.filesystem(storage.join(run_url, FOLDER))
    columns: dict[str, list[np.ndarray]] = {"step": [], "sample": [], "loss": []}
    for lo, hi, _, path in _parts(run_url):
        if (first is not None and hi < first) or (last is not None and lo > last):
            continue
        with fs.open(path, "rb") as f:
            table = pq.read_table(f)
        step = table.column("step").to_numpy()
        keep = np.ones(len(step), dtype=bool)
        if first is not None:
            keep &= step >= first
        if last is not None:
            keep &= step <= last
        for name in columns:
            columns[name].append(table.column(name).to_numpy()[keep])
    if not columns["step"]:
        return {name: np.zeros(0, dtype=np.float32 if name == "loss" else np.int64) for name in columns}
    out = {name: np.concatenate(parts) for name, parts in columns.items()}
    # newest wins: reverse (newest first), keep each (step, sample)'s first occurrence
    step, sample = out["step"][::-1], out["sample"][::-1]
    order = np.lexsort((np.arange(len(step)), sample, step))
    step_sorted, sample_sorted = step[order], sample[order]
    first_of = np.r_[True, (step_sorted[1:] != step_sorted[:-1]) | (sample_sorted[1:] != sample_sorted[:-1])]
    chosen = order[first_of]
    return {name: values[::-1][chosen] for name, values in out.items()}


def of_attempt(losses: dict[str, np.ndarray], step: int, samples: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(sample indices, losses) of ``step`` restricted to the attempt that trained ``samples``."""
    lo, hi = np.searchsorted(losses["step"], [step, step + 1])  # rows are sorted by step
    sample, loss = losses["sample"][lo:hi], losses["loss"][lo:hi]
    at = (sample >= samples[0]) & (sample < samples[1])
    return sample[at], loss[at]
