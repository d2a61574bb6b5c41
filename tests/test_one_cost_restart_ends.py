"""A flow run's end after a pool service restart: published once, and a run with a failed call never "met".

The companion of ``tests/test_one_cost_restart.py`` (same wiring: two live pools
on one store file, a clock the test moves, the Prefect API a fake): here the run's
end is the restarted instance's first request, and runs whose calls failed on the
first instance end on the second. A failed call is stored with no batch, so it
travels to the second instance's figure through the store's calls alone.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from esg_prefect.control.records import RunRecords
from esg_prefect.integration import recording
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import BatchOutcome, WorkerSpec
from esg_prefect.scheduling import ESGSettings
from esg_prefect.store import CostStore
from esg_prefect.store.tables import RunRow
from tests.test_one_cost import FakeBackend, FakeClient, ManualClock, _Handle, _results, _t4_profile
from tests.test_one_cost_restart import published  # noqa: F401  # the fixture
from tests.toy_calls import flow_call

POISON = 13


class _PoisonHandle(_Handle):
    async def execute(self, items: list[Any]) -> BatchOutcome:
        ms = 10.0 + 2.0 * len(items)
        self.clock.advance(ms)
        if POISON in items:
            return BatchOutcome(False, [], ms, "ValueError", "poison")
        return BatchOutcome(True, [x + 1 for x in items], ms)


class _PoisonBackend(FakeBackend):
    """The fake T4 node, whose batch function raises on the poison input."""

    async def start(self, spec: WorkerSpec) -> _Handle:
        self.clock.advance(5.0)
        return _PoisonHandle(self.clock, spec)


def _service_pool(clock: ManualClock, url: str) -> Pool:
    pool = Pool(_t4_profile(), PriceSheet(1e-5, {"T4": 1e-4}), settings=ESGSettings(wait_for_batch=False),
                backend=_PoisonBackend(clock, gpu=True), clock=clock)  # type: ignore[arg-type]  # fmt: skip
    recording.attach_recorders(pool, artifacts=True, store=url)
    return pool


def _failed(clock: ManualClock, fut: concurrent.futures.Future[Any]) -> None:
    for _ in range(5_000):
        if fut.done():
            assert fut.exception() is not None
            return
        clock.advance(1.0)
        concurrent.futures.wait([fut], timeout=0.02)
    raise AssertionError("the poison call did not fail")


@pytest.mark.parametrize("first_request", [True, False], ids=["end-first", "after-a-call"])
def test_runs_with_a_failed_call_ended_after_a_restart_read_as_ended_before_it(
    tmp_path: Path,
    published: tuple[list[RunRecords], FakeClient],  # noqa: F811  # the fixture imported above
    first_request: bool,
) -> None:
    """Before: the restarted service, not started yet, dropped an end that was its first request (never
    published, its row provisional); and a run whose call failed before the restart was published and stored
    as "SLO met" (failed calls have no batch, so the earlier part left them out)."""
    out, client = published
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    normal, restarted, spanning, other, late = (str(uuid.uuid4()) for _ in range(5))
    clock_a = ManualClock()
    first = _service_pool(clock_a, url)
    try:
        for run in (normal, restarted):  # a call answered, then one that fails
            _results(clock_a, [first.submit(flow_call("double", run, 6))])
            _failed(clock_a, first.submit(flow_call("inc", run, POISON)))
        _failed(clock_a, first.submit(flow_call("inc", spanning, POISON)))
        _results(clock_a, [first.submit(flow_call("double", late, 3))])
        first.end_run(normal)  # ends where it ran; the others end after the restart
        clock_a.advance(2_000.0)
    finally:
        first.close()
    clock_b = ManualClock(clock_a.t + 30_000.0)
    second = _service_pool(clock_b, url)
    try:
        if not first_request:
            _results(clock_b, [second.submit(flow_call("double", other, 7))])
        second.end_run(restarted)  # the first request of a fresh service when first_request
        _results(clock_b, [second.submit(flow_call("double", spanning, 7))])
        second.end_run(spanning)
        second.end_run(normal)  # posted again (the first instance's answer lost): it ended there, with no finish
        clock_b.advance(1_000.0)
    finally:
        second.close()
    third = _service_pool(ManualClock(clock_b.t + 30_000.0), url)  # restarted again: gets only an end, closes
    third.end_run(late)
    third.close()  # never started: it still waits for the lookup it was handed, as a started pool does
    assert [r.run_id for r in out].count(late) == 1
    with CostStore(url) as store, Session(store.engine) as s:
        rows = {run: s.get(RunRow, run) for run in (normal, restarted, spanning)}
    assert [[r.run_id for r in out].count(run) for run in (normal, restarted, spanning)] == [1, 1, 1]
    for run in (normal, restarted, spanning):
        row = rows[run]
        assert row is not None and (row.finish_ms, row.slo_met) == (None, False), run
        (line,) = [ln for ln in client.sent()[run]["markdown"].splitlines() if "Did not finish" in ln]
        assert "1 of 2 stage calls failed" in line, (run, line)
