"""The exactly-once ledger: how many applied updates each global sample index entered (issue 42, item 4).

An update is applied when its step is on the final trajectory (run.py): steps redone after a restart,
rolled back by the loss guard or left on a superseded branch changed no weight the run ended with, so
they do not count (``branches`` says which ``--resume-from`` branch each superseded step ended on). Each kept step's record names the samples the loader actually gave it (``samples``,
read from the loader before the step, not recomputed), so a resume at a wrong position shows up as
samples counted twice or never. Every index below the last kept step's end must count exactly once,
except the loss guard's skipped windows (``skipped.jsonl``), which must count zero.

A kept step without a record (a rank killed after its snapshot and before rank 0 logged it) is inferred
from its neighbours when the gap holds exactly its batches, and listed under ``inferred_steps``.
"""

from __future__ import annotations

import numpy as np

from tasks.trace.run import Run, samples_of


def _ranges(mask: np.ndarray) -> list[list[int]]:
    """``[start, end)`` runs of True in ``mask``."""
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(np.int8), 0]))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])]


def kept_ranges(run: Run) -> tuple[list[tuple[int, int, int]], list[int]]:
    """(step, start, end) of every kept step, gaps inferred; and the inferred steps."""
    batch = int(run.lineage["global_batch"])
    out: list[tuple[int, int, int]] = []
    inferred: list[int] = []
    for step, record in run.steps.items():
        samples = samples_of(record)
        if samples is None:
            continue
        if out and step > out[-1][0] + 1:
            prev_step, _, prev_end = out[-1]
            missing = list(range(prev_step + 1, step))
            crosses_skip = any(int(s["start"]) < samples[0] and int(s["end"]) > prev_end for s in run.skipped)
            if samples[0] - prev_end == batch * len(missing) and not crosses_skip:
                for k, s in enumerate(missing):
                    out.append((s, prev_end + k * batch, prev_end + (k + 1) * batch))
                inferred += missing
        out.append((step, *samples))
    return out, inferred


def ledger(run: Run) -> dict:
    """Counts per sample index up to the final step, and whether they are exactly once (module docstring)."""
    ranges, inferred = kept_ranges(run)
    end = max((e for _, _, e in ranges), default=0)
    delta = np.zeros(end + 1, dtype=np.int64)
    for _, a, b in ranges:
        delta[a] += 1
        delta[b] -= 1
    counts = np.cumsum(delta)[:end]
    skipped_mask = np.zeros(end, dtype=bool)
    for s in run.skipped:
        skipped_mask[max(0, int(s["start"])): min(end, int(s["end"]))] = True
    histogram = {str(k): int(v) for k, v in zip(*np.unique(counts, return_counts=True))}
    unexpected_skip = _ranges(skipped_mask & (counts != 0))
    never = _ranges(~skipped_mask & (counts == 0))
    repeated = _ranges(counts > 1)
    recorded = {s for s, _, _ in ranges}
    unrecorded = [s for s in range(1, run.final_step + 1) if s not in recorded]
    return {
        "run": run.url,
        "final_step": run.final_step,
        "samples": end,
        "counts": histogram,
        "skipped": [{k: s[k] for k in ("start", "end", "step", "rolled_back_to", "reason")} for s in run.skipped],
        "never_trained": never,  # outside the skipped windows
        "trained_more_than_once": repeated,
        "trained_in_skipped_windows": unexpected_skip,
        "inferred_steps": inferred,
        "unrecorded_steps": unrecorded,
        "superseded_steps": sorted({r["step"] for r in run.superseded}),
        "branches": run.branch_summary(),  # --resume-from: the superseded branches and their skipped steps
        "exactly_once": not (never or repeated or unexpected_skip or unrecorded),
    }
