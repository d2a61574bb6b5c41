"""``esg-prefect costs``: what flow runs cost, from the cost store, per run, workflow, deployment or day.

A run's cost is the one figure its Prefect artifacts show (``docs/decisions/one-cost.md``):
its shares of its batches' busy time and of the warm idle time they caused,
shown with that busy/idle split and the price sheet's unit.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time
from datetime import UTC, datetime
from typing import Any

import typer

from esg_prefect.exceptions import ESGError, InvalidInputError

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([mhdw])$")
_UNIT_S = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
FORMATS = ("table", "csv", "json")
SPLITS = ("equal", "input_size")
IDLE_BILLINGS = ("attribute", "separate")
IDLE_KEY_LINE = "the idle line holds the idle time of workers that never ran a batch"


def parse_since(text: str | None, now_s: float | None = None) -> float | None:
    """A ``--since`` value as epoch ms: an ISO date or time (naive = UTC), or an age such as ``30m``, ``12h``, ``7d``.

    Raises:
        InvalidInputError: naming the value and the accepted forms.

    Examples:
        >>> parse_since("2024-05-01")
        1714521600000.0
        >>> parse_since("2h", now_s=7200.0)
        0.0
    """
    if text is None or text == "":
        return None
    m = _RELATIVE.match(text.strip())
    if m:
        now = time.time() if now_s is None else now_s
        return (now - float(m.group(1)) * _UNIT_S[m.group(2)]) * 1000.0
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInputError(
            f"--since must be an ISO date or time (2024-05-01, 2024-05-01T12:00) or an age (30m, 12h, 7d), got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp() * 1000.0


def rows_as_csv(rows: list[dict[str, Any]]) -> str:
    """CSV with a header line (the rows' keys)."""
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def register(app: typer.Typer) -> None:
    """Add the ``costs`` command."""

    @app.command("costs")
    def costs(
        by: str = typer.Option("run", "--by", help="Group by run, workflow, deployment or day (UTC)."),
        fmt: str = typer.Option("table", "--format", help="table, csv or json."),
        url: str | None = typer.Option(
            None,
            "--url",
            help="Store URL or SQLite file; default $ESG_PREFECT_STORE_URL, else $PREFECT_HOME/esg_prefect/costs.db.",
        ),
        since: str | None = typer.Option(
            None, "--since", help="Only costs from then on: an ISO date or time (UTC) or an age such as 12h, 7d."
        ),
        split: str | None = typer.Option(None, "--split", help="Batch cost split: equal (default) or input_size."),
        idle_billing: str | None = typer.Option(
            None, "--idle-billing", help="Idle time: attribute (default) to the runs served before it, or separate."
        ),
        limit: int = typer.Option(0, "--limit", help="Show only the last N groups (the total counts all); 0: all."),
    ) -> None:
        """Costs of flow runs from the cost store, one row per group and a total (idle time attributed to no run
        has a row of its own)."""
        from esg_prefect.store import GROUP_BYS, resolve_url
        from esg_prefect.store.engine import ENV_URL, default_store_path, safe_url

        for value, hint, accepted in (
            (by, "--by", GROUP_BYS),
            (fmt, "--format", FORMATS),
            (split, "--split", SPLITS),
            (idle_billing, "--idle-billing", IDLE_BILLINGS),
        ):
            if value is not None and value not in accepted:
                raise typer.BadParameter(f"must be one of {', '.join(accepted)}; got {value!r}", param_hint=hint)
        if limit < 0:
            raise typer.BadParameter(f"must be 0 (all) or more, got {limit}", param_hint="--limit")
        try:
            resolve_url(url)  # a database the store cannot use: named with its option, as the others are
        except ESGError as exc:  # the message names the scheme, not the URL (which may hold a password)
            raise typer.BadParameter(str(exc), param_hint="--url" if url else f"${ENV_URL}") from None
        try:
            since_ms = parse_since(since)
        except InvalidInputError as exc:
            raise typer.BadParameter(str(exc).removeprefix("--since "), param_hint="--since") from None
        if url is None and not os.environ.get(ENV_URL) and not default_store_path().exists():
            # Nothing chosen and nothing recorded yet: an empty account, not a mistake to refuse.
            from esg_prefect.examples.demo import demo_store_path  # imports the models: only here

            typer.echo(
                f"No costs recorded yet (no store at {default_store_path()}). Flow runs under the ESG task "
                "runner record theirs there (e.g. `python flows/text_pipeline.py`); the demo keeps its own "
                f"(`esg-prefect costs --url {demo_store_path()}`), and `esg-prefect simulate` reports its own.",
                err=fmt != "table",
            )
            if fmt == "table":
                return
            rows: list[Any] = []
        else:
            rows = _read(url, by, since_ms, split, idle_billing)
        total = sum(r.cost for r in rows)
        shown = _last(rows, limit)
        records = [r.as_dict() for r in shown]
        if fmt == "json":
            parts = {"busy": sum(r.busy_cost for r in rows), "idle": sum(r.idle_cost for r in rows)}
            unit = rows[-1].unit if rows else "$"
            doc = {"group_by": by, "rows": records, "total": total, "total_split": parts, "unit": unit}
            typer.echo(json.dumps(doc, indent=2))
        elif fmt == "csv":
            typer.echo(rows_as_csv(records), nl=False)
        else:
            _print_table(by, shown, rows, safe_url(resolve_url(url)), len(rows) - len(shown))


def _read(url: str | None, by: str, since_ms: float | None, split: str | None, idle_billing: str | None) -> list[Any]:
    """The cost rows of the store at ``url``.

    Raises:
        typer.BadParameter: naming ``--url`` and the store, when there is no
            store there or it cannot be reached (the database's first line of why).
    """
    from sqlalchemy.exc import SQLAlchemyError

    from esg_prefect.store import CostStore, resolve_url
    from esg_prefect.store.engine import safe_url

    where = safe_url(resolve_url(url))
    try:
        store = CostStore(url, create=False)
        try:
            return store.costs(by, since_ms, split=split, idle_billing=idle_billing)  # type: ignore[arg-type]
        finally:
            store.close()
    except ESGError as exc:
        raise typer.BadParameter(
            f"{exc}; give the URL or SQLite file of a store that a pool recorded costs in", param_hint="--url"
        ) from None
    except SQLAlchemyError as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise typer.BadParameter(f"cannot read the cost store at {where}: {why}", param_hint="--url") from None


def _last(rows: list[Any], limit: int) -> list[Any]:
    """The last ``limit`` groups and the idle line (all of them for 0)."""
    groups = [r for r in rows if not r.idle]
    if limit == 0 or len(groups) <= limit:
        return rows
    return [*groups[-limit:], *(r for r in rows if r.idle)]


def _print_table(by: str, rows: list[Any], every: list[Any], where: str, hidden: int = 0) -> None:
    from rich.console import Console
    from rich.table import Table

    unit = every[-1].unit if every else "$"
    table = Table(title=f"ESG costs by {by}")
    table.add_column(by, no_wrap=True)
    for name in ("runs", "stage calls", "SLO met", "SLO missed", f"busy {unit}", f"idle {unit}", f"cost {unit}"):
        table.add_column(name, justify="right")
    for r in rows:
        money = (f"{r.busy_cost:.6g}", f"{r.idle_cost:.6g}", f"{r.cost:.6g}")
        if r.idle:
            table.add_row(r.key, "", "", "", "", *money, style="dim")
        else:
            table.add_row(r.key, str(r.runs), str(r.stage_calls), str(r.slo_met), str(r.slo_missed), *money)
    table.add_section()
    if hidden:
        table.add_row(f"({hidden} earlier groups not shown)", "", "", "", "", "", "", "", style="dim")
    busy, idle, total = (sum(getattr(r, k) for r in every) for k in ("busy_cost", "idle_cost", "cost"))
    table.add_row("total", "", "", "", "", f"{busy:.6g}", f"{idle:.6g}", f"{total:.6g}", style="bold")
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze run ids into 80 columns
        console = Console(width=160)
    console.print(table)
    console.print(
        f"A run's cost: its share of its batches' busy time and of the warm idle time they caused; {IDLE_KEY_LINE}.",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    console.print(f"store: {where}", soft_wrap=True, markup=False, highlight=False)
