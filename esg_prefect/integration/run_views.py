"""What a pooled flow run shows in the Prefect UI: its cost table, its summary, its runs-list tags.

Pure builders over the records a pool hands its run listeners
(:class:`~esg_prefect.control.records.RunRecords`); the publisher
(:mod:`esg_prefect.integration.artifacts`) posts what they build.

* :func:`run_table`: one row per stage call (stage, batch, its size and how
  many flow runs shared it, worker, queue wait, the call's share of the
  batch's cost: busy, idle and total), then a total row: the run's cost;
* :func:`run_summary`: a short markdown account: SLO met or missed, the run's
  cost with its busy/idle split, and why each batch was the size it was;
* :func:`run_tags`: the run's cost and SLO outcome as two flow run tags, which
  the Prefect UI shows on every row of its runs list and in the run's header
  (``docs/decisions/ui-cost.md``); :func:`merged_tags` puts them in front of
  the flow run's own tags.

Both UIs of Prefect 3.9 give a table artifact 700 (V2) to 845 px (V1) at a
1400 px wide window and never wrap its cells, so the table has nine columns,
the unit in the cost columns' headers, and costs to three significant
digits; the scheduler's reasons, long sentences, are a markdown list, which
wraps, not a table column, with each batch's place, predicted and actual
latency. Every cost is written by :func:`~esg_prefect.model.money.money_text`,
the one money format of the package: the table's cells carry that text, so
the table, the summary, the tag, ``esg-prefect costs`` and ``pool status``
read the same, whatever renders the table's JSON.

The cost is the run's one cost figure (``docs/decisions/one-cost.md``): its
shares of its batches' busy time and of the warm idle time those batches
caused, final once ``records.settled``.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from esg_prefect.model.attribution import CostSplit, RunCost, cost_unit, idle_cost, idle_owners, split_weights
from esg_prefect.model.config import CPU
from esg_prefect.model.money import money_round, money_str, money_text
from esg_prefect.store.rows import slo_met
from esg_prefect.wording import counted

if TYPE_CHECKING:
    from esg_prefect.control.calls import StageResult
    from esg_prefect.control.records import CallRecord, RunRecords

TOTAL_STAGE = "total"
"""``stage`` of the table's last row: the run's cost."""

CALL_COLUMNS = ("stage", "batch", "size", "runs", "worker", "wait ms")
"""The table's columns before its cost columns: ``runs`` is how many flow runs shared the batch.

How long each batch ran, the same for each of its calls, is in the summary, beside the
scheduler's prediction.
"""

COST_KINDS = ("busy", "idle", "cost")
"""The table's cost columns, each headed ``<kind> <unit>``: busy share, idle share, their sum."""

FAILED = "failed"
"""``batch`` of a stage call that failed (its error is in the summary)."""

EARLIER = "earlier"
"""Follows the batch and worker of a stage call another pool instance served (the store's other scopes)."""

TAG_PREFIX = "esg:"
"""Prefix of the tags this package sets on a flow run (and replaces when it sets them again)."""

SLO_TAGS = {True: "esg:slo-met", False: "esg:slo-missed"}
"""The SLO tag of a run that met (True) or missed (False) its SLO."""

_NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]\d+)?"  # what money_text writes


def cost_column(kind: str, unit: str) -> str:
    """The header of a cost column, its unit in it: ``cost_column("cost", "$") == "cost $"``."""
    return f"{kind} {unit}"


def table_columns(unit: str) -> tuple[str, ...]:
    """The columns of a run's table, in order, for costs in ``unit``."""
    return (*CALL_COLUMNS, *(cost_column(k, unit) for k in COST_KINDS))


def sig3(value: float) -> float:
    """``value`` to three significant digits: short in a table cell, and still a number (latencies)."""
    return money_round(value)


money = money_text
"""A cost as the table and the tags carry it: the package's money text (three significant digits)."""


