"""Young/Daly against their closed forms, goodput against Daly's exact model, spares and checkpoint cost."""

import math

import pytest

from infra.catalogue import gpu
from infra.layout import Layout
from infra.reliability import LLAMA3_MTBF_GPU_HOURS, FailureAssumptions, checkpoint_cost, cluster_mtbf_s, \
    daly_interval, goodput, plan_reliability, spare_nodes, young_interval


def test_young_interval_is_sqrt_of_2_delta_m():
    assert young_interval(5, 43_200) == pytest.approx(math.sqrt(432_000)) == pytest.approx(657.267, abs=1e-3)


def test_daly_interval_matches_his_higher_order_formula():
    # δ = 60 s, M = 1 h: √(2·60·3600)·(1 + √(1/120)/3 + 1/1080) − 60
    assert daly_interval(60, 3600) == pytest.approx(657.2671 * (1 + 0.0304290 + 0.000925926) - 60, rel=1e-6)
    assert daly_interval(8000, 3600) == 3600  # δ ≥ 2M: checkpoint once per MTBF


@pytest.mark.parametrize("delta, mtbf", [(5, 12 * 3600), (60, 3600), (300, 3 * 3600)])
def test_daly_interval_nearly_maximises_the_exact_goodput(delta, mtbf):
    best = max(goodput(t, delta, delta, 600, mtbf) for t in range(10, 20_000, 5))
    assert goodput(daly_interval(delta, mtbf), delta, delta, 600, mtbf) == pytest.approx(best, rel=2e-4)


def test_sync_goodput_is_daly_expected_time_model():
    tau, delta, restart, m = 1800.0, 60.0, 600.0, 5 * 3600.0
    expected_wall = m * math.exp(restart / m) * (math.exp((tau + delta) / m) - 1)
    assert goodput(tau, delta, delta, restart, m) == pytest.approx(tau / expected_wall)


def test_goodput_approaches_the_first_order_estimate_when_failures_are_rare():
    tau, delta, restart, m = 600.0, 5.0, 300.0, 100 * 3600.0
    first_order = 1 - delta / tau - (restart + tau / 2 + delta) / m
    assert goodput(tau, delta, delta, restart, m) == pytest.approx(first_order, abs=1e-3)


def test_async_commit_delay_costs_lost_work():
    assert goodput(600, 5, 60, 300, 3600) < goodput(600, 5, 5, 300, 3600)
    with pytest.raises(ValueError, match="commit_s < blocking_s"):
        goodput(600, 5, 4, 300, 3600)


def test_llama3_cluster_mtbf_is_about_three_hours():
    assert cluster_mtbf_s(16_384, LLAMA3_MTBF_GPU_HOURS) / 3600 == pytest.approx(54 * 24 / 419)


def test_spares_cover_the_99th_percentile_of_nodes_in_repair():
    # Poisson mean 1000 / 48,000 × 48 = 1: P(≤3) = 0.981, P(≤4) = 0.996
    assert spare_nodes(1000, 48_000, 48, 0.99) == 4
    assert spare_nodes(1000, 48_000, 48, 0.95) == 3


def test_checkpoint_cost_from_state_size_and_bandwidths():
    layout = Layout(tp=8, pp=4, dp_replicate=2, dp_shard=64, zero=1, micro_batch=1)
    cost = checkpoint_cost(70_553_706_496, layout, gpu("h100"), FailureAssumptions())
    size = 12 * 70_553_706_496
    assert cost.size_bytes == size
    assert cost.blocking_s == pytest.approx(5 + size / 2048 / 50e9)
    assert cost.commit_s == pytest.approx(cost.blocking_s + size / 500e9)
    assert cost.load_s == pytest.approx(2 * size / 500e9)  # both replicas read it


def test_interval_is_whole_steps_and_never_shorter_than_a_commit():
    layout = Layout(tp=8, pp=4, dp_replicate=1, dp_shard=128, zero=1, micro_batch=1)
    slow_storage = FailureAssumptions(storage_gbps=1.0)  # 847 s to commit
    r = plan_reliability(4096, 70_553_706_496, layout, gpu("h100"), step_s=5.0, a=slow_storage)
    assert r.interval_s >= r.checkpoint.commit_s - r.checkpoint.blocking_s
    assert r.interval_s == pytest.approx(r.interval_steps * 5.0)
    assert r.spare_gpus % 8 == 0


def test_bad_failure_assumptions_are_rejected():
    with pytest.raises(ValueError, match="mtbf_gpu_hours must be positive"):
        FailureAssumptions(mtbf_gpu_hours=0)
    with pytest.raises(ValueError, match="spare_confidence"):
        FailureAssumptions(spare_confidence=1.0)


