"""Replica groups on a cluster (``smelt launch slurm|kubernetes`` with ``[train.ft]``): the two entry points
the rendered jobs run, beside replicas.py's one-host supervisor.

    python -m tasks.train.replica_cluster supervise ARGS --nodes N --procs-per-node P --lighthouse-host H
    python -m tasks.train.replica_cluster group ARGS --replica-id R --nodes K --procs-per-node P --launch-id L

- **Slurm** (``supervise``, on the batch host): replicas.py's supervisor, unchanged, with the Lighthouse bound
  to the head node's address and each group started as a job step (``SrunStarter``) on its own
  ``nodes / dp_replicate`` nodes of the allocation. A lost group is a step that ended non-zero: restarted as a
  new step with ``SMELT_REPLICA_RESTARTED=1``, it heals from a live peer.
- **Kubernetes** (``group``, every pod of a group's Indexed Job): Kubernetes restarts a failed pod, and nobody
  tells the group it is a restart. The launch renders a fresh launch id into the pods; a pod's first start in a
  launch leaves a marker (``<run>/replicas/group-N/starts/<launch>/``), and a start that finds its own marker is
  a restart (``restart_of_launch``): it heals from a live peer, as the supervisor's restart does. Pod 0 of each
  group, when its group finished, merges the groups' records (``replicas.finish_run``, idempotent: the last
  group to finish writes the fullest record).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from tasks import storage
from tasks.config import load
from tasks.repo import REPO_ROOT, python_path
from tasks.train.config import TrainConfig, parse_data
from tasks.train.procs import kill_tree
from tasks.train.replica_group import REPLICA_ENV, RESTARTED_ENV
from tasks.train.replica_records import group_dir
from tasks.train.replicas import (Group, LocalStarter, finish_run, group_command, run_replica_groups,
                                  write_lineage)

LAUNCH_ENV = "SMELT_LAUNCH_ID"  # Kubernetes: one per `smelt launch` (restart_of_launch)
SINGLE_NODE_RDZV = "localhost:0"  # a one-node group's rendezvous: torchrun --standalone's, a free port on its node


def rdzv_endpoint(first_node: str, nodes: int, port: int) -> str:
    """A group's torchrun rendezvous: on its first node at ``port`` when it spans nodes, else its own node's."""
    return f"{first_node}:{port}" if nodes > 1 else SINGLE_NODE_RDZV


# -- Slurm -------------------------------------------------------------------------------------------------


class SrunStarter(LocalStarter):
    """Each group is a job step (``srun``) on its own ``nodes_per_group`` nodes (``--relative``), one torchrun
    agent per node (or the rank itself for a one-rank group). A step ends when its tasks end; killing one is
    ``scancel --signal=KILL JOB.STEP``, found by its name.

    The stopped-process half of the hung-group rule reads local processes (psutil): a group's ranks run on other
    nodes, so it sees none here; a group hung whole is still caught by the other half (behind the others' newest
    committed step, read from the shared run folder), a stopped rank of a multi-rank group is not (it stalls every
    group until ``ft.quorum_timeout_s`` fails them, and the run resumes from storage)."""

    def __init__(self, job_id: str, nodes_per_group: int, procs_per_node: int, node_addrs: list[str],
                 rdzv_port: int, env: dict[str, str] | None = None) -> None:
        self.job_id, self.nodes_per_group, self.procs_per_node = job_id, nodes_per_group, procs_per_node
        self.node_addrs, self.rdzv_port, self.env = node_addrs, rdzv_port, env or dict(os.environ)

    def step_name(self, replica_id: int) -> str:
        return f"smelt-group-{replica_id}"

    def command(self, nproc: int, args: list[str], replica_id: int, run_dir: str) -> tuple[list[str], dict[str, str]]:
        k = self.nodes_per_group
        first = replica_id * k
        cmd, env = group_command(self.procs_per_node, args, replica_id, run_dir, nnodes=k,
                                 rdzv=rdzv_endpoint(self.node_addrs[first], k, self.rdzv_port + replica_id))
        srun = ["srun", "--nodes", str(k), "--ntasks", str(k), "--ntasks-per-node", "1", "--relative", str(first),
                "--overlap", "--kill-on-bad-exit=1", "--export=ALL", "--job-name", self.step_name(replica_id)]
        return [*srun, *cmd], env

    def stopped(self, group: Group) -> list[int]:
        return []  # on other nodes: see the class's docstring

    def _step_id(self, replica_id: int) -> str | None:
        out = subprocess.run(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"], capture_output=True,
                             text=True, timeout=30, env=self.env)
        for line in out.stdout.splitlines():
            step, _, name = line.strip().partition(" ")
            if name.strip() == self.step_name(replica_id):
                return step
        return None

    def kill(self, group: Group) -> None:
        step = self._step_id(group.replica_id)
        if step is None:  # not running yet, or already ended: its srun goes with it
            kill_tree(group.proc)
            return
        subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=30, env=self.env)

    def stop(self, group: Group) -> None:
        if group.proc.poll() is None:
            self.kill(group)
            try:
                group.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_tree(group.proc)
                group.proc.wait()


def node_addresses(env: dict[str, str] | None = None) -> list[str]:
    """The allocation's nodes' addresses (``NodeAddr``), in ``SLURM_JOB_NODELIST``'s order: a multi-node group's
    rendezvous host, reachable from its other nodes whatever the node names resolve to."""
    env = env or dict(os.environ)
    names = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True,
                           text=True, timeout=30, env=env, check=True).stdout.split()
    addrs = []
    for name in names:
        out = subprocess.run(["scontrol", "show", "node", name, "-o"], capture_output=True, text=True, timeout=30,
                             env=env).stdout
        addr = next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeAddr=")), name)
        addrs.append(addr)
    return addrs


def supervise(ns: argparse.Namespace, cfg: TrainConfig, data: dict[str, str], args: list[str]) -> int:
    """The Slurm batch host: the Lighthouse and every group's step, to the run's end or to SIGUSR1 (the time
    limit near: the groups are stopped, and the requeued job is a new launch, resuming from the newest storage
    checkpoint: the steps after it are trained again, and ``merge_records`` keeps their new records)."""
    groups = cfg.parallel.dp_replicate
    if ns.nodes % groups:
        raise SystemExit(f"--nodes ({ns.nodes}) must be a multiple of parallel.dp_replicate ({groups}): each "
                         "replica group runs on nodes of its own")
    stop = threading.Event()

    def on_usr1(signum, frame) -> None:
        print("replicas: time limit near: stopping the groups (the requeued job resumes from storage)", flush=True)
        stop.set()

    signal.signal(signal.SIGUSR1, on_usr1)
    starter = SrunStarter(os.environ["SLURM_JOB_ID"], ns.nodes // groups, ns.procs_per_node, node_addresses(),
                          ns.rdzv_port)
    status = run_replica_groups(cfg, data, args, ns.run_dir, ns.nodes * ns.procs_per_node,
                                stop=stop, log_line=lambda line: print(line, flush=True), starter=starter,
                                lighthouse_host=ns.lighthouse_host)
    return 0 if stop.is_set() else status


# -- Kubernetes --------------------------------------------------------------------------------------------


def restart_of_launch(run_dir: str, replica_id: int, launch_id: str, pod: int) -> tuple[bool, int]:
    """Whether this start of pod ``pod`` of group ``replica_id`` is a restart within launch ``launch_id`` (its
    marker from an earlier start is there), and how many starts it had before; then records this start. A new
    ``smelt launch`` has a new id: its groups resume from storage, as every launch does."""
    url = storage.join(group_dir(run_dir, replica_id), "starts", launch_id)
    fs, path = storage.filesystem(url)
    before = [p for p in fs.ls(path, detail=False) if p.rsplit("/", 1)[-1].startswith(f"pod-{pod}-")] \
        if fs.exists(path) else []
    with storage.atomic_write(storage.join(url, f"pod-{pod}-{time.time_ns()}.json"), "w") as f:
        f.write(json.dumps({"pid": os.getpid(), "time": time.time()}))
    return bool(before), len(before)


def run_group(ns: argparse.Namespace, cfg: TrainConfig, data: dict[str, str], args: list[str]) -> int:
    """One pod of a group's Indexed Job: its torchrun agent (or rank) as a child, told whether it is a restart;
    pod 0 of a group that finished merges the groups' records."""
    pod = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    restarted, earlier = restart_of_launch(ns.run_dir, ns.replica_id, ns.launch_id, pod)
    cmd, extra = group_command(ns.procs_per_node, args, ns.replica_id, ns.run_dir, nnodes=ns.nodes,
                               rdzv=rdzv_endpoint(ns.rdzv_host, ns.nodes, ns.rdzv_port))
    env = {**os.environ, **extra, REPLICA_ENV: str(ns.replica_id), RESTARTED_ENV: "1" if restarted else "0",
           "PYTHONPATH": python_path()}
    print(f"replicas: group {ns.replica_id} pod {pod} start {earlier + 1} of launch {ns.launch_id}"
          f"{' (a restart: it heals from a live peer)' if restarted else ''}", flush=True)
    child = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env)
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))  # the pod's stop
    status = child.wait()
    if status == 0 and pod == 0:
        write_lineage(ns.run_dir, cfg, data)
        summary = finish_run(ns.run_dir, cfg, {"restarts": earlier})
        print(f"replicas: group {ns.replica_id} merged the run's record: {summary['steps']} steps", flush=True)
    return status


