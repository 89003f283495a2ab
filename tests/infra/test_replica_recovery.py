"""Replica-group recovery (infra/replica_recovery.py): the cost model against hand-computed values, the planner's
search and step, and `smelt plan --recovery replicas` (issue 41, item 5)."""

import json
import math

import pytest
import typer
from typer.testing import CliRunner

from infra.catalogue import CATALOGUE
from infra.commands import plan_command, simulate_command
from infra.layout import Layout, Rejection
from infra.planner import PlanInputs, evaluate, plan, recovery_modes, replica_step
from infra.recovery import NOT_IN_SMELT_REPLICAS, describe
from infra.recovery_figures import DEAD_PEER_DETECTION_S, HANG_SHARE
from infra.reliability import FailureAssumptions
from infra.replica_figures import ASSUMED, COMMIT_S, CROSS_GROUP_TIMEOUT_S, HEARTBEAT_TIMEOUT_S, JOIN_TIMEOUT_S, \
    QUORUM_S, USED
from infra.replica_recovery import replica_cost, slowdown, step_overhead, survivor_detection_s
from infra.timing import step_time
from tasks.train.config import ReplicaConfig

H100 = CATALOGUE["h100"]
app = typer.Typer()
app.command("plan")(plan_command)
app.command("simulate")(simulate_command)
runner = CliRunner()
SEED_2H = ["plan", "--model", "70b", "--tokens", "15e12", "--gpus", "4096", "--gpu", "h100", "--days", "60",
           "--budget", "11e6", "--mtbf-gpu-hours", "8192", "--json"]


def test_the_timeouts_are_smelts_own_train_ft_defaults():
    ft = ReplicaConfig()
    assert CROSS_GROUP_TIMEOUT_S.value == ft.timeout_s
    assert HEARTBEAT_TIMEOUT_S.value == ft.heartbeat_timeout_ms / 1000
    assert JOIN_TIMEOUT_S.value == ft.join_timeout_ms / 1000


def test_every_figure_has_a_source_and_the_unsourced_one_says_so():
    assert all(fig.source for fig in USED.values())
    assert ASSUMED and all(fig.source.startswith("ASSUMPTION") and not fig.verified for fig in ASSUMED.values())


@pytest.mark.parametrize("groups, microbatches, expected", [(2, 1, 2.0), (4, 1, 2.0), (64, 1, 2.0), (4, 3, 4 / 3),
                                                            (8, 4, 5 / 4), (2, 4, 2.0)])
def test_slowdown_is_the_busiest_survivors_whole_micro_batches(groups, microbatches, expected):
    """One sequence per rank cannot be split: survivors of any number of groups then take two."""
    assert slowdown(groups, microbatches) == pytest.approx(expected)


def test_step_overhead_is_the_quorum_a_ring_all_reduce_of_float32_gradients_and_the_vote():
    o = step_overhead(1e9, 4, 50.0)
    assert o.allreduce_s == pytest.approx(4 * 1e9 * 1.5 / 50e9)  # 0.12 s
    assert o.total == pytest.approx(0.12 + QUORUM_S.value + COMMIT_S.value)
    with pytest.raises(ValueError):
        step_overhead(1e9, 1, 50.0)


def test_survivors_detect_a_dead_group_at_the_managers_timeout_and_a_hung_one_after_the_join_timeout():
    h = HANG_SHARE.value
    assert survivor_detection_s(30.0) == pytest.approx((1 - h) * 30.0 + h * 31.0)
    # a timeout longer than the dead-peer detection: the network sees the dead peer first
    assert survivor_detection_s(100.0) == pytest.approx((1 - h) * DEAD_PEER_DETECTION_S.value + h * 101.0)


def test_a_failure_costs_half_a_step_the_stall_and_the_survivors_lost_rate_while_the_group_is_away():
    o = step_overhead(0.0, 2, 50.0)
    c = replica_cost(2, 1, 4.0, o, 50e9, H100, relaunch_s=600.0, mtbf_s=7200.0, detection_s=40.0, reconfigure_s=10.0)
    stall = 2.0 + survivor_detection_s() + 10.0 + QUORUM_S.value
    away = 40.0 + 600.0 + 50e9 / (H100.internode_gbps * 1e9) + 4.0 * 2
    assert c.stall_s == pytest.approx(stall) and c.away_s == pytest.approx(away)
    assert c.lost_s == pytest.approx(2.0 + stall + (away - stall) * 0.5)
    assert sum(p.seconds for p in c.parts()) == pytest.approx(c.lost_s)
    assert c.all_lost_probability == pytest.approx(1 - math.exp(-away / (2 * 7200.0)))
    # more groups: the others must all fail before the first is back
    c4 = replica_cost(4, 3, 4.0, step_overhead(0.0, 4, 50.0), 50e9, H100, 600.0, 7200.0, 40.0, 10.0)
    assert c4.slowdown == pytest.approx(4 / 3)
    assert c4.all_lost_probability == pytest.approx((1 - math.exp(-c4.away_s / (4 * 7200.0))) ** 3)


