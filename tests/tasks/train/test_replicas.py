"""Fault-tolerant replica groups on torchft (tasks/train/replicas.py, replica_group.py): 2 groups × 1 rank on
gloo, the tiny model; a SIGKILLed group, a SIGKILLed Lighthouse, against a fault-free run of the same config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from tasks.checkpoint_reader import list_committed, load_consolidated
from tasks import jsonlog
from tasks.config import from_dict
from tasks.trace.ledger import ledger
from tasks.trace.run import open_run
from tasks.train import replicas
from tasks.train.config import TrainConfig
from tasks.train.faults import fired_faults
from tasks.train.node_launch import prepare_run
from tasks.train.procs import stopped_processes
from tasks.train.replica_group import batch_shares, micro_batch
from tasks.train.replica_records import group_dir, group_records, newest_step
from tests.tasks.train.token_corpus import make_corpus

STEPS = 40
GLOBAL_BATCH = 8
WAIT_S = 240  # every run here is bounded by this


def replica_config(steps: int = STEPS, faults: str = "", snapshot: dict | None = None) -> dict:
    return {"model_preset": "tiny", "steps": steps, "parallel": {"dp_replicate": 2}, "faults": {"inject": faults},
            "data": {"seq_len": 64, "global_batch": GLOBAL_BATCH, "prefetch": 0},
            "snapshot": snapshot or {"enabled": "off"},
            "ft": {"enabled": True, "heartbeat_timeout_ms": 150, "join_timeout_ms": 150, "quorum_tick_ms": 20,
                   "timeout_s": 5, "max_group_restarts": 2}}


# -- the batch split -----------------------------------------------------------------------------------------


def test_shares_tile_each_global_batch_exactly_once_for_any_number_of_participants():
    for participants in (1, 2, 3, 4):
        for step in (1, 2, 7):
            shares = batch_shares(step, 12, 2, participants)
            assert len(shares) == participants
            covered = [i for a, b in shares for i in range(a, b)]
            assert covered == list(range((step - 1) * 12, step * 12))
            sizes = [b - a for a, b in shares]
            assert max(sizes) - min(sizes) <= 2  # at most one micro-batch more than another


def test_the_default_micro_batch_is_one_groups_fault_free_share_and_a_batch_too_small_is_refused():
    assert micro_batch(8, 0, 2) == 4
    assert micro_batch(8, 2, 2) == 2
    with pytest.raises(ValueError, match="at least parallel.dp_replicate"):
        micro_batch(2, 2, 2)


# -- runs --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("replica-corpus") / "tokens"))


def run_groups(corpus: str, run_dir: str, fault=None, faults: str = "",
               snapshot: dict | None = None) -> tuple[int, replicas.ReplicaGroups, dict]:
    """Run 2 groups to the end (``fault(supervisor)`` on a thread, if given, and the config's ``faults``);
    (status, supervisor, merged)."""
    cfg_dict = replica_config(faults=faults, snapshot=snapshot)
    cfg = from_dict(TrainConfig, cfg_dict)
    data = {"main": corpus}
    args = prepare_run(data, cfg_dict, run_dir)
    replicas.write_lineage(run_dir, cfg, data)
    lines: list[str] = []
    supervisor = replicas.ReplicaGroups(cfg, args, run_dir, 2, log_line=lines.append).start()
    if fault is not None:
        threading.Thread(target=fault, args=(supervisor,), daemon=True).start()
    status = supervisor.run(timeout_s=WAIT_S)
    merged = replicas.merge_records(run_dir, 2, GLOBAL_BATCH)
    assert status == 0, "\n".join(lines[-40:])
    for group in supervisor.groups:  # every process ended
        assert group.proc.poll() is not None
    assert supervisor.lighthouse.proc.poll() is not None
    return status, supervisor, merged


def wait_for_step(run_dir: str, replica_id: int, step: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        records = group_records(run_dir, replica_id)
        if records and records[-1]["step"] >= step:
            return
        time.sleep(0.05)
    raise TimeoutError(f"group {replica_id} did not reach step {step}")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("replica-reference"))
    _, _, merged = run_groups(corpus, run_dir)
    assert not merged["problems"] and merged["last_step"] == STEPS
    return {**merged, "run_dir": run_dir}


def assert_every_sample_once(run_dir: str) -> None:
    run = open_run(run_dir)
    result = ledger(run)
    assert result["exactly_once"], result
    assert result["final_step"] == STEPS and result["samples"] == STEPS * GLOBAL_BATCH


@pytest.mark.slow
def test_a_killed_group_leaves_the_other_stepping_and_rejoins_healed_with_every_sample_once(corpus, reference,
                                                                                         tmp_path):
    """Group 1 (one rank) is SIGKILLed at the start of step 5; group 0 steps on alone and holds at step 12 until
    group 1 was restarted and is up (a gate, so the survivor cannot finish the run first, whatever the load)."""
    run_dir = str(tmp_path / "run")
    _, supervisor, merged = run_groups(corpus, run_dir, faults="kill:rank=1,step=5;hold:rank=0,step=12,replica=1")
    assert not merged["problems"], merged["problems"]
    assert supervisor.groups[1].restarts == 1
    killed = next(f["time"] for f in fired_faults(run_dir) if f["kind"] == "kill")

    # The restarted group healed from the survivor: its first step after the restart is past step 5 and shared
    # with the survivor (the gate at step 12 only makes sure it is up by then; the Lighthouse may still give the
    # survivor a quorum or two alone while the restarted group reaches its first).
    restarted = [r for r in group_records(run_dir, 1) if r["time"] > supervisor.groups[1].starts[-1]]
    assert restarted and restarted[0]["step"] > 5 and restarted[0]["participants"] == 2

    # Until then the survivor kept stepping alone, from step 5 (group 1 died before its quorum), training the
    # whole global batch by accumulation: the batch never shrinks. How long it pauses is bench/chaos.py's measure,
    # not this test's: here a quiet step is far shorter than the Lighthouse's failure detection, a loaded one
    # varies tenfold.
    away = [r for r in group_records(run_dir, 0) if 5 <= r["step"] < restarted[0]["step"]]
    assert [r["step"] for r in away] == list(range(5, restarted[0]["step"]))
    assert all(r["participants"] == 1 and r["time"] > killed
               and r["read"] == [(r["step"] - 1) * GLOBAL_BATCH, r["step"] * GLOBAL_BATCH] for r in away)

    assert_every_sample_once(run_dir)
    assert merged["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)


@pytest.mark.slow
def test_the_lighthouse_killed_and_restarted_mid_run_loses_no_step(corpus, reference, tmp_path):
    run_dir = str(tmp_path / "run")

    def kill_lighthouse(supervisor):
        wait_for_step(run_dir, 0, 5)
        supervisor.lighthouse.proc.kill()

    _, supervisor, merged = run_groups(corpus, run_dir, kill_lighthouse)
    assert supervisor.lighthouse.restarts == 1
    assert not merged["problems"] and merged["steps"] == STEPS
    assert all(g.restarts == 0 for g in supervisor.groups)  # nobody restarted: the groups waited it out
    assert_every_sample_once(run_dir)
    assert merged["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)


@pytest.mark.slow
def test_launch_training_with_train_ft_runs_the_groups_and_returns_the_runs_summary(corpus, tmp_path):
    from tasks.train.node_launch import launch_training

    result = launch_training(data={"main": corpus}, config=replica_config(steps=4), run_dir=str(tmp_path / "run"),
                             nproc=2, timeout_s=WAIT_S, log=print)
    assert result["returncode"] == 0 and result["summary"]["steps"] == 4 and result["summary"]["replica_groups"] == 2
    assert ledger(open_run(str(tmp_path / "run")))["exactly_once"]


def final_weights(run_dir: str) -> dict:
    committed = list_committed(run_dir)
    assert committed and committed[-1]["step"] == STEPS
    return load_consolidated(committed[-1]["url"])[0]


@pytest.mark.slow
def test_every_group_lost_resumes_from_the_storage_checkpoint_and_ends_with_the_fault_free_weights(
        corpus, reference, tmp_path):
    """Both groups are SIGKILLed at the start of step 12, once the step-10 checkpoint committed: no live peer is
    left to heal from, so the restarted groups wait ft.timeout_s for one, then resume from step 10 and redo 11."""
    run_dir = str(tmp_path / "run")
    _, supervisor, merged = run_groups(corpus, run_dir, faults="kill:rank=0,step=12;kill:rank=1,step=12")
    assert not merged["problems"], merged["problems"]
    assert [g.restarts for g in supervisor.groups] == [1, 1]
    assert merged["storage_resumes"] >= 1 and merged["redone_steps"] == [11]
    assert_every_sample_once(run_dir)
    assert merged["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)
    got, want = final_weights(run_dir), final_weights(reference["run_dir"])
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7), name


@pytest.mark.slow
def test_every_group_lost_with_their_nodes_alive_resumes_from_the_in_memory_snapshots(corpus, reference, tmp_path):
    """Both groups are SIGKILLed at the start of step 13 with snapshots on (every step, on this node): the step-11
    snapshot is surely written then (step 12's optimizer step waited for its copy), the storage checkpoint is step
    10. The restarted groups find no live peer, and resume from the newest snapshot instead of storage."""
    run_dir = str(tmp_path / "run")
    snapshot = {"enabled": "on", "interval_steps": 1, "keep": 2, "dir": str(tmp_path / "shm")}
    _, supervisor, merged = run_groups(corpus, run_dir, faults="kill:rank=0,step=13;kill:rank=1,step=13",
                                       snapshot=snapshot)
    assert not merged["problems"], merged["problems"]
    assert [g.restarts for g in supervisor.groups] == [1, 1]
    marks = [r for g in (0, 1) for r in jsonlog.read(group_dir(run_dir, g), "metrics.jsonl")
             if "resumed_from" in r]
    assert marks and all(m["source"] == "snapshot" and m["resumed_from"] in (11, 12) for m in marks), marks
    assert merged["snapshot_resumes"] == len(marks) and merged["storage_resumes"] == 0
    assert merged["redone_steps"] == list(range(min(m["resumed_from"] for m in marks) + 1, 13))
    assert_every_sample_once(run_dir)
    got, want = final_weights(run_dir), final_weights(reference["run_dir"])
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7), name


@pytest.mark.slow
def test_two_groups_of_two_fsdp_ranks_heal_a_killed_rank_and_end_with_the_fault_free_weights(corpus, reference,
                                                                                              tmp_path):
    """Groups of 2 ranks (FSDP inside each, one torchrun agent per group): rank 1 of group 1 (global rank 3) is
    SIGKILLed at step 5; its agent ends the group, the supervisor restarts it, and each of its ranks heals its
    own shard from the same rank of group 0. The 1-rank groups' fault-free run is the reference. Both ranks of
    group 0 hold at step 12 (one held alone would leave the other in a quorum request that times out while the
    restarted group starts)."""
    run_dir = str(tmp_path / "run")
    supervisor, merged, _ = run_layout(corpus, run_dir, 2, 2, "kill:rank=3,step=5;hold:rank=0,step=12,replica=1;"
                                                              "hold:rank=1,step=12,replica=1")
    assert supervisor.groups[1].restarts == 1
    restarted = [r for r in group_records(run_dir, 1) if r["time"] > supervisor.groups[1].starts[-1]]
    assert restarted and restarted[0]["step"] > 5 and restarted[0]["participants"] == 2
    assert_every_sample_once(run_dir)
    assert merged["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)
    got, want = final_weights(run_dir), final_weights(reference["run_dir"])
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7), name


# -- a hung group -------------------------------------------------------------------------------------------


def test_newest_step_reads_the_last_whole_record_of_a_long_record_cut_by_a_kill(tmp_path):
    run_dir = str(tmp_path)
    path = tmp_path / "replicas" / "group-1" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    lines = [f'{{"step": {s}, "loss": 1.0, "pad": "{"x" * 200}"}}\n' for s in range(1, 2001)]  # ~450 KB
    path.write_text("".join(lines) + '{"resumed_from": 3}\n{"step": 2001, "lo')  # a mark, then a cut line
    assert newest_step(run_dir, 1) == 2000
    assert newest_step(run_dir, 0) == 0  # no record yet


def test_stopped_processes_names_a_stopped_process_of_the_tree_and_only_while_it_is_stopped():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert stopped_processes(proc) == []
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not stopped_processes(proc) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stopped_processes(proc) == [proc.pid]
        os.kill(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while stopped_processes(proc) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stopped_processes(proc) == []
    finally:
        proc.kill()
        proc.wait(timeout=10)


def run_layout(corpus: str, run_dir: str, groups: int, group_size: int, faults: str) -> tuple[replicas.ReplicaGroups,
                                                                                                dict, list[str]]:
    """Run ``groups`` groups of ``group_size`` ranks to the end under ``faults``; (supervisor, merged, log lines).
    A hung group hangs at its first step, which it reaches whatever step the others are at (no race); a fresh
    run's first step may wait up to ft.quorum_timeout_s for every group, 10 s here."""
    cfg_dict = replica_config(faults=faults)
    cfg_dict["parallel"].update(dp_replicate=groups, dp_shard=group_size)
    cfg_dict["ft"]["quorum_timeout_s"] = 10
    cfg = from_dict(TrainConfig, cfg_dict)
    data = {"main": corpus}
    args = prepare_run(data, cfg_dict, run_dir)
    replicas.write_lineage(run_dir, cfg, data)
    lines: list[str] = []
    supervisor = replicas.ReplicaGroups(cfg, args, run_dir, groups * group_size, log_line=lines.append).start()
    status = supervisor.run(timeout_s=WAIT_S)
    assert status == 0, "\n".join(lines[-40:])
    merged = replicas.merge_records(run_dir, groups, GLOBAL_BATCH)
    assert not merged["problems"], merged["problems"]
    return supervisor, merged, lines


@pytest.mark.slow
def test_a_deadlocked_group_left_behind_is_killed_and_restarted_and_the_run_finishes_exactly_once(
        corpus, reference, tmp_path):
    """Three groups of one rank. Group 2 deadlocks at its first step: it holds there until it was itself restarted,
    which only a kill can bring about; its process runs (not stopped) and its Manager heartbeats on, so the
    Lighthouse keeps it healthy and gives groups 0 and 1 (more than half of three) each quorum after
    ft.join_timeout_ms. They step on, both held at step 12 until group 2 is back up (a gate: the survivors cannot
    finish first; one held alone would leave the other in a quorum request no majority can answer, which times out
    while group 2 starts). Only the supervisor's rule "behind the others' newest committed step for ft.timeout_s"
    ends group 2."""
    run_dir = str(tmp_path / "run")
    supervisor, merged, lines = run_layout(corpus, run_dir, 3, 1, "hold:rank=2,step=1,replica=2;"
                                                                "hold:rank=0,step=12,replica=2;"
                                                                "hold:rank=1,step=12,replica=2")
    # group 2 killed as hung once, and restarted; a survivor that lingers after the run's last step (its interpreter
    # exiting slowly on a loaded host) may be ended the same way, but is not restarted
    assert sum("group 2 is hung: its newest committed step is 0" in line for line in lines) == 1
    assert [g.restarts for g in supervisor.groups] == [0, 0, 1]
    restarted = group_records(run_dir, 2)
    assert restarted and restarted[0]["time"] > supervisor.groups[2].starts[-1]
    # healed from a survivor, not trained from step 1 (the gate at step 12 only makes sure it is up by then: the
    # survivors may still take a quorum or two without it)
    assert restarted[0]["step"] > 1 and restarted[0]["participants"] >= 2
    assert_every_sample_once(run_dir)
    # Three groups sum the gradients in another order than the two of the reference: equal up to rounding.
    assert merged["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)


@pytest.mark.slow
def test_one_stopped_rank_of_a_two_rank_group_is_found_and_its_group_restarted(corpus, reference, tmp_path):
    """Rank 1 of group 1 (global rank 3) is SIGSTOPped at its first step. Its group's Manager, on rank 0, heartbeats
    on, so torchft's Lighthouse neither drops group 1 nor gives group 0 a quorum without it (more than half of the
    heartbeating groups must join): every group stalls alike, none is behind. The supervisor's stopped-process rule
    kills group 1 after ft.timeout_s, and the run finishes exactly once on the fault-free losses."""
    run_dir = str(tmp_path / "run")
    supervisor, merged, lines = run_layout(corpus, run_dir, 2, 2, "stop:rank=3,step=1;hold:rank=0,step=12,replica=1")
    assert supervisor.hung_kills == 1 and [g.restarts for g in supervisor.groups] == [0, 1]
    assert any("stopped for over ft.timeout_s" in line for line in lines)
    assert_every_sample_once(run_dir)
    assert merged["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)


@pytest.mark.slow
def test_a_replica_run_launched_again_with_more_steps_resumes_from_its_newest_checkpoint(corpus, tmp_path):
    """A launch (a continuation, a Prefect retry) is not a restart: every group loads the newest storage
    checkpoint at once and they step on together; no group waits ft.timeout_s for a peer to heal from."""
    from tasks.train.node_launch import launch_training

    run_dir = str(tmp_path / "run")
    lines: list[str] = []
    for steps in (4, 8):
        cfg = replica_config(steps=steps)
        cfg["checkpoint"] = {"interval_steps": 4}
        result = launch_training(data={"main": corpus}, config=cfg, run_dir=run_dir, nproc=2, timeout_s=WAIT_S,
                                 log=lines.append)
        assert result["returncode"] == 0 and result["summary"]["steps"] == steps
    assert [c["step"] for c in list_committed(run_dir)] == [4, 8]
    for g in (0, 1):
        assert [r["step"] for r in group_records(run_dir, g)] == list(range(1, 9))
    assert sum("(a new launch of the run): resumed from the storage checkpoint of step 4" in line
               for line in lines) == 2
    assert not any("every group was lost" in line for line in lines)
    assert ledger(open_run(run_dir))["exactly_once"]
