"""Start torchrun for one node and follow it: stream its log, enforce a timeout, never leak ranks.

torchrun runs in its own session (process group), so a cancelled flow, a timeout or Ctrl-C stops
the agent and every rank it started. Rendezvous is c10d on 127.0.0.1 rather than ``--standalone``:
after a worker failure, restarted gloo workers of a standalone agent could not reconnect here
(DESIGN.md §9), while c10d rendezvous restarts cleanly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tasks import datasets as contract

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 30.0  # torchrun forwards SIGTERM to its ranks and waits for them; then SIGKILL


class LaunchError(RuntimeError):
    """torchrun failed or timed out; the message says which and where the run's log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, args: list[str], run_id: str, max_restarts: int, rdzv_port: int) -> list[str]:
    """The single-node torchrun command line running ``python -m tasks.train.main ARGS`` on each rank."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}",
        "--rdzv-id", run_id,
        "--max-restarts", str(max_restarts),
        "-m", "tasks.train.main", *args,
    ]


def run_torchrun(
    nproc: int,
    args: list[str],
    run_dir: str,
    max_restarts: int = 0,
    rdzv_port: int | None = None,
    *,
    timeout_s: float | None = None,
    log_line: Callable[[str], None] = log.info,
) -> int:
    """Run torchrun with ``tasks.train.main ARGS`` on ``nproc`` local ranks; its exit status.

    Every output line goes to ``log_line``. On timeout or KeyboardInterrupt the whole process tree
    is stopped (SIGTERM, then SIGKILL after a grace period); a timeout raises LaunchError.
    """
    run_id = hashlib.sha256(contract.normalize_url(run_dir).encode()).hexdigest()[:12]
    cmd = torchrun_command(nproc, args, run_id, max_restarts, rdzv_port or free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    log.info("starting: %s", " ".join(cmd))
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)
    reader = threading.Thread(target=_forward_lines, args=(proc, log_line), daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_tree(proc)
        raise LaunchError(f"torchrun for {run_dir} ran past its {timeout_s:.0f} s timeout and was stopped") from None
    except BaseException:  # KeyboardInterrupt, a cancelled flow: no rank may outlive us
        _stop_tree(proc)
        raise
    finally:
        reader.join(timeout=10)
    return returncode


def _forward_lines(proc: subprocess.Popen, log_line: Callable[[str], None]) -> None:
    for line in proc.stdout:
        log_line(line.rstrip())


def _stop_tree(proc: subprocess.Popen) -> None:
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


def launch_torchrun(
    *,
    data: dict[str, str],
    config: dict,
    run_dir: str,
    nproc: int,
    max_restarts: int = 0,
    timeout_s: float | None = None,
    rdzv_port: int | None = None,
    log: Callable[[str], None] = log.info,
) -> dict:
    """Train ``config`` (a TrainConfig as a dict) on ``data`` (name → tokens URL) with ``nproc``
    local ranks; returns {returncode, summary, seconds, restarts}. The config is written to
    ``<run_dir>/train_config.json`` so the run folder records what ran (and restarted ranks reread it)."""
    run_dir = contract.normalize_url(run_dir)
    config_url = contract.join(run_dir, "train_config.json")
    with contract.atomic_write(config_url, "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True))
    args = ["--config", config_url, "--data", ",".join(f"{name}={url}" for name, url in data.items()),
            "--run-dir", run_dir]
    started = time.monotonic()
    returncode = run_torchrun(nproc, args, run_dir, max_restarts, rdzv_port, timeout_s=timeout_s, log_line=log)
    seconds = time.monotonic() - started
    if returncode != 0:
        raise LaunchError(f"torchrun for {run_dir} exited with status {returncode} after {seconds:.0f} s "
                          f"({max_restarts} restarts allowed); the ranks' errors are in the log above")
    fs, path = contract.filesystem(contract.join(run_dir, "summary.json"))
    summary = json.loads(fs.cat_file(path))
    return {"returncode": returncode, "summary": summary, "seconds": seconds, "restarts": summary.get("restarts", 0)}
