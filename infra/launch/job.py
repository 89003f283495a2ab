"""What a cluster launch needs, independent of the scheduler: nodes, processes per node, the
torchrun command each node's agent runs, and how long the job may take.

The run folder holds everything the ranks read (``train_config.json``) and write (checkpoints,
metrics); it must be visible from every node: an object store URL or a shared filesystem.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from dataclasses import dataclass, field

from tasks.errors import UserError
from tasks.repo import REPO_ROOT  # the checkout every node runs (a shared filesystem or the image)


FROM_CONFIG = {"from_config": True}  # a JobSpec field the run's config sets (submit.launch), not a `smelt launch` option
HEAD = "__SMELT_HEAD__"  # placeholder for the rendezvous host; each engine substitutes its own


class SubmitError(RuntimeError):
    """The scheduler refused the job; the message carries its answer."""


@dataclass
class JobSpec:
    run_dir: str
    train_args: list[str]  # tasks.train.main arguments (tasks.train.node_launch.prepare_run)
    nodes: int = 1
    procs_per_node: int = 1  # GPUs per node on a GPU cluster: one rank per GPU
    gpus_per_node: int = 0  # 0: a CPU job
    cpus_per_node: int = 0  # 0: the scheduler's default
    max_restarts: int = 3  # torchrun restarts all ranks this many times inside one job
    rdzv_port: int = 29500
    time_limit_minutes: int = 0  # 0: the partition's limit
    stop_lead_s: int = 300  # SIGUSR1 this long before the time limit: final checkpoint (tasks/train/preemption.py)
    name: str = ""
    partition: str = ""
    account: str = ""
    log_dir: str = ""  # Slurm's job output; default <repo>/smelt-logs
    image: str = "smelt:latest"  # Kubernetes container image with this repository installed
    namespace: str = "default"
    store_secret: str = "smelt-store"  # Kubernetes Secret with AWS_* keys for the object store
    env: dict[str, str] = field(default_factory=dict)
    # [train.ft]: parallel.dp_replicate torchft replica groups, each on nodes / replica_groups nodes of its own
    # (tasks/train/replica_cluster.py); 0: one torchrun job. Set by submit.launch from the run's config, not options.
    replica_groups: int = field(default=0, metadata=FROM_CONFIG)
    # Kubernetes: the Lighthouse Service's port, train.ft.lighthouse_port (Slurm: a free port on the batch host)
    lighthouse_port: int = field(default=29510, metadata=FROM_CONFIG)
    # Kubernetes: fresh per `smelt launch`; a group's pod that finds its own start of it restarted
    launch_id: str = field(default="", metadata=FROM_CONFIG)

    def __post_init__(self) -> None:
        from tasks.storage import normalize_url  # fsspec: `smelt`'s startup reads JOB_DEFAULTS without it

        self.run_dir = normalize_url(self.run_dir)
        if self.nodes < 1 or self.procs_per_node < 1:
            raise UserError(f"--nodes ({self.nodes}) and processes per node ({self.procs_per_node}) must be ≥ 1")
        if not self.name:
            self.name = "smelt-" + hashlib.sha256(self.run_dir.encode()).hexdigest()[:8]
        self.log_dir = self.log_dir or str(REPO_ROOT / "smelt-logs")
        if self.replica_groups and self.nodes % self.replica_groups:
            raise UserError(f"--nodes ({self.nodes}) must be a multiple of parallel.dp_replicate "
                             f"({self.replica_groups}) with [train.ft]: each replica group runs on nodes of its own")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def torchrun(self, run_id: str, python: str | None = None) -> list[str]:
        """This job's torchrun command line for every node's agent; the host is ``HEAD``."""
        from tasks.train.node_launch import torchrun_command

        cmd = torchrun_command(self.procs_per_node, self.train_args, run_id, self.max_restarts, self.rdzv_port,
                               nnodes=str(self.nodes), rdzv_host=HEAD)
        return [python or cmd[0], *cmd[1:]]

    @property
    def nodes_per_group(self) -> int:
        return self.nodes // self.replica_groups

    def replica_command(self, mode: str, python: str | None = None, **flags: object) -> list[str]:
        """``python -m tasks.train.replica_cluster MODE`` with the run's arguments and ``flags`` (``--x-y``)."""
        import sys

        return [python or sys.executable, "-m", "tasks.train.replica_cluster", mode, *self.train_args,
                *[a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v))]]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# What `smelt launch` passes when an option is not given (flows/cli.py): the dataclass's own defaults.
JOB_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JobSpec)
                if f.default is not dataclasses.MISSING and not f.metadata.get("from_config")}


def shell_line(cmd: list[str], head: str) -> str:
    """``cmd`` quoted for a shell, with the rendezvous host placeholder replaced by ``head`` unquoted."""
    return shlex.join(cmd).replace(HEAD, head)


def launch_command(engine: str, nodes: int, procs_per_node: int, gpus_per_node: int,
                   overrides: dict[str, object]) -> str:
    """The ``smelt launch`` command that runs a planned layout (``smelt plan`` prints it)."""
    sets = " ".join(f"--set train.{k}={v}" for k, v in overrides.items())
    return (f"smelt launch {engine} --data <tokens-url> --root <store-url> --nodes {nodes} "
            f"--procs-per-node {procs_per_node} --gpus-per-node {gpus_per_node} {sets}").rstrip()
