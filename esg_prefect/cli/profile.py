"""``esg-prefect profile``: measure the stages' latency profile on this machine (and more, on request)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from esg_prefect.cli.workdir import import_from_cwd

DEFAULT_BATCHES = "1,2,4,8,16,32"


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{what} must be integers >= 1, got {text!r}")
    return values


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated numbers, got {text!r}") from None


def _shares(text: str) -> tuple[float, ...]:
    """``--gpu-shares``: comma-separated fractions of a GPU, each in (0, 1] as ``ProfileRequest`` takes them."""
    from esg_prefect.profiler.run import GPU_SHARE_RANGE, is_gpu_share

    shares = _floats(text, "--gpu-shares")
    if not all(map(is_gpu_share, shares)):
        raise typer.BadParameter(f"must be GPU fractions in {GPU_SHARE_RANGE}, got {text!r}", param_hint="--gpu-shares")
    return shares


def _check_files(*files: tuple[str, Path | None, str]) -> None:
    """Refuse an input file that is not there, naming its option and what it takes."""
    for hint, path, what in files:
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"no file {str(path)!r}; give {what}", param_hint=hint)


def _warn_vcpus(vcpus: tuple[int, ...], cpus: int | None) -> None:
    """Warn, in one line on stderr, of ``--vcpus`` counts above the machine's ``cpus``; the run goes on.

    Such a point times that many threads sharing fewer cores: a row that reads as
    a bigger worker but is not one. Not refused: the user may want the rows anyway.
    """
    over = [v for v in vcpus if cpus is not None and v > cpus]
    if over:
        typer.echo(
            f"esg-prefect: warning: --vcpus {','.join(map(str, over))} exceeds this machine's {cpus} CPUs: those "
            f"rows time {max(over)} threads sharing {cpus} cores, not a {max(over)}-vCPU worker",
            err=True,
        )


def _check_run(
    breakdown_batch: int, co_runners: int, trace: str, utilisation: float, wait_quiet_s: float, max_attempts: int
) -> None:
    """Refuse the numbers and the trace of a run before it starts, each naming its option and range."""
    from esg_prefect.cli.args import check_number, check_trace

    for hint, value in (("--breakdown-batch", breakdown_batch), ("--co-runners", co_runners)):
        if value < 1:
            raise typer.BadParameter(f"must be at least 1, got {value}", param_hint=hint)
    if max_attempts < 1:
        raise typer.BadParameter(f"--max-attempts must be >= 1, got {max_attempts}")
    if not 0 < utilisation <= 1.5:
        raise typer.BadParameter(
            f"must be in (0, 1.5], of batch capacity, got {utilisation}", param_hint="--utilisation"
        )
    check_number(wait_quiet_s, "--wait-quiet-s", "seconds", zero_ok=True)
    check_trace(trace)


def given_options(ctx: typer.Context) -> dict[str, object]:
    """The options the user gave (typed, or from the environment), by long name, with their values.

    An option left at its default is not given, even where a user could have typed that value.
    """
    given: dict[str, object] = {}
    for param in ctx.command.params:
        name = param.name or ""
        source = ctx.get_parameter_source(name)
        if source is not None and source.name != "DEFAULT":  # by name: typer ships its own click
            given[next(o for o in param.opts if o.startswith("--"))] = ctx.params[name]
    return given


def refuse_ignored(given: dict[str, object]) -> None:
    """Refuse, in one line naming them, the given options the run would ignore (``profiler.option_modes``' tables)."""
    from esg_prefect.profiler.option_modes import ignored_option

    found = ignored_option(given)
    if found is not None:
        raise typer.BadParameter(found[1], param_hint=found[0])


def register(app: typer.Typer) -> None:
    """Add the ``profile`` command."""

    @app.command("profile")
    def profile(
        ctx: typer.Context,
        target: list[str] = typer.Option(
            ["examples"],
            "--target",
            "-t",
            help="What to profile: 'examples', 'examples:<pipeline>', 'module:attr' (a ProfileTarget or a list), "
            "or 'module:stage@module:samples'; modules are imported from the working directory too. Repeatable.",
        ),
        vcpus: str = typer.Option(
            "1,2", help="Thread counts (vCPUs), comma-separated; more than this machine's CPUs: a warning."
        ),
        batches: str = typer.Option(DEFAULT_BATCHES, help="Batch sizes, comma-separated."),
        gpu_shares: str = typer.Option("0.25,0.5,1", help="GPU shares where a GPU is present (skipped on CPU)."),
        quick: bool = typer.Option(False, "--quick", help="One repetition per point, batches 1,2 (smoke test)."),
        out_dir: Path = typer.Option(Path("profiles"), help="Where the CSV files go."),
        name: str = typer.Option("profile", help="Common name of the files written."),
        figures_dir: Path | None = typer.Option(None, help="Where the PNG figures go (default: --out-dir)."),
        breakdown: bool = typer.Option(False, "--breakdown", help="Also measure the Stash stall breakdown."),
        breakdown_batch: int = typer.Option(4, help="Batch size of the stall breakdown."),
        co_runners: int = typer.Option(1, help="Co-located tenants in the interference run."),
        trace: str = typer.Option("azure_llm_conv", help="Arrival trace of the queueing run."),
        utilisation: float = typer.Option(0.7, help="Offered load of the queueing run, of batch capacity."),
        validate: bool = typer.Option(False, "--validate", help="Validate the profile against fresh measurements."),
        profile_csv: Path | None = typer.Option(
            None, "--profile", help="Use this profile CSV instead of measuring (with --validate or --breakdown)."
        ),
        validation_batches: str = typer.Option("1,3,6,8,12,24", help="Batch sizes of the validation."),
        store: str | None = typer.Option(None, help="Profile store URL (default: the cost store's database)."),
        no_store: bool = typer.Option(False, "--no-store", help="Do not save the run in the profile store."),
        wait_quiet_s: float = typer.Option(120.0, help="Wait up to this long for other processes to quiet down."),
        max_attempts: int = typer.Option(4, help="Times a point disturbed by other processes is timed, at most."),
        as_flow: bool = typer.Option(
            False, "--flow", help="Run as the Prefect flow 'esg-profile' (progress in the UI)."
        ),
        measurements: Path | None = typer.Option(
            None, help="With --validate: reuse the fresh measurements of this validation CSV (no new runs)."
        ),
        stalls: Path | None = typer.Option(None, help="Draw the figures of this stall-breakdown CSV again."),
        fit_sizes: Path | None = typer.Option(
            None, "--fit-sizes", help="Only fit the input-size model on this samples CSV and print it."
        ),
    ) -> None:
        """Measure every stage's latency over batch sizes x vCPUs (x GPU shares), with p50/p95, memory, cold start.

        Writes a latency-profile CSV that the scheduler loads
        (ESGTaskRunner(profile="profile.csv"), or pool serve --profile), the
        per-call samples for the input-size model, and saves the run in the profile
        store. --breakdown adds the Stash stall breakdown (compute, host-to-device
        copy, interference, transfer, queueing, cold start) and the co-run table;
        --validate compares the profile's predictions with fresh measurements.
        Targets are imported from the working directory too, as with python -m.
        """
        import_from_cwd()  # a console script, unlike python -m, does not put it on the import path
        _check_files(
            ("--fit-sizes", fit_sizes, "a samples CSV (esg-prefect profile writes one)"),
            ("--profile", profile_csv, "a latency profile CSV"),
            ("--measurements", measurements, "a validation CSV"),
            ("--stalls", stalls, "a stall-breakdown CSV"),
        )
        _check_run(breakdown_batch, co_runners, trace, utilisation, wait_quiet_s, max_attempts)
        _ints(batches, "--batches")
        given = given_options(ctx)
        refuse_ignored(given)
        if validate and stalls is not None and profile_csv is None:  # --stalls measures no profile to validate
            raise typer.BadParameter(
                "--stalls measures no profile: give the one to validate with --profile", param_hint="--validate"
            )
        if fit_sizes is not None:
            from esg_prefect.exceptions import ProfileError
            from esg_prefect.profiler.results import read_samples_csv
            from esg_prefect.profiler.sizes import size_report

            try:
                samples = read_samples_csv(fit_sizes)
            except ProfileError as exc:
                raise typer.BadParameter(str(exc), param_hint="--fit-sizes") from None
            typer.echo(size_report(samples))
            return
        vcpu_counts = _ints(vcpus, "--vcpus")
        shares = _shares(gpu_shares)  # refused before any run, on a machine without a GPU too
        measuring = profile_csv is None and stalls is None  # a new profile, at these counts
        if as_flow:
            from esg_prefect.integration.api_check import check_prefect_api, prefect_api_url

            check_prefect_api(prefect_api_url())  # a server that is not up: one line, at once
            if measuring:
                _warn_vcpus(vcpu_counts, os.cpu_count())
            from esg_prefect.profiler.flow import profile_flow

            out = profile_flow(
                targets=list(target),
                vcpus=list(vcpu_counts),
                batches=list(_ints(batches, "--batches")) if not quick else None,
                gpu_shares=list(shares),
                quick=quick,
                breakdown=breakdown,
                validation=validate,
                out_dir=str(out_dir),
                name=name,
                store_url=store,
                wait_quiet_s=wait_quiet_s,
                max_attempts=max_attempts,
                breakdown_batch=breakdown_batch,
                co_runners=co_runners,
                trace=trace,
                utilisation=utilisation,
                validation_batches=(
                    list(_ints(validation_batches, "--validation-batches")) if "--validation-batches" in given else None
                ),  # else None, the flow's default: it refuses batch sizes its run would not validate
                store=not no_store,
            )
            typer.echo(out)
            return
        if measuring:
            _warn_vcpus(vcpu_counts, os.cpu_count())
        _run_cli(
            target=tuple(target),
            vcpus=vcpu_counts,
            batches=None if quick else _ints(batches, "--batches"),
            gpu_shares=shares,
            quick=quick,
            out_dir=out_dir,
            name=name,
            figures_dir=figures_dir,
            breakdown=breakdown,
            breakdown_batch=breakdown_batch,
            co_runners=co_runners,
            trace=trace,
            utilisation=utilisation,
            validate=validate,
            profile_csv=profile_csv,
            validation_batches=_ints(validation_batches, "--validation-batches"),
            store=False if no_store else store,
            wait_quiet_s=wait_quiet_s,
            max_attempts=max_attempts,
            measurements=measurements,
            stalls=stalls,
        )


def _run_cli(
    *,
    target: tuple[str, ...],
    vcpus: tuple[int, ...],
    batches: tuple[int, ...] | None,
    gpu_shares: tuple[float, ...],
    quick: bool,
    out_dir: Path,
    name: str,
    figures_dir: Path | None,
    breakdown: bool,
    breakdown_batch: int,
    co_runners: int,
    trace: str,
    utilisation: float,
    validate: bool,
    profile_csv: Path | None,
    validation_batches: tuple[int, ...],
    store: str | bool | None,
    wait_quiet_s: float,
    max_attempts: int = 4,
    measurements: Path | None = None,
    stalls: Path | None = None,
) -> None:

    from rich.console import Console
    from rich.progress import TextColumn

    from esg_prefect.cli.progress import progress_bar
    from esg_prefect.profiler.session import (
        SessionOptions,
        breakdown_options,
        measure_request,
        run_session,
        settings_for,
    )

    settings = settings_for(batches, quick, max_attempts)
    request = None
    if profile_csv is None and stalls is None:
        request = measure_request(target, vcpus, gpu_shares, settings, quick, wait_quiet_s)
    opts = SessionOptions(
        request=request,
        existing=profile_csv,
        out_dir=out_dir,
        name=name,
        figures_dir=figures_dir,
        breakdown=breakdown_options(quick, breakdown_batch, co_runners, trace, utilisation) if breakdown else None,
        validate=validate,
        validation_batches=(1, 3) if quick else validation_batches,
        validation_settings=settings if profile_csv is not None else None,
        measurements=measurements,
        stalls=stalls,
        store_url=store,
        targets=target,
    )
    console = Console(stderr=True)
    with progress_bar(console, TextColumn("{task.fields[label]}")) as bar:
        task_id = bar.add_task("[bold]profiling", total=None, label="")

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task_id, completed=done, total=total, label=label)

        def say(text: str) -> None:
            bar.update(task_id, label=text[:70])

        res = run_session(opts, progress, say)
    typer.echo(res.text())
    if res.validation is not None and not res.validation.passed():
        console.print(f"[yellow]some stages are above the {res.validation.target:.0%} median error target")
