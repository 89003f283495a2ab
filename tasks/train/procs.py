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


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it, parent first ([] once it has exited)."""
    try:
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL ``proc`` and everything it started, at once (a lost node or group); the processes signalled, for a
    caller that waits for them."""
    tree = process_tree(proc.pid)
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return tree


def stopped_processes(proc: subprocess.Popen) -> list[int]:
    """The pids of ``proc``'s tree (a group: its torchrun agent and ranks, or its one rank) that are stopped."""
    stopped = []
    for p in process_tree(proc.pid):
        try:
            if p.status() == psutil.STATUS_STOPPED:
                stopped.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return stopped


def kill_session(pid: int) -> None:
    """SIGKILL the process group (session) ``pid`` leads: ranks left behind by an agent that is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun's group (it forwards the signal to its ranks, which sit in sessions of their
    own), then SIGKILL whatever of the tree is still alive after the grace period."""
    tree = process_tree(proc.pid)
    if not tree:
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
