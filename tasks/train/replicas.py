"""Start and supervise fault-tolerant replica groups on 127.0.0.1 (``[train.ft]``, torchft 0.2.0): torchft's
Lighthouse, and ``parallel.dp_replicate`` groups, each a torchrun job of ``nproc / dp_replicate`` ranks running
``tasks.train.replica_group`` (FSDP and TP inside a group; no PP: see replica_group.py). How a group is started,
seen and killed is a ``LocalStarter`` (process trees here); replica_cluster.py's ``SrunStarter`` runs the same
supervisor on a Slurm batch host with each group a job step on its own nodes.

What torchft leaves to smelt, and where it is covered:

- **A lost group** is restarted here (``ft.max_group_restarts``); it heals from a live peer inside its Manager
  (torchft's HTTP checkpoint transport) while the others keep stepping without it.
- **The Lighthouse is a single point of failure in torchft**: it holds no state a step needs beyond the
  current quorum, so the supervisor restarts it on the same port as soon as it exits, and each group retries
  its quorum (``ReplicaGroup._quorum``) until the new one answers. Steps in flight when it died are
  discarded by the commit vote and retried: no committed step is lost.
- **A hung group** (a stopped rank, a deadlock: its processes live on) is never ended by torchft. Whole, it is
  dropped from the quorum when its heartbeats stop, and never comes back; with one rank stopped, its Manager
  (on the group's rank 0) heartbeats on, and the Lighthouse, which wants more than half of the heartbeating
  groups in a quorum, stalls every group (with two groups, until the quorum timeout fails them all). The
  supervisor kills and restarts a group that stays behind the others' newest committed step, or holds a stopped
  process, for ``ft.timeout_s`` (``ReplicaGroups._kill_hung``, which says what it does not cover).
- **A fixed global batch, every sample exactly once**: replica_group.py; ``merge_records`` proves it per step
  from the groups' own records and writes the run's ``metrics.jsonl`` (one record per committed step, with
  ``samples`` for tasks/trace's ledger and each participant's ``shares``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tasks import storage
from tasks import jsonlog
from tasks.repo import REPO_ROOT, python_path
from tasks.train.config import ReplicaConfig, TrainConfig
from tasks.train.data import TokenLoader
from tasks.train.procs import free_port, kill_session, kill_tree, stop_tree, stopped_processes
from tasks.train.replica_group import REPLICA_ENV, RESTARTED_ENV
from tasks.train.replica_records import group_dir, newest_step, up_count
from tasks.train.sample_losses import LINEAGE

log = logging.getLogger(__name__)

POLL_S = 0.05  # the supervisor's round: how soon a dead Lighthouse or group is restarted
HUNG_CHECK_S = 0.5  # how often the supervisor reads the groups' newest committed steps (a hung group's detection)


class ReplicaError(RuntimeError):
    """The replica groups cannot go on (a group out of restarts, records that break exactly-once)."""


def lighthouse_binary() -> str:
    """torchft's Lighthouse binary: beside this interpreter (the venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(here) if here.exists() else shutil.which("torchft_lighthouse")
    if not found:
        raise ReplicaError("torchft_lighthouse is not installed; pip install -c constraints.txt torchft==0.2.0")
    return found


def lighthouse_command(ft: ReplicaConfig, bind: str, binary: str | None = None) -> list[str]:
    """torchft's Lighthouse bound to ``bind`` (host:port) with the run's quorum settings (``binary``: the
    Kubernetes image's, else this host's)."""
    return [binary or lighthouse_binary(), "--bind", bind, "--min_replicas", str(ft.min_replicas),
            "--join_timeout_ms", str(ft.join_timeout_ms), "--quorum_tick_ms", str(ft.quorum_tick_ms),
            "--heartbeat_timeout_ms", str(ft.heartbeat_timeout_ms)]


