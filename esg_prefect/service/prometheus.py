"""The pool service's ``/metrics`` in the Prometheus formats: a collector, and which format a request gets.

:class:`PoolCollector` reads one pool snapshot per scrape (no stored
records: queues, workers and the running totals of
:class:`~esg_prefect.control.totals.Totals`, which only grow, so ``rate()``
works however long the pool has served). It sits on a registry of its own
(:func:`pool_registry`), not the process's global one: two services in one
process (tests, an embedding application) do not clash.

:func:`negotiate` decides between the JSON that existing clients read and the
Prometheus formats. JSON stays the default: no ``Accept``, ``*/*`` and
``application/json`` get it (the ``esg-prefect`` CLI and scripts that read
``/metrics`` with any HTTP client). Each format gets the ``q`` of the most
specific range that matches it; the highest wins, and a tie goes to the more
specific match, then to JSON, then the text format (which every scraper reads),
then OpenMetrics. So ``text/plain`` gets Prometheus' text format and a
Prometheus server (it ranks ``application/openmetrics-text`` first) OpenMetrics.
``?format=prometheus`` / ``?format=json`` override the header (the former still
picks OpenMetrics where ``Accept`` ranks it above the text format).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from esg_prefect.control.records import PoolSnapshot
from esg_prefect.control.totals import BILL_PARTS, DECISION_BUCKETS_MS, Totals
from esg_prefect.model.attribution import idle_cost
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.service.wire import BadRequest

__all__ = ["PoolCollector", "negotiate", "open_idle_dollars", "pool_registry", "render", "totals_body"]

SCRAPE_TIMEOUT_S = 30.0
TEXT, OPENMETRICS, JSON = "text/plain", "application/openmetrics-text", "application/json"
_OFFERS = (JSON, TEXT, OPENMETRICS)  # the server's preference, for ties


class PoolCollector:
    """The pool's state and running totals as Prometheus metric families (``esg_`` names).

    Args:
        pool: the pool the service drives.
        calls_in_flight: the service's calls accepted and not yet answered.
        stored_result_bytes: bytes of outcomes the service keeps for retries.
    """

    def __init__(self, pool: Pool, calls_in_flight: Callable[[], int], stored_result_bytes: Callable[[], int]) -> None:
        self.pool = pool
        self.calls_in_flight = calls_in_flight
        self.stored_result_bytes = stored_result_bytes

    def collect(self) -> Iterator[Metric]:
        """One scrape: a snapshot of the pool (blocking: call it off the event loop) turned into families."""
        snap = self.pool.snapshot(SCRAPE_TIMEOUT_S, 0)  # no records: the totals hold the history
        yield from self._state(snap)
        yield from _totals(snap.totals, self.pool.prices)  # zeros before the pool's first call

    def _state(self, snap: PoolSnapshot) -> Iterator[Metric]:
        """Gauges: the queues, the pause, the service's calls, the workers and the idle time not yet closed."""
        depth = GaugeMetricFamily("esg_queue_depth", "Calls waiting in each queue.", labels=["workflow", "stage"])
        for key, n in sorted(snap.queues.items(), key=lambda kv: (kv[0].workflow, kv[0].stage)):
            depth.add_metric([key.workflow, key.stage], n)
        yield depth
        yield GaugeMetricFamily("esg_paused", "1 while dispatching is held (POST /v1/pause).", int(self.pool.paused))
        yield GaugeMetricFamily("esg_calls_in_flight", "Calls accepted and not yet answered.", self.calls_in_flight())
        yield GaugeMetricFamily(
            "esg_stored_result_bytes", "Bytes of outcomes kept for retries.", self.stored_result_bytes(), unit="bytes"
        )
        counts: dict[tuple[str, str, str], list[int]] = {}  # (hardware, share, stage) -> [busy, idle]
        for w in snap.workers:
            counts.setdefault((w.hardware, f"{w.gpu_share:g}", w.stage), [0, 0])[0 if w.busy else 1] += 1
        workers = GaugeMetricFamily(
            "esg_workers",
            "Live workers by hardware kind, GPU share, stage and state (busy: running a batch or loading).",
            labels=["hardware", "share", "stage", "state"],
        )
        for (hw, share, stage), (busy, idle) in sorted(counts.items()):
            workers.add_metric([hw, share, stage, "busy"], busy)
            workers.add_metric([hw, share, stage, "idle"], idle)
        yield workers
        yield GaugeMetricFamily(
            "esg_open_idle_cost_dollars",
            "Cost so far of the idle intervals still open (added to esg_cost_dollars_total{part=idle} as they close).",
            open_idle_dollars(snap, self.pool.prices),
            unit="dollars",
        )


