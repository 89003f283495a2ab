"""Recovery modes: snapshot cost, the full relaunch and its sourced parts, in-process restart, disasters, spares."""

import math

import pytest

from infra.catalogue import gpu
from infra.recovery import NOT_IN_SMELT, RECOVERY_MODES, describe, disaster_probability, full_relaunch_parts, \
    full_relaunch_s, in_process_parts, snapshot_cost, spare_shortage_probability
from infra.recovery_figures import CHECKSUM_GBPS, COMPARED, DETECTION_S, MODEL_BUILD_S, PROCESS_GROUP_INIT_S, \
    SHM_WRITE_GBPS, USED

SHARD = 12 * 70_553_706_496 / 4096  # the 70B's model+optimizer state over tp2 × fsdp2048


def test_snapshot_copies_and_replicates_off_the_step_and_blocks_only_when_it_runs_past_it():
    cost = snapshot_cost(SHARD, gpu("h100"), interval_steps=1, step_s=5.0)
    hash_s = SHARD / (CHECKSUM_GBPS.value * 1e9)
    copy = SHARD / 50e9 + SHARD / (SHM_WRITE_GBPS.value * 1e9) + hash_s  # PCIe, /dev/shm, xxh3
    replicate = SHARD / 50e9 + hash_s  # 400 Gb/s per GPU, verified on the peer
    assert cost.interval_s == 5.0 and cost.copy_s == pytest.approx(copy) and cost.replicate_s == pytest.approx(replicate)
    assert cost.blocking_s == 0 and cost.commit_s == pytest.approx(copy + replicate)
    assert cost.restore_s == pytest.approx(replicate + SHARD / 50e9)
    assert cost.copy_s / cost.interval_s < 0.05  # the 70B's 207 MB shard: a few % of a step, in a thread
    # a 26 GB shard (FP8 HSDP over 16 ranks) cannot be copied within a 3.6 s step: the step waits
    big = snapshot_cost(12 * 70_553_706_496 / 32, gpu("h100"), interval_steps=1, step_s=3.6)
    assert big.blocking_s == pytest.approx(big.copy_s + big.replicate_s - 3.6)
    every_4 = snapshot_cost(12 * 70_553_706_496 / 32, gpu("h100"), interval_steps=4, step_s=3.6)
    assert every_4.interval_s == pytest.approx(14.4) and every_4.blocking_s == pytest.approx(every_4.copy_s - 3.6)


def test_full_relaunch_is_restart_minutes_at_the_default_figures_and_moves_with_them():
    assert full_relaunch_s(10, DETECTION_S.value, PROCESS_GROUP_INIT_S.value) == 600.0  # exactly: storage reproduces
    parts = full_relaunch_parts(600.0, DETECTION_S.value, PROCESS_GROUP_INIT_S.value)
    assert sum(p.seconds for p in parts) == pytest.approx(600.0)
    assert parts[-1].name == "relaunch rest, unsourced" and "no source" in parts[-1].source
    assert full_relaunch_s(10, DETECTION_S.value + 10, PROCESS_GROUP_INIT_S.value - 100) == pytest.approx(510.0)
    [whole] = full_relaunch_parts(60.0, DETECTION_S.value, PROCESS_GROUP_INIT_S.value)  # below its sourced parts
    assert whole.seconds == 60.0 and whole.name == "full relaunch (--restart-minutes)"
    assert full_relaunch_s(0, 0, 0) == 0.0


def test_in_process_restart_is_its_parts_and_falls_back_to_a_relaunch_without_a_spare():
    parts = in_process_parts(detection_s=40, process_group_init_s=100, step_s=5, restore_s=0.01, no_spare_p=0.0,
                             relaunch_s=600)
    # detect, abort, drain one step, last call, assignment+barrier, init, the trainer rebuilt in process, restore
    quick = 40 + 0.5 + 5 + 1 + 1.0 + 100 + MODEL_BUILD_S.value + 0.01
    assert sum(p.seconds for p in parts) == pytest.approx(quick) and parts[-1].seconds == 0
    never = in_process_parts(40, 100, 5, 0.01, no_spare_p=1.0, relaunch_s=600)
    assert sum(p.seconds for p in never) == pytest.approx(600.01)  # every failure relaunches instead


def test_disaster_is_the_replica_node_failing_within_the_window():
    # 8 GPUs per node at 8,192 GPU-hours each: a node fails every 1,024 h; a 10-minute window
    p = disaster_probability(600, 8, 8192)
    assert p == pytest.approx(-math.expm1(-600 * 8 / (8192 * 3600))) == pytest.approx(600 / (1024 * 3600), rel=1e-3)
    assert disaster_probability(0, 8, 8192) == 0


def test_spare_shortage_is_the_poisson_tail_at_the_spare_count():
    # nodes in repair ~ Poisson(1000 / 48,000 × 48 = 1): P(N ≥ 2) = 1 − 2/e
    assert spare_shortage_probability(1000, 48_000, 48, 2) == pytest.approx(1 - 2 / math.e)
    assert spare_shortage_probability(1000, 48_000, 48, 0) == 1.0


def test_in_process_always_says_it_is_not_in_smelts_trainer():
    assert RECOVERY_MODES == ("storage", "snapshot", "in-process", "replicas")
    assert describe("snapshot") == "snapshot" and describe("in-process") == f"in-process ({NOT_IN_SMELT})"


def test_every_figure_has_a_source_and_unverified_ones_say_so():
    for name, fig in {**USED, **COMPARED}.items():
        assert fig.source and fig.unit, name
    assert not USED["full_relaunch_s"].verified and not USED["hang_share"].verified
    assert USED["dead_peer_detection_s"].value == pytest.approx(4.096e-6 * 2**20 * 8)  # NCCL IB defaults: 34.4 s
