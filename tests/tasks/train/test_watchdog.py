"""Hang detection: diagnosing the stuck rank from heartbeats, killing a stopped local rank, and the
watchdog turning a stalled loop into an exit with its distinctive code (in a child process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

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
    """The watchdog reads a clock the script moves (its polls are real): two steps of 0.75 s, then 0.75 s without
    a step, which it must see and survive, then 1.5 s, past the 1 s limit. A loaded machine changes nothing."""
    script = textwrap.dedent("""
        import logging, sys, threading, time
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        from tasks.train import watchdog
        from tasks.train.config import WatchdogConfig

        class Clock:
            def __init__(self):
                self.now, self.polls, self.changed = 1000.0, 0, threading.Condition()
            def monotonic(self):
                with self.changed:
                    if threading.current_thread().name.startswith("smelt-watchdog"):
                        self.polls += 1
                        self.changed.notify_all()
                    return self.now
            def __getattr__(self, name):
                return getattr(time, name)

        clock = watchdog.time = Clock()
        dog = watchdog.ProgressWatchdog(WatchdogConfig(hang_timeout_s=1.0, startup_timeout_s=10.0), rank=0,
                                        world_size=1).start()
        for step in (1, 2):
            clock.now += 0.75
            dog.beat(step)
        with clock.changed:
            clock.now += 0.75
            seen = clock.polls
            assert clock.changed.wait_for(lambda: clock.polls >= seen + 2, timeout=30), "the watchdog never polled"
        print("alive 0.75 s after step 2", flush=True)
        clock.now += 0.75
        threading.Event().wait(30)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == HANG_EXIT_CODE, done.stdout + done.stderr
    assert done.stdout == "alive 0.75 s after step 2\n"
    assert "watchdog: rank 0 finished no step for 1.5 s (limit 1 s): stuck in step 3 (last finished step 2)" \
        in done.stderr, done.stderr


@pytest.mark.parametrize("field", ["collective_timeout_s", "hang_timeout_s", "startup_timeout_s"])
def test_timeouts_must_be_positive(field):
    with pytest.raises(ValueError, match="watchdog timeouts must be positive"):
        WatchdogConfig(**{field: 0})
