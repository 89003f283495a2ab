"""A run folder as trace reads it: the final trajectory, the skipped windows, the loader's order.

The final trajectory is the one goodput (tasks/train/goodput.py) and the loss guard's history
(``trainer.accepted_losses``) stand on: ``metrics.jsonl`` holds one record per step *attempt*, and in
write order a process group's start (``events.jsonl``: ``resumed_from``) discards every step after the
state it resumed from, a rejected step (``rolled_back_to``) discards every step after its rollback target,
and a step trained again replaces its earlier record. A run resumed from an older checkpoint (a superseded
branch) is one more start with an older ``resumed_from``: its abandoned steps fall out the same way, and
``superseded`` lists them; ``branches`` (tasks/branches.py, ``--resume-from``) says which branch each ended on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tasks import branches as branch_records, jsonlog, storage
from tasks.errors import UserError

METRICS, EVENTS, SKIPPED, LINEAGE = "metrics.jsonl", "events.jsonl", "skipped.jsonl", "lineage.json"


class TraceError(UserError):
    """A run folder or dataset trace cannot read; the message is one sentence."""


@dataclass
class Run:
    url: str
    lineage: dict
    steps: dict[int, dict]  # the final trajectory: step -> its metrics record
    attempts: list[dict]  # every metrics record, in write order
    skipped: list[dict]
    superseded: list[dict] = field(default_factory=list)  # records of steps later discarded
    branches: list[dict] = field(default_factory=list)  # branches.json: what --resume-from superseded

    @property
    def final_step(self) -> int:
        return max(self.steps, default=0)

    def branch_of(self, record: dict) -> int | None:
        """The superseded branch a step record ended on (None: the final trajectory, or a step merely redone)."""
        if self.steps.get(record["step"]) is record:
            return None
        return branch_records.branch_of(self.branches, record.get("group"), record["step"])

    def branch_summary(self) -> list[dict]:
        """Each branch: where it left the run, its superseded steps and kept checkpoints, what it skipped."""
        out = []
        for b in self.branches:
            steps = sorted({r["step"] for r in self.superseded if self.branch_of(r) == b["branch"]})
            out.append({"branch": b["branch"], "from_step": b["from_step"], "steps": steps, "checkpoints": b["steps"],
                        "url": b["url"], "skip_steps": b["skip_steps"], "skip_samples": b["skip_samples"]})
        return out


def final_trajectory(events: list[dict], records: list[dict]) -> tuple[dict[int, dict], list[dict]]:
    """(step -> record of the final trajectory, records discarded): see the module docstring."""
    starts = {e["group"]: e for e in events if e.get("event") == "start"}
    kept: dict[int, dict] = {}
    lost: list[dict] = []

    def discard_after(step: int) -> None:
        for s in [s for s in kept if s > step]:
            lost.append(kept.pop(s))

    by_group: dict[int | None, list[dict]] = {}
    for record in records:
        by_group.setdefault(record.get("group"), []).append(record)
    for group in sorted(set(starts) | {g for g in by_group if g is not None}):
        if group in starts:
            discard_after(starts[group].get("resumed_from") or 0)
        for record in by_group.get(group, []):
            if "rolled_back_to" in record:
                lost.append(record)
                discard_after(record["rolled_back_to"] or 0)
                continue
            if record["step"] in kept:
                lost.append(kept.pop(record["step"]))
            kept[record["step"]] = record
    return dict(sorted(kept.items())), lost


def open_run(url: str) -> Run:
    """Read a run folder; one sentence if it is not a run folder that recorded its samples."""
    url = storage.normalize_url(url)
    fs, path = storage.filesystem(storage.join(url, LINEAGE))
    if not fs.exists(path):
        if not fs.exists(storage.filesystem(url)[1]):
            raise TraceError(f"run folder {url} does not exist")
        raise TraceError(f"run folder {url} has no {LINEAGE}: it was trained before smelt recorded sample lineage "
                         "(issue 42), so its steps cannot be traced")
    lineage = json.loads(fs.cat_file(path))
    records = [r for r in jsonlog.read(url, METRICS) if "step" in r]
    steps, lost = final_trajectory(jsonlog.read(url, EVENTS), records)
    return Run(url=url, lineage=lineage, steps=steps, attempts=records, skipped=jsonlog.read(url, SKIPPED),
               superseded=lost, branches=branch_records.read(url))


def samples_of(record: dict) -> tuple[int, int] | None:
    """A step record's sample range ``[start, end)``, or None for records written before it was kept."""
    samples = record.get("samples")
    return (int(samples[0]), int(samples[1])) if samples else None
