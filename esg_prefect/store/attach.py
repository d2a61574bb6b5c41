"""Attaching a cost store to a pool: a run and batch listener with a scope of its own.

Each batch is stored as it completes, and each run's own row when it ends, so
that a pool killed mid-run loses only the batches it had not yet handed to its
listener thread. Idle intervals are stored as the pool hands them over (closed
since the previous batch or run), and when the pool closes every one still
unstored: the idle time after the last batches, which closes only then, is
part of their runs' costs.

The pool numbers batches and workers from 1 (``b1``, ``w1``) in every process;
each attachment draws a random scope that prefixes them in the store, so that
pools of one process, and processes writing one store, never share an id. The
store keeps the pool's cost split and idle billing under that scope, with its
first records, so that it prices them as the pool's artifacts do.

Across a pool service restart (``docs/decisions/one-cost.md``): at its close a
pool stores the start of each run it held that had not ended; a run's end that
reaches a pool holding none of its calls is looked up in the store, and a run
an earlier instance served is ended and published from there.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from esg_prefect.runtime.pool_records import final_records
from esg_prefect.store.billing import billing_of
from esg_prefect.store.cost_store import CostStore
from esg_prefect.store.earlier import earlier_parts, ended_elsewhere

if TYPE_CHECKING:
    from esg_prefect.control.records import BatchDone, RecordSource, RunRecords
    from esg_prefect.model.attribution import IdleRecord

logger = logging.getLogger(__name__)
_V = TypeVar("_V")

_MEMORY = 10_000  # runs each of an attachment's memories keeps, newest first


class StoreAttachment:
    """A pool's run listener that writes each ended run to a store, under a scope of its own.

    The scope keeps this pool's ``b1``/``w1`` apart from every other pool's, in
    this process and in others writing the same store. It has 16 random hex
    digits (64 bits): a store may see a pool per deployment run, millions over
    its life, and two equal scopes would merge their batches.
    """

    def __init__(
        self,
        pool: RecordSource,
        store: CostStore,
        deployment_of: Callable[[str], str | None] | None = None,
        name_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.scope = uuid.uuid4().hex[:16]
        self.billing = billing_of(pool)  # None for a source without settings: the store's defaults
        self.deployment_of = deployment_of
        self.name_of = name_of
        self._idles_seen = 0  # the pool's idle records up to here came with batches
        self._found: OrderedDict[str, None] = OrderedDict()  # runs ended_elsewhere found: an end posted again is not
        # run -> its (start, finish) as stored, where its records differ (an earlier instance's part)
        self._stored: OrderedDict[str, tuple[float, float | None]] = OrderedDict()
        self._lock = threading.Lock()  # _stored: written on the listeners' thread, read on the publisher's

    def __call__(self, records: RunRecords) -> None:
        """Record one run (called by the pool on its listener thread)."""
        deployment = _looked_up(self.deployment_of, records.run_id, "deployment name")
        # The name its calls carried (in-process or over the pool service's wire); else a lookup's.
        name = records.run_name or _looked_up(self.name_of, records.run_id, "flow run name")
        # Its batches and calls were stored as they completed (on_batches, earlier on this thread).
        stored = self.store.record_run(
            records, scope=self.scope, deployment=deployment, billing=self.billing, name=name
        )
        if stored != (records.arrival_ms, records.finish_ms):  # an earlier instance started it, or failed a call
            with self._lock:  # with_earlier publishes the run as stored
                _remember(self._stored, records.run_id, stored)

    def on_batches(self, done: Sequence[BatchDone]) -> None:
        """Record batches as they complete (called by the pool on its listener thread).

        A run's provisional row carries its deployment from its first batch on: a run whose process
        dies never ends here, and ``costs --by deployment`` would file it under none.
        """
        deployments: dict[str, str | None] = {}
        for r in (r for d in done for r in d.runs):
            if r.run_id not in deployments:
                deployments[r.run_id] = _looked_up(self.deployment_of, r.run_id, "deployment name")
        self.store.record_batches(done, scope=self.scope, billing=self.billing, deployments=deployments)
        for d in done:
            if d.idle_index >= 0:
                self._idles_seen = max(self._idles_seen, d.idle_index + len(d.new_idles))

    def store_idles(self, idles: Sequence[IdleRecord]) -> None:
        """Store closed idle intervals learned elsewhere (the artifact publisher's settle checks)."""
        self.store.record_idles(idles, self.pool.prices, scope=self.scope, billing=self.billing)

    def with_earlier(self, records: RunRecords) -> RunRecords:
        """A run's settled records, with the parts earlier instances of the pool served (from the store).

        The artifact publisher's ``complete`` hook: a pool service restarted while the run was in
        flight stored the run's first calls under another scope; they join the records
        (:attr:`~esg_prefect.control.records.RunRecords.earlier`), so that the run's published
        figure is the store's. The run starts and finishes as its stored row does, so that its SLO
        outcome is the store's too: at its first arrival (an earlier instance's, even one that only
        queued its calls and kept the start at its close), with no finish if a call failed there, as
        :meth:`__call__` found when it wrote the row (no read here). A run this pool served whole
        comes back as it is.
        """
        with self._lock:
            stored = self._stored.pop(records.run_id, None)
        if records.earlier:  # read already (ended_elsewhere)
            return records
        if stored is not None:
            records = dataclasses.replace(records, arrival_ms=stored[0], finish_ms=stored[1])
        parts = earlier_parts(self.store, records, self.scope, {c.call_id for c in records.calls})
        return dataclasses.replace(records, earlier=parts, arrival_ms=parts[0].arrival_ms) if parts else records

    def ended_elsewhere(self, run_id: str) -> RunRecords | None:
        """The records of a run that ended in the pool while it held none of its calls, from the store.

        The pool's run lookup (:meth:`~esg_prefect.runtime.pool.Pool.add_run_lookup`): a pool
        service restarted after the run's last call, whose earlier instance stored the whole run.
        Its run listeners (this one, the artifact publisher) get the records as the run's, so that
        it is published, and its row finished, as a run spanning the restart is. None (no part
        stored elsewhere, or found once already): nothing to do; one indexed read for a run the
        store has no row of.
        """
        if run_id in self._found:
            return None
        billing = self.billing or self.store.default_billing
        found = ended_elsewhere(
            self.store, run_id, self.scope, self.pool.prices, billing.cost_split, billing.idle_billing
        )
        if found is not None:
            _remember(self._found, run_id, None)
        return found

    def pool_closed(self) -> None:
        """Store the idle intervals not yet stored, closed by now, and the start of each run not ended.

        Called once, when the pool closes. A pool service stopped while a run's calls
        queued stored no batch of it: its row keeps where it started (``record_open_runs``).
        """
        final = final_records(self.pool)
        if final is not None:
            self.store.record_idles(
                final[1][self._idles_seen :], self.pool.prices, scope=self.scope, billing=self.billing
            )
        open_runs = getattr(self.pool, "open_runs", None)
        runs = open_runs() if callable(open_runs) else []
        if runs:
            deployments = {r.run_id: _looked_up(self.deployment_of, r.run_id, "deployment name") for r in runs}
            self.store.record_open_runs(runs, scope=self.scope, billing=self.billing, deployments=deployments)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Store the pool's idle intervals up to now, open ones included.

        The pool hands closed idle intervals to listeners when a run ends, so
        idle time after the last run would be missed; call this before closing a
        pool whose idle time should be billed. A later, longer copy of an open
        interval replaces the stored one.
        """
        snap = self.pool.snapshot(timeout_s)
        self.store.record_idles(snap.idles, self.pool.prices, scope=self.scope, billing=self.billing)


def _remember(memory: OrderedDict[str, _V], run_id: str, value: _V) -> None:
    """Keep ``run_id -> value``, forgetting the oldest beyond :data:`_MEMORY`."""
    memory[run_id] = value
    while len(memory) > _MEMORY:
        memory.popitem(last=False)


def _looked_up(lookup: Callable[[str], str | None] | None, run_id: str, what: str) -> str | None:
    """``lookup(run_id)``, or None when there is no lookup or it fails: a failed lookup must not lose the run."""
    if lookup is None:
        return None
    try:
        return lookup(run_id)
    except Exception as exc:
        logger.debug("no %s for run %s: %s", what, run_id, exc)
        return None


def attach_store(
    pool: RecordSource,
    store: CostStore,
    *,
    deployment_of: Callable[[str], str | None] | None = None,
    name_of: Callable[[str], str | None] | None = None,
) -> StoreAttachment:
    """Record every flow run that ends in ``pool`` into ``store``.

    Args:
        pool: the pool.
        store: the store.
        deployment_of: ``run_id -> deployment name or None``, called on the listener
            thread (the Prefect integration passes an API lookup) with a run's batches and at
            its end; a lookup that answers only once is enough (a name stored is kept).
        name_of: ``run_id -> flow run name or None``, likewise, for runs whose records carry
            no name (their calls said none).

    Returns:
        The listener, whose :meth:`StoreAttachment.flush` stores trailing idle time.
    """
    attachment = StoreAttachment(pool, store, deployment_of, name_of)
    pool.add_run_listener(attachment)
    pool.add_batch_listener(attachment.on_batches)
    add_lookup = getattr(pool, "add_run_lookup", None)  # a source without one ends only runs it served
    if callable(add_lookup):
        add_lookup(attachment.ended_elsewhere)
    return attachment
