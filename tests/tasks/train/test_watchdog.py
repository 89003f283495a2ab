"""Hang detection: diagnosing the stuck rank from heartbeats, killing a stopped local rank, and the
watchdog turning a stalled loop into an exit with its distinctive code (in a child process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tasks.train.config import WatchdogConfig
from tasks.train.watchdog import HANG_EXIT_CODE, Heartbeat, diagnose, kill_if_local

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def beat(rank: int, step: int, count: int) -> Heartbeat:
    return Heartbeat(rank, step, count, pid=1000 + rank, created=0.0, host="h")


def test_a_rank_whose_heartbeat_stopped_is_silent_and_a_live_rank_behind_is_lagging():
    first = {0: beat(0, 4, 10), 1: beat(1, 4, 7), 2: beat(2, 3, 9)}
    second = {0: beat(0, 4, 13), 1: beat(1, 4, 7), 2: beat(2, 3, 12)}
    assert diagnose(first, second, world_size=4) == ([1, 3], [2])  # rank 3 never reported


def test_ranks_alive_in_the_same_step_are_neither_silent_nor_lagging():
    first = {0: beat(0, 4, 1), 1: beat(1, 4, 1)}
    second = {0: beat(0, 4, 2), 1: beat(1, 4, 2)}
    assert diagnose(first, second, world_size=2) == ([], [])


def test_a_stopped_process_on_this_host_is_killed_but_a_recycled_pid_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        created = psutil.Process(child.pid).create_time()
        stale = Heartbeat(1, 4, 3, child.pid, created - 100, socket.gethostname())
        assert not kill_if_local(stale)
        assert not kill_if_local(Heartbeat(1, 4, 3, child.pid, created, "another-host"))
        assert kill_if_local(Heartbeat(1, 4, 3, child.pid, created, socket.gethostname()))
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_loop_that_stops_stepping_exits_with_the_hang_code_naming_its_step():
    script = textwrap.dedent("""
        import logging, sys, time
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from tasks.train.config import WatchdogConfig
        from tasks.train.watchdog import ProgressWatchdog
        dog = ProgressWatchdog(WatchdogConfig(hang_timeout_s=1.0, startup_timeout_s=10.0), rank=0, world_size=1).start()
        for step in (1, 2):
            time.sleep(0.3)
            dog.beat(step)
        time.sleep(30)
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == HANG_EXIT_CODE, done.stderr
    assert "watchdog: rank 0 finished no step for" in done.stderr
    assert "stuck in step 3 (last finished step 2)" in done.stderr
    assert time.monotonic() - started < 25


@pytest.mark.parametrize("field", ["collective_timeout_s", "hang_timeout_s", "startup_timeout_s"])
def test_timeouts_must_be_positive(field):
    with pytest.raises(ValueError, match="watchdog timeouts must be positive"):
        WatchdogConfig(**{field: 0})
