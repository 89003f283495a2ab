"""Loss guard: a NaN/Inf or spiking loss rolls the run back to its last good checkpoint and past
the batches that caused it.

Deciding: the guard sees the global loss (already all-reduced, the same float on every rank) and
its own history of accepted losses, so every rank reaches the same verdict without talking. A
spike is a robust z-score ``(loss - median) / (1.4826 · MAD)`` above ``z_threshold`` over the
last ``window`` accepted losses, tested once ``min_history`` are known; only upward spikes count.
MAD is floored at 0.1 % of the median so a flat history does not make noise look like a spike.

Skipping: the trainer reloads the newest committed checkpoint (every checkpoint is saved only
after its step passed the guard) and skips the global batches ``[end - skip_batches, end)`` of
the sample order, ``end`` being the position after the offending batch, clipped to the
checkpoint's position. Skipped ranges live in ``<run_dir>/skipped.jsonl`` (written by rank 0,
read by every rank at start) and are applied by moving the loader past them, so a restart that
resumes from an older checkpoint skips them again, and a re-run skips the same samples.
After a restart the history starts empty: the spike test needs ``min_history`` steps again.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass

from tasks import storage
from tasks.train.config import LossGuardConfig

log = logging.getLogger(__name__)

SKIPPED = "skipped.jsonl"
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution × this = its standard deviation


def robust_z(value: float, history: list[float]) -> float:
    median = statistics.median(history)
    mad = statistics.median(abs(x - median) for x in history)
    scale = MAD_TO_SIGMA * max(mad, 1e-3 * abs(median), 1e-12)
    return (value - median) / scale


class LossGuard:
    """Judges each step's global loss: None (accept) or a reason (``loss.nan``, ``loss.inf``, ``loss.spike``)."""

    def __init__(self, cfg: LossGuardConfig) -> None:
        self.cfg = cfg
        self.history: deque[tuple[int, float]] = deque(maxlen=cfg.window)
        self.last_z: float | None = None

    def check(self, step: int, loss: float) -> str | None:
        self.last_z = None
        if not self.cfg.enabled:
            return None
        if math.isnan(loss):
            return "loss.nan"
        if math.isinf(loss):
            return "loss.inf"
        if len(self.history) >= self.cfg.min_history:
            self.last_z = robust_z(loss, [value for _, value in self.history])
            if self.last_z > self.cfg.z_threshold:
                return "loss.spike"
        self.history.append((step, loss))
        return None

    def remember(self, accepted: list[tuple[int, float]]) -> None:
        """Start from these (step, loss) pairs, oldest first: a resumed run judges its next loss against
        the same recent history an uninterrupted run would have."""
        self.history.clear()
        self.history.extend(accepted[-self.cfg.window:])

    def forget_after(self, step: int) -> None:
        """Drop losses of steps after ``step``: the run rolled back to it."""
        kept = [(s, v) for s, v in self.history if s <= step]
        self.history.clear()
        self.history.extend(kept)


@dataclass(frozen=True)
class SkippedRange:
    """Global sample indices ``[start, end)`` never trained on, and why."""

    start: int
    end: int
    step: int  # the step whose loss tripped the guard
    rolled_back_to: int | None  # the checkpoint step reloaded (None: none existed, the run restarted)
    reason: str
    loss: float | None

    def to_json(self) -> dict:
        out = asdict(self)
        if out["loss"] is not None and not math.isfinite(out["loss"]):
            out["loss"] = str(out["loss"])  # JSON has no NaN
        return out


def skip_window(end: int, floor: int, skip_batches: int, global_batch: int) -> tuple[int, int]:
    """The last ``skip_batches`` global batches before sample ``end``, never before ``floor``."""
    return max(floor, end - skip_batches * global_batch), end


class SkipList:
    """The run's skipped sample ranges; moves a loader past any range it is about to read."""

    def __init__(self, run_dir: str, *, writer: bool) -> None:
        self.url = storage.join(storage.normalize_url(run_dir), SKIPPED)
        self.writer = writer
        self.ranges: list[SkippedRange] = []
        fs, path = storage.filesystem(self.url)
        if fs.exists(path):
            for line in fs.cat_file(path).decode().splitlines():
                record = json.loads(line)
                record["loss"] = float(record["loss"]) if record["loss"] is not None else None
                self.ranges.append(SkippedRange(**record))

    def add(self, skipped: SkippedRange) -> None:
        self.ranges.append(skipped)
        if self.writer:
            fs, path = storage.filesystem(self.url)
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with fs.open(path, "a") as f:
                f.write(json.dumps(skipped.to_json(), sort_keys=True) + "\n")

    def advance(self, loader) -> int:
        """Move ``loader`` (a TokenLoader) past every skipped range it stands in; returns samples skipped."""
        position = start = loader.samples_consumed
        moved = True
        while moved:
            moved = False
            for r in self.ranges:
                if r.start <= position < r.end:
                    position, moved = r.end, True
        if position != start:
            loader.load_state_dict({**loader.state_dict(), "samples_consumed": position})
            log.warning("skipping samples [%d, %d): recorded in %s", start, position, self.url)
        return position - start
