"""A local Prefect server, the process work pool, every deployment and a worker, in one command.

``smelt server start`` (or ``make serve``) starts ``prefect server start`` on 127.0.0.1 and a
process worker, each in its own process group with its log in the state folder, creates the
``smelt-process`` pool and runs ``prefect deploy --all`` from the repository root;
``smelt server stop`` ends both groups. The state folder (default ``.smelt-server/``) records the
pids and the API URL, so stop works from any shell.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from tasks.errors import UserError
from tasks.repo import REPO_ROOT

STATE_DIR = REPO_ROOT / ".smelt-server"
STATE = "server.json"
HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """The server or worker did not come up; the message names its log."""


@dataclass
class LocalServer:
    api_url: str
    port: int
    server_pid: int
    worker_pid: int | None
    state_dir: str

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")


def work_pool() -> str:
    """The work pool every deployment in prefect.yaml names."""
    spec = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    (pool,) = {d["work_pool"]["name"] for d in spec["deployments"]}
    return pool


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def api_reachable(api_url: str, timeout_s: float = 2.0) -> bool:
    """True if ``<api_url>/health`` answers."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def _spawn(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """A detached child in its own session (its own process group), output to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _env(api_url: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PWD": str(REPO_ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "tasks,flows")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _run(cmd: list[str], env: dict[str, str], what: str, timeout_s: float) -> None:
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ServerError(f"{what} failed (exit {result.returncode}): {' / '.join(tail)}")


def _wait_until(ready, proc: subprocess.Popen, timeout_s: float, what: str, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with status {proc.returncode}; see {log_path}")
        time.sleep(0.5)
    raise ServerError(f"{what} was not ready after {timeout_s:.0f} s; see {log_path}")


def read_state(state_dir: Path = STATE_DIR) -> LocalServer | None:
    path = Path(state_dir) / STATE
    return LocalServer(**json.loads(path.read_text())) if path.exists() else None


def start(state_dir: Path = STATE_DIR, port: int | None = None, deploy: bool = True, worker: bool = True,
          timeout_s: float = 180.0) -> LocalServer:
    """Start server (+ pool, deployments, worker) unless this state folder's server is already up."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    running = read_state(state_dir)
    if running and api_reachable(running.api_url):
        return running
    if running:  # a server that died: end whatever of its worker is left before starting afresh
        stop(state_dir)
    port = port or free_port()
    api_url = f"http://{HOST}:{port}/api"
    server_log = state_dir / "server.log"
    server = _spawn(_prefect("server", "start", "--host", HOST, "--port", str(port)), server_log, _env())
    info = LocalServer(api_url, port, server.pid, None, str(state_dir))
    (state_dir / STATE).write_text(json.dumps(asdict(info)))
    try:
        _wait_until(lambda: api_reachable(api_url), server, timeout_s, "prefect server", server_log)
        env = _env(api_url)
        pool = work_pool()
        _run(_prefect("work-pool", "create", pool, "--type", "process", "--overwrite"), env,
             f"creating work pool {pool}", timeout_s)
        if deploy:
            _run(_prefect("--no-prompt", "deploy", "--all"), env, "prefect deploy --all", timeout_s)
        if worker:
            worker_log = state_dir / "worker.log"
            proc = _spawn(_prefect("worker", "start", "--pool", pool, "--type", "process"), worker_log, env)
            info.worker_pid = proc.pid
            (state_dir / STATE).write_text(json.dumps(asdict(info)))
            _wait_until(lambda: b"started" in worker_log.read_bytes().lower(), proc, timeout_s,
                        "prefect worker", worker_log)
    except BaseException:
        stop(state_dir)
        raise
    return info


def _end_group(pid: int, timeout_s: float) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL whatever is left after ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            try:  # reap our own child so its group empties
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)


def stop(state_dir: Path = STATE_DIR, timeout_s: float = 15.0) -> LocalServer | None:
    """End the worker's and the server's process groups; None if nothing was recorded."""
    info = read_state(state_dir)
    if info is None:
        return None
    for pid in (info.worker_pid, info.server_pid):
        if pid:
            _end_group(pid, timeout_s)
    (Path(state_dir) / STATE).unlink(missing_ok=True)
    return info


def check_api_url(timeout_s: float = 3.0) -> None:
    """If ``PREFECT_API_URL`` is set, fail at once, in one sentence, when no server answers there."""
    api_url = os.environ.get("PREFECT_API_URL")
    if api_url and not api_reachable(api_url, timeout_s):
        raise UserError(f"no Prefect server answers at PREFECT_API_URL={api_url}; start one with "
                         "`smelt server start`, or unset PREFECT_API_URL to run with a temporary local server")
