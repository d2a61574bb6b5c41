"""Publishing each pooled flow run's cost on Prefect: its artifacts and its runs-list tags.

What is shown is built in :mod:`esg_prefect.integration.run_views`; here it is
posted, once the run's cost is final:

* :func:`publish_run`: a table artifact (:func:`run_table`) and a markdown
  artifact (:func:`run_summary`) on the flow run, then the run's cost and SLO
  tags (:func:`tag_run`), which the Prefect UI shows on the runs list and in
  the run's header (``docs/decisions/ui-cost.md``);
* :class:`RunPublisher`: the pool's listener that decides when.

The cost is the run's one cost figure (``docs/decisions/one-cost.md``), the
same ``esg-prefect costs`` and the demo show: its shares of its batches' busy
time and of the warm idle time those batches caused. It is final only once
the idle interval after each of its batches has closed (the worker's next
batch, its keep-alive expiry, the pool's close), so the publisher waits for
that (:class:`~esg_prefect.model.ledger.CostLedger`), and publishes
whatever is still pending when the pool closes. It names the flow run
explicitly through the client API, so publishing after the flow run ended,
from outside any flow run context, is fine; tags are the one flow run field
Prefect lets a client change after the run ended (``PATCH /flow_runs/{id}``).

Example:
    >>> pool = Pool(backend=InlineBackend())          # doctest: +SKIP
    >>> attach_publisher(pool)                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import httpx

# The builders are imported from here too (they lived here before run_views.py): re-exported.
from esg_prefect.integration.run_views import artifact_key as artifact_key
from esg_prefect.integration.run_views import call_costs as call_costs
from esg_prefect.integration.run_views import merged_tags
from esg_prefect.integration.run_views import money as money
from esg_prefect.integration.run_views import run_summary as run_summary
from esg_prefect.integration.run_views import run_table as run_table
from esg_prefect.model.attribution import IdleRecord
from esg_prefect.model.ledger import CostLedger, run_deadline
from esg_prefect.model.money import ROUNDED_NOTE
from esg_prefect.runtime.pool_records import final_records

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

    from esg_prefect.control.records import BatchDone, RunRecords
    from esg_prefect.runtime.pool import Pool

logger = logging.getLogger(__name__)

_money = money  # its name before run_views.py, which tests/test_one_cost.py imports


_client_lock = threading.Lock()  # guards _api_client: the listener threads of several pools share it
_api_client: tuple[str, SyncPrefectClient] | None = None


def api_client() -> SyncPrefectClient:
    """A sync Prefect client kept open for the listener threads, for the API configured now.

    Building a client costs about 35 ms of CPU, a request on an open one 2 to 8 ms:
    one client serves every run's artifacts. A new one is made when ``PREFECT_API_URL``
    changes (a test harness, a profile switch).
    """
    global _api_client
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = str(PREFECT_API_URL.value() or "")
    with _client_lock:
        if _api_client is not None and _api_client[0] == url:
            return _api_client[1]
        old, client = _api_client, get_client(sync_client=True)
        client.__enter__()
        _api_client = (url, client)
    if old is not None:
        with contextlib.suppress(Exception):  # best effort: the old server may be gone
            old[1].__exit__(None, None, None)
    return client


def flow_run_id_of(records: RunRecords) -> uuid.UUID | None:
    """The Prefect flow run of a run's records; None when ``run_id`` is not one (a stage called outside a flow run)."""
    try:
        return uuid.UUID(records.run_id)
    except ValueError:
        return None


def publish_run(records: RunRecords, client: SyncPrefectClient | None = None) -> tuple[uuid.UUID, uuid.UUID] | None:
    """Create the table and markdown artifacts of a run on its Prefect flow run, then tag it (:func:`tag_run`).

    Args:
        records: the run's records (``run_id`` is the Prefect flow run id).
        client: a sync Prefect client; default :func:`api_client`.

    Returns:
        The ids of the table and markdown artifacts, or None when ``run_id`` is
        not a flow run id.
    """
    from prefect.client.schemas.actions import ArtifactCreate

    flow_run_id = flow_run_id_of(records)
    if flow_run_id is None:
        return None
    c = client if client is not None else api_client()
    table = c.create_artifact(
        ArtifactCreate(
            type="table",
            key=artifact_key("esg-cost", records.run_id),
            description=(
                f"ESG pool: stage calls of flow run {records.run_id}, their batches and cost shares ({ROUNDED_NOTE})"
            ),
            data=json.dumps(run_table(records)),
            flow_run_id=flow_run_id,
        )
    )
    summary = c.create_artifact(
        ArtifactCreate(
            type="markdown",
            key=artifact_key("esg-summary", records.run_id),
            description=f"ESG pool: cost and SLO of flow run {records.run_id}",
            data=run_summary(records),
            flow_run_id=flow_run_id,
        )
    )
    tag_run(records, c)
    return table.id, summary.id


