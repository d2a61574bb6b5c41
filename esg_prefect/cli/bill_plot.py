"""The whole bill of a run: split busy/idle/cold (:func:`bill_totals`, :func:`bill_split`), and drawn per scheduler.

The figure puts the SLO hit rate on top and the bill stacked busy/idle/cold
below. ``esg-prefect compare`` draws one per experiment or case and
``simulate`` prints the same split under its tables; ``bench/whole_bill.py``
and docs/results.md use the same parts, so a bar reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from esg_prefect.control.totals import BILL_PARTS

__all__ = ["BILL", "bill_bars", "bill_columns", "bill_figure", "bill_means", "bill_split", "bill_totals", "label_of"]

_PARTS = {  # part (BILL_PARTS) -> (row key, legend label, colour), stacked from the bottom in this order
    "busy": ("busy_per_request", "busy excl. cold starts (batches)", "#4c72b0"),
    "idle": ("idle_per_request", "idle (kept warm, pre-warm loads included)", "#dd8452"),
    "cold_start": ("cold_per_request", "cold starts", "#c44e52"),
}

BILL = tuple(key for key, _, _ in _PARTS.values())
"""The whole bill's parts per request, as the simulator's rows name them (the keys of the plot's parts)."""


def bill_columns(per_request: Mapping[str, float]) -> dict[str, float]:
    """A row's bill columns (:data:`BILL`, in its order) from the bill per request by part (:data:`BILL_PARTS`).

    The one place that maps the bill's part names (the pool's totals, its
    Prometheus labels) to the columns of ``esg-prefect compare``'s rows.

    Raises:
        ValueError: naming the parts missing or unknown.
    """
    if set(per_request) != set(BILL_PARTS):
        raise ValueError(f"the bill's parts are {', '.join(BILL_PARTS)}; got {', '.join(sorted(per_request))}")
    return {key: per_request[part] for part, (key, _, _) in _PARTS.items()}


def bill_totals(run: Any, case: Any) -> dict[str, float]:
    """The whole bill of ``run`` in its report's window, by part (:data:`~esg_prefect.control.totals.BILL_PARTS`).

    The three parts, as the pool's totals name them, add up to the report's busy
    plus idle cost: ``cold_start`` is the part of the batches spent starting their
    worker, ``busy`` the rest of the batches, ``idle`` the warm idle time (a
    pre-warmed worker's load included, as the report bills it: the worker holds
    its share with no job). ``simulate`` prints them; :func:`bill_split` is them per request.
    """
    from esg_prefect.model.window import after_warmup

    report = run.report
    window = after_warmup(run.requests, run.stages, run.batches, run.idles, case.warmup_s * 1000.0)
    cold_ms: dict[str, float] = {}
    for s in run.stages:
        if s.cold_start_ms > 0:
            cold_ms[s.batch_id] = max(cold_ms.get(s.batch_id, 0.0), s.cold_start_ms)
    cold = sum(
        case.prices.batch_cost(b.config, b.hardware, min(cold_ms.get(b.batch_id, 0.0), b.duration_ms))
        for b in window.batches
    )
    return {"busy": max(0.0, report.busy_cost - cold), "idle": report.idle_cost, "cold_start": cold}


def bill_split(run: Any, case: Any) -> dict[str, float]:
    """The whole bill of ``run`` per request, in its report's window: the row's columns :data:`BILL`.

    :func:`bill_totals` over the window's requests; the parts add up to the
    report's ``cost_per_request`` (its busy plus idle cost).
    """
    n = run.report.overall.count or 1
    return bill_columns({part: total / n for part, total in bill_totals(run, case).items()})


_LABELS = {
    "load": "at {:g} requests/s",
    "trace_label": "on trace {}",
    "tightness": "at SLO tightness {:g}",
    "case": "{}",
}


def label_of(key: str, value: Any) -> str:
    """How a run's group value reads: ``at 300 requests/s``, ``on trace code``."""
    return _LABELS.get(key, f"{key} {{}}").format(value)


def bill_means(rows: Sequence[dict[str, Any]], group: str) -> dict[Any, dict[str, dict[str, float]]]:
    """Per value of ``group``, per scheduler (both in the rows' order): mean SLO hit rate and bill parts over seeds."""
    acc: dict[Any, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        acc.setdefault(r[group], {}).setdefault(r["scheduler"], []).append(r)
    return {
        g: {
            s: {k: sum(float(r[k]) for r in rs) / len(rs) for k in ("slo_hit_rate", *BILL)}
            for s, rs in by_sched.items()
        }
        for g, by_sched in acc.items()
    }


def bill_figure(rows: Sequence[dict[str, Any]], group: str, title: str) -> Any:
    """A matplotlib figure: per value of ``group`` a column, SLO hit rate on top, the whole bill stacked below.

    Bars are labelled with their scheduler; the legend of the bill's parts is
    below the panels (constrained layout keeps it out of them), outside every bar.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = bill_means(rows, group)
    groups = list(means)
    width = max(6.5, 1.5 + sum(0.5 * len(means[g]) + 0.6 for g in groups))
    fig, axes = plt.subplots(2, len(groups), figsize=(width, 6.4), sharey="row", squeeze=False, layout="constrained")
    for col, g in enumerate(groups):
        scheds = list(means[g])
        top, bill = axes[0][col], axes[1][col]
        top.bar(scheds, [100 * means[g][s]["slo_hit_rate"] for s in scheds], color="#55a868")
        top.set_ylim(0, 105)
        if len(groups) > 1:
            top.set_title(label_of(group, g), fontsize=9)
        base = [0.0] * len(scheds)
        for key, label, color in _PARTS.values():
            vals = [1e6 * means[g][s][key] for s in scheds]
            bill.bar(scheds, vals, bottom=base, color=color, label=label)
            base = [a + b for a, b in zip(base, vals, strict=True)]
        bill.tick_params(axis="x", labelrotation=60, labelsize=7)
        top.tick_params(axis="x", labelbottom=False)
        for ax in (top, bill):
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("SLO hit rate (%)")
    axes[1][0].set_ylabel("$ per million requests")
    fig.suptitle(f"{title}: SLO hit rate, and the whole bill per request (busy + idle + cold)", fontsize=10)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig


def bill_bars(rows: Sequence[dict[str, Any]], group: str, path: Path, title: str) -> None:
    """Write :func:`bill_figure` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = bill_figure(rows, group, title)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