class Lighthouse:
    """torchft's Lighthouse on ``host``:``port`` (127.0.0.1 on one host; the batch host's address on Slurm),
    restarted on the same port whenever it exits (``poll``)."""

    def __init__(self, ft: ReplicaConfig, port: int = 0, log_line: Callable[[str], None] = log.info,
                 host: str = "127.0.0.1") -> None:
        self.ft, self.port, self.log_line = ft, port or ft.lighthouse_port or free_port(), log_line
        self.host = host
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        cmd = lighthouse_command(self.ft, f"{self.host}:{self.port}")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def poll(self) -> bool:
        """Restart a Lighthouse that exited; True if it did."""
        if self.proc is None or self.proc.poll() is None:
            return False
        self.restarts += 1
        self.log_line(f"replicas: the Lighthouse exited ({self.proc.returncode}); restarting it on port {self.port} "
                      f"(restart {self.restarts})")
        self.start()
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@dataclass
class Group:
    replica_id: int
    proc: subprocess.Popen | None = None
    restarts: int = 0
    done: bool = False
    starts: list[float] = field(default_factory=list)
    # the hung-group check (ReplicaGroups._kill_hung), all on the supervisor's monotonic clock:
    up_before: int = 0  # up markers the group had when it was last started
    up_at: float | None = None  # when this start was first seen up (its Manager built)
    newest: int | None = None  # the newest step its record held at the last check
    behind_since: float | None = None  # since when another group holds a newer committed step
    stopped_since: float | None = None  # since when one of its processes is stopped
    killed: bool = False  # killed as hung; its exit is restarted by the next round


def group_command(nproc: int, args: list[str], replica_id: int, run_dir: str, *, nnodes: int = 1,
                  rdzv: str | None = None) -> tuple[list[str], dict[str, str]]:
    """One group's command (each of its ``nnodes`` nodes runs it, ``nproc`` ranks per node) and its extra
    environment: a torchrun agent (its own c10d rendezvous at ``rdzv``, host:port, by default a free port on
    127.0.0.1; no torchrun restarts: the supervisor restarts the group, which then heals from a peer); a one-rank
    group runs its rank directly, which saves the agent's start (a second interpreter importing torch)."""
    entry = ["-m", "tasks.train.replica_group", *args, "--replica-id", str(replica_id)]
    if nproc == 1 and nnodes == 1:
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        return [sys.executable, *entry], env
    run_id = hashlib.sha256(f"{storage.normalize_url(run_dir)}#{replica_id}".encode()).hexdigest()[:12]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv or f"127.0.0.1:{free_port()}", "--rdzv-id", run_id,
            "--max-restarts", "0", *entry], {}


class LocalStarter:
    """How a group is started, seen and killed: here, as a process tree on this host. ``replica_cluster.SrunStarter``
    starts each group as a Slurm job step on its own nodes instead; the supervisor is the same."""

    def command(self, nproc: int, args: list[str], replica_id: int, run_dir: str) -> tuple[list[str], dict[str, str]]:
        return group_command(nproc, args, replica_id, run_dir)

    def stopped(self, group: Group) -> list[int]:
        """The pids of the group's processes that are stopped (the hung-group rule's second half)."""
        return stopped_processes(group.proc)

    def kill(self, group: Group) -> None:
        """SIGKILL the whole group (its torchrun agent and ranks): its exit is restarted by the next round."""
        kill_tree(group.proc)

    def stop(self, group: Group) -> None:
        """End the group for good (the supervisor's end)."""
        if group.proc.poll() is None:
            stop_tree(group.proc)
        else:  # torchrun gone: its ranks sit in sessions of their own
            kill_session(group.proc.pid)


