"""smelt's node agent (tasks/train/agent.py) on 127.0.0.1: a failed rank is replaced by a warm spare, the
healthy ranks rejoin in their own processes and restore from memory; a rank's own error stops the job.

Every recovered run must end with the undisturbed run's losses and weights bit for bit (test_snapshot.py's
reference: the same layout under torchrun).
"""

from __future__ import annotations

import shutil
import threading

import pytest

from tasks.train.agent import NodeAgent
from tasks.train.goodput import read_jsonl
from tasks.train.node_launch import REPO_ROOT, free_port, prepare_run
from tests.tasks.train.processes import wait_for
from tests.tasks.train.test_snapshot import assert_same_run, config, restores, steps_lost
from tests.tasks.train.test_snapshot import reference  # noqa: F401 - a shared module fixture (corpus: conftest.py)

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 4


def agent_config(faults: str = "") -> dict:
    cfg = config(faults)
    cfg["watchdog"] = {"hang_timeout_s": HANG_TIMEOUT_S}
    return cfg


def run_node(corpus: str, run_dir, cfg: dict, lines: list[str], **kwargs) -> NodeAgent:
    args = prepare_run({"main": corpus}, cfg, str(run_dir))
    agent = NodeAgent(args, nnodes=1, node_rank=0, nproc=2, master_addr="127.0.0.1", master_port=free_port(),
                      env={"PYTHONPATH": str(REPO_ROOT)}, cwd=str(REPO_ROOT), log_line=lines.append, **kwargs)
    agent.status = agent.run()
    return agent


def recovery_s(run_dir, fault_time: float) -> float:
    """Seconds from the fault to the end of the next step."""
    return min(r["time"] for r in read_jsonl(str(run_dir), "metrics.jsonl") if r["time"] > fault_time) - fault_time


def test_a_killed_rank_is_replaced_by_a_warm_spare_and_the_healthy_rank_rejoins_in_its_own_process(
        corpus, reference, tmp_path):
    lines: list[str] = []
    agent = run_node(corpus, tmp_path, agent_config("kill:rank=1,step=7"), lines)
    assert agent.status == 0, "\n".join(lines[-40:])
    assert [(r["rank"], r["exit"]) for r in agent.replacements] == [(1, -9)]
    assert [a["rank"] for a in agent.assignments] == [0, 1, 1], "rank 0 must keep its process"
    [restore] = restores(tmp_path)
    assert (restore["source"], restore["step"]) == ("snapshot", 6), restore
    assert steps_lost(tmp_path) == 0
    assert recovery_s(tmp_path, agent.replacements[0]["time"]) < 10
    assert_same_run(tmp_path, reference)


def test_a_stopped_rank_is_killed_by_its_peer_and_replaced_after_the_hang_timeout(corpus, reference, tmp_path):
    lines: list[str] = []
    agent = run_node(corpus, tmp_path, agent_config("stop:rank=1,step=7"), lines)
    assert agent.status == 0, "\n".join(lines[-40:])
    assert [a["rank"] for a in agent.assignments] == [0, 1, 1]
    assert any("this rank stays for an in-process restart" in line for line in lines)
    [restore] = restores(tmp_path)
    assert (restore["source"], restore["step"]) == ("snapshot", 6), restore
    assert steps_lost(tmp_path) == 0
    assert_same_run(tmp_path, reference)


def test_a_rank_that_fails_by_itself_stops_the_job_without_a_retry(corpus, tmp_path):
    """A NaN with no checkpoint to roll back to is the loss guard's error on every rank: permanent."""
    lines: list[str] = []
    agent = run_node(corpus, tmp_path, agent_config("nan:step=3"), lines)
    assert agent.status == 1 and agent.replacements == [], "\n".join(lines[-40:])
    assert any("not retried" in line or "the job stops" in line for line in lines)


def test_a_lost_node_is_replaced_by_a_new_agent_and_the_survivor_rejoins_without_restarting(
        corpus, reference, tmp_path):
    """Two nodes of one rank each, their own stores. Node 1's rank stops at step 7; the node is then lost
    whole (its agent, rank, spare and store) and a new agent for node 1 joins the running job."""
    run_dir = tmp_path / "run"
    args = prepare_run({"main": corpus}, agent_config("stop:rank=1,step=7"), str(run_dir))
    port = free_port()
    stores = {name: tmp_path / f"store-{name}" for name in ("0", "1", "1b")}
    lines: dict[str, list[str]] = {name: [] for name in stores}
    agents: dict[str, NodeAgent] = {}
    threads: dict[str, threading.Thread] = {}
    status: dict[str, int] = {}

    def start(name: str, node_rank: int) -> None:
        env = {"PYTHONPATH": str(REPO_ROOT), "SMELT_SNAPSHOT_DIR": str(stores[name])}
        agents[name] = NodeAgent(args, nnodes=2, node_rank=node_rank, nproc=1, master_addr="127.0.0.1",
                                 master_port=port, env=env, cwd=str(REPO_ROOT), log_line=lines[name].append)
        threads[name] = threading.Thread(target=lambda: status.__setitem__(name, agents[name].run()), daemon=True)
        threads[name].start()

    try:
        start("0", 0)
        start("1", 1)
        fired = run_dir / "faults" / "fired-stop-1-7"
        wait_for("the stop of rank 1 at step 7", fired.exists, 120, lines["0"] + lines["1"])
        agents["1"].lose_node()  # the node is gone: agent loop, rank, spare
        shutil.rmtree(stores["1"])
        start("1b", 1)
        for name in ("0", "1b"):
            threads[name].join(timeout=180)
            assert status.get(name) == 0, "\n".join(lines[name][-40:])
    finally:
        for agent in agents.values():
            agent.lose_node()
    assert [a["rank"] for a in agents["0"].assignments] == [0], "node 0's rank must keep its process"
    [restore] = restores(run_dir)
    assert restore["source"] == "snapshot" and restore["step"] == 6, restore
    assert restore["sources"]["1"].startswith("peer:"), restore
    assert steps_lost(run_dir) == 0
    assert_same_run(run_dir, reference)
