"""``esg-prefect schedulers``: list the registered schedulers and ESG's knobs."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    """Add the ``schedulers`` command."""

    @app.command("schedulers")
    def schedulers(
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        markdown: bool = typer.Option(False, "--markdown", help="Print docs/settings.md: every knob explained."),
    ) -> None:
        """List schedulers by name, and the default ESG settings (the knobs)."""
        from esg_prefect.scheduling import ESGSettings, describe_schedulers

        if as_json and markdown:
            raise typer.BadParameter("--json and --markdown print different things: give one of them")
        if markdown:
            from esg_prefect.scheduling.settings_doc import settings_markdown

            typer.echo(settings_markdown(), nl=False)
            return
        names = describe_schedulers()
        knobs = ESGSettings().to_dict()
        if as_json:
            typer.echo(json.dumps({"schedulers": names, "esg_settings": knobs}, indent=2))
            return
        console = Console()
        table = Table(title="Schedulers")
        table.add_column("name")
        table.add_column("what it does")
        for name, desc in names.items():
            table.add_row(name, desc)
        console.print(table)
        knob_table = Table(title="ESG settings (defaults)")
        knob_table.add_column("knob")
        knob_table.add_column("default")
        for k, v in knobs.items():
            knob_table.add_row(k, str(v))
        console.print(knob_table)
