"""Goodput: where a run's wall time went, across every restart, process group and rollback.

Sources, append-only JSON-lines logs in the run folder (tasks/jsonlog.py: one file on local disk,
objects under ``<name>.d/`` on object stores), written by rank 0 of each process group:

- ``events.jsonl``: ``{"event": "launch", "time"}`` from the launcher, and per process group
  ``{"event": "start", "group", "time", "resumed_from", "world_size", "restart_count"}`` (``time``:
  when the trainer began building; ``group`` counts the groups of the run from 0).
- ``metrics.jsonl``: one record per step attempt, with ``group``, ``time`` (wall clock at the end
  of the iteration), ``iteration_s``, ``checkpoint_s`` (blocked on checkpointing in it) and, on a
  step the loss guard rejected, ``rolled_back_to``.

The split, in seconds (they add up to the wall time from launch to the summary):

- ``productive_s``: compute of the steps on the final trajectory;
- ``checkpoint_s``: training blocked on checkpoint saves, in every group, and the final commit;
- ``init_s``: from the launch (or the first group's start) to the first step;
- ``restart_s``: from the last progress before a failure, or a rejected step, to the next step
  (detection, teardown, process start, rendezvous, checkpoint load);
- ``lost_s``: compute of steps later discarded: trained after the checkpoint a restart resumed
  from (and so redone), or rolled back by the loss guard;
- ``other_s``: the rest (step boundaries, logging, shutdown).

A finished run continued with more steps (``{"event": "continue", "time"}``) was idle from its last
step to that event: ``idle_s``, outside the wall time and the split.
"""

from __future__ import annotations

from tasks import jsonlog

EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"  # tasks.train.metrics writes it


def read_jsonl(run_dir: str, name: str) -> list[dict]:
    return jsonlog.read(run_dir, name)


def append_event(run_dir: str, event: dict) -> None:
    jsonlog.append(run_dir, EVENTS, event)


def start_group(run_dir: str, *, time: float, resumed_from: int | None, world_size: int, restart_count: int) -> int:
    """Record a process group's start; returns its index in the run (0 for the first)."""
    group = sum(1 for e in read_jsonl(run_dir, EVENTS) if e["event"] == "start")
    append_event(run_dir, {"event": "start", "group": group, "time": time, "resumed_from": resumed_from,
                           "world_size": world_size, "restart_count": restart_count})
    return group


def _compute(record: dict) -> float:
    return record["iteration_s"] - record["checkpoint_s"]


def goodput_split(events: list[dict], records: list[dict], end_time: float, final_checkpoint_s: float = 0.0) -> dict:
    """The split described in the module docstring, plus counts and the steps that were lost."""
    starts = {e["group"]: e for e in events if e["event"] == "start"}
    launches = [e["time"] for e in events if e["event"] == "launch"]
    begin = min(launches) if launches else min((e["time"] for e in starts.values()), default=end_time)
    kept: dict[int, dict] = {}
    lost: list[dict] = []
    init = restart = 0.0
    checkpoint = final_checkpoint_s
    last_end: float | None = None
    rollbacks = 0

    def discard_after(step: int) -> None:
        for s in sorted(kept):
            if s > step:
                lost.append(kept.pop(s))

    for group in sorted(starts):
        discard_after(starts[group]["resumed_from"] or 0)
        after_rejection = False
        for i, record in enumerate(r for r in records if r.get("group") == group):
            started = record["time"] - record["iteration_s"]
            if last_end is None:
                init += started - begin
            elif i == 0 or after_rejection:
                restart += started - last_end
            checkpoint += record["checkpoint_s"]
            if record["step"] in kept:
                lost.append(kept.pop(record["step"]))
            after_rejection = "rolled_back_to" in record
            if after_rejection:
                rollbacks += 1
                lost.append(record)
                discard_after(record["rolled_back_to"] or 0)
            else:
                kept[record["step"]] = record
            last_end = record["time"]

    # A finished run continued later (``continue`` events, tasks/train/launch.continue_run) sat idle from its
    # last step to that launch: not the run's time, so neither in the wall time nor in restart_s.
    idle = 0.0
    for event in (e for e in events if e["event"] == "continue"):
        before = [r["time"] for r in records if r["time"] <= event["time"]]
        gap = event["time"] - max(before) if before else 0.0
        idle += gap
        if any(r["time"] > event["time"] for r in records):  # else the gap sat in other_s, which follows the wall
            restart -= gap
    wall = end_time - begin - idle
    productive = sum(_compute(r) for r in kept.values())
    lost_s = sum(_compute(r) for r in lost)
    split = {"productive_s": productive, "checkpoint_s": checkpoint, "init_s": init, "restart_s": restart,
             "lost_s": lost_s}
    split["other_s"] = wall - sum(split.values())
    return {
        "wall_s": wall,
        "idle_s": round(idle, 4),
        **{k: round(v, 4) for k, v in split.items()},
        "goodput": productive / wall if wall > 0 else 0.0,
        "process_groups": len(starts),
        "restarts": max(0, len(starts) - 1),
        "rollbacks": rollbacks,
        "steps_kept": len(kept),
        "lost_steps": sorted(r["step"] for r in lost),
    }


def summarize(run_dir: str, end_time: float, final_checkpoint_s: float = 0.0) -> dict:
    return goodput_split(read_jsonl(run_dir, EVENTS), read_jsonl(run_dir, METRICS), end_time, final_checkpoint_s)
