"""Progress lines: rate, ETA, and an interval that doubles so long work does not flood a log (tasks/progress.py)."""

from __future__ import annotations

from tasks.contract import ShardResult
from tasks.counters import Stats
from tasks.progress import MapProgress, RateLimit, StepProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_interval_doubles_up_to_its_cap():
    clock = Clock()
    limit = RateLimit(first_s=5, max_every_s=60, clock=clock)
    said = []
    for second in range(0, 400):
        clock.now = float(second)
        if limit.due():
            said.append(second)
    assert said == [5, 10, 20, 40, 80, 140, 200, 260, 320, 380]


def test_a_map_reports_items_records_per_second_and_eta_and_its_end():
    clock, lines = Clock(), []
    progress = MapProgress("ingest", 4, lines.append, clock=clock)
    for t in (2.0, 6.0, 7.0, 12.0):
        clock.now = t
        progress.update(ShardResult([], Stats({"in": 300})))
    assert lines == ["ingest: 2/4 work items (50%), 600 records at 100/s, ETA 0:00:06",
                     "ingest: 4/4 work items (100%), 1,200 records at 100/s in 0:00:12"]


def test_a_quick_map_says_nothing():
    clock, lines = Clock(), []
    progress = MapProgress("dedup-pairs", 2, lines.append, clock=clock)
    for t in (0.5, 1.0):
        clock.now = t
        progress.update(None)
    assert lines == []


def test_training_progress_gives_steps_tokens_per_second_and_eta_at_the_recent_pace():
    clock, lines = Clock(), []
    progress = StepProgress(1000, lines.append, clock=clock)
    for step in range(1, 41):
        clock.now = step * 0.5  # 2 steps/s, 1,000 tokens per step
        progress.update(step, step * 1000)
    assert lines[0] == "train: step 10/1000 (1%), 2.00 steps/s, 2,000 tokens/s, ETA 0:08:15"
    assert [line.split(",")[0] for line in lines[1:]] == ["train: step 20/1000 (2%)", "train: step 40/1000 (4%)"]  # 10 s, 20 s
