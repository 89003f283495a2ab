"""Chaos: dozens of injected faults on a two-node job, each measured against a fault-free run (issue 40).

Two simulated nodes on 127.0.0.1, one rank each (``dp_shard=2``, the tests' ``TINY`` model), each node with its own
snapshot store (``SMELT_SNAPSHOT_DIR``, a folder in /dev/shm). Every run trains the same ``--steps`` with the same
seed as one fault-free reference run. Three recovery paths, each under the same kinds of faults (``--paths``):

- ``agent`` (the top-level figures): in-memory snapshots, and smelt's node agent (tasks/train/agent.py) on each node:
  a failed rank is replaced by a warm spare process, the healthy rank rejoins in its own process, both restore from
  memory. A lost node 1 is replaced by a new agent joining the running job; node 0 hosts the job's store, so losing
  it ends the job, which is relaunched (a scheduler's requeue) on a fresh node 0 and the surviving node 1.
- ``torchrun``: in-memory snapshots, a torchrun agent per node. Any failed rank fails its agent (``--max-restarts
  0``) and the harness relaunches the whole job, both agents on a new rendezvous port, as a scheduler does with a
  multi-node job whose task failed (Slurm's kill-on-bad-exit and requeue). torchrun's own restarts of a two-agent
  job do not work here today (below); ``--torchrun-restarts`` uses them, to check a fix.
- ``storage``: today's restart from storage (``[train.snapshot] enabled = "off"``), relaunched as ``torchrun``.

Storage (DCP) checkpoints come every ``--interval`` steps (25), shorter than a real run's on both counts, which
favours the storage path (it redoes fewer steps per fault): issue 40's runs checkpoint every 4-11 minutes, and the
planner's 70B plan on 4,096 H100s steps every 5.1 s (``smelt plan --model 70b --tokens 15e12 --gpus 4096 --gpu
h100``), so 47-130 steps; and a real interval is 0.4-1.1 times the 10-minute restart it is weighed against, where
here 25 steps (~1 s) are a fraction of a relaunch (~7 s). ``storage.kinds[*].mean_steps_lost`` and ``step_s`` give
the redone time for any other interval. The paths take turns run by run, so that load from other jobs on the host
falls on each alike.

The fault kinds (``tasks/train/faults.py``; R is a random rank, S a random step):

- ``rank_kill``        ``kill:rank=R,step=S``                 SIGKILL of one rank at the start of step S
- ``node_kill``        ``stop:rank=R,step=S``; once it fired, the harness kills R's node whole (agent, ranks, store)
- ``hang``             ``stop:rank=R,step=S``                 SIGSTOP, left to the watchdog (``--hang-timeout``)
- ``kill_snapshot``    ``kill:rank=R,step=S,at=snapshot``     while step S's snapshot is copied (snapshot paths)
- ``kill_replicate``   ``kill:rank=R,step=S,at=replicate``    while it is sent to the other node (snapshot paths)
- ``kill_save``        ``kill:rank=R,step=S,at=save``         while step S's storage checkpoint is written
- ``corrupt_snapshot`` ``corrupt_snapshot:rank=R,step=S``     a byte of R's newest snapshot flipped, then SIGKILL

A run carries up to ``--per-run`` faults at least ``--gap`` steps apart (80 steps: seconds here, so every fault meets
a recovered job whose spare has warmed up, as failures hours apart do); each fires once. The figures of a fault come
from its fired marker (``<run>/faults/fired-*``, its wall-clock ``time``), rank 0's ``metrics.jsonl`` (one record per
step attempt: ``step``, ``group`` = the process group or generation, ``time`` = wall clock at the step's end) and the
``restore`` events in ``events.jsonl``:

- G, the fault's group: the group of the last step record at or before the fault's time;
- M: the highest step G recorded (a surviving rank 0 may finish a step after its peer died);
- R: the step the next group resumed from (its first record's step minus one);
- ``steps_lost`` = max(0, M - R): finished steps trained again;
- ``recovery_s``: from the fault to the end of the first step the run had not finished before it (the first record
  of a later group with a step above M): back to new progress, detection, restart, restore and redone steps included;
- ``restart_s``: from the fault to the end of the first step of the next group (without the redone steps' time);
- ``bit_identical``: the run's final parameters and the loss of every step it recorded equal the reference's bit for
  bit (a kind is bit-identical when every run holding it is). A step can survive in a snapshot without a loss record,
  when rank 0 dies between its snapshot and its metrics line: ``steps_without_loss_record`` counts them.

Percentiles are nearest-rank over the faults (p95 of n values: the ceil(0.95 n)-th smallest). ``step_s``: the
median wall time between consecutive steps of the reference. Each snapshot path is compared with ``storage`` over
the kinds both have (``rank_kill``, ``node_kill``, ``hang``, ``kill_save``): ``recovery_ratio`` is the ratio of the
median ``recovery_s`` of those faults, ``recovery_ratio_by_kind`` kind by kind, and ``goals`` checks issue 40's
targets (at most one step lost to a rank kill, node kill or hang; bit-identical; a median recovery at most half the
storage path's, plus the hang timeout for hangs).

Why torchrun cannot restart a two-agent job by itself here: the ranks build their process group on the agents'
rendezvous store under ``smelt/pg/<TORCHELASTIC_RESTART_COUNT>/<world>`` (tasks/train/watchdog.py). When one
node's rank dies, its agent counts a restart; the other agent restarts its healthy rank for the membership change
and counts none. The two ranks then join different namespaces, one finds the previous group's keys (gloo
"connectFullMesh ... Connection refused"), and the job fails again and again, or stalls, instead of resuming.

``--replicas`` runs only the faults of fault-tolerant replica groups (torchft, ``[train.ft]``): 2 groups of 1 and of 2
ranks, a rank killed, a group killed, a group hung, the Lighthouse killed, each against a fault-free run
(bench/chaos_replicas.py defines those figures).

Prints one JSON line on stdout; progress on stderr. ``--quick``: 40 steps, one run per path with a fault of each
kind (the smoke test). ``--log-dir``: every agent's and rank's output, one file per run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.checkpoint_reader import list_committed, load_consolidated  # noqa: E402
from tasks.contract import code_version  # noqa: E402
from tasks.train import procs  # noqa: E402
from tasks.train.node_launch import free_port, prepare_run, start_torchrun  # noqa: E402
from tests.tasks.train.token_corpus import make_corpus  # noqa: E402

KINDS = ("rank_kill", "node_kill", "hang", "kill_snapshot", "kill_replicate", "kill_save", "corrupt_snapshot")
STORAGE_KINDS = ("rank_kill", "node_kill", "hang", "kill_save")  # the others need snapshots
SPECS = {  # kind → (fault spec, fired marker)
    "rank_kill": ("kill:rank={r},step={s}", "fired-kill-{r}-{s}"),
    "node_kill": ("stop:rank={r},step={s}", "fired-stop-{r}-{s}"),
    "hang": ("stop:rank={r},step={s}", "fired-stop-{r}-{s}"),
    "kill_snapshot": ("kill:rank={r},step={s},at=snapshot", "fired-kill-{r}-{s}-snapshot"),
    "kill_replicate": ("kill:rank={r},step={s},at=replicate", "fired-kill-{r}-{s}-replicate"),
    "kill_save": ("kill:rank={r},step={s},at=save", "fired-kill-{r}-{s}-save"),
    "corrupt_snapshot": ("corrupt_snapshot:rank={r},step={s}", "fired-corrupt_snapshot-{r}-{s}"),
}
TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64}  # as tests/tasks/train
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
PORT_WAIT_S = 180.0  # the first agent must open the rendezvous store within this (a loaded host is slow)
PEER_EXIT_WAIT_S = 30.0  # once one agent failed, the other gets this long to exit before it is killed
POLL_S = 0.05


class ChaosError(RuntimeError):
    """A run did not finish as the harness expects; the message carries the agents' last lines."""


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the schedule ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int

    @property
    def spec(self) -> str:
        return SPECS[self.kind][0].format(r=self.rank, s=self.step)

    @property
    def marker(self) -> str:
        return SPECS[self.kind][1].format(r=self.rank, s=self.step)

    @property
    def restarts_itself(self) -> bool:
        return self.kind != "node_kill"  # torchrun restarts the ranks; a lost node needs a relaunch