def artifact_key(prefix: str, run_id: str) -> str:
    """An artifact key: lowercase letters, digits and dashes only, as Prefect requires.

    The whole run id, not its first characters: Prefect's run ids are time-ordered
    (UUIDv7), so the runs of one minute share a prefix, and a key names one
    artifact across all runs on the Artifacts page.

    Example:
        >>> artifact_key("esg-cost", "3F2A9C1E-0B7D-4C1A-9E55-8A8B7C6D5E4F")
        'esg-cost-3f2a9c1e-0b7d-4c1a-9e55-8a8b7c6d5e4f'
    """
    raw = f"{prefix}-{run_id}".lower()
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", raw)).strip("-")


def cost_notice(
    run_id: str, *, keep_alive_s: float | None = None, settled: bool = False, service: str | None = None
) -> str:
    """The one log line a flow run ends with: where and when its cost will appear, not a figure.

    When the run ends its cost is not known yet: the warm idle time after its
    batches is part of it and closes only at the workers' next batch, their
    keep-alive expiry or the pool's close (``docs/decisions/one-cost.md``).
    ``keep_alive_s`` is the longest keep-alive (None: unknown, as for a pool
    ``service``); ``settled``: the idle time is billed apart, so it is final now.

    Example:
        >>> cost_notice("R1", keep_alive_s=60.0)  # doctest: +NORMALIZE_WHITESPACE
        "cost of this run: published as artifact 'esg-cost-r1' (with the run's summary and cost tags) once
        the idle time after its batches closes (the workers' next batch, a keep-alive of up to 60 s, or the
        pool's close)"
    """
    where = f"artifact {artifact_key('esg-cost', run_id)!r} (with the run's summary and cost tags)"
    by = f" by the pool service at {service} (unless it runs with --no-artifacts)" if service else ""
    if settled:
        return f"cost of this run: published{by} as {where} now (idle time is billed apart)"
    keep = f"a keep-alive of up to {keep_alive_s:g} s" if keep_alive_s is not None else "the keep-alive"
    return (
        f"cost of this run: published{by} as {where} once the idle time after its batches closes "
        f"(the workers' next batch, {keep}, or the {'service' if service else 'pool'}'s close)"
    )


def call_costs(records: RunRecords) -> dict[str, RunCost]:
    """Each successful call's share of its batch's cost: busy time and the idle time the batch caused.

    A batch's cost is split among its items by the pool's cost split, and so
    is the idle time attributed to it (``records.caused_idles``); this run's
    part of each is spread evenly over this run's items in the batch (exact
    for the equal split; the pool does not say which item was which call).
    The calls of the run's :attr:`~RunRecords.earlier` parts are priced by their own part.
    """
    out: dict[str, RunCost] = {}
    for part in records.earlier:
        out |= call_costs(part)
    split = cast(CostSplit, records.cost_split)
    prices, unit = records.prices, cost_unit(records.prices)
    batches = {b.batch_id: b for b in records.batches}
    idle_of: defaultdict[str, float] = defaultdict(float)
    if records.idle_billing == "attribute":
        for idle, owner in idle_owners(records.batches, records.caused_idles):
            if owner is not None:
                idle_of[owner.batch_id] += idle_cost(idle, prices)
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
        cost_column("busy", cost.unit): money(cost.busy),
        cost_column("idle", cost.unit): money(cost.idle),
        cost_column("cost", cost.unit): money(cost.total),
    }


def all_calls(records: RunRecords) -> list[tuple[CallRecord, bool]]:
    """The run's calls, each with whether an earlier instance of the pool served it: those first."""
    return [*((c, True) for part in records.earlier for c in part.calls), *((c, False) for c in records.calls)]


def shown_id(scoped_id: str, earlier: bool) -> str:
    """A batch or worker id as shown: an earlier instance's (read from the store, ``scope:b7``) as ``b7 earlier``."""
    return f"{scoped_id.rpartition(':')[2]} {EARLIER}" if earlier else scoped_id


