"""Cost rows: per-run costs from the attribution, grouped by run, workflow, deployment or day.

Pure functions over a :class:`~esg_prefect.model.attribution.CostReport` and
the runs' attributes, so grouping is tested without a database. A run's cost
is the one figure its artifacts and the reports show (``docs/decisions/one-cost.md``),
with its busy and idle parts. The last row of every report is the idle line
(warm idle time attributed to no run: workers that never ran a batch), so
that the rows always add up to everything the workers were billed: ESG-SPEC
section 6's invariant, ``sum(rows) == sum over workers of (busy + idle) x rate``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.attribution import COST_UNIT, CostReport

GroupBy = Literal["run", "workflow", "deployment", "day"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)
IDLE_KEY = "(unattributed idle)"
"""Key of the idle line."""
NO_DEPLOYMENT = "(no deployment)"
"""Key of runs that were not started from a deployment (or whose deployment was not known)."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What grouping needs to know of one run.

    Attributes:
        run_id: the flow run.
        workflow: its workflow.
        deployment: its deployment's name, if any.
        day: UTC date of its arrival (YYYY-MM-DD).
        arrival_ms: when it arrived (orders runs).
        slo_met: whether it met its SLO; None when the run is not recorded yet
            (its items were billed in batches shared with recorded runs).
        stage_calls: its stage calls in the window.
        name: its flow run's name in Prefect, if the store has it.
    """

    run_id: str
    workflow: str
    deployment: str | None
    day: str
    arrival_ms: float
    slo_met: bool | None
    stage_calls: int = 0
    name: str | None = None


@dataclass(frozen=True, slots=True)
class CostRow:
    """One line of a cost report.

    Attributes:
        group_by: ``run``, ``workflow``, ``deployment`` or ``day``.
        key: the run id, workflow, deployment name or day; :data:`IDLE_KEY` on the idle line.
        runs: runs in the group.
        stage_calls: their stage calls.
        slo_met, slo_missed: runs of the group that met and missed their SLO.
        cost: the group's cost (batch shares plus attributed idle time), in ``unit``.
        idle: True on the idle line.
        busy_cost: the part of ``cost`` that is shares of batches' busy time.
        idle_cost: the part of ``cost`` that is warm idle time (all of it on the idle line).
        unit: the unit of the costs (the price sheet's: ``$``).
        name: grouped by run, the flow run's name when the store has it (the key stays its id);
            else None.
    """

    group_by: str
    key: str
    runs: int
    stage_calls: int
    slo_met: int
    slo_missed: int
    cost: float
    idle: bool = False
    busy_cost: float = 0.0
    idle_cost: float = 0.0
    unit: str = COST_UNIT
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict (for JSON and CSV)."""
        return asdict(self)


def check_group_by(group_by: str) -> GroupBy:
    """``group_by`` if it is one of :data:`GROUP_BYS`.

    Raises:
        InvalidInputError: naming the bad value and the choices.
    """
    if group_by not in GROUP_BYS:
        raise InvalidInputError(f"group_by must be one of {', '.join(GROUP_BYS)}; got {group_by!r}")
    return group_by  # type: ignore[return-value]


def group_key(info: RunInfo, group_by: GroupBy) -> str:
    """The group a run falls in."""
    if group_by == "run":
        return info.run_id
    if group_by == "workflow":
        return info.workflow
    if group_by == "deployment":
        return info.deployment or NO_DEPLOYMENT
    return info.day


def group_costs(report: CostReport, runs: Mapping[str, RunInfo], group_by: str) -> list[CostRow]:
    """Rows of ``report.per_run`` grouped by ``group_by``, then the idle line.

    Args:
        report: the attribution of the window's batches and idle time.
        runs: every run to show: each run of ``report.per_run`` (others are shown at cost 0).
        group_by: ``run`` (in arrival order), or ``workflow``, ``deployment``, ``day`` (sorted by key).

    Raises:
        InvalidInputError: a bad ``group_by``, or a billed run missing from ``runs``.

    Example:
        >>> rep = CostReport({"r": 2.0}, {"A": 2.0}, 1.5, 1.0, 0.5, {"A": 1.5}, {"A": 0.5})
        >>> info = {"A": RunInfo("A", "toy", None, "2024-05-01", 0.0, True, 3)}
        >>> [(r.key, r.cost, r.busy_cost, r.idle_cost) for r in group_costs(rep, info, "workflow")]
        [('toy', 2.0, 1.5, 0.5), ('(unattributed idle)', 0.5, 0.0, 0.5)]
    """
    by = check_group_by(group_by)
    missing = sorted(set(report.per_run) - set(runs))
    if missing:
        raise InvalidInputError(f"runs {missing[:5]} are billed but have no run information")
    members: defaultdict[str, list[RunInfo]] = defaultdict(list)
    for info in sorted(runs.values(), key=lambda i: (i.arrival_ms, i.run_id)):
        members[group_key(info, by)].append(info)
    keys = list(members) if by == "run" else sorted(members)
    rows = [
        CostRow(
            by,
            key,
            len(members[key]),
            sum(i.stage_calls for i in members[key]),
            sum(1 for i in members[key] if i.slo_met is True),
            sum(1 for i in members[key] if i.slo_met is False),
            sum(report.per_run.get(i.run_id, 0.0) for i in members[key]),
            busy_cost=sum(report.per_run_busy.get(i.run_id, 0.0) for i in members[key]),
            idle_cost=sum(report.per_run_idle.get(i.run_id, 0.0) for i in members[key]),
            unit=report.unit,
            name=members[key][0].name if by == "run" else None,
        )
        for key in keys
    ]
    line = report.idle_unattributed
    rows.append(CostRow(by, IDLE_KEY, 0, 0, 0, 0, line, idle=True, idle_cost=line, unit=report.unit))
    return rows
