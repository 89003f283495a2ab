"""Progress lines a person can read in a terminal and in the Prefect log, without flooding either.

A line is written when work finishes ``first_s`` after the start, then at intervals that double up
to ``max_every_s`` (5 s, 10 s, 20 s, 40 s, then every minute: about 1,400 lines a day at most), and
at the end of work that took longer than ``first_s`` (a quick map says nothing). Each says how far the work is, its rate and the time left at that rate:

    ingest: 12/40 work items (30%), 18,230 records at 1,204/s, ETA 0:00:23
    train: step 400/10000 (4%), 2.31 steps/s, 9,452 tokens/s, ETA 1:09:15
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

FIRST_S = 5.0
MAX_EVERY_S = 60.0


def eta(seconds: float) -> str:
    """``H:MM:SS`` (days first when longer than one)."""
    return str(datetime.timedelta(seconds=max(0, round(seconds))))


class RateLimit:
    """True at most once per interval; the interval doubles after each yes, up to ``max_every_s``."""

    def __init__(self, first_s: float = FIRST_S, max_every_s: float = MAX_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.max_every_s = clock, max_every_s
        self.every_s = first_s
        self.next_at = clock() + first_s

    def due(self) -> bool:
        now = self.clock()
        if now < self.next_at:
            return False
        self.next_at = now + self.every_s
        self.every_s = min(self.max_every_s, self.every_s * 2)
        return True


def records_in(result: Any) -> int:
    """Records a work item read, from its stats' ``in`` counter (a ``ShardResult``), else 0."""
    stats = getattr(result, "stats", None)
    return int(stats.get("in", 0)) if isinstance(stats, dict) else 0


class MapProgress:
    """Progress of a map over work items: items done, records read per second, ETA by items."""

    def __init__(self, label: str, total: int, log_fn: Callable[[str], None], *, limit: RateLimit | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.log_fn, self.clock = label, total, log_fn, clock
        self.limit = limit or RateLimit(clock=clock)
        self.start = clock()
        self.done = self.records = 0

    def update(self, result: Any = None) -> None:
        """One work item finished with ``result``."""
        self.done += 1
        self.records += records_in(result)
        finished = self.done == self.total and self.clock() - self.start >= FIRST_S  # quick maps stay quiet
        if finished or self.limit.due():
            self.log_fn(self.line())

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        text = f"{self.label}: {self.done}/{self.total} work items ({100 * self.done // max(1, self.total)}%)"
        if self.records:
            text += f", {self.records:,} records at {self.records / elapsed:,.0f}/s"
        if self.done < self.total:
            text += f", ETA {eta(elapsed / self.done * (self.total - self.done))}"
        else:
            text += f" in {eta(elapsed)}"
        return text


class StepProgress:
    """Progress of training: step of total, steps/s and tokens/s over the last interval, ETA at that pace."""

    def __init__(self, total_steps: int, log_fn: Callable[[str], None], *, label: str = "train",
                 limit: RateLimit | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.log_fn, self.label, self.clock = total_steps, log_fn, label, clock
        self.limit = limit or RateLimit(clock=clock)
        self._mark: tuple[float, int, int] | None = None  # (time, step, tokens) at the last line

    def update(self, step: int, tokens: int) -> None:
        now = self.clock()
        if self._mark is None:
            self._mark = (now, step, tokens)
            return
        if step >= self.total or self.limit.due():
            self.log_fn(self.line(now, step, tokens))
            self._mark = (now, step, tokens)

    def line(self, now: float, step: int, tokens: int) -> str:
        then, step0, tokens0 = self._mark
        elapsed = max(now - then, 1e-9)
        steps_per_s = (step - step0) / elapsed
        text = (f"{self.label}: step {step}/{self.total} ({100 * step // max(1, self.total)}%), "
                f"{steps_per_s:.2f} steps/s, {(tokens - tokens0) / elapsed:,.0f} tokens/s")
        if step < self.total and steps_per_s > 0:
            text += f", ETA {eta((self.total - step) / steps_per_s)}"
        return text
