"""torchft replica groups through `smelt launch slurm` on the two-node loopback Slurm cluster (tests/engines/
slurm.py, one CPU per node): the batch host runs the supervisor and the Lighthouse, each of the 2 one-rank groups
is a job step on its own node; a group's step lost mid-run is started again as a new step and heals from the
other group. Gated by the fault injector (a kill at a step, a hold until the restarted group is up), never timed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from infra.launch.submit import launch
from tasks.config import from_dict
from tasks.trace.ledger import ledger
from tasks.trace.run import open_run
from tasks.train import replicas
from tasks.train.config import TrainConfig
from tasks.train.node_launch import prepare_run
from tasks.train.procs import free_port
from tasks.train.replica_records import group_records
from tests.engines.test_slurm import restart_now, wait_for
from tests.tasks.train.token_corpus import make_corpus

pytestmark = pytest.mark.slow
STEPS, GLOBAL_BATCH = 16, 8
SETS = ["train.model_preset=tiny", f"train.steps={STEPS}", "train.parallel.dp_replicate=2", "train.data.seq_len=64",
        f"train.data.global_batch={GLOBAL_BATCH}", "train.data.prefetch=0", "train.snapshot.enabled=off",
        "train.ft.enabled=true", "train.ft.heartbeat_timeout_ms=150", "train.ft.join_timeout_ms=150",
        "train.ft.quorum_tick_ms=20", "train.ft.timeout_s=5", "train.ft.max_group_restarts=2"]
WAIT_S = 300


def launched_steps(cluster, node: str, job_id: str) -> list[str]:
    """The job steps ``node``'s slurmd launched for ``job_id``, from its log."""
    text = (cluster.dir / "log" / f"slurmd-{node}.log").read_text()
    return re.findall(rf"launch task StepId=({job_id}\.\d+)", text)


def config(sets: list[str]) -> dict:
    from flows.config import load_run_config, section

    return section(load_run_config(None, sets), "train")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("slurm-replica-corpus") / "tokens"))


@pytest.fixture(scope="module")
def reference_loss(corpus, tmp_path_factory) -> float:
    """A fault-free run of the same config on this host (replicas.py's local supervisor): its final loss."""
    reference = str(tmp_path_factory.mktemp("slurm-replica-reference"))
    cfg_dict, data = config(SETS), {"main": corpus}
    status = replicas.run_replica_groups(from_dict(TrainConfig, cfg_dict), data, prepare_run(data, cfg_dict, reference),
                                         reference, 2, timeout_s=WAIT_S, log_line=lambda line: None)
    assert status == 0
    return json.loads((Path(reference) / "summary.json").read_text())["last_loss"]


