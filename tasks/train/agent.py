"""smelt's node agent: a failed rank is replaced by a warm spare while the healthy ranks stay alive.

Why not torchrun: when one worker dies, torchrun's agent kills every worker of its node and every
other agent restarts its own at the next rendezvous, so each failure pays process start, imports
and the model build on every rank (``launch.restart = "torchrun"``, kept as the fallback). With
``launch.restart = "in-process"`` each node runs this agent instead:

- **Store and generations.** Node 0's agent hosts a TCPStore at the rendezvous address; every rank
  and agent is its client. ``smelt/agent/gen`` counts the job's process groups: each rank builds its
  group under the prefix of the current generation.
- **Warm spares.** Every rank process starts as a spare (``tasks.train.main --spare``): it imports
  torch and the trainer, then waits on its stdin for an assignment (rank, world, generation). The
  agent assigns ``nproc`` of them at once and keeps ``spares`` more waiting.
- **A rank dies** (killed by a signal, or the watchdog's hang exit): the agent bumps the
  generation and hands the dead rank's identity to a spare, then starts a new spare. The healthy
  ranks see their collective fail (gloo reports a closed peer at once; a stopped peer is SIGKILLed
  by a local rank's progress watchdog first), drop the trainer and the process group, and rebuild
  both in the same process for the new generation (``run_rank``); every rank then restores the
  newest in-memory snapshot (tasks/train/snapshot.py), so a failure costs detection + rejoin +
  restore and at most one step.
- **A rank fails by itself** (an exception: a bug, a bad config, the loss guard giving up) is
  permanent, not retried: the agent sets ``smelt/agent/abort``, every agent stops its ranks, and the
  job exits with that rank's status.
- **A whole node is lost** (its agent, ranks and store): the survivors wait ``rejoin_timeout_s`` for
  a new generation. A replacement agent started for the same ``--node-rank`` (a spare node from the
  scheduler) sees that the job is running, bumps the generation and starts its ranks; they restore
  from the replicas on other nodes. Without one, the survivors give up and the job exits for the
  scheduler's relaunch, which resumes from the snapshots as well.
- ``max_failures`` bounds the replacements of one job.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import psutil

log = logging.getLogger(__name__)

GEN_KEY = "smelt/agent/gen"
ABORT_KEY = "smelt/agent/abort"
STARTED_KEY = "smelt/agent/started"
DONE_PREFIX = "smelt/agent/done/"
GEN_ENV = "SMELT_GEN"  # a rank's generation; its presence means ranks restart in process (watchdog.py reads it)
# EX_TEMPFAIL: a hang the rank's watchdog turned into an exit (watchdog.py), replaceable like a crash
HANG_EXIT_CODE = 75
SPARE_FLAG = "--spare"
STORE_TIMEOUT_S = 60.0
POLL_S = 0.05


def _store(host: str, port: int, *, master: bool, timeout_s: float = STORE_TIMEOUT_S):
    import torch.distributed as dist  # the agent itself never needs torch otherwise

    return dist.TCPStore(host, port, is_master=master, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


@dataclass
class _Proc:
    popen: subprocess.Popen
    rank: int | None = None  # None: a spare


class NodeAgent:
    """One node's ranks and spares; ``run()`` returns the job's exit status on this node."""

    def __init__(self, args: list[str], *, nnodes: int, node_rank: int, nproc: int, master_addr: str,
                 master_port: int, spares: int = 1, max_failures: int = 16, env: dict[str, str] | None = None,
                 log_line: Callable[[str], None] = log.info, cwd: str | None = None) -> None:
        if not 0 <= node_rank < nnodes or nproc < 1 or spares < 1:
            raise ValueError(f"node rank {node_rank} of {nnodes} nodes, {nproc} ranks and {spares} spares per node: "
                             "need 0 <= node rank < nodes, at least one rank and one spare")
        self.args, self.nnodes, self.node_rank, self.nproc = list(args), nnodes, node_rank, nproc
        self.master_addr, self.master_port = master_addr, master_port
        self.spares, self.max_failures = spares, max_failures
        # One thread per rank unless told otherwise, as torchrun does: on a small host, ranks that each
        # spawn a thread per core slow tiny matmuls by orders of magnitude (~300x with 2 threads on 2 busy cores).
        self.env = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
        self.log_line, self.cwd = log_line, cwd
        self.failures = 0
        self.replacements: list[dict] = []  # each failure: rank, exit status, generation, time
        self.assignments: list[dict] = []  # each process given a rank: rank, pid, generation
        self._procs: list[_Proc] = []
        self._stop = threading.Event()

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    # -- processes ---------------------------------------------------------------------------------------

    def _spawn(self) -> _Proc:
        cmd = [sys.executable, "-m", "tasks.train.main", SPARE_FLAG, *self.args]
        popen = subprocess.Popen(cmd, cwd=self.cwd, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        proc = _Proc(popen)
        threading.Thread(target=self._forward, args=(proc,), daemon=True).start()
        self._procs.append(proc)
        return proc

    def _forward(self, proc: _Proc) -> None:
        for line in proc.popen.stdout:
            self.log_line(line.rstrip())

    def _assign(self, proc: _Proc, local_rank: int, gen: int) -> None:
        rank = self.node_rank * self.nproc + local_rank
        proc.rank = rank
        assignment = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": self.world_size,
                      "LOCAL_WORLD_SIZE": self.nproc, "GROUP_RANK": self.node_rank, "MASTER_ADDR": self.master_addr,
                      "MASTER_PORT": self.master_port, GEN_ENV: gen}
        proc.popen.stdin.write(json.dumps({k: str(v) for k, v in assignment.items()}) + "\n")
        proc.popen.stdin.flush()
        self.assignments.append({"rank": rank, "pid": proc.popen.pid, "generation": gen, "time": time.time()})

    def _spare(self) -> _Proc:
        spare = next((p for p in self._procs if p.rank is None and p.popen.poll() is None), None)
        return spare or self._spawn()

    def stop(self) -> None:
        """End the job on this node: ``run()`` returns and stops every rank and spare (SIGTERM, then SIGKILL)."""
        self._stop.set()

    def lose_node(self) -> None:
        """Simulate this node's loss (tests, the chaos bench): the loop stops touching the store and every
        process of the node dies at once, as with a power cut."""
        self._stop.set()
        for proc in list(self._procs):
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _stop_all(self) -> None:
        procs = [p.popen for p in self._procs]
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for child in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
                    try:
                        child.kill()
                    except psutil.NoSuchProcess:
                        pass
                p.wait()

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self) -> int:
        store = _store(self.master_addr, self.master_port, master=self.node_rank == 0)
        joining = store.check([STARTED_KEY])  # a replacement node joins a running job: a new generation
        gen = store.add(GEN_KEY, 1 if joining else 0)
        if joining:
            self.log_line(f"smelt agent: node {self.node_rank} joins the running job as generation {gen}")
        for _ in range(self.nproc + self.spares):
            self._spawn()
        for local_rank in range(self.nproc):
            self._assign(self._procs[local_rank], local_rank, gen)
        store.set(STARTED_KEY, "1")
        try:
            return self._supervise(store)
        finally:
            self._stop_all()

    def _supervise(self, store) -> int:
        done: set[int] = set()
        while True:
            if self._stop.is_set():
                return -signal.SIGKILL
            if store.check([ABORT_KEY]):
                why = store.get(ABORT_KEY).decode()
                self.log_line(f"smelt agent: node {self.node_rank} stops: {why}")
                return 1
            for proc in list(self._procs):
                if self._stop.is_set():
                    break
                code = proc.popen.poll()
                if code is None or proc.rank is None or proc.rank in done:
                    if code is not None and proc.rank is None:
                        self._procs.remove(proc)  # a spare that died: start another
                        self._spawn()
                    continue
                if code == 0:
                    done.add(proc.rank)
                    continue
                self._procs.remove(proc)
                if not (code < 0 or code == HANG_EXIT_CODE):
                    store.set(ABORT_KEY, f"rank {proc.rank} failed with status {code} (a permanent error: see its "
                                         "log); the job stops")
                    self.log_line(f"smelt agent: rank {proc.rank} exited with status {code}: not retried")
                    return code
                self.failures += 1
                if self.failures > self.max_failures:
                    store.set(ABORT_KEY, f"{self.failures} rank failures on node {self.node_rank}, more than "
                                         f"max_failures={self.max_failures}")
                    return 1
                started = time.time()
                gen = store.add(GEN_KEY, 1)
                local_rank = proc.rank - self.node_rank * self.nproc
                self._assign(self._spare(), local_rank, gen)
                self._spawn()  # the next spare warms up while the job goes on
                how = f"signal {-code}" if code < 0 else f"status {code}"
                self.log_line(f"smelt agent: rank {proc.rank} died ({how}); a warm spare took its place in "
                              f"generation {gen}")
                self.replacements.append({"rank": proc.rank, "exit": code, "generation": gen, "time": started})
            if len(done) == self.nproc:
                return self._finish(store)
            time.sleep(POLL_S)

    def _finish(self, store) -> int:
        """This node's ranks are done; node 0 hosts the store, so it waits for the others to be done too."""
        store.set(f"{DONE_PREFIX}{self.node_rank}", "1")
        if self.node_rank == 0:
            try:
                store.wait([f"{DONE_PREFIX}{n}" for n in range(self.nnodes)], timedelta(seconds=STORE_TIMEOUT_S))
            except RuntimeError:  # a node that never reports done has failed by itself: its agent says so
                self.log_line(f"smelt agent: not every node reported done within {STORE_TIMEOUT_S:.0f} s")
        return 0


