"""``esg-prefect demo``: pooled example pipelines with costs, then the same under Prefect's default runner."""

from __future__ import annotations

import os

import typer

from esg_prefect.exceptions import InvalidInputError


def check_prefect_api(url: str | None, timeout_s: float = 5.0) -> None:
    """Refuse, in one line, a ``PREFECT_API_URL`` that does not answer (None: Prefect starts its own API).

    Raises:
        InvalidInputError: naming the URL and what to run.
    """
    if not url:
        return
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        raise InvalidInputError(
            f"the Prefect API at PREFECT_API_URL={url} does not answer ({type(exc).__name__}): start it with "
            "`prefect server start`, or unset PREFECT_API_URL to let the demo start its own"
        ) from None


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command."""

    @app.command("demo")
    def demo(
        requests: int = typer.Option(120, help="Flow runs (requests) to start."),
        rate: float = typer.Option(2.0, help="Mean arrival rate, requests per second."),
        trace: str = typer.Option("azure_functions_2019", help="Arrival trace (see esg_prefect.workload)."),
        seed: int = typer.Option(0, help="Seed of the arrivals and inputs."),
        compare: bool = typer.Option(True, help="Also run the workload under Prefect's ThreadPoolTaskRunner."),
        backend: str = typer.Option("process", help="Workers: 'process' (worker processes) or 'inline' (threads)."),
        runs_shown: int = typer.Option(8, help="Flow runs listed with their cost."),
    ) -> None:
        """Run many concurrent flow runs of the example pipelines through ESG, and print SLO, batches and costs."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
        from rich.table import Table

        from esg_prefect.examples import demo as d

        # Every bad value is refused before quiet_prefect() changes this process's environment.
        if backend not in ("process", "inline"):
            raise typer.BadParameter(f"backend must be 'process' or 'inline', got {backend!r}")
        if requests < 1:
            raise InvalidInputError(f"--requests must be at least 1, got {requests}")
        if runs_shown < 0:
            raise InvalidInputError(f"--runs-shown must be 0 or more, got {runs_shown}")
        check_prefect_api(os.environ.get("PREFECT_API_URL"))
        arrivals = d.demo_arrivals(requests, rate, seed, trace)

        d.quiet_prefect()  # before prefect is imported: it reads its settings once

        from esg_prefect.examples.catalog import PIPELINES
        from esg_prefect.examples.driver import percentile
        from esg_prefect.examples.pipelines import SLO_MS

        console = Console()
        console.print(
            f"[bold]esg-prefect demo[/]: {len(arrivals)} requests of image/text/video pipelines from the "
            f"{trace} trace at {rate:g}/s; end-to-end SLOs: " + ", ".join(f"{n} {ms:g} ms" for n, ms in SLO_MS.items())
        )
        starting = "starting Prefect"
        if not os.environ.get("PREFECT_API_URL"):
            starting += " (an ephemeral API on an in-memory database: about 20 s)"
        with console.status(starting):
            d.warm_prefect()
        runs = []
        for label in ("esg", "threadpool") if compare else ("esg",):
            with Progress(
                TextColumn(f"[bold]{label:>10}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                bar = progress.add_task(label, total=len(arrivals))

                def done(_: object, bar: TaskID = bar) -> None:
                    progress.advance(bar)

                if label == "esg":
                    runs.append(d.run_esg(arrivals, done, backend))
                else:
                    runs.append(d.run_threadpool(arrivals, done))
        table = Table(title="Per workflow: SLO hit rate and latency (arrival to flow return)")
        for col in (
            "workflow",
            "runner",
            "requests",
            "SLO ms",
            "SLO hit",
            "p50 ms",
            "p95 ms",
            "mean batch",
            "cost/request $",
        ):
            table.add_column(col, justify="right" if col not in ("workflow", "runner") else "left")
        for wf in PIPELINES:
            for run in runs:
                outs = [o for o in run.outcomes if o.workflow == wf]
                if not outs:
                    continue
                lat = [o.latency_ms for o in outs if o.ok]
                hit = sum(1 for o in outs if o.ok and o.latency_ms <= SLO_MS[wf]) / len(outs)
                mean_batch = "-"
                if run.report is not None:
                    mean_batch = (
                        f"{run.report.workflow(wf).mean_batch_size:.1f}"
                        if wf in {g.name for g in run.report.workflows}
                        else "-"
                    )
                wf_cost = sum(c.total for _, w, c in run.per_run_cost if w == wf) if run.per_run_cost else None
                cost = wf_cost / len(outs) if wf_cost is not None else run.cost_total / len(run.outcomes)
                table.add_row(
                    wf,
                    run.runner,
                    str(len(outs)),
                    f"{SLO_MS[wf]:g}",
                    f"{hit:.0%}",
                    f"{percentile(lat, 50):.0f}",
                    f"{percentile(lat, 95):.0f}",
                    mean_batch,
                    f"{cost:.2e}",
                )
        console.print(table)
        esg = runs[0]
        if esg.report is not None:
            hist = Table(title="ESG batches per stage")
            for col in ("workflow/stage", "calls", "mean batch", "queue wait ms", "execution ms (incl. cold)"):
                hist.add_column(col)
            for st in esg.report.stages:
                hist.add_row(
                    f"{st.workflow}/{st.stage}",
                    str(st.jobs),
                    f"{st.mean_batch_size:.1f}",
                    f"{st.queue_ms:.0f}",
                    f"{st.exec_ms + st.cold_start_ms:.0f}",
                )
            console.print(hist)
        if esg.per_run_cost:
            u = esg.cost_unit
            runs_table = Table(
                title=f"Cost per flow run (first {runs_shown} of {len(esg.per_run_cost)}): busy time of its batches "
                "plus the warm idle time they caused, as in its Prefect artifacts and `esg-prefect costs`"
            )
            runs_table.add_column("flow run id")
            runs_table.add_column("workflow")
            for name in (f"busy {u}", f"idle {u}", f"cost {u}"):
                runs_table.add_column(name, justify="right")
            for rid, wf, run_cost in esg.per_run_cost[:runs_shown]:
                money = (run_cost.busy, run_cost.idle, run_cost.total)
                runs_table.add_row(rid, wf, *(f"{m:.3e}" for m in money))
            console.print(runs_table)
        for run in runs:
            ok = sum(o.ok for o in run.outcomes)
            console.print(
                f"{run.runner:>10}: {ok}/{len(run.outcomes)} requests ok in {run.wall_s:.1f} s "
                f"({ok / run.wall_s:.2f} requests/s), total cost ${run.cost_total:.3e}"
            )
        if len(runs) == 2 and runs[0].cost_total > 0:
            console.print(d.cost_ratio_line(runs[0], runs[1]))
        console.print(
            f"ESG's runs are in the demo's own cost store: esg-prefect costs --url {d.demo_store_path()}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
