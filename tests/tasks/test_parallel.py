"""ClientMap, the one Dask adapter, on a real LocalCluster of two worker processes on 127.0.0.1."""

from __future__ import annotations

import functools
import logging
import os

import pytest
from distributed import Client, LocalCluster

from tasks.parallel import ClientMap, serial_map


def _square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("item 3 is bad")
    return x


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        yield c


def test_results_come_back_in_item_order_from_both_workers(client):
    items = list(range(40))
    results = ClientMap(client, log_fn=lambda line: None)(_square_with_pid, items, label="squares")
    assert [r for r, _ in results] == [x * x for x in items] == [r for r, _ in serial_map(_square_with_pid, items)]
    assert len({pid for _, pid in results}) == 2 and os.getpid() not in {pid for _, pid in results}


def _attempt(marker_dir: str, exc: Exception, x: int) -> int:
    """Record an attempt at ``x`` (a file per attempt), then fail item 3 with ``exc``."""
    path = os.path.join(marker_dir, f"{x}-{len(os.listdir(marker_dir))}")
    open(path, "w").close()
    if x == 3:
        raise exc
    return x


def _attempts_at_three(marker_dir) -> int:
    return sum(1 for name in os.listdir(marker_dir) if name.startswith("3-"))


def test_a_permanent_failure_is_raised_once_without_dask_rerunning_it(client, tmp_path):
    from tasks.contract import DatasetError

    bad = DatasetError("shard docs-00003.parquet does not match its manifest checksum")
    with pytest.raises(DatasetError, match="does not match") as raised:
        ClientMap(client, retries=2, log_fn=lambda line: None)(functools.partial(_attempt, str(tmp_path), bad), list(range(6)))
    assert _attempts_at_three(tmp_path) == 1
    assert "_attempt" in raised.value.remote_traceback  # the worker's traceback travels with it, for the log file


def test_a_transient_failure_keeps_its_retries(client, tmp_path):
    with pytest.raises(ConnectionResetError):
        ClientMap(client, retries=2, log_fn=lambda line: None)(
            functools.partial(_attempt, str(tmp_path), ConnectionResetError("peer reset")), list(range(6)))
    assert _attempts_at_three(tmp_path) == 3


def test_an_item_that_raises_fails_the_map_with_its_own_error(client):
    with pytest.raises(ValueError, match="item 3 is bad"):
        ClientMap(client, log_fn=lambda line: None)(_fail_on_three, list(range(6)))
    assert ClientMap(client)(_fail_on_three, []) == []


def _fail_on_five_else_20_mb(x: int) -> bytes:
    """Big results take long to gather, so a failure arrives while some are still on their way."""
    from tasks.contract import DatasetError

    if x == 5:
        raise DatasetError("shard docs-00005.parquet is missing")
    return bytes(20_000_000)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


def test_a_failure_cancels_the_rest_without_the_scheduler_logging_a_lost_gather(client):
    """The CLI shows distributed's warnings: a cancel racing a background gather of finished items made
    the scheduler log "Couldn't gather keys ... forgotten" and the client "rescheduling" above a failed
    dedup's one sentence (a full-suite run; with_results=True reproduced it here in about one round in ten)."""
    from tasks.contract import DatasetError

    records = _Records()
    loggers = [logging.getLogger(name) for name in ("distributed.scheduler", "distributed.client")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        for _ in range(12):
            with pytest.raises(DatasetError, match="is missing"):
                ClientMap(client, log_fn=lambda line: None)(_fail_on_five_else_20_mb, list(range(24)))
        client.run(lambda: None)  # the scheduler has handled every cancel
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    assert records.lines == []