def parser() -> argparse.ArgumentParser:
    """The entry points' arguments (the rendered Slurm script and Kubernetes manifest pass them)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.train.replica_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("supervise", "group"))
    parser.add_argument("--config", required=True)
    parser.add_argument("--data", action="append", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--nodes", type=int, required=True, help="supervise: the job's nodes; group: the group's")
    parser.add_argument("--procs-per-node", type=int, default=1)
    parser.add_argument("--rdzv-port", type=int, default=29500, help="a multi-node group's rendezvous port "
                        "(Slurm: plus the group's id)")
    parser.add_argument("--lighthouse-host", default="127.0.0.1", help="supervise: the address to bind")
    parser.add_argument("--replica-id", type=int, default=int(os.environ.get(REPLICA_ENV, 0)))
    parser.add_argument("--rdzv-host", default="localhost", help="group: its first pod's address")
    parser.add_argument("--launch-id", default=os.environ.get(LAUNCH_ENV, ""))
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s",
                        stream=sys.stderr)
    cfg = load(TrainConfig, ns.config, [], section="train")
    data = parse_data(ns.data)
    args = ["--config", ns.config, *[a for item in ns.data for a in ("--data", item)], "--run-dir", ns.run_dir]
    if ns.mode == "supervise":
        return supervise(ns, cfg, data, args)
    if not ns.launch_id:
        raise SystemExit(f"group mode needs --launch-id (or {LAUNCH_ENV}): a restart is told apart by it")
    return run_group(ns, cfg, data, args)


if __name__ == "__main__":
    sys.exit(main())
