"""A run's records cut to a measurement window: what a report counts after a warm-up.

Both the simulator and the live runtime measure windows through
:func:`after_warmup`, then :func:`~esg_prefect.model.report.summarize` the result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from esg_prefect.model.attribution import BatchRecord, IdleRecord
from esg_prefect.model.records import RequestRecord, StageRecord

__all__ = ["Window", "after_warmup"]


@dataclass(frozen=True, slots=True)
class Window:
    """The records of a run that fall in a measurement window starting at ``start_ms``.

    Attributes:
        requests: requests that arrived at or after ``start_ms``.
        stages: the stage calls of those requests.
        batches: batches dispatched at or after ``start_ms``.
        idles: idle intervals, cut to begin no earlier than ``start_ms``.
        prior_workers: workers that ran batches dispatched before ``start_ms``: idle
            time of theirs with no batch before it in the window was caused by a
            batch outside it, so it is not the worker's lead idle time (pass it to
            :func:`~esg_prefect.model.report.summarize`; see :func:`~esg_prefect.model.attribution.idle_owners`).
    """

    requests: tuple[RequestRecord, ...]
    stages: tuple[StageRecord, ...]
    batches: tuple[BatchRecord, ...]
    idles: tuple[IdleRecord, ...]
    prior_workers: frozenset[str] = frozenset()


def after_warmup(
    requests: Iterable[RequestRecord],
    stages: Iterable[StageRecord],
    batches: Iterable[BatchRecord],
    idles: Iterable[IdleRecord],
    start_ms: float,
) -> Window:
    """Drop what happened before ``start_ms`` (a warm-up), so a report shows the steady state.

    Requests count if they arrived in the window; the cost counted is what
    was billed in it (batches dispatched in it, idle time in it), so a run
    that starts cold does not charge its start-up to the steady state.
    Both the simulator and the live runtime measure windows through this
    function, then :func:`~esg_prefect.model.report.summarize` the result.

    Example:
        >>> reqs = [RequestRecord("a", "a", "w", 0.0, 5.0, 10.0), RequestRecord("b", "b", "w", 20.0, 25.0, 10.0)]
        >>> [r.request_id for r in after_warmup(reqs, [], [], [], 10.0).requests]
        ['b']
    """
    reqs = tuple(r for r in requests if r.arrival_ms >= start_ms)
    kept = {r.request_id for r in reqs}
    cut_idles = []
    for i in idles:
        if i.end_ms <= start_ms:
            continue
        if i.start_ms < start_ms:
            loading = max(0.0, i.loading_ms - (start_ms - i.start_ms))
            i = IdleRecord(i.worker_id, i.vcpus, i.gpu_share, i.hardware, start_ms, i.end_ms, loading, i.vcpus_held)
        cut_idles.append(i)
    batch_list = list(batches)
    return Window(
        reqs,
        tuple(s for s in stages if s.request_id in kept),
        tuple(b for b in batch_list if b.start_ms >= start_ms),
        tuple(cut_idles),
        frozenset(b.worker_id for b in batch_list if b.start_ms < start_ms),
    )
