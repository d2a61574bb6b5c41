"""ESGTaskRunner makes and starts its shared pool when a flow run starts, not at the first stage call.

The first flow run of a process otherwise paid the pool's set-up on its first stage call: the process
backend's fork server imports torch and prefect (seconds) before any worker starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect import flow, task

from esg_prefect import ESGTaskRunner
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.integration import runner as runner_mod
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from tests.toy_stages import inc, toy_profile, wait_until


@pytest.fixture
def profile(tmp_path: Path) -> Iterator[str]:
    """A toy profile CSV of this test's own: its path keys a shared pool no other test has."""
    path = tmp_path / "toy.csv"
    toy_profile().to_csv(path)
    yield str(path)
    runner_mod.close_shared_pools()


def _pool_of(profile: str) -> Pool | None:
    with runner_mod._shared_lock:
        return next((p for key, p in runner_mod._shared.items() if key[2] == profile), None)


def _started(profile: str) -> bool:
    pool = _pool_of(profile)
    return pool is not None and pool._loop is not None


def test_starting_a_runner_makes_and_starts_its_shared_pool(profile: str) -> None:
    """As Prefect does for each flow run: enter a duplicate. The pool is there, started, before any call."""
    runner = ESGTaskRunner(backend="inline", artifacts=False, store=False, profile=profile)
    with runner.duplicate():
        assert wait_until(lambda: _started(profile)) and wait_until(lambda: not runner_mod._warming)
    first = _pool_of(profile)
    with runner.duplicate():  # the next flow run's duplicate: the same pool, no second warm-up
        assert not runner_mod._warming
        assert runner.duplicate().pool_client() is first


@pytest.mark.usefixtures("prefect_harness")
def test_a_flow_run_that_never_calls_a_stage_runs_as_before_and_one_that_does_uses_the_pool(profile: str) -> None:
    @task
    def plain(x: int) -> int:
        return x * 3

    runner = ESGTaskRunner(backend="inline", artifacts=False, store=False, profile=profile)

    @flow(task_runner=runner)
    def no_stage(x: int) -> int:
        return plain(x)

    @flow(task_runner=runner)
    def one_stage(x: int) -> int:
        return inc(x)

    assert no_stage(2) == 6
    assert wait_until(lambda: _started(profile))
    pool = _pool_of(profile)
    assert pool is not None and pool.snapshot().calls == ()  # made and started, but no call
    assert one_stage(4) == 5
    assert [c.ok for c in pool.snapshot().calls] == [True]


def test_a_runner_of_the_pool_service_or_of_a_given_pool_starts_no_embedded_pool() -> None:
    before = dict(runner_mod._shared)
    given = Pool(toy_profile(), backend=InlineBackend())
    try:
        with ESGTaskRunner(address="http://127.0.0.1:9").duplicate(), ESGTaskRunner(pool=given).duplicate():
            assert not runner_mod._warming  # nothing started: the service has its pool, a given one is yours
        assert runner_mod._shared == before and given._loop is None
    finally:
        given.close()


def test_a_pool_that_cannot_be_made_fails_at_the_first_stage_call_not_at_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A settings block not saved: the warm-up says so at debug level, the runner still starts, and the
    first stage call raises it in one line, as before."""
    caplog.set_level("DEBUG", logger=runner_mod.__name__)
    runner = ESGTaskRunner(settings="no-such-settings", backend="inline", artifacts=False, store=False)
    with runner.duplicate():
        assert wait_until(lambda: not runner_mod._warming)
    assert any("not started ahead of the first stage call" in r.getMessage() for r in caplog.records)
    with pytest.raises(InvalidInputError, match=r"no ESG Scheduler Settings block named 'no-such-settings'"):
        runner.duplicate().pool_client()
