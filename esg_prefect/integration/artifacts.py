"""Prefect artifacts on each flow run: its stage calls, what they cost, why batches were that size.

Two pure builders turn the records a pool hands its run listeners
(:class:`~esg_prefect.control.records.RunRecords`) into

* :func:`run_table`: one row per stage call (stage, batch and its size, how
  many flow runs shared it, worker, device and share, queue wait, predicted
  and actual latency, the call's share of the batch's cost: busy part, idle
  part, total and unit), then a total row: the run's cost;
* :func:`run_summary`: a short markdown account (the run's cost with its
  busy/idle split, SLO met or missed by how much, the scheduler's reason for
  each batch);

and a publisher, :class:`RunPublisher`, that posts them as a table artifact
and a markdown artifact of the flow run.

The cost is the run's one cost figure (``docs/decisions/one-cost.md``), the
same ``esg-prefect costs`` and the demo show: its shares of its batches' busy
time and of the warm idle time those batches caused. It is final only once
the idle interval after each of its batches has closed (the worker's next
batch, its keep-alive expiry, the pool's close), so the publisher waits for
that (:class:`~esg_prefect.model.attribution.CostLedger`), and publishes
whatever is still pending when the pool closes. It names the flow run
explicitly through the client API, so publishing after the flow run ended,
from outside any flow run context, is fine.

Example:
    >>> pool = Pool(backend=InlineBackend())          # doctest: +SKIP
    >>> attach_publisher(pool)                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import httpx

from esg_prefect.model.attribution import (
    CostLedger,
    CostSplit,
    IdleRecord,
    RunCost,
    cost_unit,
    idle_cost,
    idle_owners,
    run_deadline,
    split_weights,
)
from esg_prefect.model.config import CPU
from esg_prefect.runtime.pool_records import final_records

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

    from esg_prefect.control.calls import StageResult
    from esg_prefect.control.records import BatchDone, RunRecords
    from esg_prefect.runtime.pool import Pool

logger = logging.getLogger(__name__)

TABLE_COLUMNS = (
    "stage",
    "status",
    "batch_id",
    "batch_size",
    "runs_in_batch",
    "worker",
    "device",
    "gpu_share",
    "vcpus",
    "queue_wait_ms",
    "predicted_ms",
    "actual_ms",
    "busy_cost",
    "idle_cost",
    "cost",
    "unit",
)
"""Columns of the per-call table, in order."""

TOTAL_STAGE = "total"
"""``stage`` of the table's last row: the run's cost."""


def _ms(value: float) -> float:
    return round(value, 2)


def _money(value: float) -> float:
    """Six significant digits: enough for sub-cent shares, short in the UI."""
    return float(f"{value:.6g}")


def short_id(run_id: str) -> str:
    """The first 8 characters of a run id, as Prefect's UI shows run ids."""
    return run_id[:8]


def artifact_key(prefix: str, run_id: str) -> str:
    """An artifact key: lowercase letters, digits and dashes only, as Prefect requires.

    Example:
        >>> artifact_key("esg-cost", "3F2A9C1E-0B7D-4C1A-9E55-8A8B7C6D5E4F")
        'esg-cost-3f2a9c1e'
    """
    raw = f"{prefix}-{short_id(run_id)}".lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", raw)).strip("-")


def call_costs(records: RunRecords) -> dict[str, RunCost]:
    """Each successful call's share of its batch's cost: busy time and the idle time the batch caused.

    A batch's cost is split among its items by the pool's cost split, and so
    is the idle time attributed to it (``records.caused_idles``); this run's
    part of each is spread evenly over this run's items in the batch (exact
    for the equal split; the pool does not say which item was which call).
    """
    split = cast(CostSplit, records.cost_split)
    prices, unit = records.prices, cost_unit(records.prices)
    batches = {b.batch_id: b for b in records.batches}
    idle_of: defaultdict[str, float] = defaultdict(float)
    if records.idle_billing == "attribute":
        for idle, owner in idle_owners(records.batches, records.caused_idles):
            if owner is not None:
                idle_of[owner.batch_id] += idle_cost(idle, prices)
    out: dict[str, RunCost] = {}
    for c in records.calls:
        res = c.result
        b = batches.get(res.batch_id) if res is not None else None
        if b is None:
            continue
        busy = prices.batch_cost(b.config, b.hardware, b.duration_ms)
        mine = [w for item, w in zip(b.items, split_weights(b.items, split), strict=True) if item.run_id == c.run_id]
        share = sum(mine) / len(mine) if mine else 0.0
        out[c.call_id] = RunCost(busy * share, idle_of[b.batch_id] * share, unit)
    return out


def _cost_cells(cost: RunCost) -> dict[str, Any]:
    return {
        "busy_cost": _money(cost.busy),
        "idle_cost": _money(cost.idle),
        "cost": _money(cost.total),
        "unit": cost.unit,
    }


