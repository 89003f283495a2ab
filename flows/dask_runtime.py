"""Dask for the data stages: a LocalCluster by default, or an existing cluster by address.

Only pure ``tasks/`` functions run on Dask workers (Prefect tasks inside Dask workers
each started their own temporary server). A stage gets a ``MapFn`` that submits one Dask task per
work item, retries items whose worker died, and logs progress as items finish.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from tasks.errors import UserError
from tasks.parallel import ClientMap

T = TypeVar("T")
R = TypeVar("R")

ADDRESS_ENV = "SMELT_DASK_ADDRESS"
log = logging.getLogger(__name__)


def check_scheduler(address: str, timeout_s: float = 5.0) -> None:
    """Fail at once, in one sentence, if nothing listens at a scheduler address (``tcp://host:port``)."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--dask-address {address!r} is not a scheduler address like tcp://host:8786")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        reason = "connection refused" if isinstance(e, ConnectionRefusedError) else (e.strerror or str(e) or "timed out")
        raise UserError(f"cannot reach the Dask scheduler at {address}: {reason}") from None


@contextlib.contextmanager
def dask_cluster(address: str | None = None, n_workers: int | None = None) -> Iterator[str]:
    """Yield a scheduler address: ``address``, ``$SMELT_DASK_ADDRESS``, or a new LocalCluster's."""
    address = address or os.environ.get(ADDRESS_ENV)
    if address:
        check_scheduler(address)
        yield address
        return
    from distributed import LocalCluster

    # The scheduler runs in this process; its INFO lines (workers joining, leaving) drown the
    # stage's own progress.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    workers = n_workers or max(1, min(os.cpu_count() or 1, 8))
    # One thread per worker process: the hot loops (trafilatura, fastText, tokenizers) hold the GIL
    # for long stretches, so processes, not threads, give the parallelism.
    nanny = logging.getLogger("distributed.nanny")
    level = nanny.level
    # distributed sets its workers' environment (MALLOC_TRIM_THRESHOLD_=65536, OMP_NUM_THREADS=1 …) in this
    # process's os.environ and leaves it there: the training ranks started after the data stages then trimmed
    # their heap every step (tasks/train/node_launch.py's RANK_MALLOC_ENV lets the caller's environment win).
    saved = {key: os.environ.get(key) for key in _worker_environ_keys()}
    try:
        with LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: a fixed one warns when another cluster holds it
            silence_logs=logging.CRITICAL,  # every task error reaches the client, which raises it once (tasks/errors.py)
        ) as cluster:
            try:
                yield cluster.scheduler_address
            except BaseException:
                # A failed stage closes its cluster while workers still run cancelled items: the nanny's "still
                # alive, killing" warning would follow the failure's one sentence.
                nanny.setLevel(logging.ERROR)
                raise
    finally:
        nanny.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _worker_environ_keys() -> list[str]:
    """The variables distributed sets for its worker processes (its ``distributed.nanny`` environ settings)."""
    import dask.config

    return [key for name in ("pre-spawn-environ", "environ")
            for key in (dask.config.get(f"distributed.nanny.{name}", default=None) or {})]


class DaskMap:
    """A ``MapFn`` over a Dask scheduler: one task per item, rerun after a transient failure (tasks/parallel.py)."""

    def __init__(self, address: str, retries: int = 2, log_fn: Callable[[str], None] | None = None):
        self.address = address
        self.retries = retries
        self.log_fn = log_fn or log.info

    def __call__(self, fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]:
        from distributed import Client

        if not items:
            return []
        with Client(self.address, timeout="30s") as client:
            return ClientMap(client, self.retries, self.log_fn)(fn, items, label=label)


@contextlib.contextmanager
def dask_map(address: str | None = None, log_fn: Callable[[str], None] | None = None) -> Iterator[DaskMap]:
    """A ``MapFn`` on the given cluster, or on a LocalCluster that lives as long as the block."""
    with dask_cluster(address) as scheduler:
        yield DaskMap(scheduler, log_fn=log_fn)
