"""One report from any run: :func:`summarize`, shared by the simulator and the live runtime.

STYLE.md (after AlpaServe): one experiment description runs on both the
simulator and the live system, and one function computes the statistics, so
that the two can be compared number for number. This is that function. It
takes the records of a run (requests, stage calls, batches, idle intervals)
and the scheduler's per-decision statistics, and returns a :class:`Report`
with, overall and per workflow:

* requests, completed, failed, SLO hits and the SLO hit rate (a failed
  request is a miss), requests dispatched at risk;
* end-to-end latency percentiles of the completed requests;
* cost: the total billed (busy plus idle, ESG-SPEC section 6) and the cost per
  request, attributed by :func:`~esg_prefect.model.attribution.attribute_costs`;
  and the batch cost alone (ESG-SPEC section 2: what the paper's cost model
  counts, the serverless bill without keep-alive); per flow run, the one cost
  figure every surface shows (:attr:`Report.per_run`: busy and idle parts);
* batches: count, mean size and the size histogram;
* decisions: count, decision time p50/p99 and mean A* expansions.

Per (workflow, stage) it also gives the stall breakdown of experiment E7:
mean queueing, cold start, transfer and execution time of a job.

Percentiles interpolate linearly between the closest ranks (numpy's default
"linear" method), so small hand-worked cases have exact expected values.

Example:
    >>> from esg_prefect.model.pricing import PriceSheet
    >>> reqs = [RequestRecord("a", "a", "w", 0.0, 50.0, 100.0), RequestRecord("b", "b", "w", 0.0, None, 100.0)]
    >>> rep = summarize(reqs, [], [], [], PriceSheet(0.0, {}), [])
    >>> rep.overall.count, rep.overall.failed, rep.overall.slo_hit_rate
    (2, 1, 0.5)
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.attribution import (
    BatchRecord,
    CostReport,
    CostSplit,
    IdleBilling,
    IdleRecord,
    RunCost,
    attribute_costs,
    merge_reports,
)
from esg_prefect.model.decision_stats import DecisionCounts, decision_counts
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.records import RequestRecord, StageRecord

ALL = "all"
"""Name of the overall group in a report."""

# attribute_costs finds, for each idle interval, the batch before it by a scan over the
# worker's batches; on long runs that is quadratic. Costs are attributed in groups of
# consecutive batches of one worker (with the idle intervals that follow them), which
# gives the same attribution in linear time.
_ATTRIBUTION_GROUP = 64


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None if empty.

    Examples:
        >>> percentile([10.0, 20.0, 30.0, 40.0], 50)
        25.0
        >>> percentile([10.0, 20.0, 30.0, 40.0], 99)
        39.7
    """
    if not 0.0 <= q <= 100.0:
        raise InvalidInputError(f"percentile q must be in [0, 100], got {q!r}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """Statistics of one workflow, or of all of them (``name == "all"``).

    Attributes:
        name: workflow name or ``"all"``.
        count: requests.
        completed: requests that finished (in time or late).
        failed: requests that did not finish (rejected, failed, or still running at the end).
        slo_met: requests that finished within their SLO.
        slo_hit_rate: ``slo_met / count`` (0 when there are no requests).
        at_risk: requests with a stage dispatched best effort (no plan met its
            slack), among ``count``: in a report of a window (after a warm-up),
            those that arrived in it. Not the worker starts such dispatches made
            (``SimRun.at_risk_cold_starts``, counted over the whole run).
        latency_p50_ms, latency_p95_ms, latency_p99_ms: over completed requests.
        cost_total: money billed for the group; for ``"all"`` the run's whole
            bill (busy plus idle, attributed or not), for a workflow the costs
            attributed to its requests.
        cost_per_request: ``cost_total / count``.
        batch_cost_total: the batches' cost alone (no idle time): the whole
            run's for ``"all"``, the shares of its requests for a workflow.
        batch_cost_per_request: ``batch_cost_total / count``.
        batches: batches that ran.
        mean_batch_size: mean jobs per batch.
        batch_size_hist: ``(size, number of batches)`` pairs, by size.
        decisions: queue decisions made.
        decision_p50_ms, decision_p99_ms: decision time (None when not measured).
        mean_expansions: mean A* node expansions per decision.
    """

    name: str
    count: int
    completed: int
    failed: int
    slo_met: int
    slo_hit_rate: float
    at_risk: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    cost_total: float
    cost_per_request: float
    batch_cost_total: float
    batch_cost_per_request: float
    batches: int
    mean_batch_size: float
    batch_size_hist: tuple[tuple[int, int], ...]
    decisions: int
    decision_p50_ms: float | None
    decision_p99_ms: float | None
    mean_expansions: float

    def to_dict(self) -> dict[str, Any]:
        """Plain values (the histogram as ``{size: count}`` with string keys, for JSON)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["batch_size_hist"] = {str(size): n for size, n in self.batch_size_hist}
        return out


@dataclass(frozen=True, slots=True)
class StageSummary:
    """Where a stage's jobs spent their time (experiment E7), in mean ms per job.

    Attributes:
        workflow, stage: the queue.
        jobs: jobs of the stage that ran.
        queue_ms: waiting in the queue (batching and capacity waits).
        cold_start_ms: starting a worker.
        transfer_ms: fetching inputs from other nodes.
        exec_ms: running the model.
        mean_batch_size: mean size of the batches the jobs ran in, per job.
    """

    workflow: str
    stage: str
    jobs: int
    queue_ms: float
    cold_start_ms: float
    transfer_ms: float
    exec_ms: float
    mean_batch_size: float

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Report:
    """The statistics of one run (simulated or live).

    Attributes:
        overall: every request.
        workflows: one summary per workflow, by name.
        stages: the stall breakdown per (workflow, stage).
        busy_cost: cost of all batches (cold starts included).
        idle_cost: cost of warm idle time.
        idle_unattributed: idle cost on the separate idle line.
        cost_split: how batch costs were split among jobs.
        idle_billing: how idle time was billed.
        per_run: each flow run's cost with its busy/idle split, as
            :func:`~esg_prefect.model.attribution.attribute_costs` defines it
            (one entry per run: left out of :meth:`to_dict`).
    """

    overall: GroupSummary
    workflows: tuple[GroupSummary, ...]
    stages: tuple[StageSummary, ...]
    busy_cost: float
    idle_cost: float
    idle_unattributed: float
    cost_split: str
    idle_billing: str
    per_run: Mapping[str, RunCost] = field(default_factory=dict)

    def workflow(self, name: str) -> GroupSummary:
        """The summary of workflow ``name``.

        Raises:
            InvalidInputError: naming the workflows the report has.
        """
        for g in self.workflows:
            if g.name == name:
                return g
        raise InvalidInputError(f"report has no workflow {name!r}; it has {[g.name for g in self.workflows]}")

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for JSON files and artifacts."""
        return {
            "overall": self.overall.to_dict(),
            "workflows": {g.name: g.to_dict() for g in self.workflows},
            "stages": [s.to_dict() for s in self.stages],
            "busy_cost": self.busy_cost,
            "idle_cost": self.idle_cost,
            "idle_unattributed": self.idle_unattributed,
            "cost_split": self.cost_split,
            "idle_billing": self.idle_billing,
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per group (``"all"`` first) with the headline columns, for tables."""
        return [_row(g) for g in (self.overall, *self.workflows)]


def _row(g: GroupSummary) -> dict[str, Any]:
    return {
        "workflow": g.name,
        "requests": g.count,
        "completed": g.completed,
        "failed": g.failed,
        "slo_hit_rate": g.slo_hit_rate,
        "p50_ms": g.latency_p50_ms,
        "p95_ms": g.latency_p95_ms,
        "p99_ms": g.latency_p99_ms,
        "cost": g.cost_total,
        "cost_per_request": g.cost_per_request,
        "batch_cost_per_request": g.batch_cost_per_request,
        "mean_batch": g.mean_batch_size,
        "decision_p50_ms": g.decision_p50_ms,
        "decision_p99_ms": g.decision_p99_ms,
        "mean_expansions": g.mean_expansions,
        "at_risk": g.at_risk,
    }


# ---- cost attribution in linear time ------------------------------------------------


def _attribute(
    batches: Sequence[BatchRecord],
    idles: Sequence[IdleRecord],
    prices: PriceSheet,
    split: CostSplit,
    idle_billing: IdleBilling,
    prior_workers: Collection[str] = (),
) -> CostReport:
    """attribute_costs over groups of consecutive batches per worker; the same result, linear time.

    An idle interval is attributed to the batch of its worker that ended last
    no later than the interval's start, so it is put in the group of that
    batch; an interval with no batch before it goes with the worker's first
    group, which holds the worker's first batch (the one such lead idle time goes to).
    """
    by_worker: dict[str, list[BatchRecord]] = defaultdict(list)
    for b in batches:
        by_worker[b.worker_id].append(b)
    idle_by_worker: dict[str, list[IdleRecord]] = defaultdict(list)
    for i in idles:
        idle_by_worker[i.worker_id].append(i)
    parts: list[CostReport] = []
    for worker in sorted(set(by_worker) | set(idle_by_worker)):
        bs = sorted(by_worker.get(worker, []), key=lambda r: r.end_ms)
        ids = sorted(idle_by_worker.get(worker, []), key=lambda r: r.start_ms)
        n_groups = max(1, math.ceil(len(bs) / _ATTRIBUTION_GROUP))
        groups_b: list[list[BatchRecord]] = [
            bs[g * _ATTRIBUTION_GROUP : (g + 1) * _ATTRIBUTION_GROUP] for g in range(n_groups)
        ]
        groups_i: list[list[IdleRecord]] = [[] for _ in range(n_groups)]
        k = -1  # index in bs of the last batch ending no later than the idle's start
        for rec in ids:
            while k + 1 < len(bs) and bs[k + 1].end_ms <= rec.start_ms:
                k += 1
            groups_i[max(k, 0) // _ATTRIBUTION_GROUP].append(rec)
        parts += (
            attribute_costs(gb, gi, prices, split, idle_billing, prior_workers=prior_workers)
            for gb, gi in zip(groups_b, groups_i, strict=True)
        )
    if not parts:
        parts.append(attribute_costs([], [], prices, split, idle_billing))
    return merge_reports(parts)


# ---- summarize ------------------------------------------------------------------------


def _group(
    name: str,
    requests: Sequence[RequestRecord],
    stage_records: Sequence[StageRecord],
    decisions: DecisionCounts,
    cost_total: float,
    batch_cost_total: float,
) -> GroupSummary:
    count = len(requests)
    completed = sum(1 for r in requests if r.completed)
    met = sum(1 for r in requests if r.slo_met)
    lat = [r.latency_ms for r in requests if r.latency_ms is not None]
    sizes: dict[str, int] = {}
    for s in stage_records:
        sizes[s.batch_id] = s.batch_size
    hist = Counter(sizes.values())
    n_batches = len(sizes)
    times = decisions.times
    return GroupSummary(
        name=name,
        count=count,
        completed=completed,
        failed=count - completed,
        slo_met=met,
        slo_hit_rate=met / count if count else 0.0,
        at_risk=sum(1 for r in requests if r.at_risk),
        latency_p50_ms=percentile(lat, 50),
        latency_p95_ms=percentile(lat, 95),
        latency_p99_ms=percentile(lat, 99),
        cost_total=cost_total,
        cost_per_request=cost_total / count if count else 0.0,
        batch_cost_total=batch_cost_total,
        batch_cost_per_request=batch_cost_total / count if count else 0.0,
        batches=n_batches,
        mean_batch_size=sum(sizes.values()) / n_batches if n_batches else 0.0,
        batch_size_hist=tuple(sorted(hist.items())),
        decisions=decisions.count,
        decision_p50_ms=percentile(times, 50),
        decision_p99_ms=percentile(times, 99),
        mean_expansions=decisions.expansions / decisions.count if decisions.count else 0.0,
    )


def _stage_summaries(stage_records: Sequence[StageRecord]) -> tuple[StageSummary, ...]:
    by_stage: dict[tuple[str, str], list[StageRecord]] = defaultdict(list)
    for s in stage_records:
        by_stage[(s.workflow, s.stage)].append(s)
    out = []
    for (wf, st), recs in sorted(by_stage.items()):
        n = len(recs)
        out.append(
            StageSummary(
                workflow=wf,
                stage=st,
                jobs=n,
                queue_ms=sum(r.queue_ms for r in recs) / n,
                cold_start_ms=sum(r.cold_start_ms for r in recs) / n,
                transfer_ms=sum(r.transfer_ms for r in recs) / n,
                exec_ms=sum(r.exec_ms for r in recs) / n,
                mean_batch_size=sum(r.batch_size for r in recs) / n,
            )
        )
    return tuple(out)


def summarize(
    requests: Iterable[RequestRecord],
    stages: Iterable[StageRecord],
    batches: Iterable[BatchRecord],
    idles: Iterable[IdleRecord],
    prices: PriceSheet,
    decisions: Iterable[object],
    split: CostSplit = "equal",
    idle_billing: IdleBilling = "attribute",
    prior_workers: Collection[str] = (),
) -> Report:
    """Turn a run's records into a :class:`Report`.

    Args:
        requests: one record per request.
        stages: one record per stage call that ran.
        batches: the batches, for billing.
        idles: warm idle intervals, for billing.
        prices: the price sheet in force.
        decisions: per-decision statistics: :class:`~esg_prefect.scheduling.base.DecisionStats`
            objects or dicts with ``queue`` (a QueueKey, ``"workflow/stage"`` or a dict),
            ``decision_ms`` and ``expansions``.
        split: how a batch's cost is split among its jobs.
        idle_billing: attribute idle time to the batches that caused it (the
            module :mod:`~esg_prefect.model.attribution`'s definition), or keep it separate.
        prior_workers: for a window's records, :attr:`~esg_prefect.model.window.Window.prior_workers`.

    Returns:
        The report; workflows appear sorted by name.

    Raises:
        InvalidInputError: on duplicate request ids.
    """
    reqs = list(requests)
    ids = [r.request_id for r in reqs]
    if len(set(ids)) != len(ids):
        dup = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise InvalidInputError(f"duplicate request ids in the records: {dup[:5]}")
    stage_recs = list(stages)
    decs = decision_counts(decisions)
    batch_list = list(batches)
    costs = _attribute(batch_list, list(idles), prices, split, idle_billing, prior_workers)
    busy = _attribute(batch_list, [], prices, split, "separate")
    by_wf: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in reqs:
        by_wf[r.workflow].append(r)
    stages_by_wf: dict[str, list[StageRecord]] = defaultdict(list)
    for s in stage_recs:
        stages_by_wf[s.workflow].append(s)
    groups = []
    for wf in sorted(set(by_wf) | set(stages_by_wf)):
        wf_reqs = by_wf.get(wf, [])
        wf_cost = sum(costs.per_request.get(r.request_id, 0.0) for r in wf_reqs)
        wf_busy = sum(busy.per_request.get(r.request_id, 0.0) for r in wf_reqs)
        groups.append(_group(wf, wf_reqs, stages_by_wf.get(wf, []), decs.get(wf) or DecisionCounts(), wf_cost, wf_busy))
    overall = _group(ALL, reqs, stage_recs, DecisionCounts.total(decs.values()), costs.total, costs.busy_total)
    return Report(
        overall=overall,
        workflows=tuple(groups),
        stages=_stage_summaries(stage_recs),
        busy_cost=costs.busy_total,
        idle_cost=costs.idle_total,
        idle_unattributed=costs.idle_unattributed,
        cost_split=split,
        idle_billing=idle_billing,
        per_run={run: costs.run_cost(run) for run in costs.per_run},
    )
