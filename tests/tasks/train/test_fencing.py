"""One writer per run (tasks/lease.py wired into the launcher, the trainer, checkpoints and snapshots).

The field case: a launcher and its ranks are paused (SIGSTOP, a partition) past the lease timeout, a retry
takes the run over and finishes it, and then the paused job wakes up. It must commit nothing, stop with a
sentence naming the newer epoch, and leave one trajectory: the undisturbed run's losses and weights.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tasks import lease
from tasks.checkpoint_reader import list_committed, load_consolidated, step_url
from tasks.contract import read_manifest
from tasks.train.goodput import read_jsonl
from tasks.train.node_launch import launch_training
from tests.tasks.train.processes import follow, kill_tree, wait_for
from tests.tasks.train.token_corpus import TWO_RANKS

REPO = Path(__file__).resolve().parents[3]
TINY = {**TWO_RANKS, "steps": 10}
LEASE_TIMEOUT_S = 6.0
# The launcher as `smelt train` runs it (flows/train.py calls launch_training), in a process of its own.
LAUNCHER = """
import json, sys
from tasks.train.node_launch import LaunchError, launch_training
config, corpus, run_dir, timeout, wait = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
try:
    result = launch_training(data={"main": corpus}, config=config, run_dir=run_dir, nproc=2, max_restarts=1,
                             timeout_s=300, lease_timeout_s=timeout, lease_wait_s=wait, log=print)
except LaunchError as e:
    print("LAUNCH-ERROR", e, flush=True)
    sys.exit(1)
print("RESULT", json.dumps({"lease_epoch": result["lease_epoch"], "steps": result["summary"]["steps"]}), flush=True)
"""


def start_launcher(config: dict, corpus: str, run_dir: Path, wait_s: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, json.dumps(config), corpus, str(run_dir),
                             str(LEASE_TIMEOUT_S), str(wait_s)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)


def signal_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal the launcher and everything it started (its session), like a paused or partitioned host."""
    os.killpg(proc.pid, sig)


@pytest.mark.slow
def test_a_paused_job_taken_over_wakes_up_commits_nothing_and_names_the_newer_epoch(corpus, tmp_path):
    reference = tmp_path / "reference"
    launch_training(data={"main": corpus}, config=TINY, run_dir=str(reference), nproc=2, timeout_s=300,
                    log=print)

    run = tmp_path / "run"
    paused = copy.deepcopy(TINY)
    paused["faults"] = {"inject": "stop:rank=0,step=5"}  # the gate: rank 0 stops itself at step 5's start
    first, first_lines = start_launcher(paused, corpus, run), []
    threading.Thread(target=follow, args=(first, first_lines), daemon=True).start()
    try:
        wait_for("rank 0 stopped at step 5", lambda: (run / "faults" / "fired-stop-0-5").exists(), 120, first_lines)
        signal_tree(first, signal.SIGSTOP)  # now the launcher, its agent and every rank: nothing renews the lease
        before = [r for r in read_jsonl(str(run), "metrics.jsonl") if r.get(lease.EPOCH_KEY) == 1]
        assert [r["step"] for r in before] == [1, 2, 3, 4]

        # The retry waits for the paused launcher's lease to expire, takes the run over and finishes it.
        retry, retry_lines = start_launcher(paused, corpus, run, wait_s=120), []
        threading.Thread(target=follow, args=(retry, retry_lines), daemon=True).start()
        assert retry.wait(timeout=240) == 0, "\n".join(retry_lines[-30:])
        [result] = [json.loads(line.split(" ", 1)[1]) for line in retry_lines if line.startswith("RESULT ")]
        assert result == {"lease_epoch": 2, "steps": 10}

        signal_tree(first, signal.SIGCONT)  # the paused job wakes up in a run that is no longer its own
        assert first.wait(timeout=120) != 0
    finally:
        kill_tree(first)
    error = next(line for line in first_lines if line.startswith("LAUNCH-ERROR"))
    assert "lease epoch 1" in error and "epoch 2" in error, error

    # It committed nothing after the takeover: no metrics record and no checkpoint of epoch 1 past step 4.
    after = [r for r in read_jsonl(str(run), "metrics.jsonl") if r.get(lease.EPOCH_KEY) == 1]
    assert after == before
    assert lease.adopted_step(str(run), 2) == 4  # the retry continued from the paused job's step-4 state
    for checkpoint in list_committed(str(run)):
        epoch = read_manifest(checkpoint["url"]).meta[lease.EPOCH_KEY]
        assert epoch == 2 or checkpoint["step"] <= 4, checkpoint
    # One trajectory: the undisturbed run's losses, and its final weights bit for bit.
    losses = {r["step"]: r["loss"] for r in read_jsonl(str(run), "metrics.jsonl")}
    assert losses == {r["step"]: r["loss"] for r in read_jsonl(str(reference), "metrics.jsonl")}
    got, want = load_consolidated(step_url(str(run), 10))[0], load_consolidated(step_url(str(reference), 10))[0]
    assert not [k for k in want if not torch.equal(got[k], want[k])], "weights differ from the undisturbed run"