def _call_cells(c: CallRecord, earlier: bool = False) -> dict[str, Any]:
    r = c.result
    if r is None:
        return dict.fromkeys(CALL_COLUMNS) | {"stage": c.stage, "batch": FAILED}
    batch = shown_id(r.batch_id, earlier)
    return {
        "stage": c.stage,
        "batch": batch if c.ok else f"{batch} {FAILED}",
        "size": r.batch_size,
        "runs": r.co_batched_runs,
        "worker": shown_id(r.worker_id, earlier),
        "wait ms": sig3(r.queue_wait_ms),
    }


def run_table(records: RunRecords) -> list[dict[str, Any]]:
    """The rows of a run's table artifact: one per stage call in completion order, then the total.

    A failed call reads ``failed`` in its ``batch`` column (its share of a
    batch, if it ran in one, is in the total only). The total row's costs are
    :meth:`RunRecords.cost`: the run's one cost figure and its busy/idle split.
    Calls an earlier instance of the pool served (a restart mid-run) come first,
    their batch and worker marked ``earlier``.
    """
    costs = call_costs(records)
    unit = cost_unit(records.prices)
    rows = [
        _call_cells(c, earlier) | _cost_cells(costs.get(c.call_id, RunCost(0.0, 0.0, unit)))
        for c, earlier in all_calls(records)
    ]
    rows.append(dict.fromkeys(CALL_COLUMNS) | {"stage": TOTAL_STAGE} | _cost_cells(records.cost()))
    return rows


# ---- the runs list -----------------------------------------------------------------------------


def cost_tag(records: RunRecords) -> str:
    """The run's cost as a tag: ``esg:$0.0000502``, the figure of the table's total row."""
    cost = records.cost()
    return f"{TAG_PREFIX}{money_str(cost.total, cost.unit)}"


def run_tags(records: RunRecords) -> tuple[str, str]:
    """The tags that show the run's cost and SLO outcome on the runs list: cost first, then SLO.

    Example: ``("esg:$0.0000502", "esg:slo-met")``; a run that failed or never
    finished missed its SLO (as in the cost store).
    """
    return cost_tag(records), SLO_TAGS[slo_met(records)]


def is_run_tag(tag: str, unit: str) -> bool:
    """Whether ``tag`` is one :func:`run_tags` writes for costs in ``unit`` (replaced when they are set again)."""
    return tag in SLO_TAGS.values() or re.fullmatch(re.escape(f"{TAG_PREFIX}{unit}") + _NUMBER, tag) is not None


def merged_tags(existing: Sequence[str], records: RunRecords) -> list[str]:
    """A flow run's tags with the run's cost and SLO tags in front, its own tags kept in their order.

    ESG tags set earlier (by an earlier publication of the same run) are
    replaced; every other tag stays. In front, because Prefect's V2 runs list
    shows as many tags as fit and counts the rest.
    """
    ours = run_tags(records)
    unit = cost_unit(records.prices)
    return [*ours, *(t for t in existing if not is_run_tag(t, unit) and t not in ours)]


# ---- the summary -------------------------------------------------------------------------------


def _text(text: str) -> str:
    """Text for a markdown list item: one line, no emphasis markers."""
    return text.replace("\n", " ").replace("*", "\\*").replace("`", "'")


def _slo_line(records: RunRecords) -> str:
    slo = records.slo_ms
    if records.finish_ms is None:
        calls = all_calls(records)
        failed = sum(1 for c, _ in calls if not c.ok)
        return (
            f"**Did not finish**: {failed} of {counted(len(calls), 'stage call')} failed, "
            f"so the run counts as missing its {slo:.0f} ms SLO."
        )
    latency = records.finish_ms - records.arrival_ms
    if latency <= slo:
        return f"**SLO met**: {latency:.1f} ms end to end, {slo - latency:.1f} ms inside the {slo:.0f} ms SLO."
    return f"**SLO missed** by {latency - slo:.1f} ms: {latency:.1f} ms end to end against a {slo:.0f} ms SLO."