SEED = PlanInputs(failures=FailureAssumptions(mtbf_gpu_hours=8192, recovery="replicas"))
HSDP = Layout(tp=2, pp=1, dp_replicate=4, dp_shard=512, zero=3, micro_batch=1, activation_checkpoint="full",
              pp_schedule="1F1B")


def test_the_replica_step_is_one_groups_step_plus_the_protocol_with_the_whole_jobs_tokens():
    step, overhead = replica_step(SEED, HSDP)
    group = step_time(SEED.shape, Layout(tp=2, pp=1, dp_replicate=1, dp_shard=512, zero=3, micro_batch=1,
                                         activation_checkpoint="full", pp_schedule="1F1B"),
                      H100, SEED.global_seqs // 4, SEED.timing)
    assert step.total == pytest.approx(group.total + overhead.total)
    assert step.tokens_per_step == SEED.global_seqs * SEED.seq_len and step.world == 4096
    # gradient shard of 70B / (tp 2 × 512 ranks), float32, ring over 4 groups, at the H100's inter-node rate
    assert overhead.allreduce_s == pytest.approx(4 * SEED.shape.cfg.num_params() / 1024 * 1.5 / 50e9)


def test_the_goodput_is_one_minus_the_loss_per_failure_over_the_mtbf_times_the_disasters():
    c = evaluate(SEED, HSDP)
    r = c.reliability
    mtbf = 8192 * 3600 / 4096
    assert r.recovery == "replicas" and r.replicas.groups == 4 and r.replicas.slowdown == 2.0
    failures = 1 - r.replicas.lost_s / mtbf
    assert failures * 0.999 < r.goodput <= failures  # disasters (every group lost) cost under 0.1%
    assert r.lost_per_failure_s == pytest.approx(mtbf * (1 - r.goodput), rel=1e-9)  # failures strike in wall time


def test_replica_recovery_rejects_a_layout_without_groups_and_smelts_trainer_a_pipeline():
    no_groups = Layout(tp=2, pp=1, dp_replicate=1, dp_shard=2048, zero=3, micro_batch=1,
                       activation_checkpoint="full", pp_schedule="1F1B")
    assert evaluate(SEED, no_groups).reason == "recovery.replicas_need_groups"
    piped = Layout(tp=8, pp=4, dp_replicate=2, dp_shard=64, zero=1, micro_batch=1, activation_checkpoint="none",
                   pp_schedule="ZBVZeroBubble", virtual_stages=2)
    rejected = evaluate(SEED, piped)
    assert isinstance(rejected, Rejection) and rejected.reason == "recovery.replicas_no_pipeline"


def test_the_search_tries_replica_group_counts_and_the_comparison_has_a_replicas_row():
    result = plan(SEED)
    assert result.best.layout.dp_replicate >= 2 and result.best.layout.pp == 1
    snapshot = plan(PlanInputs(failures=FailureAssumptions(mtbf_gpu_hours=8192)))
    rows = {m.mode: m for m in recovery_modes(snapshot)}
    assert rows["replicas"].layout == result.best.layout.name != snapshot.best.layout.name
    assert rows["replicas"].goodput == pytest.approx(result.best.reliability.goodput)


def test_smelt_plan_recovery_replicas_prints_the_seed_plan_at_two_hours():
    out = json.loads(runner.invoke(app, [*SEED_2H, "--recovery", "replicas"]).stdout)
    model = out["recovery_model"]["replicas"]
    assert out["recovery"] == describe("replicas") and NOT_IN_SMELT_REPLICAS in out["recovery"]
    assert model["groups"] >= 2 and model["step_overhead_s"]["share_of_step"] < 0.01
    assert model["figures"]["reconfigure_s"]["source"].startswith("ASSUMPTION")
    assert (out["layout"], out["goodput"], out["feasible"]) == ("tp2·pp1·hsdp4x512·zero3·mb1·ac-full", 0.9512, False)
    modes = {m["mode"]: m for m in out["recovery_modes"]}
    assert modes["replicas"]["goodput"] == pytest.approx(out["goodput"], abs=1e-4)
    assert [r["factor"] for r in out["sensitivity"]].count("replica-group rebuild (assumed)") == 2
    text = " ".join(runner.invoke(app, [*SEED_2H[:-1], "--recovery", "replicas"]).stdout.split())
    assert "replica groups (torchft) │ 4 × 1,024 GPUs" in text and "infra/replica_figures.py" in text


def test_the_assumptions_are_options_and_simulate_refuses_replicas_in_one_sentence():
    slow = json.loads(runner.invoke(app, [*SEED_2H, "--recovery", "replicas", "--replica-allreduce-gbps", "1",
                                          "--replica-reconfigure-seconds", "60"]).stdout)
    base = json.loads(runner.invoke(app, [*SEED_2H, "--recovery", "replicas"]).stdout)
    assert slow["recovery_model"]["replicas"]["stall_s"] > base["recovery_model"]["replicas"]["stall_s"] + 49
    assert slow["step_s"] > base["step_s"]
    result = runner.invoke(app, ["simulate", "--recovery", "replicas", "--runs", "1"])
    assert result.exit_code == 2 and "smelt plan --recovery replicas" in " ".join(result.output.split())
