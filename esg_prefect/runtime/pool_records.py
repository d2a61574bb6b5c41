"""The pool's call records and what it hands its listeners: per-run records, completed batches, snapshots.

Batches, idle time and decisions are the control core's records; this adds
the live platform's own: one :class:`CallRecord` per answered call (its result
without the output, or its error), indexed by flow run, so that a run's end
hands its listeners exactly its calls, batches and the idle time since.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from esg_prefect.control.calls import StageCall, StageResult
from esg_prefect.control.core import Core
from esg_prefect.control.records import (
    BatchDone,
    CallRecord,
    CorrectionRow,
    PoolSnapshot,
    RequestRow,
    RunRecords,
    RunStub,
    WorkerRow,
)
from esg_prefect.control.ring import Ring
from esg_prefect.control.state import Request
from esg_prefect.control.totals import Totals
from esg_prefect.exceptions import PoolClosedError
from esg_prefect.model.attribution import BatchRecord, IdleRecord
from esg_prefect.model.pricing import PriceSheet

if TYPE_CHECKING:
    from esg_prefect.runtime.pool import Pool

T = TypeVar("T")


class CallBook:
    """Call records, and which calls and batches belong to each flow run not yet ended.

    Args:
        memory: call records kept, newest (None: all): a long-lived pool serves
            millions of calls, and its listeners (artifacts, the cost store) have
            each run's records when the run ends.
    """

    def __init__(self, memory: int | None = None) -> None:
        self.calls: list[CallRecord] | Ring[CallRecord] = [] if memory is None else Ring(memory)
        self._calls_of_run: defaultdict[str, list[int]] = defaultdict(list)  # run -> indices in calls
        self._batches_of_run: defaultdict[str, list[int]] = defaultdict(list)  # run -> indices in the batches
        self._name_of_run: dict[str, str] = {}  # run -> its flow run's name, from its calls
        self._idle_cursor = 0  # idle records already handed to run listeners
        self._batch_idle_cursor = 0  # ... and to batch listeners

    def call(
        self,
        c: StageCall,
        ready_ms: float,
        res: StageResult | None,
        err: BaseException | None,
        start: float,
        end: float,
    ) -> None:
        """Record an answered call (records keep no outputs)."""
        self._calls_of_run[c.run_id].append(len(self.calls))  # a Ring counts every call recorded
        if c.run_name:
            self._name_of_run.setdefault(c.run_id, c.run_name)
        result = None if res is None else dataclasses.replace(res, output=None)
        error = "" if err is None else str(err)
        self.calls.append(
            CallRecord(
                c.call_id,
                c.request_id,
                c.run_id,
                c.workflow.name,
                c.stage,
                ready_ms,
                start,
                end,
                err is None,
                result,
                error,
            )
        )

    def forget_run(self, run_id: str) -> None:
        """A run ended with no listener to hand its records to: drop its indexes."""
        self._calls_of_run.pop(run_id, None)
        self._batches_of_run.pop(run_id, None)
        self._name_of_run.pop(run_id, None)

    def batch(self, index: int, runs: set[str]) -> None:
        """The core's batch record ``index`` served these runs."""
        for run in runs:
            self._batches_of_run[run].append(index)

    def run_ended(
        self,
        run_id: str,
        reqs: list[Request],
        core: Core,
        slo_ms: float,
        prices: PriceSheet,
        split: str,
        idle_billing: str,
    ) -> RunRecords:
        """A run's records: its calls and batches, its outcome, and the idle time since the last run ended.

        ``split`` and ``idle_billing`` are the pool's own options, so that any reader of the
        records prices the run as the pool does.
        """
        fleet = core.fleet
        records = RunRecords(
            run_id,
            reqs[0].workflow,
            tuple(self.calls[i] for i in self._calls_of_run.pop(run_id, []) if i >= _first(self.calls)),
            tuple(fleet.batches[i] for i in self._batches_of_run.pop(run_id, []) if i >= _first(fleet.batches)),
            min(r.arrival_ms for r in reqs),
            None if any(r.failed or r.open > 0 for r in reqs) else max(r.last_end_ms for r in reqs),
            slo_ms,
            prices,
            split,  # type: ignore[arg-type]
            tuple(fleet.idles[self._idle_cursor :]),  # a Ring slices by absolute position too
            idle_billing=idle_billing,
            run_name=self._name_of_run.pop(run_id, None),
        )
        self._idle_cursor = len(fleet.idles)
        return records

    def open_runs(self, core: Core, slo: Callable[[str], float]) -> list[RunStub]:
        """The runs whose end has not reached the pool, each at its earliest arrival (by run id)."""
        runs: dict[str, RunStub] = {}
        for req in core.requests.values():
            if not req.closed and (req.run_id not in runs or req.arrival_ms < runs[req.run_id].arrival_ms):
                name = self._name_of_run.get(req.run_id)
                runs[req.run_id] = RunStub(req.run_id, req.workflow, req.arrival_ms, slo(req.workflow), name)
        return [runs[r] for r in sorted(runs)]

    def batch_done(self, done: BatchDone, core: Core, slo: Callable[[str], float]) -> BatchDone:
        """A completed batch as the batch listeners get it: with its runs and the idle time since the last one."""
        first_idle = self._batch_idle_cursor
        idles = tuple(core.fleet.idles[first_idle:])
        self._batch_idle_cursor = len(core.fleet.idles)
        runs: dict[str, RunStub] = {}
        for c in done.calls:
            req = core.requests.get(c.request_id)
            if req is not None and (c.run_id not in runs or req.arrival_ms < runs[c.run_id].arrival_ms):
                runs[c.run_id] = RunStub(
                    c.run_id, req.workflow, req.arrival_ms, slo(req.workflow), self._name_of_run.get(c.run_id)
                )
        index = len(core.fleet.batches) - 1  # the pool hands a batch over as soon as the core records it
        return dataclasses.replace(
            done, runs=tuple(runs.values()), new_idles=idles, batch_index=index, idle_index=first_idle
        )

    def snapshot(
        self,
        core: Core,
        now: float,
        slo: Callable[[str], float],
        enforcement: Mapping[str, str],
        corrections: tuple[CorrectionRow, ...],
        recent: int | None = None,
    ) -> PoolSnapshot:
        """Consistent copies of every record, with the idle time of idle workers counted up to ``now``.

        ``recent``: the newest ``recent`` of each record list only, and no requests (:meth:`Pool.snapshot`).
        """
        fleet = core.fleet
        idles = list(fleet.idles) if recent is None else fleet.idles[-recent:] if recent else []
        closed = len(idles)
        first_idle = len(fleet.idles) - closed
        batches = tail(fleet.batches, recent)
        idle_since: dict[str, float] = {}
        for w in core.fleet.workers.values():
            if not w.busy and w.idle_since_ms is not None:
                idle_since[w.worker_id] = w.idle_since_ms
        idles.extend(core.fleet.open_idles(now))  # idle time so far, not yet closed
        requests = {
            rid: RequestRow(
                r.run_id,
                r.workflow,
                r.arrival_ms,
                r.last_end_ms if r.open <= 0 and not r.failed else None,
                slo(r.workflow),
                r.at_risk,
            )
            for rid, r in (core.requests.items() if recent is None else ())
        }
        workers = tuple(
            WorkerRow(wid, w.stage, w.busy, w.vcpus, w.share, w.hardware, enforcement.get(wid, ""))
            for wid, w in core.fleet.workers.items()
        )

        decisions = core.decisions
        newest = decisions if recent is None else itertools.islice(decisions, max(0, len(decisions) - recent), None)
        return PoolSnapshot(
            tail(self.calls, recent),
            batches,
            tuple(idles),
            tuple(newest),
            requests,
            workers,
            corrections,
            closed,
            idle_since,
            len(fleet.batches) - len(batches),
            first_idle,
            {k: len(q.jobs) for k, q in core.queues.items()},
            core.totals.copy() if core.totals is not None else Totals(),
        )


def _first(records: Sequence[object] | Ring[Any]) -> int:
    """The position of the oldest record kept (0 for a list, which keeps them all)."""
    return records.first if isinstance(records, Ring) else 0


def tail(records: Sequence[T] | Ring[T], recent: int | None) -> tuple[T, ...]:
    """The newest ``recent`` records (None: every one kept)."""
    return tuple(records) if recent is None else tuple(records[-recent:]) if recent else ()


def final_records(
    pool: Pool | object,
) -> tuple[list[BatchRecord] | Ring[BatchRecord], list[IdleRecord] | Ring[IdleRecord]] | None:
    """A closed pool's batches and idle intervals, all closed, in the order it recorded them (None: it never ran).

    Positions are among every record the pool made (a long-lived pool keeps only the newest:
    :class:`~esg_prefect.control.ring.Ring`), as ``BatchDone.batch_index`` numbers them.

    For ``pool_closed()`` listeners (see :data:`~esg_prefect.control.records.RunListener`):
    the pool's loop has stopped, so its records no longer change.
    """
    try:
        fleet = pool.core.fleet  # type: ignore[union-attr]
    except (PoolClosedError, AttributeError):  # never started; or not a pool (a stand-in: nothing to read)
        return None
    return fleet.batches, fleet.idles
