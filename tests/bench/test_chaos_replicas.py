"""bench/chaos.py --replicas (bench/chaos_replicas.py): how it counts a redone step, and its options' errors. The
whole harness takes minutes on 2 cores (its figures are in docs/design.md), so it is not run here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.chaos_replicas import steps_lost

REPO = Path(__file__).resolve().parents[2]


def record(step: int, replica: int, participants: int, time: float) -> dict:
    return {"step": step, "replica": replica, "participants": participants, "time": time}


def test_a_step_committed_again_is_lost_once_the_run_went_past_it_and_split_when_side_by_side():
    together = [record(s, g, 2, s + g / 10) for s in (1, 2, 3) for g in (0, 1)]
    assert steps_lost(together) == (0, 0)
    alone_then_together = [record(1, 0, 1, 1), record(2, 0, 1, 2), record(3, 0, 2, 3), record(3, 1, 2, 3.1)]
    assert steps_lost(alone_then_together) == (0, 0)
    assert steps_lost(together + [record(2, 0, 2, 4), record(2, 1, 2, 4.1)]) == (1, 0)  # after step 3: redone
    assert steps_lost(together, resumed=[3]) == (0, 0)  # a resume named a step committed once
    assert steps_lost(together + [record(3, 0, 2, 4), record(3, 1, 2, 4.1)], resumed=[3]) == (1, 0)
    assert steps_lost([record(1, 0, 1, 1), record(1, 1, 1, 1.1)]) == (0, 1)  # two quorums of one group each
    assert steps_lost([record(1, 0, 2, 1), record(1, 1, 1, 1.1), record(2, 0, 2, 2)]) == (0, 1)  # sizes differ


def test_the_replica_options_refuse_what_cannot_run_in_one_line():
    for args, words in ((["--replica-layouts", "3x3"], "--replica-layouts"),
                        (["--replica-steps", "20", "--replica-fault-step", "15"], "--replica-fault-step")):
        done = subprocess.run([sys.executable, "bench/chaos.py", "--replicas", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
