"""Start torchrun for one node and follow it: stream its log, enforce a timeout, never leak ranks.

torchrun runs in its own session (process group), so a cancelled flow, a timeout or Ctrl-C stops
the agent and every rank it started. Rendezvous is c10d on 127.0.0.1 rather than ``--standalone``:
after a worker failure, restarted gloo workers of a standalone agent could not reconnect (torch 2.13:
"connectFullMesh failed … Connection refused"); with c10d they do, given a store namespace per attempt
(tasks/train/watchdog.py).

``nnodes="1:2"`` makes the agent elastic: agents of the same run (same run folder, rendezvous
port) form one job, and when a node is lost the rest restart from the last checkpoint with the
same global batch. The agent hosting the rendezvous endpoint must survive (c10d keeps its store).

Exclusion: ``<run_dir>/exclude_hosts.json`` (written by straggler detection) lists hosts to keep
out of the next launch. An elastic agent on a listed host refuses to start, so the job goes on
without that node; a fixed-size launch cannot run without its nodes, so there (and on one host)
the list is only reported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from tasks import branches, contract, storage
from tasks.config import from_dict
from tasks.errors import UserError
from tasks.lease import ENV_EPOCH, Lease, LeaseError, LeaseHeld, LeaseLost, acquire
from tasks.repo import REPO_ROOT, python_path
from tasks.train import goodput
from tasks.train.config import TrainConfig
from tasks.train.exclude_hosts import EXCLUDE_HOSTS, excluded_hosts
from tasks.train.procs import STOP_GRACE_S, free_port, stop_tree

log = logging.getLogger(__name__)

LEASE_TIMEOUT_S = 60.0  # a launcher that stops renewing its run folder's lease for this long can be taken over
# Every torchrun agent smelt starts (here, Slurm, Kubernetes): a fresh c10d store per rendezvous round, hosted by
# rank 0, instead of one store shared across rounds, whose keys of an earlier round would need a prefix that every
# node agrees on (each agent counts its restarts alone, so TORCHELASTIC_RESTART_COUNT differs across nodes).
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# glibc hands every freed block above its mmap threshold (32 MiB at most: a small model's step logits) back to the
# kernel and page-faults it in again next step; with neither mmap nor trimming a rank reuses its heap (a demo rank's
# step: about 60 ms of kernel time beside 150 ms of compute before, 2 after: bench/rank_malloc.py). The caller's
# environment wins.
RANK_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def rank_malloc_env() -> dict[str, str]:
    """``RANK_MALLOC_ENV`` less what this process's environment already sets."""
    return {key: value for key, value in RANK_MALLOC_ENV.items() if key not in os.environ}


class LaunchError(RuntimeError):
    """torchrun failed or timed out; the message says which and where the run's log is. ``permanent``:
    a retry cannot help (tasks/errors.py), e.g. the run folder is another launch's."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def torchrun_command(nproc: int, args: list[str], run_id: str, max_restarts: int, rdzv_port: int,
                     nnodes: str = "1", rdzv_conf: str | None = None, rdzv_host: str = "127.0.0.1") -> list[str]:
    """The torchrun command line (this node's agent) running ``python -m tasks.train.main ARGS`` on each rank.

    ``rdzv_conf`` tunes an elastic rendezvous, e.g. ``last_call_timeout=10,keep_alive_interval=1``
    (seconds to wait for more nodes once the minimum is there; heartbeat that finds lost nodes).
    ``rdzv_host``: the node hosting the rendezvous store (cluster launches, infra/launch/).
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", nnodes,
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{rdzv_host}:{rdzv_port}",
        "--rdzv-id", run_id,
        *(["--rdzv-conf", rdzv_conf] if rdzv_conf else []),
        "--max-restarts", str(max_restarts),
        "-m", "tasks.train.main", *args,
    ]


