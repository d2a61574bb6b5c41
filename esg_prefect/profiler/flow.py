"""The profiler as a Prefect flow: the same session as ``esg-prefect profile``, with progress in the UI.

Progress is a Prefect progress artifact (key ``esg-profile-progress``) updated
after each measured point, plus a run-log line per configuration step; at the
end a markdown artifact (key ``esg-profile-report``) holds the profile summary,
the stall breakdown and the validation table. Each phase is a task, so the UI
shows where the time went.

Example:
    >>> from esg_prefect.profiler.flow import profile_flow   # doctest: +SKIP
    >>> profile_flow(targets=["examples:text"], vcpus=[1], batches=[1, 2, 4], quick=True)   # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from esg_prefect.profiler.measure import MeasureSettings
from esg_prefect.profiler.option_modes import refuse_ignored_parameters
from esg_prefect.profiler.run import DEFAULT_WAIT_QUIET_S
from esg_prefect.profiler.session import (
    BreakdownOptions,
    SessionOptions,
    SessionResult,
    breakdown_options,
    measure_request,
    run_session,
    settings_for,
)
from esg_prefect.profiler.validate import VALIDATION_BATCHES

_BREAKDOWN = BreakdownOptions()
"""The stall breakdown's defaults, which the flow's parameters (and the CLI's options) start from."""
_MAX_ATTEMPTS = MeasureSettings().max_attempts


def report_markdown(res: SessionResult) -> str:
    """The session's account as markdown (fenced text tables)."""
    return "# esg-prefect profile\n\n```\n" + res.text() + "\n```\n"


@task(name="profile-session")
def _session(opts: SessionOptions) -> SessionResult:
    logger = get_run_logger()
    artifact = cast(UUID, create_progress_artifact(0.0, key="esg-profile-progress", description="points measured"))
    last = [-1]

    def progress(done: int, total: int, label: str) -> None:
        pct = 100.0 * done / max(total, 1)
        if int(pct) != last[0]:  # one API call per percent, not per point
            update_progress_artifact(artifact, pct)
            last[0] = int(pct)
        logger.debug("%d/%d %s", done, total, label)

    res = run_session(opts, progress, say=logger.info)
    update_progress_artifact(artifact, 100.0)
    return res


@flow(name="esg-profile", log_prints=True)
def profile_flow(
    targets: list[str] | None = None,
    vcpus: list[int] | None = None,
    batches: list[int] | None = None,
    gpu_shares: list[float] | None = None,
    quick: bool = False,
    breakdown: bool = False,
    validation: bool = False,
    out_dir: str = "profiles",
    name: str = "profile",
    store_url: str | None = None,
    wait_quiet_s: float = DEFAULT_WAIT_QUIET_S,
    max_attempts: int = _MAX_ATTEMPTS,
    breakdown_batch: int = _BREAKDOWN.batch,
    co_runners: int = _BREAKDOWN.co_runners,
    trace: str = _BREAKDOWN.trace,
    utilisation: float = _BREAKDOWN.utilisation,
    validation_batches: list[int] | None = None,
    store: bool = True,
) -> dict[str, Any]:
    """Profile stages on this machine (``esg-prefect profile --flow`` runs this).

    Args:
        targets: target specs (default: the example stages).
        vcpus: thread counts (default 1 and 2).
        batches: batch sizes (default 1..32).
        gpu_shares: GPU shares where a GPU is present.
        quick: one repetition per point (smoke test).
        breakdown: also run the Stash stall breakdown.
        validation: also validate the profile against fresh measurements.
        out_dir, name: where the files go (see :mod:`esg_prefect.profiler.session`).
        store_url: profile store URL (default store when None).
        wait_quiet_s: wait this long at most for the machine to quiet down per configuration.
        max_attempts: times a point disturbed by other processes is timed, at most (one with ``quick``).
        breakdown_batch, co_runners, trace, utilisation: the stall breakdown's batch size, co-located
            tenants, and the queueing run's arrival trace and offered load.
        validation_batches: batch sizes of the validation (default 1..24; 1 and 3 with ``quick``).
        store: save the run in the profile store (False: the files only).

    A parameter the run would ignore is refused, as ``esg-prefect profile`` refuses its
    option, before anything is measured: with ``quick``, ``max_attempts``, ``wait_quiet_s``
    and ``validation_batches``; the breakdown's without ``breakdown``;
    ``validation_batches`` without ``validation``; ``store_url`` with ``store=False``.
    Only a value other than the parameter's default counts.

    Returns:
        The files written (by kind) and the stored run id.

    Raises:
        InvalidInputError: a parameter the run would ignore, named with its value.
    """
    refuse_ignored_parameters(locals(), _DEFAULTS)  # first: locals() holds just the parameters
    settings = settings_for(batches, quick, max_attempts)
    opts = SessionOptions(
        request=measure_request(
            targets or ("examples",),
            vcpus or (1, 2),
            (0.25, 0.5, 1.0) if gpu_shares is None else gpu_shares,
            settings,
            quick,
            wait_quiet_s,
        ),
        out_dir=Path(out_dir),
        name=name,
        breakdown=breakdown_options(quick, breakdown_batch, co_runners, trace, utilisation) if breakdown else None,
        validate=validation,
        validation_batches=(1, 3) if quick else tuple(validation_batches or VALIDATION_BATCHES),
        store_url=store_url if store else False,
    )
    res = _session(opts)
    create_markdown_artifact(report_markdown(res), key="esg-profile-report", description="profile summary")
    return {"files": {k: str(v) for k, v in res.files.items()}, "run_id": res.run_id}


_DEFAULTS = {name: p.default for name, p in inspect.signature(profile_flow.fn).parameters.items()}
"""The flow's parameters' defaults, read from its signature: a value other than these counts as given."""
