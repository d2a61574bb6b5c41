"""Per-decision statistics, counted per workflow for :func:`~esg_prefect.model.report.summarize`.

The scheduler's decisions come as :class:`~esg_prefect.scheduling.base.DecisionStats`
objects or plain dicts (with ``queue``, ``decision_ms`` and ``expansions``). A run
holds one per queue per round, so they are counted in one pass, without an object
each; the report only needs, per workflow, how many, their timed durations and
their expansions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_MISSING = object()


def _field(item: object, name: str) -> Any:
    # dicts and attribute objects first (cheap checks: a run has a decision per queue per round);
    # any other Mapping after them.
    if isinstance(item, dict):
        return item.get(name)
    value = getattr(item, name, _MISSING)
    if value is not _MISSING:
        return value
    if isinstance(item, Mapping):
        return item.get(name)
    return None


def _workflow_of(item: object) -> str | None:
    """The workflow of a decision's queue: a QueueKey, a ``"workflow/stage"`` string, or a dict."""
    queue = _field(item, "queue")
    if queue is None:
        wf = _field(item, "workflow")
        return None if wf is None else str(wf)
    if isinstance(queue, str):
        return queue.split("/", 1)[0]
    if isinstance(queue, Mapping):
        wf = queue.get("workflow")
        return None if wf is None else str(wf)
    wf = getattr(queue, "workflow", None)
    return None if wf is None else str(wf)


class DecisionCounts:
    """What the report needs of a group's decisions: how many, their timed durations, their expansions."""

    __slots__ = ("count", "expansions", "times")

    def __init__(self) -> None:
        self.count = 0
        self.expansions = 0
        self.times: list[float] = []

    @classmethod
    def total(cls, groups: Iterable[DecisionCounts]) -> DecisionCounts:
        """All of ``groups`` together."""
        out = cls()
        for d in groups:
            out.count += d.count
            out.expansions += d.expansions
            out.times += d.times
        return out


def decision_counts(items: Iterable[object]) -> dict[str | None, DecisionCounts]:
    """Decision statistics per workflow (None: no workflow known), accumulated without an object each.

    A run holds one per queue per round (150,000 in a minute of the standard case).
    """
    out: dict[str | None, DecisionCounts] = {}
    for item in items:
        wf: Any = _MISSING
        if not isinstance(item, dict):  # fast path: a DecisionStats-like object with a QueueKey-like queue
            it: Any = item
            try:
                wf, ms, exp = it.queue.workflow, it.decision_ms, it.expansions
            except AttributeError:
                wf = _MISSING
            if not isinstance(wf, str):
                wf = _MISSING
        if wf is _MISSING:
            wf, ms, exp = _workflow_of(item), _field(item, "decision_ms"), _field(item, "expansions")
        acc = out.get(wf)
        if acc is None:
            acc = out[wf] = DecisionCounts()
        acc.count += 1
        acc.expansions += int(exp or 0)
        if ms is not None:
            acc.times.append(float(ms))
    return out
