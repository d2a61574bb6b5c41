"""One profiler session: profile, optionally the stall breakdown and the validation, files and store.

``esg-prefect profile`` and the Prefect flow (:mod:`esg_prefect.profiler.flow`)
both call :func:`run_session`, which differ only in how they show progress
(a rich progress bar; a Prefect progress artifact and run logs). Files, named
``<name>`` in ``out_dir``:

* ``<name>.csv`` - the latency profile (``LatencyProfile.from_csv`` reads it;
  ``Pool(profile=...)`` plans with it), with the profiler's extra columns;
* ``<name>_samples.csv`` - one row per timed call with its total input size
  (the Cypress size model's data);
* ``<name>_stalls.csv`` and ``<name>_corun.csv`` - the Stash breakdown and
  the co-run interference table (``InterferenceTable.from_csv``);
* ``<name>_validation.csv`` - fresh measurements against the predictions;
* figures ``profiler_<name>_<pipeline>.png`` and ``profiler_<name>_validation.png``
  in ``figures_dir`` (no second ``profiler_`` when ``name`` starts with it).

The run, its points, stalls and co-runs are also saved in the profile store
(:class:`~esg_prefect.store.profile_store.ProfileStore`) unless ``store_url`` is False.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from esg_prefect.model import LatencyProfile
from esg_prefect.profiler.breakdown import (
    COMPONENTS,
    Breakdown,
    read_breakdown_csv,
    stall_breakdown,
    write_breakdown_csv,
)
from esg_prefect.profiler.interference import InterferenceTable
from esg_prefect.profiler.measure import QUICK_BATCHES, MeasureSettings
from esg_prefect.profiler.report import (
    breakdown_table,
    noise_warnings,
    plot_breakdown,
    plot_validation,
    profile_summary,
    quiet_line,
)
from esg_prefect.profiler.run import ProfileRequest, ProfileRun, ProgressFn, run_profile
from esg_prefect.profiler.sizes import size_report
from esg_prefect.profiler.stalls import DEFAULT_TRACE
from esg_prefect.profiler.validate import (
    VALIDATION_BATCHES,
    ValidationReport,
    read_validation_csv,
    repredict,
    validate,
)


@dataclass(frozen=True, slots=True)
class BreakdownOptions:
    """Configuration of the Stash runs (one configuration for every stage)."""

    batch: int = 4
    vcpus: int = 1
    co_runners: int = 1
    trace: str = DEFAULT_TRACE
    utilisation: float = 0.7
    requests: int = 48
    slot_s: float = 2.0


def settings_for(batches: Sequence[int] | None, quick: bool, max_attempts: int) -> MeasureSettings:
    """Measurement settings from the CLI's or the flow's options; ``quick`` times each point once."""
    if quick:
        return MeasureSettings.quick(batches or QUICK_BATCHES)
    settings = MeasureSettings(max_attempts=max_attempts)
    return settings if not batches else settings.with_batches(batches)


def measure_request(
    specs: Sequence[str],
    vcpus: Sequence[int],
    gpu_shares: Sequence[float],
    settings: MeasureSettings,
    quick: bool,
    wait_quiet_s: float,
) -> ProfileRequest:
    """The profile to measure; ``quick`` waits for no quiet and times one cold start per stage, not three."""
    return ProfileRequest(
        specs=tuple(specs),
        vcpus=tuple(vcpus),
        gpu_shares=tuple(gpu_shares),
        settings=settings,
        wait_quiet_s=0.0 if quick else wait_quiet_s,
        worker_start_launches=1 if quick else 3,
    )


def breakdown_options(quick: bool, batch: int, co_runners: int, trace: str, utilisation: float) -> BreakdownOptions:
    """The Stash runs' options; ``quick`` replays 8 requests over 0.3 s slots instead of 48 over 2 s."""
    return BreakdownOptions(
        batch=batch,
        co_runners=co_runners,
        trace=trace,
        utilisation=utilisation,
        slot_s=0.3 if quick else 2.0,
        requests=8 if quick else 48,
    )


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """What a session does and where it writes.

    Args:
        request: the profile to measure; None to skip profiling and use ``existing``.
        existing: a profile CSV to validate or to break down instead of measuring one.
        out_dir, name: where the CSV files go and their common name.
        figures_dir: where the PNGs go (``out_dir`` by default).
        breakdown: the Stash breakdown options, or None to skip it.
        validate: whether to validate the profile against fresh measurements.
        validation_batches: batch sizes of the validation.
        validation_settings: measurement settings of the validation (the request's by default).
        measurements: a validation CSV whose fresh measurements to reuse instead of measuring
            again (to compare another profile on the same runs).
        stalls: a stall-breakdown CSV to draw (and tabulate) again instead of measuring.
        store_url: the profile store's URL (None: the default store; False: do not store).
        label: a label for the stored run.
        targets: what an existing profile (``existing``, no ``request``) is validated or broken
            down on: the targets it was measured from (``-t``), the example stages by default.
    """

    request: ProfileRequest | None = field(default_factory=ProfileRequest)
    existing: Path | None = None
    out_dir: Path = Path("profiles")
    name: str = "profile"
    figures_dir: Path | None = None
    breakdown: BreakdownOptions | None = None
    validate: bool = False
    validation_batches: tuple[int, ...] = VALIDATION_BATCHES
    validation_settings: MeasureSettings | None = None
    measurements: Path | None = None
    stalls: Path | None = None
    store_url: str | bool | None = None
    label: str = ""
    targets: tuple[str, ...] = ("examples",)

    @property
    def specs(self) -> tuple[str, ...]:
        """The targets: the request's, or ``targets`` when validating an existing file."""
        return self.request.specs if self.request is not None else self.targets