QUESTION_LAYOUT = Layout(tp=2, pp=1, dp_replicate=1, dp_shard=2048, zero=3, micro_batch=1)  # the seed plan's
PARAMS_70B = 70_553_706_496


def test_storage_mode_is_the_model_before_recovery_modes():
    """Full relaunch (10 min) + load; the Daly interval against every failure, 5-30 minutes for the seed plan."""
    a = FailureAssumptions(recovery="storage")  # Llama 3's rate: 12.4 h cluster MTBF
    r = plan_reliability(4096, PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), 5.073, a)
    ckpt, mtbf = checkpoint_cost(PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), a), cluster_mtbf_s(4096, a.mtbf_gpu_hours)
    steps = max(1, round(daly_interval(ckpt.blocking_s, mtbf) / 5.073), math.ceil((ckpt.commit_s - ckpt.blocking_s) / 5.073))
    assert r.restart_s == 600 + ckpt.load_s and r.interval_steps == steps and 5 * 60 < r.interval_s < 30 * 60
    assert r.goodput == goodput(steps * 5.073, ckpt.blocking_s, ckpt.commit_s, 600 + ckpt.load_s, mtbf)
    assert r.snapshot is None and r.recovery_point == (r.interval_s, ckpt.blocking_s, ckpt.commit_s)
    assert r.lost_per_failure_s == pytest.approx(mtbf * (1 / r.goodput - 1))  # the parts add up


def test_zero_cost_snapshots_lose_half_a_step_per_failure_and_never_more_than_one():
    step, m = 5.0, 2 * 3600.0
    assert goodput(step, 0, 0, 0, m) == pytest.approx(1 - step / (2 * m), rel=1e-6)
    free = FailureAssumptions(recovery="snapshot", mtbf_gpu_hours=8192, restart_minutes=0, detection_s=0,
                              process_group_init_s=0)
    r = plan_reliability(4096, PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), step, free)
    blocking = r.snapshot.blocking_s / step  # the step's share spent copying the snapshot (upper bound)
    assert r.restart_s == pytest.approx(r.snapshot.restore_s)  # nothing but the restore from a peer
    assert 1 - step / r.mtbf_s - blocking - 1e-4 < r.goodput < 1 - step / (2 * r.mtbf_s) - blocking + 1e-4


def test_snapshot_mode_relaunches_restores_from_a_peer_and_keeps_storage_for_disasters():
    a = FailureAssumptions(recovery="snapshot", mtbf_gpu_hours=8192)
    r = plan_reliability(4096, PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), 5.073, a)
    assert r.restart_s == pytest.approx(600 + r.snapshot.restore_s) and r.snapshot.interval_s == 5.073
    p = r.disaster_probability
    assert p == pytest.approx(-math.expm1(-(r.restart_s + r.snapshot.commit_s) * 8 / (8192 * 3600)))
    ckpt = r.checkpoint
    assert r.interval_steps == round(daly_interval(ckpt.blocking_s, r.mtbf_s / p) / 5.073)  # hours apart
    storage = plan_reliability(4096, PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), 5.073,
                               FailureAssumptions(recovery="storage", mtbf_gpu_hours=8192))
    assert storage.goodput < r.goodput < math.exp(-600 / r.mtbf_s)  # still a 10-minute relaunch per failure
    assert r.deciding(1)[0].name == "relaunch rest, unsourced"


def test_in_process_restart_skips_the_relaunch():
    a = FailureAssumptions(recovery="in-process", mtbf_gpu_hours=8192)
    r = plan_reliability(4096, PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), 5.073, a)
    after = ("snapshot blocking", "work redone + failed restarts", "storage saves + disasters")
    restart_parts = [p for p in r.parts if p.name not in after]
    assert r.restart_s == pytest.approx(sum(p.seconds for p in restart_parts)) and r.restart_s < 300
    assert not r.in_smelt and r.deciding(1)[0].name == "process-group (NCCL) init"
    snapshot = plan_reliability(4096, PARAMS_70B, QUESTION_LAYOUT, gpu("h100"), 5.073,
                                FailureAssumptions(recovery="snapshot", mtbf_gpu_hours=8192))
    assert r.goodput > snapshot.goodput


def test_unknown_recovery_mode_is_rejected():
    with pytest.raises(ValueError, match="choose one of storage, snapshot, in-process"):
        FailureAssumptions(recovery="live-migration")