def open_idle_dollars(snap: PoolSnapshot, prices: PriceSheet) -> float:
    """The cost so far of the idle intervals still open (the totals add each one as it closes)."""
    return sum(idle_cost(i, prices) for i in snap.idles[snap.closed_idles or 0 :])


def totals_body(snap: PoolSnapshot, prices: PriceSheet) -> dict[str, object]:
    """The running totals as JSON (``/metrics``'s ``totals``): what the counters say, for ``pool status``."""
    totals = snap.totals
    return {
        "batches": dict(sorted(totals.batches.items())),
        "calls": dict(sorted(totals.calls.items())),
        "bill_dollars": totals.bill(prices),
        "open_idle_dollars": open_idle_dollars(snap, prices),
        "decisions": totals.decisions,
    }


def _totals(totals: Totals, prices: PriceSheet) -> Iterator[Metric]:
    """Counters and the decision-time histogram, from the running totals (they only grow)."""
    batches = CounterMetricFamily("esg_batches", "Batches run, per stage (lost ones included).", labels=["stage"])
    calls = CounterMetricFamily(
        "esg_batch_calls", "Stage calls run in batches (batch items), per stage.", labels=["stage"]
    )
    for stage in sorted(totals.batches):
        batches.add_metric([stage], totals.batches[stage])
        calls.add_metric([stage], totals.calls[stage])
    yield batches
    yield calls
    cost = CounterMetricFamily(
        "esg_cost_dollars",
        "The whole bill so far, by part: busy (batches less cold starts), cold_start, idle (closed intervals).",
        labels=["part"],
        unit="dollars",
    )
    bill = totals.bill(prices)
    for part in BILL_PARTS:
        cost.add_metric([part], bill[part])
    yield cost
    yield CounterMetricFamily("esg_decisions", "Queue decisions the scheduler made, timed or not.", totals.decisions)
    buckets, seen = [], 0
    for le_ms, n in zip((*DECISION_BUCKETS_MS, math.inf), totals.decision_buckets, strict=True):
        seen += n
        buckets.append(("+Inf" if le_ms == math.inf else f"{le_ms / 1000.0:g}", float(seen)))
    yield HistogramMetricFamily(
        "esg_decision_seconds",
        "Wall time of the scheduler's timed queue decisions.",
        buckets=buckets,
        sum_value=totals.decision_ms_sum / 1000.0,
        unit="seconds",
    )


def pool_registry(
    pool: Pool, calls_in_flight: Callable[[], int], stored_result_bytes: Callable[[], int]
) -> CollectorRegistry:
    """A registry of its own holding one :class:`PoolCollector` (not ``prometheus_client.REGISTRY``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(pool, calls_in_flight, stored_result_bytes))
    return registry


def render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The exposition of ``registry`` for one ``Accept`` range (:func:`negotiate`'s): body and content type."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def negotiate(accept: str | None, fmt: str | None = None) -> str | None:
    """The ``Accept`` range to render Prometheus metrics for, or None for the JSON (the module docstring's rule).

    Raises:
        BadRequest: ``fmt`` is neither None, ``"prometheus"`` nor ``"json"`` (400).
    """
    if fmt not in (None, "prometheus", "json"):
        raise BadRequest(400, f"format must be 'prometheus' or 'json', got {fmt!r}")
    if fmt == "json":
        return None
    ranges = _ranges(accept or "")
    best: tuple[float, int, str, str] | None = None  # q, specificity, offer, the range to render for
    for offer in _OFFERS if fmt is None else _OFFERS[1:]:
        q, specific, text = _quality(ranges, offer)
        if q > 0 and (best is None or (q, specific) > best[:2]):
            best = (q, specific, offer, text)
    if best is None or best[2] == JSON:
        return None if fmt is None else TEXT
    return best[3]


def _ranges(accept: str) -> list[tuple[str, float, str]]:
    """The media ranges of an ``Accept`` header: (type, q, the range as written); a malformed q drops its range."""
    out = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = -1.0
        if 0.0 <= q <= 1.0:
            out.append((media.lower(), q, part.strip()))
    return out


def _quality(ranges: list[tuple[str, float, str]], offer: str) -> tuple[float, int, str]:
    """The q the most specific matching range gives ``offer`` (the highest among equals), how specific that
    range is (2: the type itself, 1: ``type/*``, 0: ``*/*``), and the range to render for."""
    kind = offer.split("/")[0]
    for specific, pattern in ((2, offer), (1, f"{kind}/*"), (0, "*/*")):
        matches = [(q, text) for media, q, text in ranges if media == pattern]
        if matches:
            q, text = max(matches, key=lambda m: m[0])
            return q, specific, text if specific == 2 else offer
    return 0.0, 0, offer