@dataclass(slots=True)
class SessionResult:
    """What a session produced."""

    run: ProfileRun | None = None
    profile: LatencyProfile | None = None
    files: dict[str, Path] = field(default_factory=dict)
    breakdown: Breakdown | None = None
    validation: ValidationReport | None = None
    run_id: str | None = None
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """A plain-text account: summary, breakdown, validation, files."""
        parts: list[str] = []
        if self.run is not None:
            parts += [profile_summary(self.run.points)]
            others = ", ".join(f"{k} {'?' if v is None else f'{v:.2f}'}" for k, v in self.run.other_cpu.items())
            parts.append(f"other processes' CPU during profiling (cores): {others}\n{quiet_line(self.run.points)}")
            warnings = noise_warnings(self.run.points)
            if warnings:
                parts.append("\n".join(warnings))
            parts += [f"skipped: {s}" for s in self.run.skipped]
            if self.run.samples:
                parts.append(size_report(self.run.samples))
        if self.breakdown is not None:
            parts.append(breakdown_table(self.breakdown.rows))
            oc = self.breakdown.other_cpu
            parts.append(f"other processes' CPU during the breakdown (cores): {'?' if oc is None else f'{oc:.2f}'}")
            if self.breakdown.corun.oversubscribed:
                parts.append("co-run copies wanted more cores than the machine has: the slowdowns include time-slicing")
        if self.validation is not None:
            parts.append(self.validation.table())
            parts.append(
                "other processes' CPU during validation (cores): "
                + ", ".join(f"{k} {'?' if v is None else f'{v:.2f}'}" for k, v in self.validation.other_cpu.items())
            )
        parts += self.notes
        parts += [f"wrote {k}: {v}" for k, v in self.files.items()]
        if self.run_id:
            parts.append(f"stored profile run {self.run_id}")
        return "\n\n".join(parts)


def _say_nothing(_: str) -> None:
    pass


