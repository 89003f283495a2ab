"""Eval holds (tasks/eval_holds.py): a published checkpoint is kept for its eval, for a bounded time."""

from tasks import eval_holds


def test_a_hold_lasts_until_released_or_until_it_expires(tmp_path):
    run = str(tmp_path)
    assert eval_holds.held_steps(run) == set()
    eval_holds.hold(run, 10, minutes=5, now=1000.0)
    eval_holds.hold(run, 20, minutes=1, now=1000.0)
    assert eval_holds.held_steps(run, now=1059.0) == {10, 20}
    assert eval_holds.held_steps(run, now=1061.0) == {10}  # step 20's minute is over
    eval_holds.release(run, 10)
    eval_holds.release(run, 30)  # never held: nothing to do
    assert eval_holds.held_steps(run, now=1001.0) == {20}
