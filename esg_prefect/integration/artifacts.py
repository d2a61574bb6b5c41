"""Prefect artifacts on each flow run: its stage calls, what they cost, why batches were that size.

Two pure builders turn the records a pool hands its run listeners
(:class:`~esg_prefect.runtime.pool.RunRecords`) into

* :func:`run_table`: one row per stage call (stage, batch and its size, how
  many flow runs shared it, worker, device and share, queue wait, predicted
  and actual latency, the call's share of the batch cost), then a total row;
* :func:`run_summary`: a short markdown account (cost of the run, SLO met or
  missed by how much, the scheduler's reason for each batch);

and a thin publisher, :func:`publish_run`, posts them as a table artifact and
a markdown artifact of the flow run. It runs on the pool's listener thread,
outside any flow run context, so it names the flow run explicitly through
the client API (``create_table_artifact`` would look for a context).

Costs here are the run's shares of its batches' busy time. Warm idle time of
the workers is billed once the idle interval has ended, by the cost store
(``esg-prefect costs``), so the artifact's total is the busy part.

Example:
    >>> pool = Pool(backend=InlineBackend())          # doctest: +SKIP
    >>> attach_publisher(pool)                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any, cast

import httpx

from esg_prefect.model.attribution import CostSplit, split_weights
from esg_prefect.model.config import CPU

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

    from esg_prefect.control.calls import StageResult
    from esg_prefect.control.records import RunRecords
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
    "cost",
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


def call_costs(records: RunRecords) -> dict[str, float]:
    """Each successful call's share of its batch's cost (busy time only).

    A batch's cost is split among its items by the pool's cost split; this
    run's part of it is spread evenly over this run's items in the batch
    (exact for the equal split; the pool does not say which item was which call).
    """
    split = cast(CostSplit, records.cost_split)
    batches = {b.batch_id: b for b in records.batches}
    out: dict[str, float] = {}
    for c in records.calls:
        res = c.result
        b = batches.get(res.batch_id) if res is not None else None
        if b is None:
            continue
        cost = records.prices.batch_cost(b.config, b.hardware, b.duration_ms)
        mine = [w for item, w in zip(b.items, split_weights(b.items, split), strict=True) if item.run_id == c.run_id]
        out[c.call_id] = cost * sum(mine) / len(mine) if mine else 0.0
    return out


def run_table(records: RunRecords) -> list[dict[str, Any]]:
    """The rows of a run's table artifact: one per stage call in completion order, then the total.

    A failed call has its error as status and no batch (its share of a batch,
    if it ran in one, is in the total only). The total row's cost is
    :meth:`RunRecords.busy_cost`.
    """
    costs = call_costs(records)
    rows: list[dict[str, Any]] = []
    for c in records.calls:
        r = c.result
        status = "ok" if c.ok else f"failed: {c.error}"[:200]
        if r is None:
            rows.append({col: None for col in TABLE_COLUMNS} | {"stage": c.stage, "status": status, "cost": 0.0})
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
                "cost": _money(costs.get(c.call_id, 0.0)),
            }
        )
    total = {col: None for col in TABLE_COLUMNS} | {
        "stage": TOTAL_STAGE,
        "status": "",
        "cost": _money(records.busy_cost()),
    }
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
        f"**Cost**: ${records.busy_cost():.6g}, this run's share of {_plural(len(first_call), 'batch', 'batches')} "
        f"({shared} shared with other flow runs; {records.cost_split} split of each batch's cost). "
        "Warm idle time is billed by the cost store: `esg-prefect costs`.",
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
    """A pool run listener publishing each ended run's artifacts; warns once if the API cannot be reached."""

    def __init__(self) -> None:
        self._warned = False
        self._lock = threading.Lock()  # guards _warned: pools of one process may share a publisher

    def __call__(self, records: RunRecords) -> None:
        """Publish one run (on the pool's listener thread)."""
        try:
            publish_run(records)
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


def attach_publisher(pool: Pool) -> RunPublisher:
    """Publish the artifacts of every flow run that ends in ``pool``."""
    publisher = RunPublisher()
    pool.add_run_listener(publisher)
    return publisher