def run_table(records: RunRecords) -> list[dict[str, Any]]:
    """The rows of a run's table artifact: one per stage call in completion order, then the total.

    A failed call has its error as status and no batch (its share of a batch,
    if it ran in one, is in the total only). The total row's costs are
    :meth:`RunRecords.cost`: the run's one cost figure and its busy/idle split.
    """
    costs = call_costs(records)
    unit = cost_unit(records.prices)
    rows: list[dict[str, Any]] = []
    for c in records.calls:
        r = c.result
        status = "ok" if c.ok else f"failed: {c.error}"[:200]
        cells = _cost_cells(costs.get(c.call_id, RunCost(0.0, 0.0, unit)))
        if r is None:
            rows.append({col: None for col in TABLE_COLUMNS} | {"stage": c.stage, "status": status} | cells)
            continue
        rows.append(
            {
                "stage": c.stage,
                "status": status,
                "batch_id": r.batch_id,
                "batch_size": r.batch_size,
                "runs_in_batch": r.co_batched_runs,
                "worker": r.worker_id,
                "device": r.hardware,
                "gpu_share": r.gpu_share,
                "vcpus": r.vcpus,
                "queue_wait_ms": _ms(r.queue_wait_ms),
                "predicted_ms": _ms(r.predicted_ms),
                "actual_ms": _ms(r.actual_ms),
            }
            | cells
        )
    total = {col: None for col in TABLE_COLUMNS} | {"stage": TOTAL_STAGE, "status": ""} | _cost_cells(records.cost())
    rows.append(total)
    return rows


def _slo_line(records: RunRecords) -> str:
    slo = records.slo_ms
    if records.finish_ms is None:
        failed = sum(1 for c in records.calls if not c.ok)
        return (
            f"**Did not finish**: {failed} of {_plural(len(records.calls), 'stage call', 'stage calls')} failed, "
            f"so the run counts as missing its {slo:.0f} ms SLO."
        )
    latency = records.finish_ms - records.arrival_ms
    if latency <= slo:
        return f"**SLO met**: {latency:.1f} ms end to end, {slo - latency:.1f} ms inside the {slo:.0f} ms SLO."
    return f"**SLO missed** by {latency - slo:.1f} ms: {latency:.1f} ms end to end against a {slo:.0f} ms SLO."


def _where(r: StageResult) -> str:
    device = CPU if r.hardware == CPU else f"{r.hardware} x{r.gpu_share:.2f}"
    return f"{r.worker_id} ({device}, {r.vcpus} vCPU{', cold start' if r.cold_start else ''})"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _cost_line(records: RunRecords, batches: int, shared: int) -> str:
    cost = records.cost()
    u = cost.unit
    head = (
        f"**Cost**: {u}{cost.total:.6g} (busy {u}{cost.busy:.6g} + idle {u}{cost.idle:.6g}), "
        f"this run's share of {_plural(batches, 'batch', 'batches')} ({shared} shared with other flow runs; "
        f"{records.cost_split} split of each batch's cost)"
    )
    if records.idle_billing == "separate":
        head += ". Warm idle time is billed on its own line, to no run (idle billing `separate`)"
    else:
        head += (
            " and, split the same way, of the warm idle time those batches caused: a worker's idle time "
            "goes to the batch that ended just before it, a worker's idle time before its first batch to that batch"
        )
    if records.settled:
        return head + ". Final: the idle time after each of its batches has closed; `esg-prefect costs` shows the same."
    return head + ". Not final yet: idle time after its batches was still open."


def run_summary(records: RunRecords) -> str:
    """The markdown artifact of a run: cost, SLO outcome, and why each batch was the size it was."""
    first_call: dict[str, StageResult] = {}
    stage_of: dict[str, str] = {}
    for c in records.calls:
        if c.result is not None and c.result.batch_id not in first_call:
            first_call[c.result.batch_id] = c.result
            stage_of[c.result.batch_id] = c.stage
    shared = sum(1 for r in first_call.values() if r.co_batched_runs > 1)
    lines = [
        f"### ESG pool: flow run `{short_id(records.run_id)}` of workflow `{records.workflow}`",
        "",
        _slo_line(records),
        "",
        _cost_line(records, len(first_call), shared),
    ]
    if first_call:
        lines += [
            "",
            "#### Why the batches were this size",
            "",
            "Each stage's calls from concurrent flow runs wait in one queue; a batch takes the calls "
            "waiting when the scheduler dispatches, up to the size it chose for the reason given.",
            "",
            "| stage | batch | size | flow runs | worker | scheduler's reason |",
            "|---|---|---|---|---|---|",
        ]
        for bid, r in first_call.items():
            reason = r.reason or "(none given)"
            if r.at_risk:
                reason += " - at risk of missing the SLO"
            lines.append(
                f"| {_cell(stage_of[bid])} | {_cell(bid)} | {r.batch_size} | {r.co_batched_runs} "
                f"| {_cell(_where(r))} | {_cell(reason)} |"
            )
    return "\n".join(lines) + "\n"


