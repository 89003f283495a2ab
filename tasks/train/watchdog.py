"""Hang detection: a collective timeout on the process group and a progress watchdog per rank.

A stopped, wedged or vanished peer leaves the other ranks blocked in a collective, silently,
for as long as the collective timeout (30 minutes by default). The progress watchdog turns that
into a restart within ``hang_timeout_s``: a daemon thread that the training loop feeds with
``beat(step)`` after every step. It publishes a heartbeat (last finished step, a counter, pid,
host) to the job's c10d store every poll; when no step finished within the limit it reads every
rank's heartbeat twice, a few polls apart, names the ranks that went silent (their counter stopped:
stopped, frozen or dead) or lag behind, SIGKILLs silent ranks on its own host, logs one line and
exits with ``HANG_EXIT_CODE``. torchrun's agent then restarts the group from the last checkpoint.

Why it kills silent local peers: a SIGSTOPped process keeps the agent's SIGTERM pending, and
torchrun 2.13 waits a fixed 30 s before its SIGKILL (seen here). Silent ranks on other hosts are
left to their own agent and that grace period.

Why ``init_process_group`` here: it carries the collective timeout, and under torchrun's shared
store (its default, ``TORCHELASTIC_USE_AGENT_STORE=True``) every attempt's ranks share one store, so
restarted gloo ranks would read the previous attempt's addresses from it ("connectFullMesh failed
... Connection refused", or a hang connecting to a stopped rank's socket). A namespace per attempt
(restart count and world size) fixes that on one node only: each node's agent counts its restarts
alone. smelt's own launches therefore turn the shared store off (``launch.TORCHRUN_ENV``: rank 0
hosts a fresh store every rendezvous round) and take the plain path; the namespace serves a
torchrun someone starts by hand on one node.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import psutil
import torch.distributed as dist

from tasks.train.agent import GEN_ENV, HANG_EXIT_CODE
from tasks.train.config import WatchdogConfig

log = logging.getLogger(__name__)

STORE_TIMEOUT_S = 10.0


def init_process_group(backend: str, timeout_s: float) -> None:
    """Join torchrun's process group with ``timeout_s`` per collective (see the module docstring)."""
    timeout = timedelta(seconds=timeout_s)
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout)
    attempt = f"smelt/pg/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{env['WORLD_SIZE']}"
    dist.init_process_group(backend, store=dist.PrefixStore(attempt, store), rank=int(env["RANK"]),
                            world_size=int(env["WORLD_SIZE"]), timeout=timeout)


@dataclass(frozen=True)
class Heartbeat:
    """What one rank publishes every poll."""

    rank: int
    step: int  # last finished step (-1: none yet)
    count: int  # publications so far: stops advancing when the whole process stops
    pid: int
    created: float  # the process's start time, to never kill a recycled pid
    host: str


def diagnose(first: dict[int, Heartbeat], second: dict[int, Heartbeat], world_size: int) -> tuple[list[int], list[int]]:
    """(silent ranks, lagging ranks) from two heartbeat snapshots taken a few polls apart.

    Silent: no heartbeat, or its counter did not move. Lagging: alive but behind the furthest step.
    """
    silent = [r for r in range(world_size)
              if r not in second or r not in first or second[r].count == first[r].count]
    alive = [r for r in range(world_size) if r not in silent]
    furthest = max((second[r].step for r in alive), default=-1)
    lagging = [r for r in alive if second[r].step < furthest]
    return silent, lagging


def kill_if_local(beat: Heartbeat) -> bool:
    """SIGKILL the process behind ``beat`` if it runs on this host (and is not a recycled pid)."""
    if beat.host != socket.gethostname():
        return False
    try:
        proc = psutil.Process(beat.pid)
        if abs(proc.create_time() - beat.created) > 1.0:
            return False
        proc.send_signal(signal.SIGKILL)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return True


