"""``esg-prefect costs``: what flow runs cost, from the cost store, per run, workflow, deployment or day.

A run's cost is the one figure its Prefect artifacts show (``docs/decisions/one-cost.md``):
its shares of its batches' busy time and of the warm idle time they caused,
shown with that busy/idle split and the price sheet's unit. Each pool's runs are
priced with the cost split and idle billing that pool used, as the store keeps
them; ``--split`` and ``--idle-billing`` override them, with a note when that
changes a pool's figures.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer

from esg_prefect.exceptions import ESGError, InvalidInputError
from esg_prefect.model.attribution import COST_SPLITS, IDLE_BILLINGS
from esg_prefect.wording import counted

if TYPE_CHECKING:
    from esg_prefect.store.billing import Billing, PoolPricing

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([mhdw])$")
_UNIT_S = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
FORMATS = ("table", "csv", "json")
IDLE_LINES = {
    "attribute": "the idle line holds the idle time of workers that never ran a batch",
    "separate": "the idle line holds all warm idle time (idle billing separate)",
    "mixed": (
        "the idle line holds the idle time of workers that never ran a batch, "
        "and all idle time of pools that bill it separately"
    ),
}
"""What the idle line holds, by the idle billing the rows were priced with (``mixed``: both kinds of pools)."""
COST_HEADERS = ("busy incl. cold", "idle", "cost")
"""The table's cost columns (the unit follows): busy is said to include cold starts, as ``compare``'s excludes them."""
COLUMNS_LINE = (
    "Columns: busy incl. cold = the batches' busy time, their workers' cold starts included (busy_cost in csv/json); "
    "idle = warm idle time (idle_cost); cost = busy + idle, the figure of a run's artifacts and tag (cost)."
)
"""The line under the table that says what each cost column holds."""
SHORT_ID = 8
"""Characters of a run id shown after its name: the last ones (Prefect's ids are time-ordered, the first alike)."""
RUN_NAMES_LINE = (
    f"A run is shown by its flow run name and the last {SHORT_ID} characters of its id "
    "(--format csv or json: the whole id); runs the store has no name for, by their id."
)


def run_label(key: str, name: str | None) -> str:
    """How the table names a run: its flow run's name and the end of its id, or its id when the name is unknown.

    Example:
        >>> run_label("9b6f0c1e-4a1d-4f7e-9a51-0c1d2e3f4a5b", "crimson-fox")
        'crimson-fox (2e3f4a5b)'
    """
    return f"{name} ({key[-SHORT_ID:]})" if name else key


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

    # typer prints each paragraph of the docstring with its line breaks, the first as the command's
    # summary in `esg-prefect --help`: one line each.
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
        split: str | None = typer.Option(
            None,
            "--split",
            help="Override the batch cost split, equal or input_size (default: each pool's own, as its artifacts).",
        ),
        idle_billing: str | None = typer.Option(
            None,
            "--idle-billing",
            help="Override idle billing: attribute to the runs served before it, or separate "
            "(default: each pool's own, as its artifacts).",
        ),
        limit: int = typer.Option(0, "--limit", help="Show only the last N groups (the total counts all); 0: all."),
    ) -> None:
        """Costs of flow runs from the cost store: one row per run, workflow, deployment or day, and a total.

        Idle time attributed to no run has a row of its own; --format csv or json keeps full precision.
        """
        from esg_prefect.store import GROUP_BYS, resolve_url
        from esg_prefect.store.engine import ENV_URL, default_store_path, safe_url

        for value, hint, accepted in (
            (by, "--by", GROUP_BYS),
            (fmt, "--format", FORMATS),
            (split, "--split", COST_SPLITS),
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
            pricing = Pricing.none()
        else:
            rows, pricing = _read(url, by, since_ms, split, idle_billing)
            note = pricing.note(split, idle_billing)
            if note:  # on stderr beside CSV and JSON, which stay machine-readable
                typer.echo(note, err=fmt != "table")
        total = sum(r.cost for r in rows)
        shown = _last(rows, limit)
        records = [r.as_dict() for r in shown]
        if fmt == "json":
            parts = {"busy": sum(r.busy_cost for r in rows), "idle": sum(r.idle_cost for r in rows)}
            unit = rows[-1].unit if rows else "$"
            priced = [
                {"cost_split": b.cost_split, "idle_billing": b.idle_billing}
                for b in sorted(set(pricing.used), key=repr)
            ]
            doc = {
                "group_by": by,
                "rows": records,
                "total": total,
                "total_split": parts,
                "unit": unit,
                "priced_as": priced,
            }
            typer.echo(json.dumps(doc, indent=2))
        elif fmt == "csv":
            typer.echo(rows_as_csv(records), nl=False)
        else:
            _print_table(by, shown, rows, safe_url(resolve_url(url)), pricing, len(rows) - len(shown))


def _read(
    url: str | None, by: str, since_ms: float | None, split: str | None, idle_billing: str | None
) -> tuple[list[Any], Pricing]:
    """The cost rows of the store at ``url``, and how they were priced.

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
            # the rows and each pool's options from one read of the store
            rows, pools = store.priced_costs(by, since_ms, split, idle_billing)  # type: ignore[arg-type]
        finally:
            store.close()
    except ESGError as exc:
        raise typer.BadParameter(
            f"{exc}; give the URL or SQLite file of a store that a pool recorded costs in", param_hint="--url"
        ) from None
    except SQLAlchemyError as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise typer.BadParameter(f"cannot read the cost store at {where}: {why}", param_hint="--url") from None
    return rows, Pricing.of(list(pools.values()), store.default_billing, split is not None or idle_billing is not None)


@dataclass(frozen=True)
class Pricing:
    """How the rows were priced: the options each pool stored, those used (overrides applied), the store's defaults.

    Attributes:
        stored: per pool in the rows, the options it priced its runs with (what its artifacts
            show); None for a pool that stored none (an older esg-prefect's): not known.
        default: what such a pool's records are read with (the store's defaults).
        used: per pool, the options its rows were priced with here.
        overridden: whether ``--split`` or ``--idle-billing`` was given.
    """

    stored: list[Billing | None]
    default: Billing
    used: list[Billing]
    overridden: bool

    @classmethod
    def of(cls, pools: list[PoolPricing], default: Billing, overridden: bool) -> Pricing:
        """From how the store priced each pool, its defaults, and whether an override was given."""
        return cls([p.stored for p in pools], default, [p.used for p in pools], overridden)

    @classmethod
    def none(cls) -> Pricing:
        """No store: nothing priced."""
        from esg_prefect.store.billing import DEFAULT_BILLING

        return cls([], DEFAULT_BILLING, [], False)

    def note(self, split: str | None, idle_billing: str | None) -> str | None:
        """One line when ``--split``/``--idle-billing`` change the figures of pools whose options are known."""
        return override_note([b for b in self.stored if b is not None], split, idle_billing)

    def idle_line(self) -> str:
        """What the idle line holds, for the options the rows were priced with."""
        kinds = {b.idle_billing for b in self.used} or {"attribute"}
        return IDLE_LINES[kinds.pop() if len(kinds) == 1 else "mixed"]

    def cost_line(self) -> str:
        """What a run's cost is, for the options the rows were priced with."""
        caused = not self.used or any(b.idle_billing == "attribute" for b in self.used)
        idle = " and of the warm idle time they caused" if caused else ""
        return f"A run's cost: its share of its batches' busy time{idle}; {self.idle_line()}."

    def priced_line(self) -> str:
        """How the rows were priced, in a sentence or two."""
        if not self.used:
            return "No pool billed anything in this window."
        if self.overridden:
            return f"Priced with the options given: {'; '.join(sorted({b.describe() for b in self.used}))}."
        known = sorted({b.describe() for b in self.stored if b is not None})
        unknown = sum(1 for b in self.stored if b is None)
        lines = (
            [f"Priced as each pool priced its runs (its artifacts show the same): {'; '.join(known)}."] if known else []
        )
        if unknown:
            one = unknown == 1
            lines.append(
                f"{counted(unknown, 'pool')} stored no pricing options (written by an older esg-prefect): "
                f"{'its' if one else 'their'} records read as {self.default.describe()}; if {'it' if one else 'they'} "
                "priced otherwise, give --split and --idle-billing."
            )
        return " ".join(lines)


def override_note(own: list[Billing], split: str | None, idle_billing: str | None) -> str | None:
    """One line saying that ``--split``/``--idle-billing`` change some pools' figures; None when they change none.

    ``own``: the options each pool priced its runs with (what its artifacts show).

    Example:
        >>> from esg_prefect.store.billing import Billing
        >>> print(override_note([Billing("input_size", "separate")], "equal", "separate"))
        note: --split equal overrides the pool's own input_size split: these figures differ from its artifacts
    """
    given = (
        ("--split", split, "cost_split", "split"),
        ("--idle-billing", idle_billing, "idle_billing", "idle billing"),
    )
    differ = [(f, v, k, w) for f, v, k, w in given if v is not None and any(getattr(b, k) != v for b in own)]
    if not differ:
        return None
    flags = " ".join(f"{f} {v}" for f, v, _, _ in differ)
    theirs = " and ".join(
        f"{' or '.join(sorted({getattr(b, k) for b in own if getattr(b, k) != v}))} {w}" for _, v, k, w in differ
    )
    verb = "overrides" if len(differ) == 1 else "override"
    changed = sum(1 for b in own if any(getattr(b, k) != v for _, v, k, _ in differ))
    if len(own) == 1:
        return f"note: {flags} {verb} the pool's own {theirs}: these figures differ from its artifacts"
    return (
        f"note: {flags} {verb} what {changed} of {len(own)} pools priced their runs with ({theirs}): "
        "these figures differ from their artifacts"
    )


def _last(rows: list[Any], limit: int) -> list[Any]:
    """The last ``limit`` groups and the idle line (all of them for 0)."""
    groups = [r for r in rows if not r.idle]
    if limit == 0 or len(groups) <= limit:
        return rows
    return [*groups[-limit:], *(r for r in rows if r.idle)]


def _print_table(by: str, rows: list[Any], every: list[Any], where: str, pricing: Pricing, hidden: int = 0) -> None:
    from rich.console import Console
    from rich.markup import escape  # keys are user text (flow run names, workflows): never markup
    from rich.table import Table

    from esg_prefect.model.money import ROUNDED_NOTE, money_exponent, money_text

    unit = every[-1].unit if every else "$"
    table = Table(title=f"ESG costs by {by}")
    table.add_column(by, no_wrap=True)
    for name in ("runs", "stage calls", "SLO met", "SLO missed", *(f"{k} {unit}" for k in COST_HEADERS)):
        table.add_column(name, justify="right")
    kinds = ("busy_cost", "idle_cost", "cost")
    totals = [sum(getattr(r, k) for r in every) for k in kinds]
    # One notation per column, from the rows shown and the total under them.
    exponent = [money_exponent([*(getattr(r, k) for r in rows), t]) for k, t in zip(kinds, totals, strict=True)]
    for r in rows:
        money = tuple(money_text(getattr(r, k), e) for k, e in zip(kinds, exponent, strict=True))
        if r.idle:
            table.add_row(r.key, "", "", "", "", *money, style="dim")
        else:
            label = run_label(r.key, r.name) if by == "run" else r.key
            table.add_row(escape(label), str(r.runs), str(r.stage_calls), str(r.slo_met), str(r.slo_missed), *money)
    table.add_section()
    if hidden:
        table.add_row(f"({hidden} earlier groups not shown)", "", "", "", "", "", "", "", style="dim")
    total = (money_text(t, e) for t, e in zip(totals, exponent, strict=True))
    table.add_row("total", "", "", "", "", *total, style="bold")
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze run ids into 80 columns
        console = Console(width=160)
    console.print(table)
    rounded = f"Costs in {unit}, {ROUNDED_NOTE} (--format csv or json: full precision)."
    named = [RUN_NAMES_LINE] if any(r.name for r in rows) else []
    for line in (COLUMNS_LINE, *named, pricing.cost_line(), pricing.priced_line(), rounded, f"store: {where}"):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