def spread(total: int, kinds: tuple[str, ...]) -> list[str]:
    """``total`` fault kinds, as evenly over ``kinds`` as they go (the first kinds get the remainder)."""
    return [kinds[i % len(kinds)] for i in range(total)]


def schedule(kinds: list[str], *, steps: int, interval: int, per_run: int, gap: int,
             rng: random.Random) -> list[list[Fault]]:
    """Pack the faults into runs of at most ``per_run``, at random steps at least ``gap`` apart, on random ranks.

    ``kill_save`` needs a storage checkpoint step (a multiple of ``interval`` before the last two steps); every
    other kind gets a uniformly random free step in [3, steps - 3], so it lands anywhere in the storage interval.
    """
    pool = list(kinds)
    rng.shuffle(pool)
    save_steps = list(range(interval, steps - 2, interval))
    runs = []
    for first in range(0, len(pool), per_run):
        batch = sorted(pool[first:first + per_run], key=lambda k: k != "kill_save")  # the fewest choices first
        for _ in range(1000):  # a random placement can corner itself: try again
            taken: list[int] = []
            for kind in batch:
                free = [s for s in (save_steps if kind == "kill_save" else range(3, steps - 2))
                        if all(abs(s - t) >= gap for t in taken)]
                if not free:
                    break
                taken.append(rng.choice(free))
            if len(taken) == len(batch):
                break
        else:
            raise ValueError(f"{len(batch)} faults ({', '.join(batch)}) do not fit {steps} steps {gap} apart with "
                             f"checkpoints every {interval}: raise --steps or lower --per-run or --gap")
        runs.append(sorted((Fault(kind, rng.randrange(2), step) for kind, step in zip(batch, taken)),
                           key=lambda f: f.step))
    return runs