class ProgressWatchdog:
    """Exits this process when no step finishes in time; call ``beat(step)`` after every step.

    ``start()`` is collective when ``world_size > 1`` (rank 0 picks the heartbeat namespace).
    """

    def __init__(self, cfg: WatchdogConfig, *, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.poll_s = max(0.2, min(5.0, cfg.hang_timeout_s / 10))
        self._last_step = -1
        self._long_phase = True  # until the first step: building, checkpoint load, compile
        self._last_progress = time.monotonic()
        self._count = 0
        self._created = psutil.Process().create_time()
        self._host = socket.gethostname()
        self._store = None
        self._early: dict[int, Heartbeat] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"smelt-watchdog-r{rank}", daemon=True)

    def start(self) -> "ProgressWatchdog":
        self._store = self._open_store()
        self._last_progress = time.monotonic()
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        """A step finished (published at once: peers must see the step a rank stopped after)."""
        self._last_step = step
        self._last_progress = time.monotonic()
        self._long_phase = False
        self._publish()

    def long_phase(self) -> None:
        """Until the next beat the limit is ``startup_timeout_s``: a checkpoint load or the final commit follows."""
        self._long_phase = True
        self._last_progress = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.poll_s + STORE_TIMEOUT_S)

    # -- the thread --------------------------------------------------------------------------------

    def _limit(self) -> float:
        return self.cfg.startup_timeout_s if self._long_phase else self.cfg.hang_timeout_s

    def _run(self) -> None:
        settle = 3 * self.poll_s
        while not self._stop.wait(self.poll_s):
            self._publish()
            idle = time.monotonic() - self._last_progress
            if idle < self._limit() - settle:
                self._early = None
            elif self._early is None:
                self._early = self._snapshot()  # the first look; the second comes at the limit
            if idle >= self._limit():
                self._fire(idle)

    def _open_store(self):
        if self.world_size == 1 or "MASTER_ADDR" not in os.environ:
            return None
        box = [uuid.uuid4().hex if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        try:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=timedelta(seconds=STORE_TIMEOUT_S))
        except (RuntimeError, ValueError) as e:  # the watchdog still works, it just cannot name peers
            log.warning("watchdog: no c10d store at %s:%s (%s); hangs will not name the stuck rank",
                        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], e)
            return None
        return dist.PrefixStore(f"smelt/watchdog/{box[0]}", store)

    def _publish(self) -> None:
        with self._lock:  # the loop's beat() and the thread's poll
            if self._store is None:
                return
            self._count += 1
            beat = Heartbeat(self.rank, self._last_step, self._count, os.getpid(), self._created, self._host)
            try:
                self._store.set(str(self.rank), json.dumps(beat.__dict__))
            except RuntimeError as e:  # never stall training on a lost store: stop publishing
                log.warning("watchdog: heartbeats stopped, the c10d store failed (%s); hangs will not name "
                            "the stuck rank", e)
                self._store = None

    def _snapshot(self) -> dict[int, Heartbeat]:
        out: dict[int, Heartbeat] = {}
        if self._store is None:
            return out
        for rank in range(self.world_size):
            try:
                if self._store.check([str(rank)]):
                    out[rank] = Heartbeat(**json.loads(self._store.get(str(rank))))
            except RuntimeError:
                pass  # unreachable store or rank: it counts as silent
        return out

    def _fire(self, idle: float) -> None:
        line = (f"watchdog: rank {self.rank} finished no step for {idle:.1f} s (limit {self._limit():.0f} s): "
                f"stuck in step {self._last_step + 1} (last finished step {self._last_step})")
        killed = False
        if self._store is not None:
            first = self._early
            if first is None:
                first = self._snapshot()
                time.sleep(3 * self.poll_s)
            self._publish()  # this rank is alive, whatever its last poll
            second = self._snapshot()
            silent, lagging = diagnose(first, second, self.world_size)
            text, killed = self._describe(silent, lagging, second)
            line += "; " + text
        if killed and GEN_ENV in os.environ:
            # smelt's agent (tasks/train/agent.py) replaces the killed rank; this one rejoins once its collective fails
            log.error("%s; this rank stays for an in-process restart", line)
            self._last_progress, self._early = time.monotonic(), None
            return
        log.error("%s; exiting with code %d so torchrun restarts the group", line, HANG_EXIT_CODE)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(HANG_EXIT_CODE)

    def _describe(self, silent: list[int], lagging: list[int], beats: dict[int, Heartbeat]) -> tuple[str, bool]:
        """What the heartbeats say, and whether a silent rank on this host was SIGKILLed."""
        parts, killed_any = [], False
        for rank in silent:
            beat = beats.get(rank)
            where = f"since step {beat.step}" if beat else "never reported"
            killed = beat is not None and beat.pid != os.getpid() and kill_if_local(beat)
            killed_any |= killed
            parts.append(f"rank {rank} silent {where} (stopped, frozen or dead)"
                         + (f", SIGKILLed pid {beat.pid} on this host" if killed else ""))
        for rank in lagging:
            parts.append(f"rank {rank} alive but behind, at step {beats[rank].step}")
        if not parts:
            return "every rank is alive and waiting in the same step (a collective no rank completes)", False
        return "stuck: " + "; ".join(parts), killed_any
