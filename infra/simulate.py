"""Monte Carlo failure simulator: how long a run really takes when the cluster keeps breaking.

Failures are a renewal process in wall-clock time, independent of what the job does: gaps are
exponential (the closed form's assumption) or Weibull with the same mean (shape < 1: failures cluster,
as Schroeder & Gibson 2006 measured on HPC systems). Planned maintenance is a Poisson process.
The job follows the trainer's protocol (docs/design.md §4): every ``interval_s`` of progress it blocks
``blocking_s`` for an async save that commits ``commit_s`` after it began; an interruption rolls back to
the newest committed save and costs ``restart_s`` (which another failure may interrupt); a planned stop
first saves (``commit_s``), so it loses no work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DISTRIBUTIONS = ("exponential", "weibull")


@dataclass(frozen=True)
class RunModel:
    """One training run, in seconds. ``work_s``: failure-free training time, saves excluded (inf: run until
    the simulation's horizon)."""

    work_s: float
    interval_s: float
    blocking_s: float
    commit_s: float
    restart_s: float
    mtbf_s: float
    planned_per_s: float = 0.0
    distribution: str = "exponential"
    weibull_shape: float = 0.7

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown failure distribution {self.distribution!r}; choose one of "
                             f"{', '.join(DISTRIBUTIONS)}")
        if self.interval_s <= 0 or self.mtbf_s <= 0 or self.weibull_shape <= 0:
            raise ValueError("interval_s, mtbf_s and weibull_shape must be positive")
        if self.commit_s < self.blocking_s:
            raise ValueError("commit_s must be at least blocking_s")

    def progress(self, wall_s: float) -> float:
        """Training progress after ``wall_s`` of uninterrupted running (saves block)."""
        cycle = self.interval_s + self.blocking_s
        full, rest = divmod(wall_s, cycle)
        return full * self.interval_s + min(rest, self.interval_s)

    def committed(self, wall_s: float) -> float:
        """Progress safe in a committed checkpoint after ``wall_s`` of uninterrupted running."""
        saves = math.floor((wall_s - self.commit_s + self.blocking_s) / (self.interval_s + self.blocking_s))
        return max(saves, 0) * self.interval_s

    def wall_to_finish(self, remaining_s: float) -> float:
        """Wall time to do ``remaining_s`` of progress from a fresh start (no save needed at the end)."""
        if math.isinf(remaining_s):
            return math.inf
        saves = max(math.ceil(remaining_s / self.interval_s) - 1, 0)
        return remaining_s + saves * self.blocking_s


@dataclass(frozen=True)
class RunOutcome:
    wall_s: float
    failures: int
    planned: int
    progress_s: float  # kept training progress (work_s, or less when a horizon cut the run)


class _Arrivals:
    """Failure times drawn in batches (a renewal process starting at 0)."""

    def __init__(self, model: RunModel, rng: np.random.Generator):
        self.model, self.rng = model, rng
        self.times: np.ndarray = np.empty(0)
        self.next_index, self.clock = 0, 0.0

    def _gaps(self, n: int) -> np.ndarray:
        m = self.model
        if m.distribution == "exponential":
            return self.rng.exponential(m.mtbf_s, n)
        scale = m.mtbf_s / math.gamma(1 + 1 / m.weibull_shape)  # same mean as the exponential
        return scale * self.rng.weibull(m.weibull_shape, n)

    def next(self) -> float:
        if self.next_index == len(self.times):
            self.times = self.clock + np.cumsum(self._gaps(256))
            self.clock, self.next_index = float(self.times[-1]), 0
        t = float(self.times[self.next_index])
        self.next_index += 1
        return t


def simulate_run(model: RunModel, rng: np.random.Generator, horizon_s: float = math.inf) -> RunOutcome:
    """One run until its work is done (or the wall clock reaches ``horizon_s``)."""
    failures_at = _Arrivals(model, rng)
    next_failure = failures_at.next()
    next_planned = rng.exponential(1 / model.planned_per_s) if model.planned_per_s > 0 else math.inf
    kept, resumed_at = 0.0, 0.0  # committed progress; when the current stretch of training began
    failures = planned = 0
    while True:
        finish = resumed_at + model.wall_to_finish(model.work_s - kept)
        event = min(next_failure, next_planned)
        if finish <= event and finish <= horizon_s:
            return RunOutcome(finish, failures, planned, model.work_s)
        if horizon_s < event:
            progress = kept + model.progress(max(horizon_s - resumed_at, 0.0))
            return RunOutcome(horizon_s, failures, planned, min(progress, model.work_s))
        running = event - resumed_at  # negative while restarting
        if next_failure <= next_planned:
            failures += 1
            if running > 0:
                kept += model.committed(running)
            resumed_at = event + model.restart_s
            next_failure = failures_at.next()
        else:
            planned += 1
            if running > 0:  # save everything, then restart; during a restart maintenance costs nothing
                kept += model.progress(running)
                resumed_at = event + model.commit_s + model.restart_s
            next_planned = event + rng.exponential(1 / model.planned_per_s)


@dataclass(frozen=True)
class Simulation:
    wall_s: np.ndarray
    failures: np.ndarray
    planned: np.ndarray
    progress_s: np.ndarray

    @property
    def goodput(self) -> np.ndarray:
        return self.progress_s / self.wall_s

    @property
    def interruptions(self) -> np.ndarray:
        return self.failures + self.planned


def simulate(model: RunModel, runs: int = 1000, seed: int = 0, horizon_s: float = math.inf) -> Simulation:
    """``runs`` independent runs; the same seed gives the same draws."""
    if runs < 1:
        raise ValueError(f"--runs must be at least 1, got {runs}")
    rng = np.random.default_rng(seed)
    outcomes = [simulate_run(model, rng, horizon_s) for _ in range(runs)]
    return Simulation(wall_s=np.array([o.wall_s for o in outcomes]),
                      failures=np.array([o.failures for o in outcomes]),
                      planned=np.array([o.planned for o in outcomes]),
                      progress_s=np.array([o.progress_s for o in outcomes]))


def percentiles(values: np.ndarray) -> dict[str, float]:
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90), "mean": float(values.mean())}


def plot(sim: Simulation, path: str, cost_per_s: float, deadline_days: float, budget: float) -> None:
    """Histograms of days, cost and interruptions with the deadline and budget marked, written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days, cost = sim.wall_s / 86400, sim.wall_s * cost_per_s / 1e6
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, values, limit, title in ((axes[0], days, deadline_days, "days to finish"),
                                     (axes[1], cost, budget / 1e6, "cost ($M)"),
                                     (axes[2], sim.interruptions, None, "interruptions")):
        ax.hist(values, bins=40, color="#4c72b0")
        for q, style in zip(np.percentile(values, [10, 50, 90]), (":", "-", ":")):
            ax.axvline(q, color="black", linestyle=style, linewidth=1)
        if limit is not None:
            ax.axvline(limit, color="#c44e52", linewidth=2, label="limit")
            ax.legend(loc="upper right")
        ax.set_title(title)
    fig.suptitle(f"{len(days)} simulated runs (p10 / p50 / p90 dotted / solid / dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
