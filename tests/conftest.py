"""Shared fixtures: one Prefect test harness for the whole run (it takes seconds to start)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Cost records of test runs go to a throw-away store, never to the user's ~/.prefect one.
os.environ.setdefault("ESG_PREFECT_STORE_URL", f"sqlite:///{tempfile.mkdtemp(prefix='esg-test-store-')}/costs.db")
os.environ.setdefault("DO_NOT_TRACK", "1")


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API for tests that run flows; started once per session (per xdist worker)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
