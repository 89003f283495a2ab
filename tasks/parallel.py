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
    """A ``MapFn`` over a ``distributed.Client``: one task per item, ``retries`` reruns of an item that
    failed transiently (tasks/errors.py; a dead worker's items are rerun by Dask itself), a permanent
    failure raised once, at once, with the rest cancelled, and rate-limited progress lines
    (tasks/progress.py: items, records/s, ETA)."""

    def __init__(self, client: Any, retries: int = 2, log_fn: Callable[[str], None] | None = None):
        self.client, self.retries, self.log_fn = client, retries, log_fn or log.info

    def __call__(self, fn: Callable[[T], R], items: Sequence[T], *, label: str = "") -> list[R]:
        from distributed import as_completed

        from tasks.errors import Guarded, RemoteFailure
        from tasks.progress import MapProgress

        if not items:
            return []
        futures = self.client.map(Guarded(fn), list(items), retries=self.retries, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(futures)
        progress = MapProgress(label or getattr(fn, "__name__", "map"), len(futures), self.log_fn)
        # One foreground gather per batch of finished items: a round trip per batch, not per result,
        # and no gather left in flight when a failure cancels the rest (with_results=True gathers in
        # the background, and a cancel racing it made the scheduler log "Couldn't gather keys").
        for batch in as_completed(futures).batches():
            for future, result in zip(batch, self.client.gather(batch)):
                if isinstance(result, RemoteFailure):
                    self.client.cancel(futures)
                    result.reraise()
                results[index[future.key]] = result
                progress.update(result)
        return results
