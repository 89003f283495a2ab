"""Straggler detection: find the rank that makes every other rank wait.

Every rank times each step in two parts: *compute*, from the step's start to its arrival at the
step-end all-reduce of the loss (less any time blocked on a checkpoint), and *wait*, the time
spent in that all-reduce, which every rank leaves together. The first step of a process group
(allocation, warm-up) is not timed. A slow rank arrives late and hardly waits; the others wait for it. Every
``every_steps`` steps all ranks all-gather three floats each: the window's median step compute (one
step that a descheduled process or a collector pause stretched does not move it), mean wait, and
steps timed; rank 0 flags a rank whose compute exceeds the median of all ranks by more than ``margin`` (a fraction) for
``consecutive_windows`` windows in a row, once per run for a rank on a host (a window in which a
noisy step hides it does not make it a new straggler when its streak starts again). The median is
not moved by one straggler among three or more ranks; with two ranks it is their mean, so a margin
of 0.25 flags a rank 1.67× the other.

Limits: collectives inside the step (FSDP all-gathers, the gradient-norm all-reduce) also wait
for the slowest rank, and that wait counts as compute for everyone; only the slowness after a
rank's last such collective (or before its first, e.g. data loading) separates it from the rest.
A device-level signal (CUDA event timing per kernel) would see more; this one needs nothing.

Reports, on rank 0: a warning naming the rank and host, ``straggler_max_ratio`` and
``stragglers`` in the step's metrics record, and ``<run_dir>/stragglers.json`` rewritten each
window (the train flow publishes it). With ``write_exclude_list``, flagged hosts are also written
to ``<run_dir>/exclude_hosts.json``, which the launcher reads on the next launch
(tasks/train/node_launch.py: on one host it can only report them).
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
from collections import deque

import torch
import torch.distributed as dist

from tasks import storage
from tasks.train.config import StragglerConfig
from tasks.train.exclude_hosts import EXCLUDE_HOSTS, write_excluded

log = logging.getLogger(__name__)

REPORT = "stragglers.json"
KEPT_WINDOWS = 50


def compare_to_median(compute: list[float], margin: float) -> tuple[list[float], list[int]]:
    """Each rank's compute over the median of all ranks, and the ranks above ``1 + margin``."""
    median = statistics.median(compute)
    ratios = [c / median if median > 0 else 1.0 for c in compute]
    return ratios, [r for r, ratio in enumerate(ratios) if ratio > 1 + margin]


class StragglerDetector:
    """Per-rank step timing; ``maybe_check(step)`` is collective on window ends (call it on every rank)."""

    def __init__(self, cfg: StragglerConfig, run_dir: str, *, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.run_dir = storage.normalize_url(run_dir)
        self.enabled = world_size > 1
        self.hosts = [socket.gethostname()]
        if self.enabled:
            self.hosts = [None] * world_size
            dist.all_gather_object(self.hosts, socket.gethostname())
        self.streak = [0] * world_size
        self.flagged: list[dict] = self._earlier_flags() if self.enabled and rank == 0 else []
        self.windows: deque[dict] = deque(maxlen=KEPT_WINDOWS)
        self._computes: list[float] = []  # this window's step compute seconds
        self._wait_s = 0.0
        self._warm = False

    def observe(self, compute_s: float, wait_s: float) -> None:
        if not self._warm:
            self._warm = True
            return
        self._computes.append(compute_s)
        self._wait_s += wait_s

    def maybe_check(self, step: int) -> dict:
        """At the end of a window: gather, judge, report; returns metric fields (rank 0) or {}."""
        if not self.enabled or step % self.cfg.every_steps:
            return {}
        steps = len(self._computes)
        mine = [statistics.median(self._computes) if steps else 0.0, self._wait_s / max(steps, 1), float(steps)]
        parts = [torch.zeros(3, dtype=torch.float64) for _ in range(self.world_size)]
        dist.all_gather(parts, torch.tensor(mine, dtype=torch.float64))
        gathered = torch.stack(parts)
        self._computes, self._wait_s = [], 0.0
        compute, wait = gathered[:, 0].tolist(), gathered[:, 1].tolist()
        ratios, slow = compare_to_median(compute, self.cfg.margin)
        self.streak = [self.streak[r] + 1 if r in slow else 0 for r in range(self.world_size)]
        if self.rank != 0:
            return {}
        self.windows.append({"step": step, "compute_s": compute, "wait_s": wait, "ratio": ratios, "slow": slow})
        known = {(f["rank"], f["host"]) for f in self.flagged}  # a straggler is flagged once per run, not per streak
        newly = [r for r in range(self.world_size)
                 if self.streak[r] == self.cfg.consecutive_windows and (r, self.hosts[r]) not in known]
        for r in newly:
            self.flagged.append({"rank": r, "host": self.hosts[r], "step": step, "ratio": ratios[r],
                                 "windows": self.cfg.consecutive_windows})
            log.warning("straggler: rank %d on %s took %.2f× the median step compute for %d windows of %d steps "
                        "(up to step %d)", r, self.hosts[r], ratios[r], self.cfg.consecutive_windows,
                        self.cfg.every_steps, step)
        self._write_report()
        if newly and self.cfg.write_exclude_list:
            self._write_exclude_list()
        current = [r for r in range(self.world_size) if self.streak[r] >= self.cfg.consecutive_windows]
        return {"straggler_max_ratio": max(ratios), "stragglers": current}

    def _earlier_flags(self) -> list[dict]:
        """Flags raised by earlier process groups of this run (they are kept in the report)."""
        fs, path = storage.filesystem(storage.join(self.run_dir, REPORT))
        return json.loads(fs.cat_file(path))["flagged"] if fs.exists(path) else []

    def _write_report(self) -> None:
        report = {"every_steps": self.cfg.every_steps, "margin": self.cfg.margin,
                  "consecutive_windows": self.cfg.consecutive_windows, "world_size": self.world_size,
                  "hosts": self.hosts, "flagged": self.flagged, "windows": list(self.windows)}
        with storage.atomic_write(storage.join(self.run_dir, REPORT), "w") as f:
            f.write(json.dumps(report, indent=2))

    def _write_exclude_list(self) -> None:
        hosts = write_excluded(self.run_dir, self.flagged, reason="straggler")
        log.warning("straggler: wrote %s listing %s for the next launch", EXCLUDE_HOSTS, ", ".join(hosts))
