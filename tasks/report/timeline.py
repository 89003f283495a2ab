"""What happened to a run over time: each restart and rollback, each checkpoint, and the final trajectory.

A *restart* is a process group after the first (``start`` events, tasks/train/goodput.py). Its cause is
read from the events around it: an explicit ``failure`` event (``cause``) if a launcher wrote one; a new
``launch`` (the previous launch ended: a failure its retries did not absorb, a cancelled job, a requeue)
or ``continue`` (a finished run asked for more steps); else a larger ``restart_count`` (ranks replaced or
restarted inside the launch: a rank died or hung). Its *steps lost* are the steps trained past the step it
resumed from (redone); its *recovery* is the time from the last step before it to the first step after
it, as goodput's ``restart_s`` counts it. A loss-guard rollback is a fault too: the step it rejected and
those back to the checkpoint it reloaded are lost.
"""

from __future__ import annotations


def final_trajectory(metrics: list[dict]) -> list[dict]:
    """One record per step, the last attempt of each (what the run's model went through), by step."""
    by_step: dict[int, dict] = {}
    for record in metrics:
        if "rolled_back_to" in record:
            continue
        by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def _cause(events: list[dict], before: float, start: dict, previous: dict) -> str:
    between = [e for e in events if before <= e.get("time", 0) <= start["time"]]
    explicit = [e for e in between if e["event"] == "failure" and e.get("cause")]
    if explicit:
        return str(explicit[-1]["cause"])
    if any(e["event"] == "continue" for e in between):
        return "continued: the finished run was asked for more steps"
    if any(e["event"] == "launch" for e in between):
        return "relaunched: the previous launch ended before the last step (failure, cancel or requeue)"
    if start.get("restart_count", 0) > previous.get("restart_count", 0):
        return (f"rank failure: ranks replaced inside the launch (restart {start['restart_count']}; a rank died, "
                "hung or was preempted)")
    return "restarted"


def faults(events: list[dict], metrics: list[dict]) -> list[dict]:
    """Every restart and rollback, in time order: ``kind``, ``cause``, ``time``, ``resumed_from``,
    ``steps_lost``, ``recovery_s``, and for restarts where the state came from (``restored_from``)."""
    starts = sorted((e for e in events if e["event"] == "start"), key=lambda e: e["group"])
    out = []
    for previous, start in zip(starts, starts[1:]):
        before = [r for r in metrics if r.get("group") is not None and r["group"] < start["group"]]
        after = [r for r in metrics if r.get("group") == start["group"]]
        last_end = max((r["time"] for r in before), default=previous["time"])
        resumed = start.get("resumed_from") or 0
        reached = max((r["step"] for r in before), default=resumed)
        restore = next((e for e in events if e["event"] == "restore" and e["time"] >= last_end
                        and (not after or e["time"] <= after[0]["time"])), None)
        first = after[0]["time"] - after[0]["iteration_s"] if after else None
        out.append({"kind": "restart", "time": start["time"], "group": start["group"],
                    "cause": _cause(events, last_end, start, previous), "resumed_from": resumed,
                    "steps_lost": max(0, reached - resumed),
                    "recovery_s": round(first - last_end, 3) if first is not None else None,
                    "restored_from": (f"{restore['source']} step {restore['step']}" if restore else
                                      ("storage" if resumed else "nothing (a fresh start)"))})
    for i, record in enumerate(metrics):
        if "rolled_back_to" not in record:
            continue
        target = record["rolled_back_to"] or 0
        nxt = next((r for r in metrics[i + 1:]), None)
        out.append({"kind": "rollback", "time": record["time"], "group": record.get("group"),
                    "cause": f"loss guard rejected step {record['step']} (loss {record['loss']:.4g})",
                    "resumed_from": target, "steps_lost": record["step"] - target,
                    "recovery_s": round(nxt["time"] - nxt["iteration_s"] - record["time"], 3) if nxt else None,
                    "restored_from": f"storage step {target}"})
    return sorted(out, key=lambda f: f["time"])


def checkpoint_timeline(metrics: list[dict], checkpoints: list[dict]) -> dict:
    """Seconds training was blocked by checkpointing at each step of the final trajectory, and the
    committed checkpoints still in the run folder (step, loss, tokens)."""
    trajectory = final_trajectory(metrics)
    return {"blocked": [(r["step"], r.get("checkpoint_s", 0.0)) for r in trajectory],
            "committed": [{"step": c["step"], "loss": c.get("loss"), "tokens": c.get("tokens")} for c in checkpoints]}


def straggler_grid(report: dict | None) -> dict | None:
    """Ranks × windows of each rank's step compute over the median (stragglers.json), or None with one rank."""
    if not report or not report.get("windows"):
        return None
    windows = report["windows"]
    ranks = len(windows[0]["ratio"])
    return {"steps": [w["step"] for w in windows], "ranks": list(range(ranks)),
            "ratio": [[w["ratio"][r] for w in windows] for r in range(ranks)],
            "hosts": report.get("hosts", []), "flagged": report.get("flagged", []), "margin": report.get("margin")}
