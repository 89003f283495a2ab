"""Helpers for tests that run torchrun agents or smelt's node agents as simulated nodes on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tasks.train import procs


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` (a rendezvous store, once up)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def follow(proc, lines: list[str]) -> None:
    """Collect a process's output lines (run on a thread)."""
    for line in proc.stdout:
        lines.append(line.rstrip())


def kill_tree(proc) -> None:
    """SIGKILL a process and everything it started, at once (a node lost), and reap it."""
    procs.kill_tree(proc)
    proc.wait()


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float, lines: list[str]) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` with the last log lines after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f} s:\n" + "\n".join(lines[-30:])
        time.sleep(0.1)