class ReplicaGroups:
    """The Lighthouse and every group of one run, supervised by ``poll`` (one round) or ``run``; the groups are
    process trees on this host, or what ``starter`` makes them (Slurm job steps)."""

    def __init__(self, cfg: TrainConfig, args: list[str], run_dir: str, nproc: int, *,
                 env: dict[str, str] | None = None, log_line: Callable[[str], None] = log.info,
                 starter: LocalStarter | None = None, lighthouse_host: str = "127.0.0.1") -> None:
        groups = cfg.parallel.dp_replicate
        if nproc % groups:
            raise ValueError(f"launch.nproc ({nproc}) must be a multiple of parallel.dp_replicate ({groups}): "
                             "each replica group gets the same number of ranks")
        self.cfg, self.args, self.run_dir = cfg, args, storage.normalize_url(run_dir)
        self.group_nproc, self.log_line = nproc // groups, log_line
        self.lighthouse = Lighthouse(cfg.ft, log_line=log_line, host=lighthouse_host)
        self.starter = starter or LocalStarter()
        self.groups = [Group(i) for i in range(groups)]
        self.env = {**os.environ, **(env or {}), "TORCHFT_LIGHTHOUSE": self.lighthouse.address,
                    "PYTHONPATH": python_path()}
        self._readers: list[threading.Thread] = []
        self._checked = 0.0
        self.hung_kills = 0

    def start(self) -> "ReplicaGroups":
        self.lighthouse.start()
        for group in self.groups:
            self._start_group(group)
        return self

    def _start_group(self, group: Group) -> None:
        cmd, extra = self.starter.command(self.group_nproc, self.args, group.replica_id, self.run_dir)
        env = {**self.env, **extra, REPLICA_ENV: str(group.replica_id), RESTARTED_ENV: "1" if group.restarts else "0"}
        group.up_before, group.up_at = up_count(self.run_dir, group.replica_id), None
        group.behind_since = group.stopped_since = None
        group.killed = False
        group.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1, start_new_session=True)
        group.starts.append(time.time())
        reader = threading.Thread(target=self._forward, args=(group.proc,), daemon=True)
        reader.start()
        self._readers.append(reader)

    def _forward(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.log_line(line.rstrip())

    def poll(self) -> int | None:
        """One supervision round: restart the Lighthouse or a failed group; the job's exit status once every
        group finished (0) or one ran out of restarts (its status), else None."""
        self.lighthouse.poll()
        if time.monotonic() - self._checked >= HUNG_CHECK_S:
            self._checked = time.monotonic()
            self._kill_hung(self._checked)
        finished = any(g.done for g in self.groups)
        for group in self.groups:
            if group.done or group.proc is None or (code := group.proc.poll()) is None:
                continue
            if code == 0 or finished:  # a group that fails after the run's last step has nothing left to do
                group.done = True
                finished = True
                continue
            if group.restarts >= self.cfg.ft.max_group_restarts:
                self.log_line(f"replicas: group {group.replica_id} exited with {code}, out of restarts "
                              f"({self.cfg.ft.max_group_restarts}); stopping the job")
                return code
            group.restarts += 1
            self.log_line(f"replicas: group {group.replica_id} exited with {code}; restarting it "
                          f"(restart {group.restarts}); it heals from a live peer")
            self._start_group(group)
        return 0 if all(g.done for g in self.groups) else None

    def _kill_hung(self, now: float) -> None:
        """Kill a group that is hung for ``ft.timeout_s`` (the next round restarts it, and it heals from a live
        peer): once up, it stayed behind another group's newest committed step, or one of its processes is stopped.

        torchft cannot: a hung group's processes live on. Stopped whole, its heartbeats stop and the Lighthouse
        drops it; the others step on, but it never exits, so the run gets neither its replica back nor its end.
        With one rank of a multi-rank group stopped, the group's Manager server (on its rank 0) heartbeats on
        while its quorum waits for that rank; the Lighthouse then wants more than half of the heartbeating groups
        in a quorum (torchft's split-brain guard), so with two groups nobody steps, until the quorum timeout
        (``ft.quorum_timeout_s``) fails every group at once and the run falls back to storage.

        Why "behind the others' newest step" and not "no step for a while": a Lighthouse that is away, or a
        survivor held at a gate, stops every group alike, and no group is behind then; a healthy group commits each
        step with its quorum, so it is behind only between another's record and its own (milliseconds). Why only
        once it is up (its Manager built, ``replica_group.mark_up``): a start (interpreter, imports, the model) can
        take longer than ``ft.timeout_s`` on a loaded host, and is not a hang. A group still running after another
        finished the run is behind the last step, so it is ended the same way (it has nothing left to do). Why
        stopped processes: they are the stall the first rule cannot see, every group stalled by one stopped rank.
        Not covered: a rank deadlocked while running (not stopped) in a multi-rank group of a two-group job stalls
        every group alike, until ``ft.quorum_timeout_s``."""
        timeout = self.cfg.ft.timeout_s
        live = [g for g in self.groups if not (g.done or g.killed) and g.proc is not None and g.proc.poll() is None]
        newest = {g.replica_id: newest_step(self.run_dir, g.replica_id) for g in self.groups}
        front = max(newest.values(), default=0)
        for group in live:
            if group.up_at is None and up_count(self.run_dir, group.replica_id) > group.up_before:
                group.up_at = now
            stopped = self.starter.stopped(group)
            group.stopped_since = (group.stopped_since or now) if stopped else None
            mine = newest[group.replica_id]
            if mine != group.newest or mine >= front:  # it committed a step since the last check, or leads
                group.newest, group.behind_since = mine, None
            else:
                group.behind_since = group.behind_since or now
            if group.stopped_since is not None and now - group.stopped_since > timeout:
                why = f"process(es) {stopped} stopped for over ft.timeout_s ({timeout:g} s)"
            elif (group.behind_since is not None and group.up_at is not None
                  and now - max(group.behind_since, group.up_at) > timeout):
                why = (f"its newest committed step is {mine}, another group's is {front}, for over ft.timeout_s "
                       f"({timeout:g} s)")
            else:
                continue
            self.hung_kills += 1
            group.killed = True
            self.log_line(f"replicas: group {group.replica_id} is hung: {why}; killing it")
            self.kill_group(group.replica_id)

    def run(self, *, timeout_s: float | None = None, stop: threading.Event | None = None) -> int:
        """Supervise until every group is done, one is out of restarts, ``stop`` is set or the timeout passes
        (then every process is stopped and this raises ReplicaError)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while (status := self.poll()) is None:
                if stop is not None and stop.is_set():
                    return 1
                if deadline is not None and time.monotonic() > deadline:
                    raise ReplicaError(f"replica groups of {self.run_dir} ran past their {timeout_s:.0f} s timeout")
                time.sleep(POLL_S)
            return status
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop every group's process tree and the Lighthouse (nothing outlives the supervisor)."""
        for group in self.groups:
            if group.proc is not None:
                self.starter.stop(group)
        self.lighthouse.stop()
        for reader in self._readers:
            reader.join(timeout=5)

    def kill_group(self, replica_id: int) -> None:
        """SIGKILL a whole group (its torchrun agent and ranks): a lost host, for tests and bench/chaos.py."""
        self.starter.kill(self.groups[replica_id])


# -- the run's record --------------------------------------------------------------------------------------


def resumes_in(logs: list[list[dict]]) -> list[dict]:
    """The groups' resumes (in their logs: a launch, or every group lost; from an in-memory snapshot, a storage
    checkpoint or the start), oldest first."""
    return sorted((r for log in logs for r in log if "resumed_from" in r), key=lambda r: r["time"])


def superseded(record: dict, resumes: list[dict]) -> bool:
    """A step committed before a resume from an older checkpoint was trained again after it: that record is
    off the run's final trajectory."""
    return any(m["resumed_from"] < record["step"] and m["time"] > record["time"] for m in resumes)


def merge_records(run_dir: str, groups: int, global_batch: int, *, write: bool = True) -> dict:
    """Check every committed step against the exactly-once contract and write the run's ``metrics.jsonl``.

    For each step any group committed: every group that committed it agrees on its loss and assignment
    (``shares``), the shares tile the step's global batch ``[(s-1)·B, s·B)`` exactly once, and what each group's
    loader read is its own share. Steps 1..last must all be committed. Returns {steps, last_step, problems,
    pauses (per group: the longest gap between its committed steps, and its median step time)}; writes only
    when there is no problem, one record per step with ``samples`` (tasks/trace's ledger) and ``shares``.
    Records a resume from storage superseded (``superseded``) are left out and listed as ``redone_steps``."""
    by_step: dict[int, list[dict]] = {}
    pauses = {}
    logs = [jsonlog.read(group_dir(run_dir, g), "metrics.jsonl") for g in range(groups)]
    resumes = resumes_in(logs)
    redone: set[int] = set()
    for g, log_records in enumerate(logs):
        records = [r for r in log_records if "step" in r]
        for r in records:
            if superseded(r, resumes):
                redone.add(r["step"])
                continue
            by_step.setdefault(r["step"], []).append(r)
        times = [r["time"] for r in records]
        step_times = sorted(r["step_time_s"] for r in records[1:]) or [0.0]
        pauses[g] = {"longest_gap_s": max((b - a for a, b in zip(times, times[1:])), default=0.0),
                     "median_step_s": step_times[len(step_times) // 2], "committed": len(records)}
    problems: list[str] = []
    last = max(by_step, default=0)
    merged = []
    for step in range(1, last + 1):
        records = by_step.get(step)
        if not records:
            problems.append(f"step {step}: no group committed it")
            continue
        first = records[0]
        for r in records[1:]:
            if r["shares"] != first["shares"] or abs(r["loss"] - first["loss"]) > 1e-12 * max(1.0, abs(first["loss"])):
                problems.append(f"step {step}: groups {first['replica']} and {r['replica']} disagree")
        for r in records:
            if r["read"] != r["shares"][r["participant_rank"]]:
                problems.append(f"step {step}: group {r['replica']} read {r['read']}, not its share")
        covered = sorted(tuple(s) for s in first["shares"] if s[1] > s[0])
        expect, ok = (step - 1) * global_batch, True
        for a, b in covered:
            ok &= a == expect
            expect = b
        if not ok or expect != step * global_batch:
            problems.append(f"step {step}: shares {first['shares']} do not tile [{(step - 1) * global_batch}, "
                            f"{step * global_batch}) exactly once")
        # "group": 0: the groups are one job to tasks/trace's final trajectory (records without one are skipped)
        merged.append({"step": step, "group": 0, "loss": first["loss"], "samples": [(step - 1) * global_batch, step * global_batch],
                       "shares": first["shares"], "participants": first["participants"],
                       "groups": sorted(r["replica"] for r in records), "grad_norm": first["grad_norm"],
                       "lr": first["lr"], "tokens": first["tokens"], "time": min(r["time"] for r in records),
                       "step_time_s": max(r["step_time_s"] for r in records)})
    if write and not problems:
        with storage.atomic_write(storage.join(storage.normalize_url(run_dir), "metrics.jsonl"), "w") as f:
            f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in merged))
    return {"steps": len(merged), "last_step": last, "problems": problems, "pauses": pauses,
            "final_loss": merged[-1]["loss"] if merged else None, "redone_steps": sorted(redone),
            "storage_resumes": sum(m.get("source") != "snapshot" for m in resumes),
            "snapshot_resumes": sum(m.get("source") == "snapshot" for m in resumes)}


def write_lineage(run_dir: str, cfg: TrainConfig, data: dict[str, str]) -> None:
    """``lineage.json`` for tasks/trace: the loader's order at the run's global batch."""
    with TokenLoader(data, dict(cfg.data.mixture) or None, split="train", seq_len=cfg.data.seq_len,
                     global_batch=cfg.data.global_batch, dp_rank=0, dp_size=1, seed=cfg.data.seed,
                     prefetch=0) as loader:
        order = loader.order()
    with storage.atomic_write(storage.join(storage.normalize_url(run_dir), LINEAGE), "w") as f:
        f.write(json.dumps(order, indent=2, sort_keys=True))


def run_replica_groups(cfg: TrainConfig, data: dict[str, str], args: list[str], run_dir: str, nproc: int, *,
                       timeout_s: float | None = None, env: dict[str, str] | None = None,
                       stop: threading.Event | None = None, log_line: Callable[[str], None] = log.info,
                       starter: LocalStarter | None = None, lighthouse_host: str = "127.0.0.1") -> int:
    """launch.py's hook for ``[train.ft]`` (and the Slurm batch host's, replica_cluster.py): run the groups to
    the end, then check and write the run's record and ``summary.json``; the exit status."""
    write_lineage(run_dir, cfg, data)
    supervisor = ReplicaGroups(cfg, args, run_dir, nproc, env=env, log_line=log_line, starter=starter,
                               lighthouse_host=lighthouse_host).start()
    status = supervisor.run(timeout_s=timeout_s, stop=stop)
    if status != 0:
        return status
    finish_run(run_dir, cfg, {"restarts": sum(g.restarts for g in supervisor.groups),
                              "lighthouse_restarts": supervisor.lighthouse.restarts})
    return 0


def finish_run(run_dir: str, cfg: TrainConfig, counts: dict) -> dict:
    """Check the groups' records, write the run's ``metrics.jsonl`` and ``summary.json`` (with ``counts``: the
    restarts the caller saw); the summary. Idempotent: on Kubernetes each finishing group calls it."""
    merged = merge_records(run_dir, cfg.parallel.dp_replicate, cfg.data.global_batch)
    if merged["problems"]:
        raise ReplicaError(f"replica groups broke exactly-once: {'; '.join(merged['problems'][:3])}")
    summary = {"steps": merged["last_step"], "last_loss": merged["final_loss"], **counts,
               "replica_groups": cfg.parallel.dp_replicate, "pauses": merged["pauses"],
               "redone_steps": merged["redone_steps"], "storage_resumes": merged["storage_resumes"],
        "snapshot_resumes": merged["snapshot_resumes"]}
    with storage.atomic_write(storage.join(storage.normalize_url(run_dir), "summary.json"), "w") as f:
        f.write(json.dumps(summary, indent=2, sort_keys=True))
    return summary
