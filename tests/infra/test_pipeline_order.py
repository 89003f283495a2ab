"""The pipeline step simulation behind the planner's ZB-V bubble (infra/pipeline_order.py)."""

import pytest

from infra.pipeline_order import makespan, zbv_bubble, zbv_order


def one_f_one_b(pp: int, m: int) -> tuple:
    """1F1B with split backwards: rank r warms up with pp − 1 − r forwards, then alternates."""
    order = []
    for r in range(pp):
        ops, f = [], 0
        for _ in range(min(pp - 1 - r, m)):
            ops.append(("F", r, f))
            f += 1
        for b in range(m):
            if f < m:
                ops.append(("F", r, f))
                f += 1
            ops += [("I", r, b), ("W", r, b)]
        order.append(tuple(ops))
    return tuple(order)


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_1f1b_takes_the_textbook_m_plus_pp_minus_1_slots(pp, m):
    # the whole backward as one action (W = 0): (m + pp − 1)(F + B)
    assert makespan(one_f_one_b(pp, m), pp, {"F": 1.0, "I": 2.0, "W": 0.0}) == pytest.approx((m + pp - 1) * 3.0)
    # a separate weight gradient is off the critical path but for the first stage's: (pp − 1)·W less
    split = makespan(one_f_one_b(pp, m), pp, {"F": 1.0, "I": 1.3, "W": 0.7})
    assert split == pytest.approx((m + pp - 1) * 3.0 - (pp - 1) * 0.7)


def test_every_rank_of_zbv_runs_each_action_of_its_two_stages_once():
    pp, m = 4, 6
    for r, ops in enumerate(zbv_order(pp, m)):
        expected = {(kind, stage, mb) for kind in "FIW" for stage in (r, 2 * pp - 1 - r) for mb in range(m)}
        assert len(ops) == len(expected) and set(ops) == expected


def test_torchs_zbv_order_idles_more_than_the_zero_bubble_papers_count():
    # with F = B = W the paper's ZB-V bubble, (pp − 1)(F + B − 2W), is zero; torch's order leaves (pp − 1)·F
    for pp in (2, 4, 8):
        assert zbv_bubble(pp, 4 * pp, 1.0, 1.0, 1.0) == pytest.approx(pp - 1)
    # and (pp − 1)·B where the backward is longer, as in transformer layers (B > F > W, B < F + W)
    assert zbv_bubble(4, 16, 1.0, 1.3, 0.7) == pytest.approx(3 * 1.3)
    # it does not grow with the micro-batches once there are 2pp − 1 or more
    assert zbv_bubble(4, 7, 1.0, 1.3, 0.7) == pytest.approx(zbv_bubble(4, 64, 1.0, 1.3, 0.7))


def test_an_order_that_waits_on_itself_is_an_error():
    with pytest.raises(ValueError, match="deadlocks"):
        makespan(((("I", 0, 0), ("F", 0, 0)),), 1, {"F": 1.0, "I": 1.0, "W": 1.0})
