"""How stages fan out: a ``MapFn`` applies a function to work items and returns results in order.

Stages in ``tasks/`` take a ``MapFn`` so they stay plain Python: tests pass ``serial_map``; the
flows and the benches pass ``ClientMap`` (the one Dask adapter), which spreads work items over a
``distributed.Client``'s cluster, reruns items whose worker died, and reports progress as they
finish. ``flows/dask_runtime.py`` only chooses the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)


class MapFn(Protocol):
    def __call__(self, fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]: ...


def serial_map(fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]:
    return [fn(item) for item in items]


class ClientMap:
    """A ``MapFn`` over a ``distributed.Client``: one task per item, ``retries`` reruns if its worker
    dies, and a progress line (``label: k/n work items done``) at every tenth of a long map."""

    def __init__(self, client: Any, retries: int = 2, log_fn: Callable[[str], None] | None = None):
        self.client, self.retries, self.log_fn = client, retries, log_fn or log.info

    def __call__(self, fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]:
        from distributed import as_completed

        if not items:
            return []
        futures = self.client.map(fn, list(items), retries=self.retries, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(futures)
        step = max(1, len(futures) // 10)
        # with_results: results come over in the background as tasks finish, not one round trip each
        for done, (future, result) in enumerate(as_completed(futures, with_results=True), 1):
            results[index[future.key]] = result
            if done == len(futures) or done % step == 0:
                self.log_fn(f"{label or getattr(fn, '__name__', 'map')}: {done}/{len(futures)} work items done")
        return results
