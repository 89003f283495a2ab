"""Replica groups as Kubernetes runs them (tasks/train/replica_cluster.py ``group``): each group's pod restarted
in place on failure, told it is a restart only by its own start marker of the launch, healing from a live peer;
the finishing groups merge the run's record. Kubernetes' part (run the pod's command again when it exits non-zero,
restartPolicy OnFailure) is played by the test; everything else is the pods' real command, on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.config import from_dict
from tasks.repo import REPO_ROOT, python_path
from tasks.trace.ledger import ledger
from tasks.trace.run import open_run
from tasks.train import replicas
from tasks.train.config import TrainConfig
from tasks.train.node_launch import prepare_run
from tasks.train.replica_cluster import restart_of_launch
from tasks.train.replica_records import group_records
from tests.tasks.train.test_replicas import GLOBAL_BATCH, replica_config
from tests.tasks.train.token_corpus import make_corpus

STEPS = 16
WAIT_S = 240


def test_a_pods_second_start_in_a_launch_is_a_restart_and_a_new_launch_starts_afresh(tmp_path):
    run_dir = str(tmp_path)
    assert restart_of_launch(run_dir, 1, "launch-a", 0) == (False, 0)  # the launch's first start
    assert restart_of_launch(run_dir, 1, "launch-a", 0) == (True, 1)  # Kubernetes restarted it
    assert restart_of_launch(run_dir, 1, "launch-a", 0) == (True, 2)
    assert restart_of_launch(run_dir, 1, "launch-a", 1) == (False, 0)  # another pod of the group
    assert restart_of_launch(run_dir, 0, "launch-a", 0) == (False, 0)  # another group
    assert restart_of_launch(run_dir, 1, "launch-b", 0) == (False, 0)  # the next `smelt launch`: from storage


@pytest.mark.slow
def test_a_group_pod_restarted_in_place_heals_from_its_peer_and_the_finishing_groups_merge_the_record(tmp_path):
    corpus = make_corpus(str(tmp_path / "corpus"))
    cfg_dict = replica_config(steps=STEPS, faults="kill:rank=1,step=5;hold:rank=0,step=10,replica=1")
    cfg, data = from_dict(TrainConfig, cfg_dict), {"main": corpus}
    run_dir = str(tmp_path / "run")
    args = prepare_run(data, cfg_dict, run_dir)
    lighthouse = replicas.Lighthouse(cfg.ft)
    lighthouse.start()
    env = {**os.environ, "TORCHFT_LIGHTHOUSE": lighthouse.address, "PYTHONPATH": python_path(),
           "JOB_COMPLETION_INDEX": "0", "OMP_NUM_THREADS": "1"}
    logs = {g: open(tmp_path / f"group-{g}.log", "w") for g in (0, 1)}

    def start(g: int) -> subprocess.Popen:  # the pod's command, as render_replicas writes it
        return subprocess.Popen([sys.executable, "-m", "tasks.train.replica_cluster", "group", *args,
                                 "--replica-id", str(g), "--nodes", "1", "--launch-id", "launch-1"], cwd=REPO_ROOT,
                                env=env, stdout=logs[g], stderr=subprocess.STDOUT)

    pods, starts, done = {g: start(g) for g in (0, 1)}, {0: 1, 1: 1}, set()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(done) < 2:
            assert time.monotonic() < deadline, (tmp_path / "group-1.log").read_text()[-3000:]
            for g, pod in pods.items():
                if g in done or pod.poll() is None:
                    continue
                if pod.returncode == 0:
                    done.add(g)
                else:  # restartPolicy: OnFailure
                    assert starts[g] < 3, (tmp_path / f"group-{g}.log").read_text()[-3000:]
                    starts[g] += 1
                    pods[g] = start(g)
            time.sleep(0.1)
    finally:
        for pod in pods.values():
            if pod.poll() is None:
                pod.kill()
            pod.wait()
        lighthouse.stop()
        for f in logs.values():
            f.close()
    assert starts == {0: 1, 1: 2}
    assert "(a restart: it heals from a live peer)" in (tmp_path / "group-1.log").read_text()

    summary = json.loads((Path(run_dir) / "summary.json").read_text())  # written by a finishing group
    assert summary["steps"] == STEPS and summary["replica_groups"] == 2
    merged = replicas.merge_records(run_dir, 2, GLOBAL_BATCH, write=False)
    assert not merged["problems"], merged["problems"]
    restarted = [r for r in group_records(run_dir, 1) if r["step"] >= 5]
    assert restarted and restarted[0]["step"] > 5 and restarted[0]["participants"] == 2  # healed, not from step 1
    assert merged["storage_resumes"] == 0
    result = ledger(open_run(run_dir))
    assert result["exactly_once"] and result["samples"] == STEPS * GLOBAL_BATCH, result

    reference = str(tmp_path / "reference")
    fault_free = replica_config(steps=STEPS)
    lines: list[str] = []
    status = replicas.run_replica_groups(from_dict(TrainConfig, fault_free), data, prepare_run(data, fault_free, reference),
                                         reference, 2, timeout_s=WAIT_S, log_line=lines.append)
    assert status == 0, "\n".join(lines[-60:])
    want = json.loads((Path(reference) / "summary.json").read_text())["last_loss"]
    assert summary["last_loss"] == pytest.approx(want, rel=1e-5)