def submit(cluster, corpus: str, tmp_path: Path, monkeypatch, sets: list[str], **options) -> tuple[dict, Path]:
    """`smelt launch slurm` of a 2-node job into ``tmp_path/run`` (sbatch exports the submitting environment to the
    job, so the cluster's config and a cache of the test's own go with it); (the launch's answer, its log)."""
    for key, value in {"SLURM_CONF": cluster.env["SLURM_CONF"], "OMP_NUM_THREADS": "1",
                       "SMELT_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)
    job = launch("slurm", data={"main": corpus}, config=config(sets), run_dir=str(tmp_path / "run"),
                 dry_run=False, nodes=2, procs_per_node=1, log_dir=str(tmp_path / "logs"), **options)
    return job, tmp_path / "logs" / f"{job['name']}-{job['job_id']}.out"


def completed(cluster, job: dict, log: Path) -> str:
    """Wait for the job to end (cancelled, with its log in the failure, past WAIT_S); its log once COMPLETED."""
    try:
        state = cluster.wait_job(job["job_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=WAIT_S)
    except TimeoutError:
        cluster.run("scancel", job["job_id"], check=False)
        raise AssertionError(f"the job did not end in {WAIT_S} s; its log:\n{log.read_text()[-4000:]}") from None
    text = log.read_text()
    assert state == "COMPLETED", text[-4000:]
    return text


# Group 1's one rank (global rank 1) at the start of step 5: SIGKILLed (its step ends non-zero), or SIGSTOPped (a
# group hung whole on another node: the supervisor sees it behind the other's newest committed step for
# ft.timeout_s and ends its step with scancel). Group 0 holds at step 10 until the restarted group 1 is up, so the
# survivor cannot finish the run alone, whatever the load.
FAULTS = {"kill": ("kill:rank=1,step=5;hold:rank=0,step=10,replica=1", "replicas: group 1 exited with"),
          "hang": ("stop:rank=1,step=5;hold:rank=0,step=10,replica=1", "replicas: group 1 is hung")}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_launch_slurm_runs_replica_groups_as_job_steps_and_a_lost_group_heals(slurm_cluster, corpus, reference_loss,
                                                                              tmp_path, monkeypatch, fault):
    inject, said = FAULTS[fault]
    run_dir = tmp_path / "run"
    job, log = submit(slurm_cluster, corpus, tmp_path, monkeypatch, [*SETS, f"train.faults.inject={inject}"])
    assert job["replica_groups"] == 2 and "tasks.train.replica_cluster supervise" in job["text"]
    text = completed(slurm_cluster, job, log)
    # each group is a job step on its own node: group 0 once on n1, group 1 on n2, and again there once lost
    steps = {n: launched_steps(slurm_cluster, n, job["job_id"]) for n in ("n1", "n2")}
    assert (len(steps["n1"]), len(steps["n2"])) == (1, 2), steps
    assert said in text and "restarting it (restart 1)" in text

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["restarts"] == 1 and summary["replica_groups"] == 2
    merged = replicas.merge_records(str(run_dir), 2, GLOBAL_BATCH, write=False)
    assert not merged["problems"], merged["problems"]
    # the restarted group healed from the survivor: its first committed step after the fault is past 5, shared
    restarted = [r for r in group_records(str(run_dir), 1) if r["step"] >= 5]
    assert restarted and restarted[0]["step"] > 5 and restarted[0]["participants"] == 2
    alone = [r for r in group_records(str(run_dir), 0) if 5 <= r["step"] < restarted[0]["step"]]
    assert alone and all(r["participants"] == 1 for r in alone)  # the survivor stepped on, the whole batch
    result = ledger(open_run(str(run_dir)))
    assert result["exactly_once"] and result["samples"] == STEPS * GLOBAL_BATCH, result
    assert summary["last_loss"] == pytest.approx(reference_loss, rel=1e-5)


def test_a_replica_group_spanning_both_nodes_is_one_step_meeting_on_its_first_node(slurm_cluster, corpus, tmp_path,
                                                                                    monkeypatch):
    """One group of 2 nodes × 1 rank (FSDP over dp_shard 2): one job step with a torchrun agent on each node, their
    rendezvous on the group's first node's address (NodeAddr, whatever the node names resolve to)."""
    run_dir = tmp_path / "run"
    sets = [s for s in SETS if not s.startswith(("train.steps", "train.parallel"))]
    job, log = submit(slurm_cluster, corpus, tmp_path, monkeypatch,
                      [*sets, "train.steps=4", "train.parallel.dp_replicate=1", "train.parallel.dp_shard=2"],
                      rdzv_port=free_port())
    completed(slurm_cluster, job, log)
    steps = {n: launched_steps(slurm_cluster, n, job["job_id"]) for n in ("n1", "n2")}
    assert len(steps["n1"]) == 1 and steps["n1"] == steps["n2"], steps  # the same step on both nodes
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["restarts"] == 0
    assert not replicas.merge_records(str(run_dir), 1, GLOBAL_BATCH, write=False)["problems"]


def test_the_time_limit_signal_stops_the_groups_and_the_requeued_job_resumes_them_from_storage(
        slurm_cluster, corpus, reference_loss, tmp_path, monkeypatch):
    """Both groups are SIGSTOPped at the start of step 6, once checkpoint 4 committed (a gate: neither is behind the
    other, so nothing else ends them); Slurm's SIGUSR1 before the time limit reaches the supervisor through the batch
    shell, which stops the groups' steps and requeues the job; the rerun is a new launch: both groups load
    checkpoint 4, train step 5 again, and finish on the fault-free loss."""
    run_dir = tmp_path / "run"
    job, log = submit(slurm_cluster, corpus, tmp_path, monkeypatch,
                      [*SETS, "train.checkpoint.interval_steps=4",
                       "train.faults.inject=stop:rank=0,step=6;stop:rank=1,step=6"])
    try:
        for rank in (0, 1):
            wait_for(run_dir / "faults" / f"fired-stop-{rank}-6", WAIT_S, f"rank {rank}'s step-6 gate")
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job["job_id"])
        restart_now(slurm_cluster, job["job_id"])
        state = slurm_cluster.wait_job(job["job_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=WAIT_S)
    except (TimeoutError, AssertionError):
        slurm_cluster.run("scancel", job["job_id"], check=False)
        raise AssertionError(f"the job did not go as planned; its log:\n{log.read_text()[-4000:]}") from None
    text = log.read_text()
    assert state == "COMPLETED", text[-4000:]
    assert "stopped before the time limit; requeueing" in text and "restart 1" in text
    assert slurm_cluster.job_field(job["job_id"], "Restarts") == "1"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["redone_steps"] == [5] and summary["storage_resumes"] >= 2
    assert ledger(open_run(str(run_dir)))["exactly_once"]
    assert summary["last_loss"] == pytest.approx(reference_loss, rel=1e-5)