def run_session(
    opts: SessionOptions,
    progress: ProgressFn | None = None,
    say: Callable[[str], None] = _say_nothing,
) -> SessionResult:
    """Profile, break down, validate, write the files and store the run (see the module docstring)."""
    out_dir = opts.out_dir
    figs = opts.figures_dir or out_dir
    stem = opts.name if opts.name.startswith("profiler") else f"profiler_{opts.name}"
    res = SessionResult()
    path = out_dir / f"{opts.name}.csv"
    if opts.request is not None:
        say(f"profiling {', '.join(opts.request.specs)} at batches {list(opts.request.settings.batches)}")
        res.run = run_profile(opts.request, progress)
        res.run.write(path, out_dir / f"{opts.name}_samples.csv")
        res.files["profile"] = path
        res.files["samples"] = out_dir / f"{opts.name}_samples.csv"
        res.profile = res.run.profile()
    elif opts.existing is not None:
        res.profile = LatencyProfile.from_csv(opts.existing)
    settings = opts.validation_settings or (opts.request.settings if opts.request else MeasureSettings())
    if opts.stalls is not None:
        rows = read_breakdown_csv(opts.stalls)
        for pipeline in dict.fromkeys(r.pipeline for r in rows):
            key = f"figure {pipeline or 'stages'}"
            res.files[key] = plot_breakdown(rows, pipeline, figs / f"{stem}_{pipeline or 'stages'}.png")
        res.notes.append(breakdown_table(rows))
    if opts.breakdown is not None:
        b = opts.breakdown
        say(f"stall breakdown at batch {b.batch}, {b.vcpus} vCPU, {b.co_runners} co-runner(s), trace {b.trace}")
        res.breakdown = stall_breakdown(
            opts.specs,
            batch=b.batch,
            vcpus=b.vcpus,
            co_runners=b.co_runners,
            trace=b.trace,
            utilisation=b.utilisation,
            requests=b.requests,
            slot_s=b.slot_s,
            settings=settings,
            worker_start_launches=opts.request.worker_start_launches if opts.request else 3,
            progress=say,
        )
        write_breakdown_csv(res.breakdown.rows, out_dir / f"{opts.name}_stalls.csv")
        InterferenceTable(res.breakdown.corun.rows).to_csv(out_dir / f"{opts.name}_corun.csv")
        res.files["stalls"] = out_dir / f"{opts.name}_stalls.csv"
        res.files["corun"] = out_dir / f"{opts.name}_corun.csv"
        for pipeline in res.breakdown.pipelines():
            key = f"figure {pipeline or 'stages'}"
            res.files[key] = plot_breakdown(res.breakdown.rows, pipeline, figs / f"{stem}_{pipeline or 'stages'}.png")
    if opts.validate:
        if res.profile is None:
            raise ValueError("validation needs a profile: measure one or give an existing CSV")
        if opts.measurements is not None:
            say(f"predicting the measurements of {opts.measurements}")
            res.validation = repredict(read_validation_csv(opts.measurements), res.profile)
        else:
            say(f"validating against fresh measurements at batches {list(opts.validation_batches)}")
            res.validation = validate(
                res.profile, opts.specs, batches=opts.validation_batches, settings=settings, progress=say
            )
            left = sorted(res.profile.stages() - set(res.validation.stages()))
            if left:  # a profile of other stages than the targets: say so, not a silent partial check
                res.notes.append(
                    f"not validated: {', '.join(left)}: in the profile but not among the targets "
                    f"({', '.join(opts.specs)}) at these batch sizes; give -t the targets it was measured from"
                )
        res.validation.to_csv(out_dir / f"{opts.name}_validation.csv")
        res.files["validation"] = out_dir / f"{opts.name}_validation.csv"
        res.files["figure validation"] = plot_validation(res.validation, figs / f"{stem}_validation.png")
    if opts.store_url is not False and (res.run is not None or res.breakdown is not None):
        res.run_id = _store(opts, res)
    return res


def _store(opts: SessionOptions, res: SessionResult) -> str:
    from esg_prefect.store.profile_store import ProfileStore

    url = opts.store_url if isinstance(opts.store_url, str) else None
    with ProfileStore(url) as store:
        run = res.run
        points: list[dict[str, Any]] = []
        if run is not None:
            for p in run.points:
                d = p.to_dict()
                d["cold_start_ms"] = p.total_cold_start_ms
                points.append(d)
        rid = store.add_run(
            started_at_ms=(run.started_at_s * 1000.0) if run else 0.0,
            wall_s=run.wall_s if run else 0.0,
            points=points,
            host=run.host if run else {},
            request=asdict(opts.request) if opts.request else {"existing": str(opts.existing)},
            other_cpu=run.other_cpu if run else {},
            label=opts.label,
        )
        if res.breakdown is not None:
            stalls = []
            for r in res.breakdown.rows:
                for c in COMPONENTS:
                    ms = getattr(r, f"{c}_ms")
                    stalls.append(
                        {
                            "stage": r.stage,
                            "hardware": r.hardware,
                            "batch": r.batch,
                            "vcpus": r.vcpus,
                            "gpu_share": r.gpu_share,
                            "component": c,
                            "ms": ms,
                        }
                    )
            store.add_stalls(rid, stalls)
            store.add_coruns(
                rid,
                [{k: v for k, v in asdict(r).items()} for r in res.breakdown.corun.rows],
            )
    return rid
