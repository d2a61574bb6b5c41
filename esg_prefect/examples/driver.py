"""Drive flow runs from a list of arrivals: the live half of an experiment.

Each arrival starts one flow run at its arrival time (relative to the start of
the run), in a thread, up to ``max_concurrency`` at once; the flow's latency is
measured from the arrival to the flow's return, so waiting for a thread counts
against the request as it would against a user. The demo and the runtime
benchmark drive the example pipelines with it under different task runners.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request as the client saw it."""

    index: int
    workflow: str
    arrival_ms: float
    end_ms: float
    ok: bool
    error: str = ""

    @property
    def latency_ms(self) -> float:
        """From arrival to the flow's return."""
        return self.end_ms - self.arrival_ms


def run_workload(
    arrivals: Sequence[tuple[float, str]],
    call: Callable[[int, str], Any],
    max_concurrency: int = 64,
    on_done: Callable[[RequestOutcome], None] | None = None,
) -> list[RequestOutcome]:
    """Start ``call(index, workflow)`` at each arrival time and wait for all.

    Args:
        arrivals: ``(arrival_ms, workflow)`` pairs in time order, relative to now.
        call: runs one request (a flow call); raising marks the request failed.
        max_concurrency: most requests in flight at once.
        on_done: called as each request finishes (progress bars).
    """
    t0 = time.perf_counter()

    def now_ms() -> float:
        return (time.perf_counter() - t0) * 1000.0

    def one(i: int, arrival: float, workflow: str) -> RequestOutcome:
        try:
            call(i, workflow)
            out = RequestOutcome(i, workflow, arrival, now_ms(), True)
        except Exception as exc:  # a failed request is an outcome to report, not a crash of the driver
            out = RequestOutcome(i, workflow, arrival, now_ms(), False, f"{type(exc).__name__}: {exc}")
        if on_done is not None:
            on_done(out)
        return out

    futures = []
    with concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="esg-request") as ex:
        for i, (arrival, workflow) in enumerate(arrivals):
            delay = arrival - now_ms()
            if delay > 0:
                time.sleep(delay / 1000.0)
            # Each request runs in a copy of the caller's context, so that Prefect settings
            # contexts (``temporary_settings``) around this call apply to its flow runs.
            futures.append(ex.submit(contextvars.copy_context().run, one, i, arrival, workflow))
        return [f.result() for f in futures]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]
