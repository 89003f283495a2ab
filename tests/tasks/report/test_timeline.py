"""A run's faults from its events and metrics: each restart's cause, steps lost and recovery seconds, and
each loss-guard rollback (tasks/report/timeline.py); the derived TensorBoard scalars built from them."""

from __future__ import annotations

import pytest

from tasks.report.scalars import derived_scalars
from tasks.report.timeline import faults, final_trajectory


def steps(group: int, first: int, last: int, t0: float) -> list[dict]:
    """Records of steps ``first..last``, one a second from ``t0``, each 0.8 s long."""
    return [{"step": s, "group": group, "time": t0 + (s - first + 1), "iteration_s": 0.8, "checkpoint_s": 0.0,
             "loss": 5.0 - 0.1 * s, "tokens": 100 * s} for s in range(first, last + 1)]


def test_an_in_process_restart_and_a_relaunch_name_their_cause_steps_lost_and_recovery():
    events = [{"event": "launch", "time": 0.0},
              {"event": "start", "group": 0, "time": 1.0, "resumed_from": None, "restart_count": 0},
              {"event": "start", "group": 1, "time": 12.0, "resumed_from": 4, "restart_count": 1},
              {"event": "restore", "time": 12.5, "source": "snapshot", "step": 4},
              {"event": "launch", "time": 30.0},
              {"event": "start", "group": 2, "time": 31.0, "resumed_from": 8, "restart_count": 0}]
    metrics = steps(0, 1, 6, 2.0) + steps(1, 5, 9, 13.0) + steps(2, 9, 10, 32.0)
    first, second = faults(events, metrics)
    assert first["kind"] == "restart" and first["cause"].startswith("rank failure")
    assert (first["resumed_from"], first["steps_lost"], first["restored_from"]) == (4, 2, "snapshot step 4")
    assert first["recovery_s"] == pytest.approx((13.0 + 1 - 0.8) - (2.0 + 6))  # last step's end → next step's start
    assert second["cause"].startswith("relaunched") and second["steps_lost"] == 1
    assert [r["step"] for r in final_trajectory(metrics)] == list(range(1, 11))


def test_a_loss_guard_rollback_is_a_fault_whose_rejected_steps_are_lost():
    metrics = steps(0, 1, 6, 0.0)
    metrics.insert(6, {**metrics[5], "step": 7, "time": 7.0, "loss": 40.0, "rolled_back_to": 4})
    metrics += steps(0, 5, 7, 8.0)
    (rollback,) = faults([{"event": "start", "group": 0, "time": 0.0, "resumed_from": None}], metrics)
    assert rollback["kind"] == "rollback" and "rejected step 7" in rollback["cause"]
    assert (rollback["resumed_from"], rollback["steps_lost"]) == (4, 3)
    assert final_trajectory(metrics)[-1]["loss"] == pytest.approx(4.3)  # the redone step 7, not the rejected one


def test_derived_scalars_carry_goodput_each_restart_and_each_splits_eval():
    events = [{"event": "start", "group": 0, "time": 0.0, "resumed_from": None, "restart_count": 0},
              {"event": "start", "group": 1, "time": 9.0, "resumed_from": 2, "restart_count": 1}]
    metrics = steps(0, 1, 3, 0.0) + steps(1, 3, 4, 10.0)
    evaluation = {"step": 4, "splits": {"web": {"val_loss": 3.0, "bits_per_byte": 1.5}},
                  "total": {"val_loss": 3.0, "bits_per_byte": 1.5}}
    goodput = {"productive_s": 3.2, "checkpoint_s": 0.0, "init_s": 1.0, "restart_s": 6.0, "lost_s": 0.8,
               "other_s": 1.0, "wall_s": 12.0, "goodput": 0.27}
    scalars = {(tag, step): value for tag, value, step, _ in derived_scalars(
        {"metrics": metrics, "events": events, "goodput": goodput, "evaluations": [evaluation], "generated_at": 0})}
    assert scalars[("goodput/restart_s", 4)] == 6.0 and scalars[("goodput/fraction", 4)] == 0.27
    assert scalars[("faults/restarts", 2)] == 1.0 and scalars[("faults/steps_lost", 2)] == 1.0
    assert scalars[("eval/web/loss", 4)] == 3.0 and scalars[("eval/total/bits_per_byte", 4)] == 1.5
