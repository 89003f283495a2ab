"""The planner's search, verdict and sensitivity, including the 70B / 15T / 4,096 H100 question."""

import dataclasses

import pytest

from infra.catalogue import gpu
from infra.layout import Layout
from infra.planner import Candidate, PlanInputs, candidate_layouts, evaluate, plan, sensitivity, to_dict


@pytest.fixture(scope="module")
def question():
    """70B, 15T tokens, 4,096 H100s, 60 days, $11M: the issue's question with default assumptions."""
    return plan(PlanInputs(model="70b", tokens=15e12, gpus=4096, gpu=gpu("h100"), days=60, budget=11e6))


def test_70b_question_is_feasible_and_a_tp8_pipelined_layout_is_within_ten_percent(question):
    best = question.best
    assert question.feasible and question.reasons() == []
    assert best.layout.world == 4096 and best.layout.tp <= 8
    pipelined = [c for c, _ in question.runners_up if c.layout.tp == 8 and c.layout.pp > 1]
    assert pipelined and pipelined[0].wall_s < 1.10 * best.wall_s  # Meta's kind of layout is a close second
    assert 0.38 <= best.step.mfu <= 0.43  # Llama 3's published 38-43% band
    assert 45 < best.days < 60 and 9e6 < best.cost < 11e6
    assert 0.9 < best.reliability.goodput < 1
    # snapshot recovery (the default): a snapshot every step; storage checkpoints only against disasters, so hours
    # apart (the storage mode's Daly interval, 5-30 minutes, is checked in test_reliability.py)
    r = best.reliability
    assert r.recovery == "snapshot" and r.snapshot.interval_s == pytest.approx(best.step.total)
    assert r.interval_s > 3600


def test_chosen_layout_fits_and_beats_every_runner_up(question):
    best = question.best
    assert best.memory.total <= best.memory.usable
    assert question.runners_up and all(c.wall_s >= best.wall_s for c, _ in question.runners_up)
    assert all("s/step" in why or "GB per GPU" in why for _, why in question.runners_up)
    assert question.rejections.counts["memory.exceeds_capacity"] > 0


def test_cost_counts_spares_and_the_break_even_price_meets_the_budget(question):
    best = question.best
    assert best.gpu_hours == pytest.approx(best.wall_s / 3600 * (4096 + best.reliability.spare_gpus))
    assert best.reliability.spare_gpus > 0
    assert best.gpu_hours * question.break_even_price == pytest.approx(11e6)


def test_a_tight_budget_or_deadline_is_reported_with_numbers(question):
    poor = plan(dataclasses.replace(question.inputs, budget=5e6, days=30))
    assert not poor.feasible and poor.best is not None
    reasons = " ".join(poor.reasons())
    assert "deadline is 30" in reasons and "budget is $5.00M" in reasons and "break-even price" in reasons


def test_no_layout_fits_a_405b_model_on_one_node():
    result = plan(PlanInputs(model="405b", tokens=1e12, gpus=8, days=1000, budget=1e12))
    assert not result.fits and not result.feasible
    assert result.rejections.counts["memory.exceeds_capacity"] > 0
    assert "no layout fits" in result.reasons()[0] and to_dict(result)["layout"] is None


def test_user_mistakes_are_one_sentence_errors():
    with pytest.raises(ValueError, match="multiple of 8"):
        PlanInputs(gpus=100)
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        PlanInputs(model="huge")
    with pytest.raises(ValueError, match="pass --vocab-size"):
        PlanInputs(model="tiny", gpus=8)
    with pytest.raises(ValueError, match="less than one sequence"):
        PlanInputs(global_batch_tokens=100)


def test_layouts_the_batch_cannot_feed_are_rejected_with_a_reason():
    inputs = PlanInputs(model="8b", gpus=64, tokens=1e9)
    too_wide = Layout(tp=1, pp=1, dp_replicate=1, dp_shard=64, zero=3, micro_batch=64)
    result = evaluate(inputs, too_wide)
    assert result.reason == "layout.batch_indivisible" and "2048 sequences" in result.message
    assert isinstance(evaluate(inputs, Layout(tp=1, pp=1, dp_replicate=1, dp_shard=64, zero=3, micro_batch=1,
                                              activation_checkpoint="full")), Candidate)