def start_torchrun(nproc: int, args: list[str], run_dir: str, max_restarts: int = 0, rdzv_port: int | None = None,
                   *, nnodes: str = "1", rdzv_conf: str | None = None,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start this node's torchrun agent in a session of its own; its output is the Popen's stdout."""
    run_id = hashlib.sha256(storage.normalize_url(run_dir).encode()).hexdigest()[:12]
    cmd = torchrun_command(nproc, args, run_id, max_restarts, rdzv_port or free_port(), nnodes, rdzv_conf)
    env = {**rank_malloc_env(), **os.environ, **TORCHRUN_ENV, **(env or {}),
           "PYTHONPATH": python_path()}
    log.info("starting: %s", " ".join(cmd))
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)


def check_not_excluded(run_dir: str, nnodes: str, log_line: Callable[[str], None] = log.warning) -> None:
    """Refuse to start an elastic agent on an excluded host; report the list otherwise (see the module docstring)."""
    hosts = excluded_hosts(run_dir)
    if not hosts:
        return
    host = socket.gethostname()
    low, _, high = nnodes.partition(":")
    elastic = bool(high) and int(low) < int(high)
    if host in hosts and elastic:
        raise LaunchError(f"host {host} is listed in {run_dir}/{EXCLUDE_HOSTS} (a straggler); the elastic job "
                          "continues without it. Delete the file to let this host rejoin")
    why = (f"this host ({host}) is not among them" if host not in hosts else
           f"a launch of fixed size ({nnodes} node(s)) cannot run without its hosts, so this is only reported")
    log_line(f"{EXCLUDE_HOSTS} lists {', '.join(hosts)}: {why}")


def run_torchrun(
    nproc: int,
    args: list[str],
    run_dir: str,
    max_restarts: int = 0,
    rdzv_port: int | None = None,
    *,
    nnodes: str = "1",
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    stop: threading.Event | None = None,
    log_line: Callable[[str], None] = log.info,
) -> int:
    """Run torchrun with ``tasks.train.main ARGS`` on ``nproc`` local ranks; its exit status.

    Every output line goes to ``log_line``; ``env`` is added to the ranks' environment. On timeout,
    KeyboardInterrupt or ``stop`` (the launcher lost its lease) the whole process tree is stopped
    (SIGTERM, then SIGKILL after a grace period); a timeout raises LaunchError.
    """
    check_not_excluded(run_dir, nnodes, log_line)
    proc = start_torchrun(nproc, args, run_dir, max_restarts, rdzv_port, nnodes=nnodes, env=env)
    reader = threading.Thread(target=_forward_lines, args=(proc, log_line), daemon=True)
    reader.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while (returncode := proc.poll()) is None:
            if stop is not None and stop.is_set():
                stop_tree(proc)
                return proc.wait()
            if deadline is not None and time.monotonic() > deadline:
                stop_tree(proc)
                raise LaunchError(f"torchrun for {run_dir} ran past its {timeout_s:.0f} s timeout and was stopped")
            time.sleep(0.2)  # short waits: a KeyboardInterrupt or a stop lands between them
    except BaseException:  # KeyboardInterrupt, a cancelled flow: no rank may outlive us
        stop_tree(proc)
        raise
    finally:
        reader.join(timeout=10)
    return returncode


def _forward_lines(proc: subprocess.Popen, log_line: Callable[[str], None]) -> None:
    for line in proc.stdout:
        log_line(line.rstrip())


def data_vocab_size(data: dict[str, str]) -> int:
    """The vocabulary of the tokens datasets a run trains on (each must be a complete tokens dataset)."""
    return max(int(contract.open_dataset(url, kind="tokens").meta["vocab_size"]) for url in data.values())


def preflight(cfg: TrainConfig, data: dict[str, str], world_sizes: list[int]) -> dict:
    """Every check that needs the data or the world size, before torchrun starts; returns the dry-run report.

    A user mistake (a malformed fault spec, a missing dataset, a vocabulary smaller than the data's,
    mixture names that are not the data's, a layout or batch the world size cannot split) is one
    ValueError/DatasetError sentence here rather than a traceback on every rank and a restart per attempt.
    """
    from tasks.train.faults import parse_faults  # torch: loaded when a launch is checked, not with the launcher
    from tasks.train.trainer import describe_layout

    parse_faults(cfg.faults.inject)
    vocab = data_vocab_size(data)
    cfg.model_for_data(vocab)
    if cfg.data.mixture and sorted(cfg.data.mixture) != sorted(data):
        raise UserError(f"train.data.mixture names {sorted(cfg.data.mixture)} but the data is {sorted(data)}; "
                         "use the same names")
    report: dict = {}
    for world_size in world_sizes:
        try:
            report = describe_layout(cfg, world_size=world_size, vocab_size=vocab)
        except UserError as e:
            raise UserError(f"on {world_size} rank(s): {e}") from None
    return report


CONFIG = "train_config.json"
RUN_KIND = "model"  # the kind of the manifest flows/train.py commits in a run folder when a launch finishes
CODE = "tasks.train"  # what the ranks run: tasks/train and the shared core (tasks/*.py), see contract.code_version


def code_version() -> str:
    """The version of the code a launch trains with; recorded in ``events.jsonl``, never part of the run's identity."""
    return contract.code_version(CODE)


def prepare_run(data: dict[str, str], config: dict, run_dir: str, *, write: bool = True,
                log_line: Callable[[str], None] = log.info) -> list[str]:
    """Write ``<run_dir>/train_config.json`` (the run folder records what ran, and restarted ranks reread
    it); returns the ``tasks.train.main`` arguments that train it on ``data`` (name → tokens URL).
    A folder that already holds a run continues it (``continue_run``). ``write=False``: only the
    arguments (a dry run)."""
    run_dir = storage.normalize_url(run_dir)
    config_url = storage.join(run_dir, CONFIG)
    if write:
        continue_run(run_dir, config, log_line)
        with storage.atomic_write(config_url, "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True))
    data_args = [arg for name, url in data.items() for arg in ("--data", f"{name}={url}")]
    return ["--config", config_url, *data_args, "--run-dir", run_dir]


def continue_run(run_dir: str, config: dict, log_line: Callable[[str], None] = log.info) -> None:
    """Before a launch into a folder that already holds a run (its ``train_config.json``): say that the
    run continues and what changed, and record it in ``events.jsonl``.

    - A config that differs from the previous launch's (the run's identity is the same, or the folder
      would be another one: tasks/train/identity.py) appends ``{"event": "config_changed", "changes":
      {"steps": [60, 1000], ...}, "code_version", "previous_code_version", "checkpoint_step", "time"}``
      (``checkpoint_step``: the newest committed checkpoint, where the trainer resumes unless a newer
      in-memory snapshot survived), and the previous config is kept as ``train_config.<n>.json``
      (n = 1, 2, … in launch order).
    - Code that differs from the newest code version the events record (each launch records its own)
      appends the same event, with no config changes when only the code changed.
    - A finished run (its ``model`` manifest) asked for more steps than it reached is no longer finished:
      its manifest is removed before any rank starts (its final checkpoint stays, and the trainer resumes
      from it; the flow commits a new manifest when this launch finishes), and ``{"event": "continue",
      "finished_step", "steps", "time"}`` marks where the run sat idle (goodput leaves that time out).
    """
    from tasks.checkpoint_reader import list_committed  # torch; the flow has imported it by now
    from tasks.train.identity import config_changes

    fs, path = storage.filesystem(storage.join(run_dir, CONFIG))
    if not fs.exists(path):
        return  # a new run
    previous = json.loads(fs.cat_file(path))
    now = time.time()
    steps = from_dict(TrainConfig, config).steps
    committed = list_committed(run_dir, checksums=False)
    checkpoint_step = committed[-1]["step"] if committed else None
    finished = contract.read_manifest(run_dir)
    if finished is not None and finished.kind == RUN_KIND and int(finished.meta.get("step", 0)) < steps:
        mfs, mpath = storage.filesystem(storage.join(run_dir, contract.MANIFEST))
        mfs.rm(mpath)
        goodput.append_event(run_dir, {"event": "continue", "time": now, "finished_step": finished.meta.get("step"),
                                       "steps": steps})
    changes = config_changes(previous, config)
    code = code_version()
    previous_code = next((e["code_version"] for e in reversed(goodput.read_jsonl(run_dir, goodput.EVENTS))
                          if e.get("code_version")), None)
    code_changed = previous_code is not None and previous_code != code
    kept = None
    if changes:
        kept = f"train_config.{len(fs.glob(path[:-len('.json')] + '.*.json')) + 1}.json"
        with storage.atomic_write(storage.join(run_dir, kept), "w") as f:
            f.write(json.dumps(previous, indent=2, sort_keys=True))
    if changes or code_changed:
        goodput.append_event(run_dir, {"event": "config_changed", "time": now, "changes": changes,
                                       "code_version": code, "previous_code_version": previous_code,
                                       "checkpoint_step": checkpoint_step, "previous_config": kept})
    what = [f"{key} {old!r} → {new!r}" for key, (old, new) in changes.items()]
    what += [f"code {previous_code} → {code}"] if code_changed else []
    where = f"newest checkpoint: step {checkpoint_step}" if checkpoint_step is not None else "no committed checkpoint"
    log_line(f"train: run {run_dir} continues ({where}) to step {steps}; "
             + (f"changed: {'; '.join(what)}" if what else "config and code unchanged"))


RESTARTS = ("in-process", "torchrun")


def run_agent(nproc: int, args: list[str], max_restarts: int, *, timeout_s: float | None = None,
              env: dict[str, str] | None = None, stop: threading.Event | None = None,
              log_line: Callable[[str], None] = log.info) -> int:
    """Run ``tasks.train.main ARGS`` on ``nproc`` local ranks under smelt's node agent (tasks/train/agent.py):
    a failed rank is replaced by a warm spare, up to ``max_restarts`` times, while the others stay alive.
    Its exit status; on timeout, KeyboardInterrupt or ``stop`` every rank and spare is stopped. ``env`` is
    added to the ranks' environment."""
    from tasks.train.agent import NodeAgent

    env = {**rank_malloc_env(), **(env or {}),
           "PYTHONPATH": python_path()}
    agent = NodeAgent(args, nnodes=1, node_rank=0, nproc=nproc, master_addr="127.0.0.1", master_port=free_port(),
                      max_failures=max_restarts, env=env, cwd=str(REPO_ROOT), log_line=log_line)
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("status", agent.run()), name="smelt-agent",
                              daemon=True)
    thread.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while (thread.is_alive() and (deadline is None or time.monotonic() < deadline)
               and not (stop is not None and stop.is_set())):
            thread.join(timeout=0.2)  # short waits: a KeyboardInterrupt lands between them
        if thread.is_alive() and not (stop is not None and stop.is_set()):
            raise LaunchError(f"training ran past its {timeout_s:.0f} s timeout and was stopped")
    finally:
        if "status" not in result:  # a timeout, KeyboardInterrupt, a cancelled flow: no rank may outlive us
            # (not thread.is_alive(): a join that a KeyboardInterrupt broke into may report a live thread dead)
            agent.stop()
            deadline = time.monotonic() + STOP_GRACE_S
            while "status" not in result and time.monotonic() < deadline:
                time.sleep(0.1)
    return result.get("status", 1)


def take_run_lease(run_dir: str, *, wait_s: float = 0.0, timeout_s: float = LEASE_TIMEOUT_S,
                   log: Callable[[str], None] = log.info) -> Lease:
    """The run folder's lease (tasks/lease.py) for one launcher, to be renewed within ``timeout_s``; another
    launcher holding it is a LaunchError naming it, at once or after waiting ``wait_s``."""
    try:
        return acquire(storage.normalize_url(run_dir), timeout_s=timeout_s, wait=wait_s,
                       on_wait=lambda held: log(f"waiting for the run folder's lease: {held.describe()}"))
    except LeaseHeld as e:
        raise LaunchError(str(e), permanent=True) from None


def launch_training(
    *,
    data: dict[str, str],
    config: dict,
    run_dir: str,
    nproc: int,
    max_restarts: int = 0,
    timeout_s: float | None = None,
    restart: str = "in-process",
    lease: Lease | None = None,
    lease_wait_s: float = 0.0,
    lease_timeout_s: float = LEASE_TIMEOUT_S,
    rdzv_port: int | None = None,
    nnodes: str = "1",
    log: Callable[[str], None] = log.info,
    resume_from: int | None = None,
    skip_steps: tuple[int, int] | None = None,
    branch_request: str | None = None,
) -> dict:
    """Train ``config`` (a TrainConfig as a dict) on ``data`` (name → tokens URL) with ``nproc``
    local ranks; returns {returncode, summary, seconds, restarts, lease_epoch}. The config, data and
    layout are checked (``preflight``) before any rank starts.

    ``restart``: ``in-process`` (smelt's node agent: a failed rank is replaced by a warm spare, the others
    rejoin without restarting) or ``torchrun`` (torchrun restarts every rank; also for ``nnodes`` other
    than one, the elastic and multi-agent launches).

    One launcher per run folder: it holds the folder's lease from before it writes anything until the
    ranks are done (``take_run_lease`` with ``lease_wait_s`` and ``lease_timeout_s``, released at the end;
    or the caller's ``lease``, which the caller releases), renewing it every quarter of its timeout. The
    ranks get the lease's epoch (``SMELT_LEASE_EPOCH``) and check it before they commit; a launcher that
    loses its lease (not renewed in time: paused, partitioned; or taken over) stops its ranks and raises
    LaunchError naming the newer holder.

    ``resume_from`` / ``skip_steps``: the ranks continue from that older checkpoint, the later ones kept as a
    superseded branch, skipping the samples of steps A..B (``--resume-from``, tasks/branches.py); ``branch_request``
    names the request (the flow run's id), so a retried launch continues its branch instead of branching again."""
    branches.check_request(resume_from, skip_steps)
    branch_args = [*(["--resume-from", str(resume_from)] if resume_from is not None else []),
                   *(["--skip-steps", f"{skip_steps[0]}:{skip_steps[1]}"] if skip_steps else []),
                   *(["--branch-request", branch_request] if branch_request and resume_from is not None else [])]
    if nproc < 1:
        raise UserError(f"launch.nproc must be at least 1, got {nproc}")
    if restart not in RESTARTS:
        raise UserError(f"launch.restart is {restart!r}; choose one of {', '.join(RESTARTS)}")
    low, _, high = nnodes.partition(":")
    preflight(from_dict(TrainConfig, config), data, sorted({int(low) * nproc, int(high or low) * nproc}))
    run_dir = storage.normalize_url(run_dir)
    own = lease is None
    if own:
        lease = take_run_lease(run_dir, wait_s=lease_wait_s, timeout_s=lease_timeout_s, log=log)
    lost = threading.Event()
    try:
        with lease.keep_alive(on_lost=lambda _: lost.set()):
            result = _launch_leased(data, config, run_dir, nproc, max_restarts, timeout_s, restart, rdzv_port, nnodes,
                                    log, lease.epoch, lost, branch_args)
        lease.fence()
    except (LaunchError, LeaseLost):
        if lease.lost is not None:  # the ranks' failure is the lease's loss: say that, not "exited with status"
            raise LaunchError(str(lease.lost), permanent=True) from None
        raise
    finally:
        if own:
            with contextlib.suppress(LeaseError):
                lease.release()
    return {**result, "lease_epoch": lease.epoch}


def _launch_leased(data: dict[str, str], config: dict, run_dir: str, nproc: int, max_restarts: int,
                   timeout_s: float | None, restart: str, rdzv_port: int | None, nnodes: str,
                   log: Callable[[str], None], lease_epoch: int, stop: threading.Event,
                   branch_args: list[str]) -> dict:
    """``launch_training`` once this launcher holds the run folder's lease."""
    args = prepare_run(data, config, run_dir, log_line=log)
    args += branch_args  # --resume-from, --skip-steps: every restart of this launch passes them (tasks/branches.py)
    env = {ENV_EPOCH: str(lease_epoch)}  # the ranks fence their commits with it
    started = time.monotonic()
    goodput.append_event(run_dir, {"event": "launch", "time": time.time(), "host": socket.gethostname(),
                                   "code_version": code_version()})
    if config.get("ft", {}).get("enabled"):  # [train.ft]: torchft replica groups (tasks/train/replicas.py)
        from tasks.train.replicas import run_replica_groups

        returncode = run_replica_groups(from_dict(TrainConfig, config), data, args, run_dir, nproc,
                                        timeout_s=timeout_s, env=env, stop=stop, log_line=log)
    elif restart == "in-process" and nnodes == "1":
        check_not_excluded(run_dir, nnodes, log)
        returncode = run_agent(nproc, args, max_restarts, timeout_s=timeout_s, env=env, stop=stop, log_line=log)
    else:
        returncode = run_torchrun(nproc, args, run_dir, max_restarts, rdzv_port, nnodes=nnodes, timeout_s=timeout_s,
                                  env=env, stop=stop, log_line=log)
    seconds = time.monotonic() - started
    if returncode != 0:
        launcher = "torchrun" if restart == "torchrun" or nnodes != "1" else "smelt's agent"
        raise LaunchError(f"training in {run_dir} ({launcher}) exited with status {returncode} after {seconds:.0f} s "
                          f"({max_restarts} restarts allowed); the ranks' errors are in the log above")
    fs, path = storage.filesystem(storage.join(run_dir, "summary.json"))
    summary = json.loads(fs.cat_file(path))
    return {"returncode": returncode, "summary": summary, "seconds": seconds, "restarts": summary.get("restarts", 0)}
