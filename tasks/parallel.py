"""How stages fan out: a ``MapFn`` applies a function to work items and returns results in order.

Stages in ``tasks/`` take a ``MapFn`` so they stay plain Python: tests pass ``serial_map``; the
flows pass a Dask-backed map (``flows/dask_runtime.py``) that spreads work items over a cluster.
"""

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class MapFn(Protocol):
    def __call__(self, fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]: ...


def serial_map(fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]:
    return [fn(item) for item in items]