# -- one job: two agents, node kills, bounded waits ---------------------------------------------------------


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL an agent and everything under it (ranks included); reap the agent."""
    psutil.wait_procs(procs.kill_tree(proc), timeout=10)
    proc.wait(timeout=10)


def holds_pid(proc: subprocess.Popen, pid: int) -> bool:
    try:
        return any(child.pid == pid for child in psutil.Process(proc.pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return False


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Job:
    """One run folder trained by two single-rank nodes until both finish; what a fault does to the nodes is the
    subclass's: ``start`` both nodes, ``poll`` them (None while running, True when both finished, False when one
    failed), ``relaunch`` the job, ``lose_node`` after a node kill's stop."""

    UNPLANNED_LIMIT = 3  # failures without a fault that are relaunched before the run is given up

    def __init__(self, name: str, args: list[str], run_dir: Path, store_root: Path, faults: list[Fault],
                 log_path: Path | None) -> None:
        self.name, self.args, self.run_dir, self.store_root, self.faults = name, args, run_dir, store_root, faults
        self.stores = [self._new_store() for _ in range(2)]
        self.tail: list[str] = []
        self.launches = 0
        self._log = open(log_path, "w") if log_path else None
        self._lock = threading.Lock()

    def _new_store(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="node-", dir=self.store_root))

    def line(self, tag: str, text: str) -> None:
        stamped = f"{time.time():.3f} {tag} {text.rstrip()}"
        with self._lock:
            self.tail = [*self.tail[-199:], stamped]
            if self._log:  # None once the run is over: a killed agent's last lines may still come in
                self._log.write(stamped + "\n")

    def why(self, what: str) -> ChaosError:
        with self._lock:
            return ChaosError(f"{self.name}: {what}; the nodes' last lines:\n" + "\n".join(self.tail[-60:]))

    def _fired(self) -> set[str]:
        folder = self.run_dir / "faults"
        return {p.name for p in folder.iterdir()} if folder.exists() else set()

    def run(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        node_kills = [f for f in self.faults if f.kind == "node_kill"]
        unplanned = 0
        try:
            self.start()
            seen = self._fired()  # the faults that fired before this launch: a failure needs a newer one
            while True:
                if time.monotonic() > deadline:
                    raise self.why(f"not finished within {timeout_s:.0f} s")
                fired = self._fired()
                for fault in [f for f in node_kills if f.marker in fired]:
                    node_kills.remove(fault)
                    self.lose_node(fault, json.loads((self.run_dir / "faults" / fault.marker).read_text())["pid"])
                    seen = fired
                state = self.poll()
                if state:
                    return
                if state is False:
                    fired = self._fired()
                    if fired == seen:
                        unplanned += 1
                        self.line("chaos", "a failure no injected fault explains: the job is relaunched")
                        if unplanned > self.UNPLANNED_LIMIT:
                            raise self.why(f"{unplanned} failures that no injected fault explains")
                    self.relaunch()
                    seen = fired
                time.sleep(POLL_S)
        finally:
            self.stop()
            with self._lock:
                if self._log:
                    self._log.close()
                    self._log = None


class TorchrunJob(Job):
    """A torchrun agent per node. A failed rank fails its agent (``--max-restarts 0``) and the job is relaunched,
    both agents on a new rendezvous port, as a scheduler does with a multi-node job whose task failed (Slurm's
    kill-on-bad-exit and requeue): torchrun's own restarts of a two-agent job hang here (see the module docstring).
    ``self_restart``: let torchrun restart the ranks itself instead (to check a fix)."""

    def __init__(self, *args, self_restart: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.self_restart = self_restart
        self.agents: list[subprocess.Popen] = []
        self._failed_at: float | None = None

    def start(self) -> None:
        """Both agents, on a fresh rendezvous port."""
        self.launches += 1
        self.line("chaos", f"launch {self.launches}: two torchrun agents")
        fired = self._fired()
        restarts = sum(f.restarts_itself and f.marker not in fired for f in self.faults) + 2 if self.self_restart else 0
        port = free_port()
        self.agents = []
        for node, store in enumerate(self.stores):  # together, as a scheduler starts a job's nodes
            os.environ["SMELT_SNAPSHOT_DIR"] = str(store)
            proc = start_torchrun(1, self.args, str(self.run_dir), restarts, port, nnodes="2", rdzv_conf=RDZV_CONF)
            self.agents.append(proc)
            threading.Thread(target=self._follow, args=(proc, f"L{self.launches}N{node}"), daemon=True).start()
        # Whichever agent binds the port first hosts the rendezvous store; the other falls back to a client.
        deadline = time.monotonic() + PORT_WAIT_S
        while not listening(port):
            if time.monotonic() > deadline or any(agent.poll() is not None for agent in self.agents):
                raise self.why(f"no agent opened the rendezvous port {port} within {PORT_WAIT_S:.0f} s (exit "
                               f"statuses {[agent.poll() for agent in self.agents]})")
            time.sleep(POLL_S)

    def _follow(self, proc: subprocess.Popen, tag: str) -> None:
        for text in proc.stdout:
            self.line(tag, text)

    def poll(self) -> bool | None:
        codes = [agent.poll() for agent in self.agents]
        if all(code == 0 for code in codes):
            return True
        if not any(code not in (None, 0) for code in codes):
            return None
        if not self.self_restart:
            return False
        # torchrun restarts by itself: an agent that gave up fails the job once the other had time to exit too
        self._failed_at = self._failed_at or time.monotonic()
        if None not in codes or time.monotonic() - self._failed_at > PEER_EXIT_WAIT_S:
            raise self.why(f"an agent failed (exit statuses {codes})")
        return None

    def stop(self) -> None:
        for agent in self.agents:
            kill_tree(agent)

    def relaunch(self) -> None:
        self.stop()
        self.start()

    def lose_node(self, fault: Fault, pid: int) -> None:
        """The node running the stopped rank is gone (agent, rank, store); the job is relaunched on the survivor
        and a fresh node."""
        lost = next((i for i, agent in enumerate(self.agents) if holds_pid(agent, pid)), None)
        if lost is None:
            raise self.why(f"the stopped rank (pid {pid}) of {fault} runs under neither agent")
        kill_tree(self.agents[lost])
        shutil.rmtree(self.stores[lost])
        self.line("chaos", f"node {lost} lost with rank {fault.rank} (pid {pid}) and its store")
        self.stores = [self.stores[1 - lost], self._new_store()]
        self.relaunch()


class AgentJob(Job):
    """smelt's node agent per node (tasks/train/agent.py, in this process): a failed rank is replaced by a warm
    spare and the other rank rejoins in its own process. A lost node 1 is replaced by a new agent joining the running
    job; node 0 hosts the job's store, so losing it ends the job, which is relaunched (as a scheduler would) on a
    fresh node 0 and the surviving node 1 with its store."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nodes: list[dict] = []
        self.port = 0

    def _start_node(self, node_rank: int) -> dict:
        from tasks.train.agent import NodeAgent  # torch.distributed's store, imported when first needed

        tag = f"L{self.launches}N{node_rank}" + ("+" if len(self.nodes) > 1 else "")
        env = {"PYTHONPATH": str(REPO), "SMELT_SNAPSHOT_DIR": str(self.stores[node_rank])}
        agent = NodeAgent(self.args, nnodes=2, node_rank=node_rank, nproc=1, master_addr="127.0.0.1",
                          master_port=self.port, env=env, cwd=str(REPO), log_line=lambda text: self.line(tag, text))
        node = {"agent": agent, "rank": node_rank, "status": None}

        def run() -> None:
            try:
                node["status"] = agent.run()
            except Exception as e:  # noqa: BLE001 - a lost store, a failed spawn: the job failed, say why
                self.line(tag, f"agent error: {e!r}")
                node["status"] = -1

        node["thread"] = threading.Thread(target=run, daemon=True)
        node["thread"].start()
        return node

    def start(self) -> None:
        self.launches += 1
        self.line("chaos", f"launch {self.launches}: two node agents")
        self.port = free_port()
        self.nodes = []
        self.nodes = [self._start_node(0), self._start_node(1)]

    def live(self) -> list[dict]:
        return [n for n in self.nodes if not n.get("lost")]

    def poll(self) -> bool | None:
        statuses = [n["status"] for n in self.live()]
        if all(status == 0 for status in statuses):
            return True
        return False if any(status not in (None, 0) for status in statuses) else None

    def stop(self) -> None:
        for node in self.nodes:
            node["agent"].lose_node()
        for node in self.nodes:
            node["thread"].join(timeout=30)
            if node["thread"].is_alive():
                raise self.why(f"node {node['rank']}'s agent did not stop within 30 s")

    def relaunch(self) -> None:
        self.stop()
        self.start()

    def lose_node(self, fault: Fault, pid: int) -> None:
        node = next((n for n in self.live() if any(a["pid"] == pid for a in n["agent"].assignments)), None)
        if node is None:
            raise self.why(f"the stopped rank (pid {pid}) of {fault} runs under neither agent")
        node["agent"].lose_node()
        node["lost"] = True
        shutil.rmtree(self.stores[node["rank"]])
        self.line("chaos", f"node {node['rank']} lost with rank {fault.rank} (pid {pid}) and its store")
        self.stores[node["rank"]] = self._new_store()
        if node["rank"] == 0:  # the job's store went with it
            self.relaunch()
        else:
            self.line("chaos", "a new node 1 joins the running job")
            self.nodes.append(self._start_node(node["rank"]))


# -- what a run shows -------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    """A run log's records; a line cut by a SIGKILL is skipped."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def trajectory(records: list[dict]) -> dict[int, float]:
    """Each step's loss on the final trajectory: a redone step's last record wins."""
    return {r["step"]: r["loss"] for r in sorted(records, key=lambda r: r["time"])}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_consolidated(list_committed(str(run_dir))[-1]["url"])[0]


def compare_run(run_dir: Path, reference: dict) -> dict:
    """Whether the run ended bit-identical to the reference: its final parameters, and the loss of every step it
    recorded. Also the first step whose loss differs, the loss guard's rollbacks (step → the step rolled back to),
    and the steps without a loss record (a step can survive, in a snapshot, the rank 0 that would have logged it:
    a SIGKILL between the snapshot and the metrics line)."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    losses = trajectory(records)
    differing = sorted(step for step, loss in losses.items() if reference["losses"].get(step) != loss)
    got, want = final_weights(run_dir), reference["weights"]
    weights = sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    return {"identical": weights and not differing, "first_differing_loss_step": differing[0] if differing else None,
            "weights_equal": weights, "missing": sorted(set(reference["losses"]) - set(losses)),
            "rollbacks": {r["step"]: r["rolled_back_to"] for r in records if r.get("rolled_back_to") is not None}}


def measure(run_dir: Path, faults: list[Fault]) -> tuple[list[dict], int]:
    """Each fired fault's figures (see the module docstring) and the number of restarts no fault explains."""
    records = sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda r: r["time"])
    events = read_jsonl(run_dir / "events.jsonl")
    restores = sorted((e for e in events if e["event"] == "restore"), key=lambda e: e["time"])
    groups = {e["group"] for e in events if e["event"] == "start"}
    out = []
    for fault in faults:
        marker = run_dir / "faults" / fault.marker
        if not marker.exists():
            out.append({"kind": fault.kind, "rank": fault.rank, "step": fault.step, "fired": False})
            continue
        t = json.loads(marker.read_text())["time"]
        before = [r for r in records if r["time"] <= t]
        group = before[-1]["group"] if before else -1
        done = max((r["step"] for r in records if r["group"] == group), default=0)
        after = [r for r in records if r["group"] > group]
        if not after:
            out.append({"kind": fault.kind, "rank": fault.rank, "step": fault.step, "fired": True, "recovered": False})
            continue
        resumed = after[0]["step"] - 1
        progress = next((r for r in after if r["step"] > done), None)
        if progress is None:  # the run ended without passing the fault's step again
            out.append({"kind": fault.kind, "rank": fault.rank, "step": fault.step, "fired": True, "recovered": False})
            continue
        restore = next((e for e in restores if t < e["time"] <= after[0]["time"]), None)
        out.append({
            "kind": fault.kind, "rank": fault.rank, "step": fault.step, "fired": True, "recovered": True,
            "steps_lost": max(0, done - resumed), "finished_before": done, "resumed_from": resumed,
            "recovery_s": progress["time"] - t, "restart_s": after[0]["time"] - t,
            "source": restore["source"] if restore else "scratch",
            "peer_sources": sum(str(s).startswith("peer") for s in (restore or {}).get("sources", {}).values()),
            "refused": len((restore or {}).get("refused", [])),
            "restore_s": restore.get("seconds") if restore else None,
        })
    unplanned = len(groups) - 1 - sum(f.get("fired", False) for f in out)
    return out, unplanned


def nearest_rank(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def figures(results: list[dict], kinds: tuple[str, ...], identical_by_kind: dict[str, bool]) -> dict:
    """The per-kind and overall figures of one path."""
    fired = [r for r in results if r["fired"]]
    recovered = [r for r in fired if r["recovered"]]
    by_kind = {}
    for kind in kinds:
        mine = [r for r in recovered if r["kind"] == kind]
        lost = [r["steps_lost"] for r in mine]
        by_kind[kind] = {
            "faults": sum(r["kind"] == kind for r in fired),
            "unfired": sum(r["kind"] == kind and not r["fired"] for r in results),
            "unrecovered": sum(r["kind"] == kind and not r["recovered"] for r in fired),
            "max_steps_lost": max(lost, default=None),
            "mean_steps_lost": r3(statistics.fmean(lost)) if lost else None,
            "median_recovery_s": r3(nearest_rank([r["recovery_s"] for r in mine], 0.5)),
            "p95_recovery_s": r3(nearest_rank([r["recovery_s"] for r in mine], 0.95)),
            "median_restart_s": r3(nearest_rank([r["restart_s"] for r in mine], 0.5)),
            "median_restore_s": r3(nearest_rank([r["restore_s"] for r in mine if r["restore_s"] is not None], 0.5)),
            "sources": {s: sum(r["source"] == s for r in mine) for s in sorted({r["source"] for r in mine})},
            "peer_restores": sum(r["peer_sources"] > 0 for r in mine),
            "refused_copies": sum(r["refused"] for r in mine),
            "bit_identical": identical_by_kind.get(kind),
        }
    return {
        "faults": len(fired),
        "kinds": by_kind,
        "max_steps_lost": max((r["steps_lost"] for r in recovered), default=None),
        "median_recovery_s": r3(nearest_rank([r["recovery_s"] for r in recovered], 0.5)),
        "p95_recovery_s": r3(nearest_rank([r["recovery_s"] for r in recovered], 0.95)),
        "median_restart_s": r3(nearest_rank([r["restart_s"] for r in recovered], 0.5)),
        "bit_identical": bool(identical_by_kind) and all(identical_by_kind.values()),
        "unfired": len(results) - len(fired),
        "unrecovered": len(fired) - len(recovered),
    }


# -- the bench --------------------------------------------------------------------------------------------


class LoadSampler:
    """The 1-minute load average every few seconds, for the record (other jobs share this machine)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.start, self.samples = os.getloadavg(), []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    def result(self) -> dict:
        self._stop.set()
        end = os.getloadavg()
        samples = self.samples or [end[0]]
        return {"start": [round(x, 2) for x in self.start], "end": [round(x, 2) for x in end],
                "mean_1m": round(statistics.fmean(samples), 2), "max_1m": round(max(samples), 2),
                "cpus": os.cpu_count()}


def train_config(args, snapshots: bool, faults: list[Fault]) -> dict:
    return {
        "model": dict(TINY),
        "data": {"seq_len": 16, "global_batch": 8},
        "parallel": {"dp_shard": 2},
        "steps": args.steps,
        "checkpoint": {"interval_steps": args.interval},
        "snapshot": {"enabled": "on" if snapshots else "off"},
        "watchdog": {"hang_timeout_s": args.hang_timeout},
        "faults": {"inject": ";".join(f.spec for f in faults)},
    }


@dataclass(frozen=True)
class Recovery:
    """One way to recover: whether snapshots are taken, and what restarts the ranks."""

    name: str
    snapshots: bool
    restart: str  # "agent" | "torchrun"
    kinds: tuple[str, ...]
    what: str


PATHS = {
    "agent": Recovery("agent", True, "agent", KINDS,
                   "in-memory snapshots; smelt's node agent replaces a failed rank with a warm spare, the others "
                   "rejoin in process"),
    "torchrun": Recovery("torchrun", True, "torchrun", KINDS,
                      "in-memory snapshots; torchrun agents, the job relaunched after each failure"),
    "storage": Recovery("storage", False, "torchrun", STORAGE_KINDS,
                     "today's restart from storage: no snapshots; torchrun agents, the job relaunched after each "
                     "failure"),
}


class Bench:
    def __init__(self, args, root: Path) -> None:
        self.args, self.root = args, root
        self.corpus = make_corpus(str(root / "corpus"))
        self.shm = Path(tempfile.mkdtemp(prefix="smelt-chaos-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        self.count = 0
        self.launches = 0

    def close(self) -> None:
        shutil.rmtree(self.shm, ignore_errors=True)

    def job(self, path: Recovery, faults: list[Fault], label: str | None = None) -> Path:
        """Train one run folder to the end under ``faults``; its folder."""
        self.count += 1
        run_dir = self.root / f"run-{self.count:02d}-{label or path.name}"
        args = prepare_run({"main": self.corpus}, train_config(self.args, path.snapshots, faults), str(run_dir))
        log_path = Path(self.args.log_dir) / f"{run_dir.name}.log" if self.args.log_dir else None
        store_root = Path(tempfile.mkdtemp(prefix=f"{self.count:02d}-", dir=self.shm))
        common = (run_dir.name, args, run_dir, store_root, faults, log_path)
        job = (AgentJob(*common) if path.restart == "agent" else
               TorchrunJob(*common, self_restart=self.args.torchrun_restarts))
        started = time.monotonic()
        try:
            job.run(timeout_s=120 + 60 * len(faults) + 2 * self.args.steps)
        finally:
            shutil.rmtree(store_root, ignore_errors=True)
            self.launches += job.launches
        say(f"  {run_dir.name}: {len(faults)} faults, {job.launches} launch(es), {time.monotonic() - started:.0f} s")
        return run_dir

    def reference(self) -> dict:
        run_dir = self.job(PATHS["torchrun"], [], "reference")
        records = sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda r: r["time"])
        gaps = [b["time"] - a["time"] for a, b in zip(records, records[1:])]
        out = {"losses": trajectory(records), "weights": final_weights(run_dir), "step_s": statistics.median(gaps)}
        self.drop(run_dir)
        return out

    def drop(self, run_dir: Path) -> None:
        if self.args.keep:
            say(f"  kept {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)

    def run_all(self, plan: dict[str, list[list[Fault]]], reference: dict) -> dict[str, tuple[dict, list[dict]]]:
        """Every run of every path, the paths taking turns (so that load from other jobs on this host falls on
        each alike); each path's figures and every fault's."""
        acc = {name: {"results": [], "identical": {}, "unplanned": 0, "missing": 0, "launches": 0, "rollbacks": 0,
                      "diverged": []} for name in plan}
        for i in range(max(map(len, plan.values()), default=0)):
            for name, runs in plan.items():
                if i >= len(runs):
                    continue
                faults, a = runs[i], acc[name]
                say(f"{name} run {i + 1}/{len(runs)}: " + ", ".join(f"{f.kind}@{f.step}/r{f.rank}" for f in faults))
                launches = self.launches
                run_dir = self.job(PATHS[name], faults)
                a["launches"] += self.launches - launches
                measured, extra = measure(run_dir, faults)
                check = compare_run(run_dir, reference)
                a["unplanned"] += extra
                a["missing"] += len(check["missing"])
                a["rollbacks"] += len(check["rollbacks"])
                for kind in {f.kind for f in faults}:
                    a["identical"][kind] = a["identical"].get(kind, True) and check["identical"]
                if not check["identical"]:
                    a["diverged"].append({"faults": [f"{f.kind}@{f.step}/r{f.rank}" for f in faults],
                                          **{k: v for k, v in check.items() if k not in ("identical", "missing")}})
                a["results"] += measured
                done = [m for m in measured if m.get("recovered")]
                say(f"  steps lost {[m['steps_lost'] for m in done]}, recovery_s "
                    f"{[round(m['recovery_s'], 1) for m in done]}, bit-identical {check['identical']}"
                    + (f", {extra} unplanned restart(s)" if extra else "")
                    + (f", loss-guard rollback(s) {check['rollbacks']}" if check["rollbacks"] else "")
                    + (f", no loss record of step(s) {check['missing']}" if check["missing"] else ""))
                self.drop(run_dir)
        out = {}
        for name, a in acc.items():
            figures_ = {"path": PATHS[name].what, **figures(a["results"], PATHS[name].kinds, a["identical"]),
                        "diverged_runs": a["diverged"], "loss_guard_rollbacks": a["rollbacks"],
                        "unplanned_restarts": a["unplanned"], "steps_without_loss_record": a["missing"],
                        "runs": len(plan[name]), "launches": a["launches"]}
            if self.args.per_fault:
                figures_["per_fault"] = [{k: r3(v) if isinstance(v, float) else v for k, v in r.items()}
                                         for r in a["results"]]
            out[name] = (figures_, a["results"])
        return out


def goals(snap: dict, storage: dict, hang_timeout: float) -> dict:
    """Issue 40's targets: at most one step lost to a rank kill, node kill or hang; bit-identical runs; the median
    recovery at most half the storage path's (plus the hang timeout for hangs), kind by kind."""
    main = ("rank_kill", "node_kill", "hang")
    lost = [snap["kinds"][k]["max_steps_lost"] for k in main if snap["kinds"][k]["max_steps_lost"] is not None]
    halves = {}
    for kind in STORAGE_KINDS:
        mine, theirs = snap["kinds"][kind]["median_recovery_s"], storage["kinds"][kind]["median_recovery_s"]
        if mine is not None and theirs is not None:
            halves[kind] = mine <= theirs / 2 + (hang_timeout if kind == "hang" else 0)
    return {"steps_lost_le_1": bool(lost) and max(lost) <= 1, "bit_identical": snap["bit_identical"],
            "recovery_le_half_storage": halves}


def compare(snap: dict, snap_results: list[dict], storage: dict, storage_results: list[dict],
            hang_timeout: float) -> dict:
    """A snapshot path against the storage path, over the kinds both have: the ratio of their median recoveries
    (over those kinds' faults), the ratio kind by kind, and the goals."""
    def median(results: list[dict]) -> float | None:
        return nearest_rank([r["recovery_s"] for r in results if r.get("recovered") and r["kind"] in STORAGE_KINDS],
                            0.5)

    mine, theirs = median(snap_results), median(storage_results)
    by_kind = {}
    for kind in STORAGE_KINDS:
        a, b = snap["kinds"][kind]["median_recovery_s"], storage["kinds"][kind]["median_recovery_s"]
        if a and b:
            by_kind[kind] = r3(a / b)
    return {"median_recovery_s_common_kinds": {"this": r3(mine), "storage": r3(theirs)},
            "recovery_ratio": r3(mine / theirs) if mine and theirs else None, "recovery_ratio_by_kind": by_kind,
            "goals": goals(snap, storage, hang_timeout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="The module docstring defines "
                                     "every figure (python -c 'import bench.chaos; help(bench.chaos)').")
    parser.add_argument("--faults", type=int, default=50,
                        help="faults on each snapshot path, spread over its 7 kinds (default 50)")
    parser.add_argument("--storage-faults", type=int,
                        help="faults on the storage path, over its 4 kinds (default: as many per kind as a snapshot "
                             "path has)")
    parser.add_argument("--paths", default="agent,torchrun,storage",
                        help="which recovery paths to measure, of agent, torchrun, storage (default all; the first "
                             "snapshot path gives the top-level figures)")
    parser.add_argument("--steps", type=int, default=600, help="steps of every run (default 600)")
    parser.add_argument("--interval", type=int, default=25, help="storage checkpoint interval in steps (default 25)")
    parser.add_argument("--gap", type=int, default=80,
                        help="fewest steps between two faults of a run (default 80: a few seconds here, so each "
                             "fault meets a recovered job with a warm spare, as failures hours apart do)")
    parser.add_argument("--per-run", type=int,
                        help="faults per run (default: steps // gap - 1, 6 with the defaults)")
    parser.add_argument("--hang-timeout", type=float, default=5.0,
                        help="[train.watchdog] hang_timeout_s (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed (default 0)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 40 steps, checkpoint every 20, one fault of each kind per path")
    parser.add_argument("--torchrun-restarts", action="store_true",
                        help="let torchrun restart the ranks itself instead of relaunching the job (hangs here "
                             "today; to check a fix, see the module docstring)")
    parser.add_argument("--per-fault", action="store_true", help="also list every fault's figures in the JSON")
    parser.add_argument("--log-dir", help="write each run's agent and rank output to a file here")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (their paths go to stderr)")
    replica = parser.add_argument_group("replica groups (bench/chaos_replicas.py defines every figure)")
    replica.add_argument("--replicas", action="store_true",
                         help="run only the replica-group faults: 2 torchft groups x 1 and x 2 ranks, a rank killed, "
                              "a group killed, a group hung, the Lighthouse killed, each against a fault-free run")
    replica.add_argument("--replica-layouts", default="2x1,2x2", help="of 2x1, 2x2 (default both)")
    replica.add_argument("--replica-steps", type=int, default=200, help="steps of every replica run (default 200)")
    replica.add_argument("--replica-seq-len", type=int, default=16,
                         help="sequence length of the replica runs: longer steps, against the fixed failure detection "
                              "(default 16)")
    replica.add_argument("--replica-fault-step", type=int, default=20,
                         help="the step each replica fault hits (default 20)")
    replica.add_argument("--replica-timeout", type=float, default=3.0,
                         help="[train.ft] timeout_s: cross-group collectives, and how long a group may stay behind "
                              "before the supervisor deems it hung (default 3)")
    replica.add_argument("--rtol", type=float, default=1e-5,
                         help="relative tolerance against the fault-free run (default 1e-5)")
    args = parser.parse_args(argv)
    if args.replicas:
        return replica_main(parser, args)
    if args.quick:
        args.steps, args.interval, args.gap, args.faults, args.per_run = 40, 20, 4, len(KINDS), len(KINDS)
        if args.storage_faults is None:
            args.storage_faults = len(STORAGE_KINDS)
    if args.per_run is None:
        args.per_run = max(1, args.steps // max(1, args.gap) - 1)
    names = [n.strip() for n in args.paths.split(",") if n.strip()]
    if not names or any(n not in PATHS for n in names):
        parser.error(f"--paths takes a comma-separated list of {', '.join(PATHS)}")
    if min(args.faults, args.interval, args.gap, args.per_run) < 1 or args.steps < 12:
        parser.error("--faults, --interval, --gap and --per-run must be at least 1, --steps at least 12")
    per_kind = math.ceil(args.faults / len(KINDS))
    storage_faults = args.storage_faults if args.storage_faults is not None else per_kind * len(STORAGE_KINDS)
    rng = random.Random(args.seed)
    runs = {}
    try:
        for name in names:
            total = storage_faults if name == "storage" else args.faults
            runs[name] = schedule(spread(total, PATHS[name].kinds), steps=args.steps, interval=args.interval,
                                  per_run=args.per_run, gap=args.gap, rng=rng) if total else []
    except ValueError as e:
        parser.error(str(e))
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)

    # One thread per rank, as torchrun sets it for several ranks per node and smelt's agent does: two ranks
    # spawning a thread per core on a small host slow tiny matmuls many times over (~300x on 2 busy cores).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load = LoadSampler()
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="smelt-chaos-"))
    bench = Bench(args, root)
    say(f"paths {', '.join(f'{n} ({sum(map(len, runs[n]))} faults, {len(runs[n])} runs)' for n in names)}; "
        f"{args.steps} steps, faults {args.gap}+ steps apart, checkpoint every {args.interval}, hang timeout "
        f"{args.hang_timeout:g} s; work in {root}")
    try:
        reference = bench.reference()
        say(f"reference: {len(reference['losses'])} steps, a step every {reference['step_s'] * 1e3:.0f} ms")
        measured = bench.run_all({name: runs[name] for name in names}, reference)
    except ChaosError as e:
        say(str(e))
        return 1
    finally:
        bench.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    storage = measured.get("storage")
    out: dict = {"bench": "chaos"}
    for name in names:
        figures_, results = measured[name]
        if storage and name != "storage":
            figures_ = {**figures_, **compare(figures_, results, *storage, args.hang_timeout)}
        if "faults" not in out and name != "storage":
            out.update(figures_)  # the first snapshot path: the top-level figures
        else:
            out[name] = figures_
    out.update({
        "step_s": r3(reference["step_s"]),
        "load_avg": load.result(),
        "steps": args.steps,
        "checkpoint_interval_steps": args.interval,
        "hang_timeout_s": args.hang_timeout,
        "wall_s": round(time.monotonic() - started, 1),
        "code_version": code_version("tasks.train"),
        "seed": args.seed,
    })
    print(json.dumps(out))
    return 0


def replica_main(parser: argparse.ArgumentParser, args) -> int:
    """``--replicas``: only the replica-group faults (bench/chaos_replicas.py); one JSON line as ``main``'s."""
    from bench.chaos_replicas import LAYOUTS, run_replicas

    args.replica_layouts = [n.strip() for n in args.replica_layouts.split(",") if n.strip()]
    if not args.replica_layouts or any(n not in LAYOUTS for n in args.replica_layouts):
        parser.error(f"--replica-layouts takes a comma-separated list of {', '.join(LAYOUTS)}")
    if not 2 <= args.replica_fault_step <= args.replica_steps - 8:
        parser.error("--replica-fault-step must be at least 2 and at most --replica-steps - 8")
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank, as main() says why
    load = LoadSampler()
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="smelt-chaos-replicas-"))
    say(f"replica groups {', '.join(args.replica_layouts)}: {args.replica_steps} steps, faults at step "
        f"{args.replica_fault_step}; work in {root}")
    try:
        figures_ = run_replicas(args, root, make_corpus(str(root / "corpus")), say)
    except RuntimeError as e:
        say(str(e))
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"bench": "chaos", **figures_, "load_avg": load.result(),
                      "wall_s": round(time.monotonic() - started, 1), "code_version": code_version("tasks.train")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