def _failures(records: RunRecords) -> list[str]:
    failed = [c for c, _ in all_calls(records) if not c.ok]
    if not failed:
        return []
    return ["", "**Failed stage calls**:", "", *(f"- **{_text(c.stage)}**: {_text(c.error[:200])}" for c in failed)]


def _cost_line(records: RunRecords, batches: int, shared: int) -> str:
    cost = records.cost()
    u = cost.unit
    head = (
        f"**Cost**: {money_str(cost.total, u)} (busy {money_str(cost.busy, u)} + idle {money_str(cost.idle, u)}), "
        f"this run's share of {counted(batches, 'batch', 'batches')} ({shared} shared with other flow runs; "
        f"{records.cost_split} split of each batch's cost)"
    )
    if records.idle_billing == "separate":
        head += ". Warm idle time is billed on its own line, to no run (idle billing `separate`)"
    else:
        head += (
            " and, split the same way, of the warm idle time those batches caused: a worker's idle time "
            "goes to the batch that ended just before it, a worker's idle time before its first batch to that batch"
        )
    earlier = sum(len(part.calls) for part in records.earlier)
    if records.earlier:
        head += (
            f". {counted(earlier, 'stage call')} of this run {'was' if earlier == 1 else 'were'} "
            f"served by another pool instance (read from the cost store): marked `{EARLIER}` in the table, "
            "each priced as that instance priced it"
        )
    if records.settled:
        return head + ". Final: the idle time after each of its batches has closed; `esg-prefect costs` shows the same."
    return head + ". Not final yet: idle time after its batches was still open."


def _where(r: StageResult) -> str:
    device = CPU if r.hardware == CPU else f"{r.hardware} x{r.gpu_share:.2f}"
    return f"{r.worker_id} ({device}, {r.vcpus} vCPU{', cold start' if r.cold_start else ''})"


def _decision(stage: str, r: StageResult, earlier: bool = False) -> str:
    """One batch's line: what it was, where it ran, predicted and actual latency, the scheduler's reason."""
    reason = _text(r.reason or "(no reason given)")
    risk = "; at risk of missing the SLO" if r.at_risk else ""
    if earlier:
        r = dataclasses.replace(r, batch_id=shown_id(r.batch_id, True), worker_id=shown_id(r.worker_id, True))
    return (
        f"- **{_text(stage)}**, batch {_text(r.batch_id)} ({counted(r.batch_size, 'call')} of "
        f"{counted(r.co_batched_runs, 'flow run')}) on {_text(_where(r))}: {reason}{risk}. "
        f"Predicted {sig3(r.predicted_ms):g} ms, took {sig3(r.actual_ms):g} ms."
    )


def run_summary(records: RunRecords) -> str:
    """The markdown artifact of a run: SLO outcome, cost, failed calls, and why each batch was the size it was."""
    first_call: dict[str, tuple[str, StageResult, bool]] = {}
    for c, earlier in all_calls(records):
        if c.result is not None and c.result.batch_id not in first_call:
            first_call[c.result.batch_id] = (c.stage, c.result, earlier)
    shared = sum(1 for _, r, _ in first_call.values() if r.co_batched_runs > 1)
    lines = [
        f"### ESG pool: flow run `{records.run_id}` of workflow `{records.workflow}`",
        "",
        _slo_line(records),
        "",
        _cost_line(records, len(first_call), shared),
        *_failures(records),
    ]
    if first_call:
        lines += [
            "",
            "#### Why the batches were this size",
            "",
            "Each stage's calls from concurrent flow runs wait in one queue; a batch takes the calls "
            "waiting when the scheduler dispatches, up to the size it chose for the reason given.",
            "",
            *(_decision(stage, r, earlier) for stage, r, earlier in first_call.values()),
        ]
    return "\n".join(lines) + "\n"