def test_a_pipelined_layout_converts_to_the_trainers_parallel_config(question):
    layout = next(c.layout for c, _ in question.runners_up if c.layout.pp > 1)
    pc = layout.to_parallel_config(question.inputs.global_seqs)
    assert (pc.tp, pc.pp, pc.dp_shard * pc.dp_replicate) == (layout.tp, layout.pp, layout.dp)
    assert pc.pp_microbatches == 2048 // layout.dp // layout.micro_batch
    assert pc.pp_schedule == layout.pp_schedule
    overrides = layout.trainer_overrides(2048, 8192)
    assert overrides["data.global_batch"] == 2048 and overrides["data.micro_batch"] == 0


def test_sensitivity_moves_the_way_it_should(question):
    rows = {(r.factor, r.setting): r for r in sensitivity(question)}
    by_factor = {}
    for (factor, _), row in rows.items():
        by_factor.setdefault(factor, []).append(row)
    low_mtbf, high_mtbf = by_factor["MTBF per GPU"]
    assert low_mtbf.days > question.best.days > high_mtbf.days
    cheap, dear = by_factor["price"]
    assert cheap.cost < question.best.cost < dear.cost and cheap.days == dear.days
    half, double = by_factor["GPU count"]
    assert half.days > question.best.days > double.days and "fsdp" in half.layout
    assert "planner error" not in by_factor  # only when the validation's error is given
    # the same full-recomputation layout with the trainer's blocks compiled: its recomputation skips w2
    [compiled] = by_factor["trainer compiled"]
    assert compiled.setting == "parallel.compile=true" and compiled.layout == question.best.layout.name
    assert compiled.days < question.best.days and compiled.cost < question.best.cost


def test_planner_error_rows_stretch_the_step_and_keep_the_layout(question):
    faster, slower = [r for r in sensitivity(question, planner_error=0.05) if r.factor == "planner error"]
    assert (faster.setting, slower.setting) == ("step -5.0%", "step +5.0%")
    assert faster.layout == slower.layout == question.best.layout.name
    # days follow the step (goodput moves a little with the checkpoint interval in steps)
    assert faster.days / question.best.days == pytest.approx(0.95, rel=0.01)
    assert slower.days / question.best.days == pytest.approx(1.05, rel=0.01)
    assert faster.cost < question.best.cost < slower.cost
    longer = evaluate(question.inputs, question.best.layout, step_scale=1.05)
    assert longer.step.total == pytest.approx(1.05 * question.best.step.total)
    assert longer.step.tokens_per_s == pytest.approx(question.best.step.tokens_per_s / 1.05)


def test_json_has_the_verdict_keys(question):
    out = to_dict(question)
    for key in ("feasible", "layout", "mfu", "days", "gpu_hours", "cost_usd", "checkpoint_interval_min", "goodput"):
        assert out[key] is not None
    assert out["parallel"]["tp"] == question.best.layout.tp
    assert out["memory_gb"]["total_gb"] <= out["memory_gb"]["usable_gb"]


def test_other_systems_interleave_deeper_than_the_trainer():
    """smelt's trainer runs two stages per rank; with ``deep_interleaving`` (a --stack search) Interleaved1F1B also
    takes every deeper count that splits the layers evenly: 80 layers on 4 ranks, 20 each, so 4, 5, 10 and 20."""
    shape = PlanInputs().shape

    def depths(deep: bool) -> set[int]:
        return {layout.virtual_stages for layout in candidate_layouts(shape, 64, 8, deep_interleaving=deep)
                if layout.pp == 4 and layout.pp_schedule == "Interleaved1F1B"}

    assert depths(False) == {2} and depths(True) == {2, 4, 5, 10, 20}
    assert {layout.virtual_stages for layout in candidate_layouts(shape, 64, 8, deep_interleaving=True)
            if layout.pp_schedule != "Interleaved1F1B"} == {1, 2}  # 1F1B, and ZB-V's V
