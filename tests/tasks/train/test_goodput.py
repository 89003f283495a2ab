"""Goodput accounting over restarts and rollbacks, from literal events and step records."""

from __future__ import annotations

import pytest

from tasks.train.goodput import append_event, goodput_split, read_jsonl, start_group


def step(group: int, number: int, end: float, iteration_s: float = 1.0, checkpoint_s: float = 0.0, **extra) -> dict:
    return {"group": group, "step": number, "time": end, "iteration_s": iteration_s, "checkpoint_s": checkpoint_s,
            **extra}


def test_a_restart_loses_the_steps_after_the_checkpoint_it_resumes_from():
    events = [{"event": "launch", "time": 0.0},
              {"event": "start", "group": 0, "time": 1.0, "resumed_from": None},
              {"event": "start", "group": 1, "time": 20.0, "resumed_from": 2}]
    records = [step(0, 1, 11.0), step(0, 2, 12.5, iteration_s=1.5, checkpoint_s=0.5), step(0, 3, 13.5),
               step(1, 3, 31.0), step(1, 4, 32.0, checkpoint_s=0.25)]
    split = goodput_split(events, records, end_time=33.0, final_checkpoint_s=0.5)
    assert split["lost_steps"] == [3] and split["steps_kept"] == 4 and split["restarts"] == 1
    assert split["init_s"] == 10.0  # launch → first step
    assert split["restart_s"] == 16.5  # last progress (13.5) → first step of group 1 (30.0)
    assert split["productive_s"] == 3.75 and split["lost_s"] == 1.0
    assert split["checkpoint_s"] == 1.25
    assert split["wall_s"] == 33.0 and split["other_s"] == pytest.approx(0.5)  # after the last step
    assert split["goodput"] == pytest.approx(3.75 / 33.0)


def test_a_rollback_loses_the_rejected_step_and_the_steps_after_its_checkpoint():
    events = [{"event": "start", "group": 0, "time": 0.0, "resumed_from": None}]
    records = [step(0, 1, 2.0), step(0, 2, 3.0), step(0, 3, 4.0), step(0, 4, 5.0, rolled_back_to=2),
               step(0, 3, 7.0), step(0, 4, 8.0)]
    split = goodput_split(events, records, end_time=8.0)
    assert split["rollbacks"] == 1 and split["restarts"] == 0
    assert split["lost_steps"] == [3, 4] and split["steps_kept"] == 4
    assert split["init_s"] == 1.0 and split["restart_s"] == 1.0  # the reload between 5.0 and 6.0
    assert split["productive_s"] + split["lost_s"] + split["init_s"] + split["restart_s"] == pytest.approx(8.0)


def test_a_finished_run_continued_later_leaves_its_idle_time_out_of_the_wall_time():
    events = [{"event": "launch", "time": 0.0},
              {"event": "start", "group": 0, "time": 1.0, "resumed_from": None},
              {"event": "continue", "time": 100.0, "finished_step": 2, "steps": 3},  # tasks/train/launch.continue_run
              {"event": "launch", "time": 100.0},
              {"event": "start", "group": 1, "time": 101.0, "resumed_from": 2}]
    records = [step(0, 1, 11.0), step(0, 2, 12.0), step(1, 3, 111.0)]
    split = goodput_split(events, records, end_time=112.0)
    assert split["idle_s"] == 88.0  # the last step of the finished launch (12.0) → the continuing launch
    assert split["restart_s"] == 10.0  # that launch → its first step (110.0)
    assert split["wall_s"] == 24.0 and split["lost_steps"] == [] and split["productive_s"] == 3.0
    assert sum(split[k] for k in ("productive_s", "checkpoint_s", "init_s", "restart_s", "lost_s",
                                  "other_s")) == pytest.approx(split["wall_s"])


def test_groups_are_counted_from_the_events_file(tmp_path):
    run = str(tmp_path)
    append_event(run, {"event": "launch", "time": 0.0})
    assert start_group(run, time=1.0, resumed_from=None, world_size=2, restart_count=0) == 0
    assert start_group(run, time=5.0, resumed_from=4, world_size=1, restart_count=1) == 1
    assert [e["event"] for e in read_jsonl(run, "events.jsonl")] == ["launch", "start", "start"]
    assert read_jsonl(run, "missing.jsonl") == []
