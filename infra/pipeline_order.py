"""The order in which torch.distributed.pipelining's ZB-V schedule (``ScheduleZBVZeroBubble``, the one smelt's
trainer runs) puts each rank's forwards, input-gradient and weight-gradient backwards, and the length of
one step of such an order, from an event simulation: the planner's ZB-V bubble.

The zero-bubble paper (Qi et al. 2024) gives ZB-V a bubble of (pp − 1)(F + B − 2W) chunk-times. torch's
static order leaves more: its first rank starts the last stage's forwards only after 2pp − 1 forwards of
the first stage, so with B ≥ F the last ranks idle for about (pp − 1)·B. tests/infra/test_pipeline_inflight.py
checks that this order is the one torch builds.
"""

from __future__ import annotations

from functools import lru_cache

# (kind, stage, micro-batch); kind: "F" forward, "I" input gradient, "W" weight gradient, "B" the whole
# backward (I and W in one)
Action = tuple[str, int, int]


def zbv_order(pp: int, microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """Each rank's actions in order. Rank r runs stage r (its first chunk) and stage 2pp − 1 − r (its
    second); the order is built for at least 2pp − 1 micro-batches and the extra ones dropped."""
    n = max(2 * pp - 1, microbatches)
    order = []
    for r in range(pp):
        first, second = r, 2 * pp - 1 - r
        ops: list[Action] = []
        count = {"F0": 0, "F1": 0, "I0": 0, "I1": 0, "W0": 0, "W1": 0}

        def add(kind: str, chunk: int) -> None:
            key = f"{kind}{chunk}"
            ops.append((kind, first if chunk == 0 else second, count[key]))
            count[key] += 1

        for _ in range(2 * (pp - r) - 1):  # warm-up: the first chunk's forwards ...
            add("F", 0)
        for _ in range(r):  # ... the second chunk's interleaved with them ...
            add("F", 1)
            add("F", 0)
        for _ in range(pp - r):  # ... and the second chunk's first backwards
            add("F", 1)
            add("I", 1)
            add("W", 1)
        while count["F1"] < count["F0"] or count["F0"] < n:  # steady state: one of each per chunk
            if count["F0"] < n:
                add("F", 0)
            add("I", 0)
            add("W", 0)
            add("F", 1)
            add("I", 1)
            add("W", 1)
        for _ in range(r):  # cool-down: input gradients first, weight gradients after
            add("I", 0)
            add("I", 1)
        for _ in range(pp - r):
            add("I", 0)
            add("W", 0)
        while count["W1"] < count["I1"]:
            add("W", 1)
        while count["W0"] < count["I0"]:
            add("W", 0)
        order.append(tuple(a for a in ops if a[2] < microbatches))
    return tuple(order)


def makespan(order: tuple[tuple[Action, ...], ...], stages: int, seconds: dict[str, float]) -> float:
    """Time until the last rank finishes, each rank running its actions in order as soon as their inputs
    exist (a forward needs the previous stage's forward; a backward, whole or input-gradient only, the next
    stage's, or the forward on the last stage; a weight gradient its input gradient), communication free.
    ``seconds`` gives F, I and W; a whole backward takes I + W."""
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * len(order)
    position = [0] * len(order)
    remaining = sum(len(ops) for ops in order)
    while remaining:
        progressed = False
        for rank, ops in enumerate(order):
            while position[rank] < len(ops):
                kind, stage, mb = ops[position[rank]]
                if kind == "F":
                    needs = ("F", stage - 1, mb) if stage > 0 else None
                elif kind in ("I", "B"):
                    needs = ("F", stage, mb) if stage == stages - 1 else ("I", stage + 1, mb)
                else:
                    needs = ("I", stage, mb)
                if needs is not None and needs not in done:
                    break
                start = max(free[rank], done[needs] if needs is not None else 0.0)
                if kind == "B":
                    free[rank] = done[("I", stage, mb)] = done[("W", stage, mb)] = start + seconds["I"] + seconds["W"]
                else:
                    free[rank] = done[(kind, stage, mb)] = start + seconds[kind]
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the pipeline order deadlocks")
    return max(free)


@lru_cache(maxsize=256)
def zbv_bubble(pp: int, microbatches: int, forward: float, input_grad: float, weight_grad: float) -> float:
    """Idle time of a ZB-V step beyond its work, in the units of the three per-stage durations."""
    seconds = {"F": forward, "I": input_grad, "W": weight_grad}
    work = microbatches * 2 * (forward + input_grad + weight_grad)
    return makespan(zbv_order(pp, microbatches), 2 * pp, seconds) - work
