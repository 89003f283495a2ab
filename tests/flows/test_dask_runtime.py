"""The data stages' LocalCluster leaves this process's environment as it found it."""

import os

import pytest

from flows.dask_runtime import dask_cluster

pytestmark = pytest.mark.slow  # a LocalCluster starts a worker process


def test_the_workers_environment_does_not_leak_into_the_processes_started_after_the_cluster(monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with dask_cluster(n_workers=1):
        # distributed sets its workers' settings here (a rank started now would trim its heap every step)
        assert os.environ.get("MALLOC_TRIM_THRESHOLD_") == "65536"
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ
    assert os.environ["OMP_NUM_THREADS"] == "3"
