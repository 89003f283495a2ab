"""Straggler judgement: each rank's compute against the median of all ranks (the multi-rank flagging runs
for real in tests/tasks/train/test_fault_tolerance.py)."""

from __future__ import annotations

import json

import pytest

from tasks.train.config import StragglerConfig
from tasks.train.stragglers import StragglerDetector, compare_to_median
from tests.tasks.train.ranks import run_ranks


def test_one_slow_rank_among_many_is_flagged_against_the_median():
    ratios, slow = compare_to_median([1.0, 1.02, 0.98, 1.01, 3.0], margin=0.25)
    assert slow == [4] and ratios[4] == pytest.approx(3.0 / 1.01)


def test_two_ranks_three_times_apart_flag_the_slow_one_and_balanced_ranks_flag_none():
    assert compare_to_median([1.0, 3.0], margin=0.25)[1] == [1]  # 3.0 / 2.0 = 1.5 > 1.25
    assert compare_to_median([1.0, 1.2], margin=0.25)[1] == []
    assert compare_to_median([0.0, 0.0], margin=0.25) == ([1.0, 1.0], [])  # a window without timed steps


def test_a_single_rank_has_no_one_to_be_slower_than(tmp_path):
    detector = StragglerDetector(StragglerConfig(every_steps=1), str(tmp_path), rank=0, world_size=1)
    detector.observe(1.0, 0.0)
    assert detector.maybe_check(1) == {} and not (tmp_path / "stragglers.json").exists()


def test_a_margin_must_be_positive():
    with pytest.raises(ValueError, match="margin > 0"):
        StragglerConfig(margin=0)


def _streaks_worker(rank: int, run_dir: str) -> None:
    detector = StragglerDetector(StragglerConfig(every_steps=1, consecutive_windows=2), run_dir, rank=rank,
                                 world_size=2)
    detector.observe(1.0, 0.0)  # the untimed first step
    for window, slow in enumerate([True, True, False, True, True, True], start=1):
        detector.observe(3.0 if rank == 1 and slow else 1.0, 0.0)
        detector.maybe_check(window)


def test_a_straggler_whose_streak_breaks_and_starts_again_is_flagged_once(tmp_path):
    """One window in which the slow rank did not show used to flag it a second time when its streak came
    back (test_fault_tolerance.py's 2-rank run met one under load: rank 1 flagged twice)."""
    run_ranks(2, _streaks_worker, str(tmp_path))
    report = json.loads((tmp_path / "stragglers.json").read_text())
    assert [(f["rank"], f["step"]) for f in report["flagged"]] == [(1, 2)]
    assert [w["slow"] for w in report["windows"]] == [[1], [1], [], [1], [1], [1]]


def _stretched_step_worker(rank: int, run_dir: str) -> None:
    detector = StragglerDetector(StragglerConfig(every_steps=3, consecutive_windows=1), run_dir, rank=rank,
                                 world_size=2)
    detector.observe(1.0, 0.0)  # the untimed first step
    for compute in ([1.0, 1.0, 10.0] if rank == 0 else [3.0, 3.0, 3.0]):
        detector.observe(compute, 0.0)
    detector.maybe_check(3)


def test_one_stretched_step_on_a_healthy_rank_neither_hides_the_straggler_nor_flags_the_healthy_rank(tmp_path):
    """A window's compute is its median step: rank 0's one 10 s step (descheduled, a collector pause) would
    make its mean 4 s against the straggler's 3 s; the median keeps 1 s against 3 s."""
    run_ranks(2, _stretched_step_worker, str(tmp_path))
    report = json.loads((tmp_path / "stragglers.json").read_text())
    assert [f["rank"] for f in report["flagged"]] == [1]
    assert report["windows"][0]["compute_s"] == [1.0, 3.0]
