"""Process plumbing every launcher of ranks shares (torchrun, smelt's node agent, torchft replica groups).

Its own module so that what a launcher starts can use it without importing the launcher.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess

import psutil

log = logging.getLogger(__name__)

STOP_GRACE_S = 30.0  # torchrun forwards SIGTERM to its ranks and waits for them; then SIGKILL


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (rendezvous, stores)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun's group (it forwards the signal to its ranks, which sit in sessions of their
    own), then SIGKILL whatever of the tree is still alive after the grace period."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_S)
    for p in alive:
        try:
            log.warning("killing pid %d, still alive %.0f s after SIGTERM", p.pid, STOP_GRACE_S)
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
