"""Fault injection: kill, stop, slow down or poison a rank on cue, to prove the run survives it.

Off unless asked for, by ``[train.faults] inject`` or the ``SMELT_FAULTS`` environment variable
(both are read, same syntax). The trainer knows nothing of faults: ``fault_callbacks`` gives the rank's
entry point (tasks/train/main.py) the callbacks it passes to the Trainer (tasks/train/callbacks.py): faults separated by ``;``, each ``kind:key=value,...``.

    kill:rank=1,step=7            SIGKILL rank 1 at the start of step 7
    kill:rank=0,step=6,at=save    ... just after the step-6 checkpoint save started (its files in flight;
                                  with checkpoint.async_mode=off the save is already complete then)
    kill:rank=1,step=8,at=saved   ... once the step-8 checkpoint has committed
    kill:rank=1,step=8,at=snapshot  ... just after the step-8 in-memory snapshot started (its copy in flight)
    kill:rank=1,step=8,at=replicate ... once that snapshot is copied, while it is being replicated
    stop:rank=0,step=5            SIGSTOP rank 0 at the start of step 5: a hang, it never comes back
    slow:rank=1,factor=3          rank 1 sleeps (factor - 1) × its compute time every step (step=S: from S)
    nan:step=6                    the loss and gradients of step 6 become NaN (rank=R: on rank R only)
    corrupt_snapshot:rank=1,step=7  at the start of step 7, flip a byte in rank 1's newest snapshot file on its
                                  node (step 6's), then SIGKILL rank 1: the restart must refuse that copy
    crash_in_save:step=10         every rank (rank=R: rank R) exits after the step-10 checkpoint's files
                                  are written and before its manifest (the checkpointer's on_written hook);
                                  step 10 must be a checkpoint step
    hold:rank=0,step=12,replica=1 replica groups ([train.ft]; rank: replica id × group size + rank in the group):
                                  at the start of step 12, before its quorum, the rank waits until replica
                                  group 1 was restarted and is up again (a gate that keeps a survivor from
                                  finishing the run before a restarted group is back, whatever the timing)

Kills and stops at the start of a step first wait for earlier checkpoint saves to commit and earlier
snapshots to be replicated, so the state a restart resumes from does not depend on timing. Every fault
but ``slow`` fires once per run: before acting, the rank writes
``<run_dir>/faults/fired-<kind>-<rank>-<step>[-<at>]`` (JSON: pid, host, time), and a restarted rank
drops the faults whose marker exists. ``slow`` is a
condition, not an event: it holds in every process group.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tasks import storage
from tasks.errors import UserError
from tasks.train.callbacks import Callback
from tasks.train.config import FaultConfig

log = logging.getLogger(__name__)

ENV = "SMELT_FAULTS"
FAULTS_DIR = "faults"
KINDS = ("kill", "stop", "slow", "nan", "crash_in_save", "corrupt_snapshot", "hold")
KILL_PHASES = ("step", "save", "saved", "snapshot", "replicate")
_NEEDS = {"kill": ("rank", "step"), "stop": ("rank", "step"), "slow": ("rank", "factor"), "nan": ("step",),
          "crash_in_save": ("step",), "corrupt_snapshot": ("rank", "step"), "hold": ("rank", "step", "replica")}
_KEYS = {"rank", "step", "factor", "at", "replica"}
HOLD_TIMEOUT_S = 300.0  # a hold whose gate never opens fails the rank instead of hanging the test


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None  # None: every rank
    step: int | None = None
    factor: float = 1.0
    at: str = "step"
    replica: int | None = None  # hold: the replica group waited for

    def marker(self, rank: int) -> str:
        """File name recording that this fault fired on ``rank``."""
        suffix = "" if self.at == "step" else f"-{self.at}"
        return f"fired-{self.kind}-{rank}-{self.step}{suffix}"


def parse_faults(text: str) -> list[Fault]:
    """``"kill:rank=1,step=7;nan:step=6"`` → faults; a malformed entry raises ValueError naming it."""
    faults = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        kind, _, rest = entry.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise UserError(f"fault {entry!r}: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
        fields: dict[str, str] = {}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in _KEYS:
                raise UserError(f"fault {entry!r}: {item!r} must be one of {', '.join(sorted(_KEYS))} as key=value")
            fields[key] = value.strip()
        missing = [k for k in _NEEDS[kind] if k not in fields]
        if missing:
            raise UserError(f"fault {entry!r} needs {' and '.join(missing)} (e.g. {kind}:"
                             f"{','.join(f'{k}=1' for k in _NEEDS[kind])})")
        at = fields.get("at", "step")
        if at not in KILL_PHASES or (at != "step" and kind != "kill"):
            raise UserError(f"fault {entry!r}: at= is only for kill and must be one of {', '.join(KILL_PHASES)}")
        try:
            fault = Fault(kind, int(fields["rank"]) if "rank" in fields else None,
                          int(fields["step"]) if "step" in fields else None, float(fields.get("factor", 1.0)), at,
                          int(fields["replica"]) if "replica" in fields else None)
        except ValueError:
            raise UserError(f"fault {entry!r}: rank, step and replica must be integers, factor a number") from None
        if kind == "slow" and fault.factor < 1:
            raise UserError(f"fault {entry!r}: factor must be >= 1 (3 means three times slower)")
        faults.append(fault)
    return faults


class FaultInjector(Callback):
    """The faults of one rank: a trainer callback (tasks/train/callbacks.py), each hook a no-op without faults."""

    def __init__(self, faults: list[Fault], run_dir: str, rank: int) -> None:
        self.rank = rank
        self.dir_url = storage.join(storage.normalize_url(run_dir), FAULTS_DIR)
        mine = [f for f in faults if f.rank in (None, rank)]
        fired = self._fired() if mine else set()
        self.faults = [f for f in mine if f.kind == "slow" or f.marker(rank) not in fired]
        self._snapshots = None  # the trainer's snapshotter, once it has taken a snapshot
        self._crash_at: int | None = None  # crash_in_save: the step whose checkpoint this rank dies in
        if self.faults:
            log.warning("fault injection armed on rank %d: %s", rank, self.faults)

    @classmethod
    def from_config(cls, cfg: FaultConfig, run_dir: str, rank: int) -> "FaultInjector":
        text = ";".join(filter(None, [cfg.inject, os.environ.get(ENV, "")]))
        return cls(parse_faults(text), run_dir, rank)

    # -- callback hooks, in the order a step meets them -------------------------------------------

    def on_step_start(self, step: int, checkpointer=None) -> None:
        """kill / stop at the start of ``step``, once earlier saves (if any: replica groups keep none) committed."""
        for fault in self._due(step, ("kill", "stop", "corrupt_snapshot"), at="step"):
            if checkpointer is not None:
                checkpointer.wait_for_commit()
            if self._snapshots is not None:
                self._snapshots.wait()
            self._fire(fault, step)

    def on_hold(self, step: int, back: Callable[[int], bool]) -> None:
        """hold at the start of ``step`` until ``back(replica)``: that group was restarted and is up again."""
        for fault in self._due(step, ("hold",)):
            log.warning("fault injection: rank %d holds at step %d until replica group %d is back", self.rank, step,
                        fault.replica)
            deadline = time.monotonic() + HOLD_TIMEOUT_S
            while not back(fault.replica):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hold at step {step}: replica group {fault.replica} was not back within "
                                       f"{HOLD_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
            self._fire(fault, step)

    def on_loss(self, step: int, loss: torch.Tensor, params) -> torch.Tensor:
        """A NaN loss, and the NaN gradients its backward would have produced."""
        for fault in self._due(step, ("nan",)):
            self._fire(fault, step)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(float("nan"))
            return loss * float("nan")
        return loss

    def on_step_end(self, step: int, compute_s: float) -> None:
        for fault in self.faults:
            if fault.kind == "slow" and step >= (fault.step or 1):
                time.sleep((fault.factor - 1) * compute_s)

    def on_save_start(self, step: int) -> None:
        """Arm crash_in_save for this step's save (``on_checkpoint_written`` carries it out)."""
        for fault in self._due(step, ("crash_in_save",)):
            self._fire(fault, step)

    def on_checkpoint_written(self, step: int) -> None:
        """crash_in_save: exit once this rank's files of the step are on storage, before the manifest."""
        if self._crash_at == step:
            log.error("fault injection: crash_in_save on rank %d: exiting before the manifest of step %d",
                      self.rank, step)
            logging.shutdown()
            os._exit(1)

    def on_save_end(self, step: int, started: bool, checkpointer) -> None:
        """kill at=save (the step's files in flight) or at=saved (once they committed)."""
        if not started:
            return
        for fault in self._due(step, ("kill",), at="save"):
            self._fire(fault, step)
        for fault in self._due(step, ("kill",), at="saved"):
            checkpointer.wait_for_commit()
            self._fire(fault, step)

    def on_snapshot(self, step: int, snapshots) -> None:
        """kill at=snapshot (its copy in flight) or at=replicate (copied, being replicated)."""
        self._snapshots = snapshots
        for fault in self._due(step, ("kill",), at="snapshot"):
            self._fire(fault, step)
        for fault in self._due(step, ("kill",), at="replicate"):
            snapshots.wait_for_copy()
            self._fire(fault, step)

    # -- firing ----------------------------------------------------------------------------------

    def _due(self, step: int, kinds: tuple[str, ...], at: str = "step") -> list[Fault]:
        return [f for f in self.faults if f.kind in kinds and f.step == step and f.at == at]

    def _fire(self, fault: Fault, step: int) -> None:
        self.faults.remove(fault)
        record = {"kind": fault.kind, "rank": self.rank, "step": step, "at": fault.at, "pid": os.getpid(),
                  "host": socket.gethostname(), "time": time.time()}
        with storage.atomic_write(storage.join(self.dir_url, fault.marker(self.rank)), "w") as f:
            f.write(json.dumps(record))
        log.warning("fault injection: %s on rank %d at step %d (pid %d)", fault.kind + (
            "" if fault.at == "step" else f"@{fault.at}"), self.rank, step, os.getpid())
        if fault.kind == "corrupt_snapshot":
            self._corrupt_newest_snapshot()
        if fault.kind in ("kill", "corrupt_snapshot"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault.kind == "crash_in_save":
            self._crash_at = step

    def _corrupt_newest_snapshot(self) -> None:
        """Flip one byte in the middle of this rank's newest snapshot file on its node."""
        if self._snapshots is None:
            raise RuntimeError("corrupt_snapshot needs snapshots (snapshot.enabled) and a step after the first")
        store = self._snapshots.store
        path = store.path(self.rank, max(s for s in store.steps() if store.path(self.rank, s).exists()))
        with open(path, "r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        log.warning("fault injection: flipped a byte of %s", path)

    def _fired(self) -> set[str]:
        fs, path = storage.filesystem(self.dir_url)
        if not fs.exists(path):
            return set()
        return {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)}


def fault_callbacks(cfg: FaultConfig, run_dir: str, rank: int) -> list[Callback]:
    """The trainer callbacks for ``[train.faults]`` and ``SMELT_FAULTS`` on ``rank``: none when nothing is armed."""
    injector = FaultInjector.from_config(cfg, run_dir, rank)
    return [injector] if injector.faults else []


def fired_faults(run_dir: str) -> list[dict]:
    """The fault records of a run (what fired, where, when), oldest first."""
    url = storage.join(storage.normalize_url(run_dir), FAULTS_DIR)
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        return []
    entries = [e for e in fs.ls(path, detail=False) if e.rstrip("/").rsplit("/", 1)[-1].startswith("fired-")]
    records = [json.loads(fs.cat_file(entry)) for entry in entries]
    return sorted(records, key=lambda r: r["time"])
