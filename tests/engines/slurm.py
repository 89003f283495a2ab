"""A two-node Slurm 22.05 cluster on 127.0.0.1 for tests (docs/design.md §8): munged, slurmctld and two
slurmd ("n1", "n2") on this host, each a child process in a session of its own, with a short
credential lifetime so a requeued job starts again in seconds.

Teardown SIGKILLs the daemons and then every process whose environment names this cluster's
SLURM_CONF or that slurmstepd started (a killed slurmd leaves its steps orphaned).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

NODES = ("n1", "n2")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol")


def missing() -> str | None:
    """Why this host cannot run the cluster (None if it can)."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if absent:
        return f"Slurm/munge not installed ({', '.join(absent)} missing): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "the loopback Slurm cluster runs its daemons as root"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Cluster:
    dir: Path
    conf: Path
    env: dict[str, str]

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> str:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
        return out.stdout

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", job_id, "-o", check=False)
        for item in out.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
        return "UNKNOWN"

    def job_field(self, job_id: str, name: str) -> str:
        for item in self.run("scontrol", "show", "job", job_id, "-o").split():
            if item.startswith(name + "="):
                return item.split("=", 1)[1]
        return ""

    def wait_job(self, job_id: str, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {state}, not {sorted(states)}, after {timeout:.0f} s; "
                                   f"log: {self.dir / 'log'}")
            time.sleep(0.5)

    def log_tail(self, lines: int = 40) -> str:
        """The end of slurmctld's log, for failure messages."""
        return "\n".join((self.dir / "log" / "slurmctld.log").read_text().splitlines()[-lines:])

    def kill_node_tasks(self, node: str, job_id: str) -> None:
        """SIGKILL the processes of job ``job_id`` on ``node`` (all nodes share this host here)."""
        victims = []
        for p in psutil.process_iter(["environ"]):
            with contextlib.suppress(psutil.Error):
                env = p.info["environ"] or {}
                if env.get("SLURMD_NODENAME") == node and env.get("SLURM_JOB_ID") == job_id:
                    victims.append(p)
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(victims, timeout=10)

    def wait_nodes_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if all(states.get(n, "").startswith("idle") for n in NODES):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not idle after {timeout:.0f} s: {states}")
            time.sleep(0.3)


def _conf(d: Path, host: str, ports: list[int]) -> str:
    nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=1 State=UNKNOWN"
                      for n, p in zip(NODES, ports[1:]))
    return f"""ClusterName=smelttest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket,cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=10
KillWait=10
MinJobAge=600
MailProg=/bin/true
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def slurm_cluster(d: str | Path) -> Iterator[Cluster]:
    d = Path(d)
    for sub in ("state", "log", *(f"spool/{n}" for n in NODES)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, socket.gethostname(), _free_ports(1 + len(NODES))))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []

    def start(*cmd: str) -> subprocess.Popen:
        log = open(d / "log" / f"{Path(cmd[0]).name}-{len(procs)}.out", "wb")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        procs.append(p)
        return p

    try:
        subprocess.run([_bin("mungekey"), "--create", f"--keyfile={d}/munge.key"], check=True, capture_output=True)
        os.chmod(d / "munge.key", 0o600)
        munged = start(_bin("munged"), "-F", f"--key-file={d}/munge.key", f"--socket={d}/munge.socket",
              f"--pid-file={d}/munged.pid", f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge.seed")
        deadline = time.monotonic() + 20
        while not (d / "munge.socket").exists():
            if munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start; see {d}/log")
            time.sleep(0.1)
        start(_bin("slurmctld"), "-D", "-f", str(conf))
        for n in NODES:
            start(_bin("slurmd"), "-D", "-f", str(conf), "-N", n)
        cluster = Cluster(d, conf, env)
        cluster.wait_nodes_idle()
        yield cluster
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        _kill_leftovers(str(conf))


def _kill_leftovers(conf: str) -> None:
    """Job steps and their tasks outlive a SIGKILLed slurmd: end every process that carries this
    cluster's SLURM_CONF (slurmstepd inherits it from slurmd, job tasks from sbatch's environment)."""
    victims = []
    for p in psutil.process_iter(["environ"]):
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and (p.info["environ"] or {}).get("SLURM_CONF") == conf:
                victims.append(p)
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(victims, timeout=10)
