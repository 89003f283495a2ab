"""Training through `smelt launch slurm` on a two-node loopback Slurm cluster (2 nodes × 1 gloo rank):
scancel and resubmit, the time-limit signal, a node taken down (requeue); every job completes.

Each interruption is gated, not timed: the fault injector SIGSTOPs a rank at the start of a chosen
step after the earlier checkpoints committed (tasks/train/faults.py), and the test acts once that
fault's marker exists, so the checkpoint a rerun resumes from is known in advance.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.checkpoint_reader import list_committed
from tasks.train.goodput import read_jsonl
from tests.tasks.train.token_corpus import make_corpus

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TINY = ["train.data.seq_len=16", "train.data.global_batch=8", "train.model.dim=32", "train.model.n_layers=2",
        "train.model.n_heads=4", "train.model.n_kv_heads=2", "train.model.ffn_hidden=64"]


def launch(cluster, tmp_path: Path, name: str, sets: list[str], *extra: str) -> dict:
    """`smelt launch slurm` as a user types it; returns its --json answer."""
    env = {**cluster.env, "OMP_NUM_THREADS": "1", "SMELT_CACHE_DIR": str(tmp_path / "cache")}
    corpus = tmp_path / "corpus"
    if not (corpus / "manifest.json").exists():
        make_corpus(str(corpus))
    cmd = [sys.executable, "-m", "flows.cli", "launch", "slurm", "--data", str(corpus), "--root", str(tmp_path / name),
           "--run-dir", str(tmp_path / name / "train"), "--nodes", "2", "--procs-per-node", "1", "--max-restarts", "0",
           "--log-dir", str(tmp_path / f"{name}-logs"),
           "--rdzv-port", str(_free_port()), "--json", *extra, *[a for s in [*TINY, *sets] for a in ("--set", s)]]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _free_port() -> int:
    from tasks.train.node_launch import free_port

    return free_port()


def wait_for(path: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} not seen after {timeout:.0f} s"
        time.sleep(0.2)


def wait_for_pending(pid: int, signum: int, timeout: float, log: Path) -> None:
    """Until ``signum`` is pending on the (stopped) process ``pid``, read off /proc/PID/status: the signal
    has been delivered and waits there, however long the scheduler took to forward it."""
    bit, deadline = 1 << (signum - 1), time.monotonic() + timeout
    while True:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        if any(line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & bit for line in status):
            return
        assert time.monotonic() < deadline, f"{signal.Signals(signum).name} not pending on {pid} after " \
                                            f"{timeout:.0f} s; the job's log:\n{log.read_text() if log.exists() else ''}"
        time.sleep(0.1)


def run_path(job: dict) -> Path:
    return Path(job["run_dir"].removeprefix("file://"))


def starts(job: dict) -> list[dict]:
    return [e for e in read_jsonl(job["run_dir"], "events.jsonl") if e["event"] == "start"]


def restores(job: dict) -> list[dict]:
    return [e for e in read_jsonl(job["run_dir"], "events.jsonl") if e["event"] == "restore"]


def restart_now(cluster, job_id: str) -> None:
    """A requeued job may start once its old credentials expired (its EligibleTime, cred_expire=10 s
    here); then start it at once instead of at the scheduler's next cycle."""
    cluster.wait_job(job_id, {"PENDING"}, timeout=60)
    eligible = datetime.datetime.fromisoformat(cluster.job_field(job_id, "EligibleTime"))
    time.sleep(max(0.0, (eligible - datetime.datetime.now()).total_seconds()) + 1)
    cluster.run("scontrol", "update", f"jobid={job_id}", "StartTime=now", check=False)  # it may have started


def test_scancel_and_resubmit_then_the_time_limit_signal_each_resume_where_they_should(slurm_cluster, tmp_path):
    """Job 1 is cancelled at step 6 (checkpoint 4 committed, step 5 snapshotted in the nodes' memory); the
    same command resubmitted resumes from the snapshot of 5; near its "time limit" (step 9) the signal
    checkpoints step 9 and requeues; the rerun resumes from 9 and completes."""
    sets = ["train.steps=12", "train.checkpoint.interval_steps=4",
            "train.faults.inject=stop:rank=0,step=6;stop:rank=1,step=9"]
    job = launch(slurm_cluster, tmp_path, "run", sets)
    assert job["world_size"] == 2 and "--nnodes 2 --nproc-per-node 1" in job["text"]
    faults = run_path(job) / "faults"
    wait_for(faults / "fired-stop-0-6", 120, "the step-6 gate")
    slurm_cluster.run("scancel", job["job_id"])
    assert slurm_cluster.wait_job(job["job_id"], {"CANCELLED"}, timeout=60) == "CANCELLED"
    assert [c["step"] for c in list_committed(job["run_dir"])][-1] == 4

    again = launch(slurm_cluster, tmp_path, "run", sets)  # the same command, the same run folder
    assert again["run_dir"] == job["run_dir"] and again["job_id"] != job["job_id"]
    wait_for(faults / "fired-stop-1-9", 120, "the step-9 gate")
    # What Slurm does stop_lead_s before the time limit: SIGUSR1 to the batch shell.
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", again["job_id"])
    log = tmp_path / "run-logs" / f"{again['name']}-{again['job_id']}.out"
    stopped = json.loads((faults / "fired-stop-1-9").read_text())["pid"]
    # Release rank 1 only once it holds the forwarded signal pending: it handles it on waking, before its step-9
    # vote, so every rank agrees to stop at step 9 whenever rank 0's copy arrives.
    wait_for_pending(stopped, signal.SIGUSR1, 30, log)
    os.kill(stopped, signal.SIGCONT)
    restart_now(slurm_cluster, again["job_id"])
    state = slurm_cluster.wait_job(again["job_id"], {"COMPLETED", "FAILED"}, timeout=180)
    assert state == "COMPLETED", slurm_cluster.log_tail()
    assert "stop requested (SIGUSR1): final checkpoint at step 9" in log.read_text()
    summary = json.loads((run_path(job) / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["world_size"] == 2 and summary["resumed_from"] == 9
    assert [s["resumed_from"] for s in starts(job)] == [None, 5, 9]
    assert [(e["source"], e["step"]) for e in restores(job)][0] == ("snapshot", 5)


def test_a_node_taken_down_requeues_the_job_which_resumes(slurm_cluster, tmp_path):
    sets = ["train.steps=12", "train.checkpoint.interval_steps=4", "train.faults.inject=stop:rank=1,step=6"]
    job = launch(slurm_cluster, tmp_path, "down", sets)
    wait_for(run_path(job) / "faults" / "fired-stop-1-6", 120, "the step-6 gate")
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=smelt-test")
    slurm_cluster.kill_node_tasks("n2", job["job_id"])  # the node is gone, and its processes with it
    # The job is requeued; its slurmd still answers, so the node returns (ReturnToService=2), as a
    # replaced node would: resuming it by hand is only needed where it has not yet.
    restart_now(slurm_cluster, job["job_id"])
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert slurm_cluster.wait_job(job["job_id"], {"COMPLETED", "FAILED"}, timeout=180) == "COMPLETED"
    assert slurm_cluster.job_field(job["job_id"], "Restarts") == "1"
    summary = json.loads((run_path(job) / "summary.json").read_text())
    # The node came back with its memory (as a rebooted node would not: test_snapshot.py covers a lost store).
    assert summary["steps"] == 12 and summary["resumed_from"] == 5
    assert [s["resumed_from"] for s in starts(job)] == [None, 5]
    assert [(e["source"], e["step"]) for e in restores(job)] == [("snapshot", 5)]
