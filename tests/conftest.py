"""Shared fixtures: one Prefect test harness for the whole run (it takes seconds to start)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.prefect_server import CLIENT_SETTINGS

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Cost records of test runs go to a throw-away store, never to the user's ~/.prefect one.
os.environ.setdefault("ESG_PREFECT_STORE_URL", f"sqlite:///{tempfile.mkdtemp(prefix='esg-test-store-')}/costs.db")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Prefect clients that wait out a busy test server (see tests/prefect_server.py), for the harness's
# clients too. Set before Prefect is imported: it reads its settings then.
for _name, _value in CLIENT_SETTINGS.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API for tests that run flows; started once per session (per xdist worker)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing.utilities import prefect_test_harness

    try:
        # A ceiling on a condition (the server answers): it took over a minute on a loaded machine.
        with prefect_test_harness(server_startup_timeout=300):
            yield
    finally:
        # The harness stops its server only after draining Prefect's log and event workers; when the
        # drain fails (a loaded machine's timeouts), the server outlived the session as an orphan.
        for server in list(SubprocessASGIServer._instances.values()):
            with contextlib.suppress(Exception):
                server.stop()