def tag_run(records: RunRecords, client: SyncPrefectClient | None = None) -> list[str] | None:
    """Put the run's cost and SLO tags in front of its flow run's tags (:func:`merged_tags`).

    The flow run's own tags are kept. Read, then written whole (the API has no
    "add a tag"): a tag added to the run in between would be lost, which, with
    the run ended, only a person editing it at that moment could do.

    Returns:
        The flow run's tags now; None when ``run_id`` is not a flow run id or
        the flow run is gone (deleted before its cost settled).
    """
    from prefect.exceptions import ObjectNotFound

    flow_run_id = flow_run_id_of(records)
    if flow_run_id is None:
        return None
    c = client if client is not None else api_client()
    try:
        existing = list(c.read_flow_run(flow_run_id).tags)
    except ObjectNotFound:
        logger.info("flow run %s is gone: its cost is not tagged on it", records.run_id)
        return None
    tags = merged_tags(existing, records)
    if tags != existing:
        c.update_flow_run(flow_run_id, tags=tags)
    return tags


class RunPublisher:
    """A pool's run and batch listener: publishes each flow run's artifacts and tags once its cost is final.

    It follows the pool's batches and closed idle intervals in a
    :class:`~esg_prefect.model.ledger.CostLedger`. An ended run is
    published when the idle interval after each of its batches has closed:
    most often a later batch on the same worker shows that (the pool hands
    closed idle time over with each batch); when the pool goes quiet, the
    keep-alive expiry does, which the publisher checks in a snapshot of the
    pool once the expiry is past (``poll``); at the pool's close
    (:meth:`pool_closed`) every run still pending is published. Under
    ``idle_billing="separate"`` a run's cost is final when it ends.

    Artifacts are posted from a thread of the publisher's own, so that the
    pool's listeners (the cost store, the pool service's answers) never wait
    on the Prefect API; if the API cannot be reached, it warns once.

    Args:
        pool: the pool (its clock, keep-alive, snapshots and final records);
            None for a publisher fed by hand (:meth:`publish` only).
        client: the Prefect client to post with; default :func:`api_client`.
        publish: what to do with a run's settled records instead of posting them
            (tests; default :func:`publish_run`).
        on_idles: called with closed idle intervals the publisher learned from a
            snapshot, before it publishes the runs they settle (the cost store's
            ``StoreAttachment.store_idles``, so that it shows the same figure).
        complete: called with a settled run's records before they are published, on the
            publisher's thread; returns them with what this pool did not serve (the cost
            store's ``StoreAttachment.with_earlier``: the run's calls served by an earlier
            instance of a restarted pool service, so that the figure is the store's).
        poll: check the pool's snapshot for expired keep-alives (off: only batches
            and the pool's close settle runs).
        grace_ms: how long past a keep-alive's expiry, on the pool's clock, before
            a snapshot is taken (a busy pool hands the closed idle time over
            with its next batch first), and the least time between snapshots.
    """

    def __init__(
        self,
        pool: Pool | None = None,
        *,
        client: SyncPrefectClient | None = None,
        publish: Callable[[RunRecords], object] | None = None,
        on_idles: Callable[[Sequence[IdleRecord]], None] | None = None,
        complete: Callable[[RunRecords], RunRecords] | None = None,
        poll: bool = True,
        grace_ms: float = 1000.0,
    ) -> None:
        self.pool = pool
        self.client = client
        self._publish_fn = publish
        self.on_idles = on_idles
        self.complete = complete
        self.poll_enabled = poll and pool is not None
        self.grace_ms = grace_ms
        self._warned: set[str] = set()  # what failed and was warned of once: "api", "store"
        self._lock = threading.Lock()  # guards everything below: listener, publisher and closing threads
        self._wake = threading.Condition(self._lock)
        self._ledger = CostLedger()
        self._ended: dict[str, RunRecords] = {}  # ended runs whose cost is not final yet
        self._queue: list[RunRecords] = []  # settled runs to publish
        self._next_batch = 0  # the pool's batch records up to here are in the ledger
        self._next_idle = 0  # ... and its idle records
        self._last_poll_ms = float("-inf")
        self._stopped = False
        self._thread: threading.Thread | None = None

    # ---- what the pool hands over ----------------------------------------------------------

    def __call__(self, records: RunRecords) -> None:
        """A flow run ended (on the pool's listener thread): publish it once its cost is final."""
        if not (records.calls or records.earlier):  # ended again (its calls were handed over before): nothing new
            return
        with self._lock:  # the records carry the pool's own idle billing (runtime.pool_records)
            # Settled already: a run whose calls all ran on an earlier instance (the store's lookup).
            if records.settled or records.idle_billing == "separate" or self._ledger.closed:
                self._queue.append(dataclasses.replace(records, settled=True))
            else:
                self._ended[records.run_id] = records
                self._ledger.watch(records.run_id, [b.batch_id for b in records.batches])
                self._take_ready()
        self._kick()

    def on_batches(self, done: Sequence[BatchDone]) -> None:
        """Batches completed (on the pool's listener thread), with the idle intervals closed since."""
        with self._lock:
            for d in done:
                if d.batch_index < 0 or d.idle_index < 0:  # not numbered: take it as it comes
                    self._ledger.add([d.batch], d.new_idles)
                    continue
                batch = [d.batch] if d.batch_index >= self._next_batch else []
                self._ledger.add(batch, d.new_idles[max(0, self._next_idle - d.idle_index) :])
                self._next_batch = max(self._next_batch, d.batch_index + 1)
                self._next_idle = max(self._next_idle, d.idle_index + len(d.new_idles))
            self._take_ready()
        self._kick()

    def poll(self, timeout_s: float = 5.0) -> None:
        """Take a snapshot of the pool and settle the runs whose idle time has closed since."""
        if self.pool is None:
            return
        try:
            snap = self.pool.snapshot(timeout_s)
        except Exception as exc:  # the pool is closing (its close settles everything), or busy
            logger.debug("no snapshot of the pool for settling run costs: %s", exc)
            return
        if snap.closed_idles is None:
            return
        new_idles: list[IdleRecord] = []
        with self._lock:
            if self._ledger.closed:
                return
            # Positions are among every record the pool made; the snapshot's tuples start at first_*.
            fb, fi = snap.first_batch, snap.first_idle
            new_idles = list(snap.idles[max(0, self._next_idle - fi) : snap.closed_idles])
            if self._next_batch <= fb + len(snap.batches):  # the snapshot is no older than what the ledger holds
                self._ledger.add(snap.batches[max(0, self._next_batch - fb) :], new_idles)
                self._next_batch = fb + len(snap.batches)
                self._next_idle = max(self._next_idle, fi + snap.closed_idles)
                self._ledger.sync(snap.idle_since)
            else:
                new_idles = []
        if new_idles and self.on_idles is not None:
            try:
                self.on_idles(new_idles)
            except Exception:  # the store's failure must not keep the artifacts back
                logger.exception("storing the idle intervals learned from a snapshot failed")
        with self._lock:
            self._take_ready()
        self._kick()

    def pool_closed(self) -> None:
        """The pool closed: every idle interval has closed; publish every ended run still pending."""
        self._stop()
        final = final_records(self.pool) if self.pool is not None else None
        with self._lock:
            if final is not None:
                batches, idles = final
                self._ledger.add(batches[self._next_batch :], idles[self._next_idle :])
                self._next_batch, self._next_idle = len(batches), len(idles)
            self._ledger.close()
            self._take_ready()
            queue, self._queue = self._queue, []
        for records in queue:
            self.publish(records)

    def _take_ready(self) -> None:
        """Queue the runs the ledger says are settled (holding the lock)."""
        for run_id, idles in self._ledger.ready():
            records = self._ended.pop(run_id, None)
            if records is not None:
                self._queue.append(dataclasses.replace(records, caused_idles=idles, settled=True))

    # ---- the publisher's thread ---------------------------------------------------------------

    def _kick(self) -> None:
        """Wake the publisher's thread (started on first use) for queued runs or a new keep-alive to watch."""
        with self._lock:
            if self._stopped or (not self._queue and not self._ended):
                return
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="esg-artifacts", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # interpreter shutdown: the pool's close publishes what is queued
                    return
                self._thread = thread
            self._wake.notify()

    def _next_poll_ms(self) -> float | None:
        """When to take the next snapshot, on the pool's clock (None: nothing to wait for); holding the lock."""
        if not self.poll_enabled or self.pool is None or not self._ended:
            return None
        keep = self.pool.keep_alive_ms()
        longest = max(keep.values(), default=60_000.0)
        deadline = run_deadline(self._ledger.waiting(), lambda hw: keep.get(hw, longest))
        if deadline is None:
            return None
        return max(deadline + self.grace_ms, self._last_poll_ms + self.grace_ms)

    def _run(self) -> None:
        while True:
            with self._lock:
                due = False
                while not self._stopped and not self._queue:
                    at = self._next_poll_ms()
                    if at is not None and self.pool is not None:
                        now = self.pool.clock.now()
                        if now >= at:
                            self._last_poll_ms = now
                            due = True
                            break
                        # Real seconds to wait: the pool's clock may be a test's, so look again within 1 s.
                        self._wake.wait(min(max((at - now) / 1000.0, 0.01), 1.0))
                    else:
                        self._wake.wait()
                if self._stopped:
                    return
                queue, self._queue = self._queue, []
            for records in queue:
                self.publish(records)
            if due:
                self.poll()

    def _stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10.0)

    # ---- posting --------------------------------------------------------------------------------

    def publish(self, records: RunRecords) -> None:
        """Post one run's artifacts and tags now; an unreachable API is warned of once, then logged at debug level."""
        if self.complete is not None:
            try:
                records = self.complete(records)
            except Exception as exc:  # the store cannot be read: this pool's part is still published
                # Once, in one line: a store that is down fails every run, and a traceback each said nothing more.
                self._warn_once(
                    "store",
                    "could not read the earlier part of flow run %s from the cost store (%s: %s); its artifacts "
                    "show this pool's part only. Further failures are logged at debug level.",
                    "could not read the earlier part of flow run %s from the cost store: %s: %s",
                    records.run_id,
                    type(exc).__name__,
                    exc,
                )
        try:
            if self._publish_fn is not None:
                self._publish_fn(records)
            else:
                publish_run(records, self.client)
        except httpx.HTTPError as exc:  # the API is down or refuses: the run itself is unaffected
            self._warn_once(
                "api",
                "could not publish ESG artifacts of flow run %s (%s); check PREFECT_API_URL, "
                "or pass ESGTaskRunner(artifacts=False). Further failures are logged at debug level.",
                "could not publish ESG artifacts of flow run %s: %s",
                records.run_id,
                exc,
            )
        except Exception:  # whatever else goes wrong, the other runs are still published
            logger.exception("publishing ESG artifacts of flow run %s failed", records.run_id)

    def _warn_once(self, what: str, warning: str, debug: str, *args: object) -> None:
        """Log ``warning`` the first time ``what`` fails, ``debug`` after: a failure each run repeats says no more."""
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        logger.log(logging.WARNING if first else logging.DEBUG, warning if first else debug, *args)


def attach_publisher(
    pool: Pool,
    *,
    on_idles: Callable[[Sequence[IdleRecord]], None] | None = None,
    complete: Callable[[RunRecords], RunRecords] | None = None,
) -> RunPublisher:
    """Publish the artifacts of every flow run that ends in ``pool``, once its cost is final.

    Attach it before the pool's first call (it follows every batch and idle interval).
    ``on_idles`` and ``complete``: see :class:`RunPublisher`.
    """
    publisher = RunPublisher(pool, on_idles=on_idles, complete=complete)
    pool.add_run_listener(publisher)
    pool.add_batch_listener(publisher.on_batches)
    return publisher
