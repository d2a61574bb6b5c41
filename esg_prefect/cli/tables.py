"""The tables ``esg-prefect simulate`` and ``compare`` print and write, from rows of plain values.

On a console too narrow for a table it is split into several, each led by the
row's name, so that no header or value is cut short. Costs are written as
every other surface writes them (:func:`~esg_prefect.model.money.money_text`),
each column in one notation decided from its values; other figures to about
three significant digits. "Busy" means the batches with
their workers' cold starts in ``simulate``'s rows and without them in
``compare``'s: so the cost columns' headers say which, and a line under each
table says what every cost column holds and its key in the JSON files; another
says what ``cold_starts`` counts, which is not what the cost columns cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from esg_prefect.cli.bill_plot import BILL
from esg_prefect.model.money import money_exponent, money_text

if TYPE_CHECKING:
    from rich.console import JustifyMethod

MONEY_COLUMNS = frozenset({"cost", "cost_per_request", "batch_cost_per_request", *BILL})
"""The row keys that hold money: written by :func:`~esg_prefect.model.money.money_text`."""

HEADERS = {
    "cost": "whole bill $",
    "cost_per_request": "whole bill $/req",
    "batch_cost_per_request": "busy incl. cold $/req",
    "busy_per_request": "busy excl. cold $/req",
    "cold_per_request": "cold starts $/req",
    "idle_per_request": "idle $/req",
}
"""The header of a cost column, by row key: what it holds, so that no two kinds of "busy" read alike."""

_MEANS = {
    "cost": "the batches, cold starts included, + idle",
    "cost_per_request": "the batches, cold starts included, + idle, per request",
    "batch_cost_per_request": "the batches, their workers' cold starts included",
    "busy_per_request": "the batches less their workers' cold starts",
    "cold_per_request": "the part of the batches spent starting their worker",
    "idle_per_request": "workers kept warm with no batch, pre-warm loads included",
}


COUNT_NOTES = {
    "cold_starts": "workers started over the whole run, warm-up and pre-warmed ones included, while the cost "
    "columns leave the warm-up out and bill a pre-warm load as idle",
}
"""What a count column counts, where it is not what the costs beside it cover."""


def count_legend(columns: Sequence[str]) -> str | None:
    """The line under a table that says what its :data:`COUNT_NOTES` columns count; None when it has none."""
    shown = [c for c in columns if c in COUNT_NOTES]
    return "; ".join(f"{c} = {COUNT_NOTES[c]}" for c in shown) + "." if shown else None


def header(column: str) -> str:
    """The header a table shows for the row key ``column`` (the key itself unless it is a cost)."""
    return HEADERS.get(column, column)


def cost_legend(columns: Sequence[str]) -> str | None:
    """The line under a table that says what each of its cost columns holds; None when it has none.

    Example:
        >>> print(cost_legend(["scheduler", "cost"]))
        Costs (3 significant digits): whole bill $ = the batches, cold starts included, + idle (cost).
    """
    shown = [c for c in columns if c in _MEANS]
    if not shown:
        return None
    return "Costs (3 significant digits): " + "; ".join(f"{header(c)} = {_MEANS[c]} ({c})" for c in shown) + "."


def _is_money(column: str, v: Any) -> bool:
    return column in MONEY_COLUMNS and isinstance(v, int | float) and not isinstance(v, bool)


def money_notations(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, bool]:
    """Per money column of ``rows``: whether it is written with exponents (one notation for the column)."""
    return {
        c: money_exponent(float(r[c]) for r in rows if _is_money(c, r.get(c))) for c in columns if c in MONEY_COLUMNS
    }


def cell(column: str, v: Any, exponent: bool | None = None) -> str:
    """A value as a table shows it: money in the package's one format (in the column's notation, ``exponent``,
    from :func:`money_notations`), other numbers short, None as ``-``."""
    if v is None:
        return "-"
    if _is_money(column, v):
        return money_text(float(v), exponent)
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def column_groups(widths: Sequence[int], room: int, keys: int = 1) -> list[list[int]]:
    """Indexes of the columns of each table, so that each fits ``room`` characters with the first ``keys``
    columns (the row's name) in every one.

    ``widths`` are the columns' content widths; each column takes three more (padding and border),
    the table one more. A column too wide to fit beside the keys still gets a table of its own.
    """
    head = list(range(min(keys, len(widths))))
    base = 1 + sum(widths[i] + 3 for i in head)
    groups: list[list[int]] = []
    used = 0
    for i in range(len(head), len(widths)):
        if not groups or used + widths[i] + 3 > room:
            groups.append(list(head))
            used = base
        groups[-1].append(i)
        used += widths[i] + 3
    return groups if groups else [head]


def print_table(
    console: Console, title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str], keys: int = 1
) -> None:
    """A rich table of ``columns`` of ``rows``; on a console too narrow for it, several tables of fewer
    columns, each led by the first ``keys`` columns, so that no header or value is cut short. Cost columns
    get their :data:`HEADERS`, and the table its :func:`cost_legend` line."""
    names = [header(c) for c in columns]
    notation = money_notations(rows, columns)
    cells = [[cell(c, r.get(c), notation.get(c)) for c in columns] for r in rows]
    widths = [max([len(n), *(len(row[i]) for row in cells)]) for i, n in enumerate(names)]
    groups = column_groups(widths, console.width, keys)
    for n, group in enumerate(groups):
        table = Table(title=f"{title} ({n + 1}/{len(groups)})" if len(groups) > 1 else title)
        for i in group:
            justify: JustifyMethod = "right" if columns[i] in MONEY_COLUMNS else "left"  # money: digits line up
            table.add_column(names[i], no_wrap=True, min_width=widths[i], justify=justify)
        for row in cells:
            table.add_row(*(row[i] for i in group))
        console.print(table)
    for legend in (count_legend(columns), cost_legend(columns)):
        if legend is not None:
            console.print(legend, highlight=False, markup=False)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """The same table in Markdown, its legend line under it."""
    lines = ["| " + " | ".join(header(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    notation = money_notations(rows, columns)
    for r in rows:
        lines.append("| " + " | ".join(cell(c, r.get(c), notation.get(c)) for c in columns) + " |")
    legends = [text for text in (count_legend(columns), cost_legend(columns)) if text is not None]
    return "\n".join(lines) + "".join(f"\n\n{text}" for text in legends)
