"""ClientMap, the one Dask adapter, on a real LocalCluster of two worker processes on 127.0.0.1."""

from __future__ import annotations

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


def test_results_come_back_in_item_order_from_both_workers_with_progress_lines(client):
    lines = []
    items = list(range(40))
    results = ClientMap(client, log_fn=lines.append)(_square_with_pid, items, label="squares")
    assert [r for r, _ in results] == [x * x for x in items] == [r for r, _ in serial_map(_square_with_pid, items)]
    assert len({pid for _, pid in results}) == 2 and os.getpid() not in {pid for _, pid in results}
    assert lines[-1] == "squares: 40/40 work items done" and len(lines) == 10  # every tenth


def test_an_item_that_raises_fails_the_map_with_its_own_error(client):
    with pytest.raises(ValueError, match="item 3 is bad"):
        ClientMap(client, log_fn=lambda line: None)(_fail_on_three, list(range(6)))
    assert ClientMap(client)(_fail_on_three, []) == []
