"""Superseded branches of a run: what ``--resume-from STEP`` leaves behind, kept apart and listed.

Resuming a run from an older retained checkpoint (``smelt train --resume-from STEP``) starts a new
trajectory at STEP. The checkpoints after STEP belong to the old one: they are moved whole (manifest
and all) to ``<run>/branches/<n>/checkpoints/step-NNNNNNNN/``, so ``<run>/checkpoints/`` holds one
trajectory (the run's newest checkpoint, retention and every reader see only it) and the old one stays
readable as a run folder of its own (``tasks.checkpoint_reader.list_committed(<run>/branches/<n>)``).
Retention never looks under ``branches/``: a declared branch is kept until someone deletes it.

``<run>/branches.json`` lists the branches, oldest first, each ``{"branch": n, "from_step": STEP,
"steps": [checkpoint steps moved], "url": "branches/<n>", "group": the process group (goodput's numbering)
that continues from STEP, "epoch": the launch's lease epoch, "skip_steps": [A, B] or None, "skip_samples":
[start, end) or None, "time", "complete"}``. The record is written before anything moves and marked
complete after, so a rank killed mid-move finishes it on restart. One request is declared once: a
launch with the same ``request`` id (the flow run's, so Prefect's retries), else a restarted rank of the
same lease epoch (without a lease: of the same job, restart count above zero), continues the new
trajectory instead of branching again.

``--skip-steps A:B`` (PaLM's remedy for a spike) skips the samples steps A..B would have trained on after
STEP: the loader's position at STEP plus the batches of steps STEP+1..A-1, then B-A+1 global batches, as a
loss-guard ``skipped.jsonl`` window (``reason: resume.skip_steps``) that the loader, the ledger and trace
already honour. Imports no torch: trace and eval read it.
"""

from __future__ import annotations

import json
import logging
import time

from tasks import contract, storage
from tasks.checkpoint_layout import CHECKPOINTS_DIR, step_dirs
from tasks.errors import UserError

log = logging.getLogger(__name__)

BRANCHES = "branches.json"
BRANCHES_DIR = "branches"
SKIP_REASON = "resume.skip_steps"


def parse_skip_steps(text: str | None) -> tuple[int, int] | None:
    """``"A:B"`` → (A, B); one sentence for anything else."""
    if text is None or text == "":
        return None
    first, sep, last = str(text).partition(":")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise UserError(f"--skip-steps {text!r} is not A:B (two step numbers, first ≤ last)") from None
    if (not sep and last) or a < 1 or b < a:
        raise UserError(f"--skip-steps {text!r} is not A:B (two step numbers, 1 ≤ first ≤ last)")
    return a, b


def check_request(resume_from: int | None, skip_steps: tuple[int, int] | None) -> None:
    """One sentence for a request the trainer cannot serve, before any rank starts."""
    if skip_steps is not None and resume_from is None:
        raise UserError("--skip-steps needs --resume-from: the skipped steps must follow the checkpoint resumed from")
    if resume_from is not None and resume_from < 1:
        raise UserError(f"--resume-from {resume_from}: checkpoints are numbered from step 1")
    if skip_steps is not None and skip_steps[0] <= resume_from:
        raise UserError(f"--skip-steps {skip_steps[0]}:{skip_steps[1]} must name steps after --resume-from "
                         f"{resume_from} (those before are already in its weights)")


def read(run_dir: str) -> list[dict]:
    """The run's branch records, oldest first (none for a run that never branched)."""
    fs, path = storage.filesystem(storage.join(storage.normalize_url(run_dir), BRANCHES))
    return list(json.loads(fs.cat_file(path))["branches"]) if fs.exists(path) else []


def write(run_dir: str, records: list[dict]) -> None:
    with storage.atomic_write(storage.join(storage.normalize_url(run_dir), BRANCHES), "w") as f:
        f.write(json.dumps({"branches": records}, indent=2, sort_keys=True))


def branch_url(run_dir: str, record: dict) -> str:
    """The folder holding a branch's checkpoints (a run folder of its own for tasks.checkpoint_reader)."""
    return storage.join(storage.normalize_url(run_dir), record["url"])


def served(records: list[dict], from_step: int, skip_steps: tuple[int, int] | None, *, request: str | None,
           epoch: int | None, restarted: bool) -> dict | None:
    """The newest record if it is this request, already declared (see the module docstring)."""
    if not records:
        return None
    last = records[-1]
    same = last["from_step"] == from_step and (tuple(last["skip_steps"]) if last["skip_steps"] else None) == skip_steps
    if request is not None:
        ours = last.get("request") == request
    else:
        ours = last.get("epoch") == epoch if epoch is not None else restarted
    return last if same and ours else None


