"""The suite's xdist groups hold: ``--dist loadgroup`` keeps each ``xdist_group`` on one worker.

Some modules must not run beside themselves on two workers (one local Ray
cluster at a time; one profiling session or Prefect server per module). pytest
9.2 dropped the nodeid suffix xdist groups by (pytest-xdist#1386), and the
groups were silently ignored; this test fails if that happens again.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("suite-groups")


def test_xdist_groups_are_honoured(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run under --dist loadgroup (scripts/test.sh runs it so)")
    assert request.node.nodeid.endswith("@suite-groups"), request.node.nodeid
