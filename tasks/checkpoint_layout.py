"""Where a run's checkpoints live: ``<run>/checkpoints/step-NNNNNNNN/``, named and listed.

The names only, no torch: ``tasks/branches.py`` (which trace and eval read) moves step folders with them, and
``tasks/checkpoint_reader.py``, the reader, imports branches; the layout sits below both so neither imports the other.
"""

from __future__ import annotations

import re

from tasks import contract, storage

CHECKPOINTS_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoints_url(run_dir_url: str) -> str:
    return storage.join(storage.normalize_url(run_dir_url), CHECKPOINTS_DIR)


def step_url(run_dir_url: str, step: int) -> str:
    return storage.join(checkpoints_url(run_dir_url), f"step-{step:08d}")


def relative_step(step: int) -> str:
    """A step's folder relative to its run folder: what manifests record, so a moved run still resolves."""
    return f"{CHECKPOINTS_DIR}/step-{step:08d}"


def run_dir_of(step_url: str) -> str:
    """``<run>/checkpoints/step-NNNNNNNN`` → ``<run>``."""
    url = storage.normalize_url(step_url).rstrip("/")
    parent, _, name = url.rpartition("/")
    if not _STEP_DIR.match(name) or not parent.endswith(f"/{CHECKPOINTS_DIR}"):
        raise contract.DatasetError(f"{step_url} is not a checkpoint folder (<run>/{CHECKPOINTS_DIR}/step-NNNNNNNN)")
    return parent.rpartition("/")[0]


def step_of(step_url: str) -> int | None:
    """The step a ``<run>/checkpoints/step-NNNNNNNN`` URL names, or None for any other URL."""
    try:
        run_dir_of(step_url)
    except contract.DatasetError:
        return None
    return int(step_url.rstrip("/").rpartition("-")[2])


def step_dirs(run_dir_url: str) -> dict[int, str]:
    """``step -> url`` of every ``step-NNNNNNNN`` folder, committed or not."""
    root = checkpoints_url(run_dir_url)
    fs, path = storage.filesystem(root)
    if not fs.exists(path):
        return {}
    out = {}
    for entry in fs.ls(path, detail=False):
        match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
        if match:
            out[int(match.group(1))] = storage.join(root, match.group(0))
    return dict(sorted(out.items()))
