"""smelt's TensorBoard event files, read back with TensorBoard's own reader, appended locally and rolled
as whole objects where a store has no append (tasks/tb_events.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tasks.tb_events import EventWriter


def read(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def write_steps(writer: EventWriter, steps: range) -> None:
    for step in steps:
        writer.scalars({"train/loss": 10.0 / step, "train/lr": 1e-3}, step, wall_time=1_000 + step)
        writer.flush()


def test_scalars_appended_to_a_local_file_read_back_with_tensorboard(tmp_path):
    writer = EventWriter(str(tmp_path / "train"))
    write_steps(writer, range(1, 6))
    writer.close()
    assert len(list((tmp_path / "train").iterdir())) == 1
    assert read(tmp_path / "train") == {"train/loss": [(s, pytest.approx(10.0 / s)) for s in range(1, 6)],
                                        "train/lr": [(s, pytest.approx(1e-3)) for s in range(1, 6)]}


def test_without_append_each_flush_rewrites_one_object_and_rolls_to_a_new_one(tmp_path):
    writer = EventWriter(str(tmp_path / "train"), roll_records=2)
    writer.appendable = False  # what an object store gets: whole objects, one PUT per flush
    write_steps(writer, range(1, 6))
    writer.close()
    assert len(list((tmp_path / "train").iterdir())) == 3  # 2 + 2 + 1 flushes
    assert [s for s, _ in read(tmp_path / "train")["train/loss"]] == [1, 2, 3, 4, 5]


def test_a_later_file_that_resumes_at_an_earlier_step_supersedes_the_steps_after_it(tmp_path):
    """What a restart writes: the new process group's file marks a restart at the step after the one it
    resumed from, and TensorBoard drops the first file's points from there on (the final trajectory)."""
    first = EventWriter(str(tmp_path / "train"))
    write_steps(first, range(1, 8))
    first.close()
    second = EventWriter(str(tmp_path / "train"))
    second.session_start(5, wall_time=2_000)
    second.scalars({"train/loss": 99.0}, 5, wall_time=2_000)
    second.close()
    assert read(tmp_path / "train")["train/loss"][-2:] == [(4, pytest.approx(2.5)), (5, 99.0)]
