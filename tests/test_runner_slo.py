"""Where a flow run's SLO starts (arrival, or start with ``slo_from="start"``), and saved pool blocks."""

from __future__ import annotations

import concurrent.futures

import pytest
from prefect import flow

from esg_prefect import ESGTaskRunner
from esg_prefect.control.calls import StageCall
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from tests.toy_stages import inc, toy_profile

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_a_requests_slo_starts_when_its_flow_run_was_expected_not_when_it_began_running() -> None:
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from esg_prefect.integration.stage import request_arrival_ms

    t = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    ms = t.timestamp() * 1000.0
    called = SimpleNamespace(created=t, expected_start_time=t, start_time=t + timedelta(seconds=0.4))
    assert request_arrival_ms(called) == ms  # creating and starting the run is spent against the SLO
    scheduled = SimpleNamespace(created=t - timedelta(minutes=5), expected_start_time=t, start_time=t)
    assert request_arrival_ms(scheduled) == ms  # a scheduled run's request arrives at its slot
    early = SimpleNamespace(created=t, expected_start_time=t + timedelta(minutes=1), start_time=t)
    assert request_arrival_ms(early) == ms  # started ahead of its slot: not later than it started
    bare = SimpleNamespace(created=None, expected_start_time=None, start_time=t)
    assert request_arrival_ms(bare) == ms


def test_with_slo_from_start_a_runs_slo_starts_when_it_began_running() -> None:
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from esg_prefect.integration.stage import request_arrival_ms

    t = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    late = SimpleNamespace(created=t, expected_start_time=t, start_time=t + timedelta(seconds=14))
    assert request_arrival_ms(late, "start") == (t + timedelta(seconds=14)).timestamp() * 1000.0
    assert request_arrival_ms(late, "arrival") == t.timestamp() * 1000.0
    assert request_arrival_ms(late) == t.timestamp() * 1000.0  # the default: the request's arrival


def test_the_runners_slo_from_reaches_each_stage_call() -> None:
    """A deployment-like run picked up long after its slot: ``slo_from`` decides which clock its calls carry."""
    from prefect.context import FlowRunContext

    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    seen: list[tuple[float, float, float]] = []  # (call's arrival, run's expected start, run's start), ms
    submit = pool.submit

    def spy(call: StageCall) -> concurrent.futures.Future:  # type: ignore[type-arg]
        run = FlowRunContext.get().flow_run  # type: ignore[union-attr]
        assert run is not None and run.expected_start_time is not None and run.start_time is not None
        seen.append((call.arrival_ms, run.expected_start_time.timestamp() * 1e3, run.start_time.timestamp() * 1e3))
        return submit(call)

    pool.submit = spy  # type: ignore[method-assign]
    try:
        for slo_from in ("start", "arrival"):

            @flow(task_runner=ESGTaskRunner(pool=pool, slo_from=slo_from))  # type: ignore[arg-type]
            def one(x: int) -> int:
                return inc(x)

            assert one(1) == 2
    finally:
        pool.close()
    (a_start, _, started), (a_arrival, expected, started2) = seen
    assert a_start == started  # "start": when the run began running
    assert a_arrival == min(expected, started2)  # "arrival": its slot, never later than it began


def test_slo_from_is_checked_and_kept_by_duplicates() -> None:
    with pytest.raises(InvalidInputError, match="slo_from must be 'arrival' or 'start', got 'created'"):
        ESGTaskRunner(slo_from="created")  # type: ignore[arg-type]
    a = ESGTaskRunner(backend="inline", slo_from="start")
    assert a.duplicate().slo_from == "start" and a.duplicate() == a
    assert a != ESGTaskRunner(backend="inline")


def test_a_saved_pool_blocks_name_stands_for_the_block() -> None:
    from esg_prefect.integration.blocks import ESGPool

    ESGPool(backend="inline", scheduler="fast-gshare").save("test-runner-pool", overwrite=True)
    assert ESGTaskRunner(pool="test-runner-pool") == ESGTaskRunner(backend="inline", scheduler="fast-gshare")
    with pytest.raises(InvalidInputError, match="no ESG Pool block named 'no-such-pool'"):
        ESGTaskRunner(pool="no-such-pool")


@pytest.mark.parametrize("slo", [0.5, 2])
def test_an_slo_under_10_ms_is_warned_of_as_likely_seconds(slo: float) -> None:
    """``slo_ms=0.5`` meant as half a second: Prefect's own time per run uses it up, so every call would
    be served best effort with no other hint; one warning names the value and the likely intent."""
    from esg_prefect import Pipeline

    with pytest.warns(UserWarning, match=rf"pipeline 'quick': slo_ms={slo:g} is {slo:g} ms.*slo_ms={slo * 1000:g}"):
        Pipeline("quick", slo_ms=slo)


def test_an_slo_of_10_ms_or_more_is_not_warned_of(recwarn: pytest.WarningsRecorder) -> None:
    from esg_prefect import Pipeline

    Pipeline("fine", slo_ms=10)
    assert not [w for w in recwarn if "slo_ms" in str(w.message)]
