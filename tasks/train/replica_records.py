"""Where a replica group's records and markers live in the run folder, and reading them: the group writes them
(replica_group.py), the supervisor and the record merge read them (replicas.py)."""

from __future__ import annotations

import json
import os
import time

from tasks import jsonlog, storage


def group_dir(run_dir: str, replica_id: int) -> str:
    return storage.join(storage.normalize_url(run_dir), "replicas", f"group-{replica_id}")


def mark_up(run_dir: str, replica_id: int) -> None:
    """Record that this start of the group is up (its Manager heartbeating): ``up/<pid>.json``, one per start."""
    url = storage.join(group_dir(run_dir, replica_id), "up", f"{os.getpid()}.json")
    with storage.atomic_write(url, "w") as f:
        f.write(json.dumps({"pid": os.getpid(), "time": time.time()}))


def up_count(run_dir: str, replica_id: int) -> int:
    """How many starts of the group came up (``mark_up``'s markers)."""
    fs, path = storage.filesystem(storage.join(group_dir(run_dir, replica_id), "up"))
    return len(fs.ls(path, detail=False)) if fs.exists(path) else 0


def restarted_and_up(run_dir: str, replica_id: int) -> bool:
    """Whether the group was started again and that start is up (what a ``hold`` fault waits for)."""
    return up_count(run_dir, replica_id) >= 2


def newest_record(run_dir: str, replica_id: int) -> dict | None:
    """The group's newest committed-step record (None if none); read from the file's tail on local disk, so it costs
    the same on step 10 and step 10 million (the supervisor reads it every round, a group in a short quorum too)."""
    fs, path = storage.filesystem(storage.join(group_dir(run_dir, replica_id), "metrics.jsonl"))
    if not fs.isfile(path):  # none yet, or an object store's segments (tasks/jsonlog.py): read whole
        records = [r for r in jsonlog.read(group_dir(run_dir, replica_id), "metrics.jsonl") if "step" in r]
        return records[-1] if records else None
    with fs.open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 65536))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # cut by the seek, or by a SIGKILL mid-write
            continue
        if "step" in record:
            return record
    return None


def group_records(run_dir: str, replica_id: int) -> list[dict]:
    """Every committed-step record of the group, oldest first (resume marks left out)."""
    return [r for r in jsonlog.read(group_dir(run_dir, replica_id), "metrics.jsonl") if "step" in r]


def newest_step(run_dir: str, replica_id: int) -> int:
    """The step of the group's newest committed-step record (0 if none)."""
    record = newest_record(run_dir, replica_id)
    return record["step"] if record else 0


def last_committed_step(run_dir: str, groups: int) -> int:
    """The newest step any group recorded as committed (0 if none)."""
    return max(newest_step(run_dir, g) for g in range(groups))
