"""When a live pool's run costs are final: the idle intervals each ended run's batches caused.

The live side of :func:`~esg_prefect.model.attribution.attribute_costs`: a
run's cost is final once the idle interval after each of its batches has
closed (the worker's next batch starts, its keep-alive runs out, or the pool
closes). :class:`CostLedger` follows that as records come in.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from esg_prefect.model.attribution import BatchRecord, IdleRecord

__all__ = ["CostLedger", "run_deadline"]


@dataclass(slots=True)
class _Held:
    """A batch the ledger holds: the idle time attributed to it so far, and whether that is all."""

    batch: BatchRecord
    runs_left: set[str]  # its runs whose costs are not yet released
    idles: list[IdleRecord] = field(default_factory=list)
    after: bool = False  # the idle interval after it is among ``idles``
    settled: bool = False  # the idle interval after it has closed (recorded, or of no length)


class CostLedger:
    """Which ended runs' costs are final, and the idle intervals their batches caused.

    The live side of :func:`attribute_costs`: a pool's records are fed in as
    they come, and a run is *ready* once it has ended and the idle interval
    after each of its batches has closed (its worker ran a later batch, or is
    no longer idle since that batch: keep-alive expiry, eviction, the pool's
    close). :meth:`ready` then hands over the idle intervals attributed to the
    run's batches, so that ``attribute_costs(run's batches, those intervals)``
    gives the run exactly the cost ``attribute_costs`` gives it over all the
    pool's records. Batches are forgotten once every run in them is released.

    Records must each be fed once (the owner follows the pool's record
    indices), a batch before or with the idle interval after it. Not
    thread-safe: its owner serialises calls.

    Example:
        >>> from esg_prefect.model.attribution import BatchItem
        >>> from esg_prefect.model.config import Config
        >>> b = BatchRecord("b1", "w1", (BatchItem("q", "r1"),), Config(1, 1, 0.0), "cpu", 0.0, 10.0)
        >>> ledger = CostLedger()
        >>> ledger.add([b], [])
        >>> ledger.watch("r1", ["b1"])
        >>> ledger.ready()
        []
        >>> ledger.add([], [IdleRecord("w1", 1, 0.0, "cpu", 10.0, 60.0)])
        >>> [(run, [(i.start_ms, i.end_ms) for i in idles]) for run, idles in ledger.ready()]
        [('r1', [(10.0, 60.0)])]
    """

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._on_worker: dict[str, list[_Held]] = {}  # held batches of each worker, by end time
        self._first: dict[str, BatchRecord] = {}  # each worker's first batch (kept: it dates lead idle time)
        self._lead: dict[str, list[IdleRecord]] = {}  # idle time of workers whose first batch is not in yet
        self._waiting: dict[str, set[str]] = {}  # ended run -> its batches not yet settled
        self._batches_of: dict[str, list[str]] = {}  # ended run -> its held batches
        self._ready: list[str] = []
        self.closed = False

    def add(self, batches: Iterable[BatchRecord], idles: Iterable[IdleRecord]) -> None:
        """Take finished batches and closed idle intervals (in any order within one call)."""
        touched: set[str] = set()
        for b in batches:
            if b.batch_id in self._held:
                continue
            h = _Held(b, {i.run_id for i in b.items})
            self._held[b.batch_id] = h
            lst = self._on_worker.setdefault(b.worker_id, [])
            if not lst or lst[-1].batch.end_ms <= b.end_ms:
                lst.append(h)
            else:
                bisect.insort(lst, h, key=lambda x: x.batch.end_ms)
            first = self._first.get(b.worker_id)
            if first is None or b.start_ms < first.start_ms:
                self._first[b.worker_id] = b
            touched.add(b.worker_id)
        for i in idles:
            w = i.worker_id
            lst = self._on_worker.get(w, [])
            k = bisect.bisect_right(lst, i.start_ms, key=lambda x: x.batch.end_ms) - 1
            if k >= 0:
                lst[k].idles.append(i)
                lst[k].after = True
                touched.add(w)
                continue
            first = self._first.get(w)
            if first is not None and first.end_ms <= i.start_ms:
                continue  # the batch before it was released: this interval was seen then
            self._lead.setdefault(w, []).append(i)
            touched.add(w)
        for w in touched:
            self._review(w)

    def _review(self, worker: str) -> None:
        lead, first = self._lead.get(worker), self._first.get(worker)
        if lead and first is not None:
            owner = self._held.get(first.batch_id)
            if owner is not None:
                owner.idles.extend(i for i in lead if first.start_ms >= i.end_ms)
            del self._lead[worker]
        lst = self._on_worker.get(worker, [])
        for h in lst[:-1]:  # a later batch ran on the worker: the idle time between them is in
            self._settle(h)
        if lst and lst[-1].after:
            self._settle(lst[-1])

    def sync(self, idle_since: Mapping[str, float]) -> None:
        """The workers idle now and since when (after :meth:`add` took every record up to now).

        A worker's last batch is settled unless the worker has been idle since that batch ended.
        """
        for w, lst in self._on_worker.items():
            if lst and not lst[-1].settled and idle_since.get(w) != lst[-1].batch.end_ms:
                self._settle(lst[-1])

    def close(self) -> None:
        """The pool closed (after :meth:`add` took its last records): every idle interval has closed.

        Idle time of workers that never ran a batch stays unattributed (the idle line).
        """
        for h in list(self._held.values()):
            self._settle(h)
        self._lead.clear()
        self.closed = True

    def watch(self, run_id: str, batch_ids: Iterable[str]) -> None:
        """Run ``run_id`` ended, with its calls in these batches (ones not held are left out)."""
        held = [bid for bid in dict.fromkeys(batch_ids) if bid in self._held]
        if run_id in self._batches_of:  # ended again (or more calls): one watch
            held = list(dict.fromkeys([*self._batches_of[run_id], *held]))
        waiting = {bid for bid in held if not self._held[bid].settled}
        self._batches_of[run_id] = held
        self._waiting[run_id] = waiting
        if not waiting and run_id not in self._ready:
            self._ready.append(run_id)

    def waiting(self) -> list[BatchRecord]:
        """The batches whose open idle time keeps some ended run's cost from being final."""
        ids = {bid for bids in self._waiting.values() for bid in bids}
        return [self._held[bid].batch for bid in sorted(ids)]

    def pending_runs(self) -> int:
        """Ended runs whose cost is not yet final."""
        return sum(1 for w in self._waiting.values() if w)

    def ready(self) -> list[tuple[str, tuple[IdleRecord, ...]]]:
        """The ended runs whose costs became final since the last call, each with the idle intervals
        attributed to its batches; they are released (forgotten)."""
        out = []
        for run_id in self._ready:
            held = [h for bid in self._batches_of.pop(run_id, []) if (h := self._held.get(bid)) is not None]
            self._waiting.pop(run_id, None)
            out.append((run_id, tuple(i for h in held for i in h.idles)))
            for h in held:
                self._release(h, run_id)
        self._ready = []
        return out

    def _settle(self, h: _Held) -> None:
        if h.settled:
            return
        h.settled = True
        bid = h.batch.batch_id
        for run_id in h.runs_left:
            waiting = self._waiting.get(run_id)
            if waiting and bid in waiting:
                waiting.discard(bid)
                if not waiting:
                    self._ready.append(run_id)

    def _release(self, h: _Held, run_id: str) -> None:
        h.runs_left.discard(run_id)
        if h.runs_left or not h.settled:
            return
        del self._held[h.batch.batch_id]
        lst = self._on_worker[h.batch.worker_id]
        lst.remove(h)
        if not lst:
            del self._on_worker[h.batch.worker_id]


def run_deadline(batches: Iterable[BatchRecord], keep_alive_ms: Callable[[str], float]) -> float | None:
    """When the idle time after these batches closes at the latest, if their workers run nothing else.

    Keep-alive expiry: a batch's end plus its hardware's keep-alive. None for no batches.
    """
    return max((b.end_ms + keep_alive_ms(b.hardware) for b in batches), default=None)
