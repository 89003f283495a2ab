"""The checkout smelt runs from: every process it starts (ranks, node agents, cluster jobs, the local Prefect
server) runs in this folder with it first on PYTHONPATH, so ``python -m tasks.train.main`` finds this code."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def python_path() -> str:
    """PYTHONPATH for a child process: the checkout first, then whatever this process was given."""
    return os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
