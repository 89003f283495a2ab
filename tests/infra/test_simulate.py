"""Monte Carlo simulator: agrees with the closed form where its assumptions hold; deterministic by seed."""

import math

import numpy as np
import pytest

from infra.reliability import goodput
from infra.simulate import RunModel, simulate, simulate_run

HOUR, DAY = 3600.0, 86400.0
BASE = dict(work_s=20 * DAY, interval_s=1800.0, blocking_s=20.0, commit_s=60.0, restart_s=600.0, mtbf_s=4 * HOUR)


def test_mean_goodput_is_within_2_percent_of_the_closed_form():
    sim = simulate(RunModel(**BASE), runs=100, seed=1)
    closed = goodput(1800.0, 20.0, 60.0, 600.0, 4 * HOUR)
    assert sim.goodput.mean() == pytest.approx(closed, rel=0.02)
    assert sim.failures.mean() == pytest.approx(20 * DAY / closed / (4 * HOUR), rel=0.05)


def test_without_failures_a_run_takes_its_work_plus_its_saves():
    model = RunModel(**{**BASE, "mtbf_s": 1e15})
    outcome = simulate_run(model, np.random.default_rng(0))
    saves = math.ceil(20 * DAY / 1800) - 1
    assert outcome.failures == 0 and outcome.wall_s == pytest.approx(20 * DAY + saves * 20.0)


def test_progress_and_commits_follow_the_save_cycle():
    model = RunModel(**BASE)
    assert model.progress(1800 + 20 + 100) == 1900  # one full cycle, then 100 s more
    assert model.committed(1800 + 59) == 0  # the first save commits 60 s after it starts
    assert model.committed(1800 + 60) == 1800


def test_planned_stops_lose_no_work_only_save_and_restart_time():
    model = RunModel(**{**BASE, "mtbf_s": 1e15, "blocking_s": 0.0, "planned_per_s": 1 / DAY})
    outcome = simulate_run(model, np.random.default_rng(3))
    stops = (outcome.wall_s - 20 * DAY) / (60.0 + 600.0)
    assert outcome.planned > 5 and stops == pytest.approx(round(stops)) and round(stops) <= outcome.planned


def test_the_same_seed_gives_the_same_runs():
    a, b = simulate(RunModel(**BASE), runs=5, seed=7), simulate(RunModel(**BASE), runs=5, seed=7)
    c = simulate(RunModel(**BASE), runs=5, seed=8)
    assert np.array_equal(a.wall_s, b.wall_s) and not np.array_equal(a.wall_s, c.wall_s)


@pytest.mark.parametrize("distribution", ["exponential", "weibull"])
def test_interruption_rate_over_a_horizon_is_one_per_mtbf(distribution):
    model = RunModel(**{**BASE, "work_s": math.inf, "distribution": distribution})
    sim = simulate(model, runs=40, seed=2, horizon_s=30 * DAY)
    assert sim.interruptions.mean() == pytest.approx(30 * DAY / (4 * HOUR), rel=0.05)
    assert np.all(sim.wall_s == 30 * DAY) and np.all(sim.goodput < 1)


def test_bad_models_are_rejected():
    with pytest.raises(ValueError, match="unknown failure distribution 'gamma'"):
        RunModel(**{**BASE, "distribution": "gamma"})
    with pytest.raises(ValueError, match="commit_s must be at least blocking_s"):
        RunModel(**{**BASE, "commit_s": 1.0})
    with pytest.raises(ValueError, match="--runs"):
        simulate(RunModel(**BASE), runs=0)
