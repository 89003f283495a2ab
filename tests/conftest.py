"""One Prefect test harness (a temporary server with its database in a temp dir) for the whole session.

It lives at the root so that every folder shares it: two session harnesses (one per folder) nest, and
events emitted under the second then reach the first server.
"""

import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def snapshot_store():
    """Every run's in-memory snapshots (tasks/train/snapshot.py) in a folder of this session, removed at its end;
    torchrun ranks inherit the variable. Tests that simulate nodes give each its own folder."""
    folder = tempfile.mkdtemp(prefix="smelt-test-snapshots-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.environ["SMELT_SNAPSHOT_DIR"] = folder
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
