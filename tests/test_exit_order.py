"""A runner's pool closes at exit before Prefect's event worker stops, whenever the pool was made;
the pool service sends the events of its last artifacts before it exits.

A shared pool is made by the runner's warm-up as a flow run starts, which can be before
Prefect registers its event worker's exit hook (at the run's first task event). Threading's
exit hooks run in reverse order of registration, so a pool whose only exit hook dates from
its making closed after that worker had stopped, and every artifact published at its close
logged "Error emitting event ... can't register atexit after shutdown" with a traceback.

The pool service closes its pool when it stops, publishing the last runs' artifacts; each
emits an event, left to the event worker's exit drain, which logged "Still processing items"
after every Ctrl-C. ``flush_prefect_events`` sends them first.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from esg_prefect.integration.recording import flush_prefect_events
from tests.toy_stages import toy_profile

SCRIPT = """
import sys, threading
from esg_prefect.integration import runner as r

runner = r.ESGTaskRunner(profile=sys.argv[1], backend="inline", artifacts=False, store=sys.argv[2])
pool = r.shared_pool(**runner._config)  # as the warm-up does when the flow run starts
close = pool.close
pool.close = lambda *a, **k: (print("pool closed", flush=True), close(*a, **k))
# Prefect's event worker, registered at the run's first task event, after the pool was made:
threading._register_atexit(lambda: print("prefect event worker stopped", flush=True))
assert runner.pool_client() is pool  # the run's first stage call
"""


def test_the_pool_closes_before_prefects_event_worker_stops(tmp_path: Path) -> None:
    csv = tmp_path / "toy.csv"
    toy_profile().to_csv(csv)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(csv), f"sqlite:///{tmp_path / 'costs.db'}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line in ("pool closed", "prefect event worker stopped")]
    assert lines[:2] == ["pool closed", "prefect event worker stopped"], done.stdout


def test_flushing_starts_no_event_worker() -> None:
    """``EventsWorker.instance()`` would start one (and, with no API set, a temporary API for it)."""
    from prefect.events.worker import EventsWorker

    before = dict(EventsWorker._instances)
    assert flush_prefect_events() is True
    assert dict(EventsWorker._instances) == before


@pytest.mark.parametrize("flushed", [False, True])
def test_events_flushed_before_the_exit_leave_the_drain_nothing_to_report(
    flushed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from prefect.events import Event
    from prefect.events.clients import EventsClient
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    gate = threading.Event()  # the API is slow to take the events until it is set
    sent: list[Event] = []

    class SlowClient(EventsClient):
        async def _emit(self, event: Event) -> None:
            await asyncio.to_thread(gate.wait, 30)
            sent.append(event)

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # the worker's API client: no server
        worker = EventsWorker.instance(SlowClient)
    try:
        for i in range(2):  # a pool's close publishes a run's table and markdown artifacts
            worker.send(Event(event="prefect.artifact.created", resource={"prefect.resource.id": f"a.{i}"}))
        if flushed:
            assert flush_prefect_events(timeout_s=0.05) is False  # bounded: an API that takes nothing holds no exit
            gate.set()
            assert flush_prefect_events() is True and len(sent) == 2
        else:  # one event in the client, one queued
            _wait_until(lambda: worker._queue.qsize() == 1)
    finally:
        with caplog.at_level(logging.WARNING, logger="EventsWorker"):
            drain = threading.Thread(target=worker.drain)  # as at exit: stop, then send what is left
            drain.start()
            _wait_until(lambda: worker._stopped and (flushed or worker._queue.qsize() == 2))  # one queued + the stop
            gate.set()
            drain.join(30)
    assert len(sent) == 2
    assert ("Still processing items" in caplog.text) is not flushed


def _wait_until(condition: Callable[[], bool]) -> None:
    give_up = time.monotonic() + 30  # a ceiling on a condition, not a timing
    while not condition():
        assert time.monotonic() < give_up, "the condition never held"
        time.sleep(0.01)