# -- the rank's side -------------------------------------------------------------------------------------


def wait_for_assignment() -> None:
    """A spare: block until the agent writes this process's identity on stdin, then take it."""
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)  # the agent is gone: nothing to do
    os.environ.update(json.loads(line))


def is_peer_failure(error: BaseException) -> bool:
    """A collective failed because a peer went away (gloo's or the store's words), not a fault of ours."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) or any(
        words in text for words in ("Connection closed by peer", "Read error", "Connection reset", "Broken pipe",
                                    "gloo", "Socket Timeout", "connectFullMesh"))


def next_generation(store, current: int, timeout_s: float) -> int | None:
    """The job's generation once it is newer than ``current``; None if the job aborts or nothing comes in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store.check([ABORT_KEY]):
            return None
        gen = store.add(GEN_KEY, 0)
        if gen > current:
            return gen
        time.sleep(POLL_S)
    return None


def run_rank(build_and_train: Callable[[], None], *, backend: str, timeout_s: float, rejoin_timeout_s: float) -> None:
    """Train in generations: on a peer's failure, drop the process group and rebuild for the next one.

    ``build_and_train`` builds a Trainer on the current process group and trains it to the end,
    aborting (not closing) it if a collective fails. ``timeout_s``: each collective's."""
    import torch.distributed as dist

    env = os.environ
    store = _store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), master=False)
    gen = int(env[GEN_ENV])
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    while True:
        dist.init_process_group(backend, store=dist.PrefixStore(f"smelt/pg/{gen}", store), rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        try:
            build_and_train()
            dist.destroy_process_group()
            return
        except Exception as e:  # noqa: BLE001 - sorted below: a peer's failure or ours
            peer = is_peer_failure(e)
            dist.destroy_process_group()
            if not peer:
                raise
            log.warning("rank %d: a peer failed in generation %d (%s); rejoining", rank, gen, str(e)[:200])
            new = next_generation(store, gen, rejoin_timeout_s)
            if new is None:
                raise RuntimeError(f"rank {rank}: no new generation within {rejoin_timeout_s:.0f} s after a peer "
                                   f"failed (or the job aborted); exiting for a relaunch") from e
            gen = new
            env[GEN_ENV] = str(gen)
