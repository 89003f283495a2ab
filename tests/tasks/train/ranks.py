"""Start a few gloo ranks on this machine, cheaply, for multi-process trainer tests (CPU, 127.0.0.1).

A fork server that has imported torch and the calling test module once saves each rank that import
(tens of seconds on two shared cores), and unlike plain fork it never forks a process that has run
OpenMP or gloo threads. Each rank uses one intra-op thread: more only fight over the cores.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A collective that waits longer than this means a hung rank: fail the test instead of waiting on.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one intra-op thread for the block (a single-process reference run in the test process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _rank_main(rank: int, world: int, port: int, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn: Callable, *args) -> None:
    """Call ``fn(rank, *args)`` on ``world`` processes joined in one gloo group; raises if any rank fails.

    ``fn`` must be a module-level function (it is pickled by reference); ranks hand results back
    through files.
    """
    multiprocessing.set_forkserver_preload([fn.__module__])
    mp.start_processes(_rank_main, args=(world, free_port(), fn, args), nprocs=world, start_method="forkserver")
