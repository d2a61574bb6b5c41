"""Do two reports of one case agree? The check behind the simulator-vs-runtime conformance test.

The same case (:class:`~esg_prefect.simulator.case.Case`) runs in the simulator
and on the live runtime, and each run is summarized by the one
:func:`~esg_prefect.model.report.summarize`. :func:`compare_reports` lists
where the two reports differ beyond a stated :class:`Tolerance`; the
conformance test asserts the list is empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esg_prefect.model.report import Report


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far a simulated report may be from a live one of the same case and still agree.

    Attributes:
        slo_hit_rate_abs: absolute difference of SLO hit rates (0.05: five points).
        latency_p50_rel: relative difference of median latencies.
        batch_cost_rel: relative difference of batch cost per request.
        mean_batch_rel: relative difference of mean batch sizes.
        failed_abs: absolute difference of failed-request fractions.

    The defaults are the ones the conformance test states: the simulator
    reproduces the runtime's decisions (same scheduler, same arrivals), not
    its noise, so medians and rates must agree closely, tails need not.
    """

    slo_hit_rate_abs: float = 0.05
    latency_p50_rel: float = 0.25
    batch_cost_rel: float = 0.25
    mean_batch_rel: float = 0.25
    failed_abs: float = 0.02


def _rel(a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def compare_reports(simulated: Report, live: Report, tolerance: Tolerance | None = None) -> list[str]:
    """Where ``simulated`` and ``live`` disagree beyond ``tolerance``; empty when they agree.

    Compares the overall group and each workflow present in both: request
    counts (exactly), SLO hit rate, failed fraction, median latency, batch
    cost per request and mean batch size.

    Example:
        >>> from esg_prefect.model.pricing import PriceSheet
        >>> from esg_prefect.model.records import RequestRecord
        >>> from esg_prefect.model.report import summarize
        >>> rep = summarize([RequestRecord("a", "a", "w", 0.0, 50.0, 100.0)], [], [], [], PriceSheet(0.0, {}), [])
        >>> compare_reports(rep, rep)
        []
    """
    tol = tolerance or Tolerance()
    problems: list[str] = []
    live_groups = {g.name: g for g in (live.overall, *live.workflows)}
    for g in (simulated.overall, *simulated.workflows):
        other = live_groups.get(g.name)
        if other is None:
            problems.append(f"{g.name}: in the simulated report only")
            continue
        if g.count != other.count:
            problems.append(f"{g.name}: {g.count} requests simulated, {other.count} live")
            continue
        checks = (
            ("slo_hit_rate", abs(g.slo_hit_rate - other.slo_hit_rate), tol.slo_hit_rate_abs),
            ("failed fraction", abs(g.failed - other.failed) / max(g.count, 1), tol.failed_abs),
            ("latency p50", _rel(g.latency_p50_ms, other.latency_p50_ms), tol.latency_p50_rel),
            (
                "batch cost per request",
                _rel(g.batch_cost_per_request, other.batch_cost_per_request),
                tol.batch_cost_rel,
            ),
            ("mean batch size", _rel(g.mean_batch_size, other.mean_batch_size), tol.mean_batch_rel),
        )
        for name, diff, limit in checks:
            if diff > limit:
                problems.append(f"{g.name}: {name} differs by {diff:.3g} (tolerance {limit:g})")
    return problems