# ---- publishing ------------------------------------------------------------------------------


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


def publish_run(records: RunRecords, client: SyncPrefectClient | None = None) -> tuple[uuid.UUID, uuid.UUID] | None:
    """Create the table and markdown artifacts of a run on its Prefect flow run.

    Args:
        records: the run's records (``run_id`` is the Prefect flow run id).
        client: a sync Prefect client; default :func:`api_client`.

    Returns:
        The ids of the table and markdown artifacts, or None when ``run_id`` is
        not a flow run id (a stage called outside a flow run).
    """
    from prefect.client.schemas.actions import ArtifactCreate

    try:
        flow_run_id = uuid.UUID(records.run_id)
    except ValueError:
        return None
    short = short_id(records.run_id)
    c = client if client is not None else api_client()
    table = c.create_artifact(
        ArtifactCreate(
            type="table",
            key=artifact_key("esg-cost", records.run_id),
            description=f"ESG pool: stage calls of flow run {short}, their batches and cost shares",
            data=json.dumps(run_table(records)),
            flow_run_id=flow_run_id,
        )
    )
    summary = c.create_artifact(
        ArtifactCreate(
            type="markdown",
            key=artifact_key("esg-summary", records.run_id),
            description=f"ESG pool: cost and SLO of flow run {short}",
            data=run_summary(records),
            flow_run_id=flow_run_id,
        )
    )
    return table.id, summary.id


class RunPublisher:
    """A pool's run and batch listener: publishes each flow run's artifacts once its cost is final.

    It follows the pool's batches and closed idle intervals in a
    :class:`~esg_prefect.model.attribution.CostLedger`. An ended run is
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
        poll: bool = True,
        grace_ms: float = 1000.0,
    ) -> None:
        self.pool = pool
        self.client = client
        self._publish_fn = publish
        self.on_idles = on_idles
        self.poll_enabled = poll and pool is not None
        self.grace_ms = grace_ms
        self._warned = False
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

    def _billing(self) -> str:
        settings = getattr(self.pool, "settings", None)
        return str(getattr(settings, "idle_billing", "attribute"))

    def __call__(self, records: RunRecords) -> None:
        """A flow run ended (on the pool's listener thread): publish it once its cost is final."""
        if not records.calls:  # the run ended again (its calls were handed over the first time): nothing new
            return
        billing = self._billing()
        with self._lock:
            if billing == "separate" or self._ledger.closed:
                self._queue.append(dataclasses.replace(records, settled=True, idle_billing=billing))
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
            new_idles = list(snap.idles[self._next_idle : snap.closed_idles])
            if self._next_batch <= len(snap.batches):  # the snapshot is no older than what the ledger holds
                self._ledger.add(snap.batches[self._next_batch :], new_idles)
                self._next_batch, self._next_idle = len(snap.batches), max(self._next_idle, snap.closed_idles)
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
        billing = self._billing()
        for run_id, idles in self._ledger.ready():
            records = self._ended.pop(run_id, None)
            if records is not None:
                self._queue.append(dataclasses.replace(records, caused_idles=idles, settled=True, idle_billing=billing))

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
        """Post one run's artifacts now; an unreachable API is warned of once, then logged at debug level."""
        try:
            if self._publish_fn is not None:
                self._publish_fn(records)
            else:
                publish_run(records, self.client)
        except httpx.HTTPError as exc:  # the API is down or refuses: the run itself is unaffected
            with self._lock:
                first, self._warned = not self._warned, True
            if first:
                logger.warning(
                    "could not publish ESG artifacts of flow run %s (%s); check PREFECT_API_URL, "
                    "or pass ESGTaskRunner(artifacts=False). Further failures are logged at debug level.",
                    records.run_id,
                    exc,
                )
            else:
                logger.debug("could not publish ESG artifacts of flow run %s: %s", records.run_id, exc)
        except Exception:  # whatever else goes wrong, the other runs are still published
            logger.exception("publishing ESG artifacts of flow run %s failed", records.run_id)


def attach_publisher(pool: Pool, *, on_idles: Callable[[Sequence[IdleRecord]], None] | None = None) -> RunPublisher:
    """Publish the artifacts of every flow run that ends in ``pool``, once its cost is final.

    Attach it before the pool's first call (it follows every batch and idle interval).
    """
    publisher = RunPublisher(pool, on_idles=on_idles)
    pool.add_run_listener(publisher)
    pool.add_batch_listener(publisher.on_batches)
    return publisher
