"""One Prefect test harness (a temporary server with its database in a temp dir) for the whole session.

It lives at the root so that every folder shares it: two session harnesses (one per folder) nest, and
events emitted under the second then reach the first server.
"""

import os

import pytest


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