def declare(run_dir: str, from_step: int, later: dict[int, str], committed: set[int], *,
            skip_steps: tuple[int, int] | None, request: str | None, epoch: int | None, group: int) -> dict:
    """Record branch n+1 and move the step folders ``later`` (step → URL, all after ``from_step``) under it;
    uncommitted ones (crashed saves) are deleted, not kept. A finished run's manifest naming a moved step is
    removed: the run is unfinished until the new trajectory commits its own. Returns the record."""
    run_dir = storage.normalize_url(run_dir)
    records = read(run_dir)
    n = max((r["branch"] for r in records), default=0) + 1
    record = {"branch": n, "from_step": int(from_step), "steps": sorted(s for s in later if s in committed),
              "url": f"{BRANCHES_DIR}/{n}", "group": int(group), "epoch": epoch, "request": request,
              "skip_steps": list(skip_steps) if skip_steps else None, "skip_samples": None,
              "time": time.time(), "complete": False}
    write(run_dir, records + [record])
    finished = contract.read_manifest(run_dir)
    if finished is not None and int(finished.meta.get("step", 0)) > from_step:
        fs, path = storage.filesystem(storage.join(run_dir, contract.MANIFEST))
        fs.rm(path)
        log.warning("run %s finished at step %s, now on branch %d: it is unfinished until this launch commits",
                    run_dir, finished.meta.get("step"), n)
    return finish(run_dir, record)


def finish(run_dir: str, record: dict) -> dict:
    """Move whatever of ``record``'s branch is still under ``checkpoints/`` (idempotent); mark it complete."""
    target = storage.join(branch_url(run_dir, record), CHECKPOINTS_DIR)
    for step, url in step_dirs(run_dir).items():
        if step <= record["from_step"]:
            continue
        if step in record["steps"]:
            _move(url, storage.join(target, url.rstrip("/").rsplit("/", 1)[-1]))
        else:  # an uncommitted save of the old trajectory, or the tail of a move a crash cut short
            fs, path = storage.filesystem(url)
            fs.rm(path, recursive=True)
    record = {**record, "complete": True}
    update(run_dir, record)
    log.warning("branch %d: checkpoints after step %d (%s) kept under %s, superseded", record["branch"],
                record["from_step"], record["steps"] or "none", branch_url(run_dir, record))
    return record


def update(run_dir: str, record: dict) -> None:
    """Replace the record of ``record['branch']``."""
    write(run_dir, [record if r["branch"] == record["branch"] else r for r in read(run_dir)])


def _move(src: str, dst: str) -> None:
    """One committed step folder, committed at its destination before it stops being committed here: a local
    rename; elsewhere every file, the manifest last, then the source's manifest first."""
    fs, src_path = storage.filesystem(src)
    _, dst_path = storage.filesystem(dst)
    manifest = f"{src_path}/{contract.MANIFEST}"
    if not fs.exists(manifest):  # the source's manifest went first: the destination is complete
        fs.rm(src_path, recursive=True)
        return
    if fs.exists(dst_path):
        fs.rm(dst_path, recursive=True)  # a copy a crash cut short
    fs.makedirs(dst_path.rsplit("/", 1)[0], exist_ok=True)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        fs.mv(src_path, dst_path, recursive=True)
        return
    files = sorted(p for p in fs.find(src_path) if p != manifest)
    for path in files:
        fs.copy(path, dst_path + path[len(src_path):])
    fs.copy(manifest, f"{dst_path}/{contract.MANIFEST}")
    fs.rm(manifest)
    fs.rm(src_path, recursive=True)


def skip_window(position: int, from_step: int, skip_steps: tuple[int, int], global_batch: int,
                skipped: list[tuple[int, int]]) -> tuple[int, int]:
    """Samples ``[start, end)`` that steps A..B would train on, the loader standing at ``position`` after
    ``from_step`` and moving past the run's ``skipped`` windows before each step, as the trainer does."""

    def past(p: int) -> int:
        moved = True
        while moved:
            moved = False
            for a, b in skipped:
                if a <= p < b:
                    p, moved = b, True
        return p

    first, last = skip_steps
    for _ in range(from_step + 1, first):
        position = past(position) + global_batch
    start = past(position)
    return start, start + (last - first + 1) * global_batch


def branch_of(records: list[dict], group: int | None, step: int) -> int | None:
    """The branch a step record of process group ``group`` ended on: the first branch declared after that group
    ran whose ``from_step`` is before the step (None: no branch superseded it)."""
    if group is None:
        return None
    for record in records:
        if record["group"] > group and step > record["from_step"]:
            return record["branch"]
    return None
