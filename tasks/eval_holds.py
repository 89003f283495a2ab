"""Eval holds: retention keeps a published checkpoint until its eval has run, or a bounded time has passed.

The train flow publishes each committed checkpoint (flows/train.py) and a deployment trigger evaluates it
later (flows/evaluation.py). With a small ``checkpoint.keep_last`` the trainer's retention could delete it
first, and its eval would only report it skipped. So publishing writes a hold,
``<run>/eval_holds/step-NNNNNNNN.json`` with an expiry (``checkpoint.eval_hold_minutes``), before the event
goes out; the eval releases it when it has finished (or found the checkpoint gone), and retention
(tasks/train/checkpoint_writer.py) keeps a held step. The expiry bounds the disk a run pays when no eval ever comes
(no deployment trigger, a failed eval): after it, the next retention pass deletes the step as before. A hold
that outlives the run's last save is honoured by the next retention pass, which a later launch of the run makes.
"""

from __future__ import annotations

import json
import time

from tasks import storage

HOLDS_DIR = "eval_holds"


def _url(run_dir: str, step: int) -> str:
    return storage.join(storage.normalize_url(run_dir), HOLDS_DIR, f"step-{step:08d}.json")


def hold(run_dir: str, step: int, minutes: float, *, now: float | None = None) -> None:
    """Keep ``step`` from retention for ``minutes`` or until ``release``."""
    now = time.time() if now is None else now
    with storage.atomic_write(_url(run_dir, step), "w") as f:
        f.write(json.dumps({"step": step, "since": now, "until": now + minutes * 60}))


def release(run_dir: str, step: int) -> None:
    """The eval of ``step`` has finished (or found it gone): retention may delete it."""
    fs, path = storage.filesystem(_url(run_dir, step))
    if fs.exists(path):
        fs.rm(path)


def held_steps(run_dir: str, *, now: float | None = None) -> set[int]:
    """Steps whose hold has not expired."""
    now = time.time() if now is None else now
    fs, path = storage.filesystem(storage.join(storage.normalize_url(run_dir), HOLDS_DIR))
    if not fs.exists(path):
        return set()
    held = set()
    for entry in fs.ls(path, detail=False):
        record = json.loads(fs.cat_file(entry))
        if record["until"] > now:
            held.add(int(record["step"]))
    return held
