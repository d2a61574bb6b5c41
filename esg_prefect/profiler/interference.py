"""Co-run interference: how much slower a stage runs beside tenants at the same share.

PALDIA's hybrid sharing (ESG-SPEC section 7) needs to know what co-running
costs: a batch either co-runs on a device now, paying a slowdown from a
*measured co-run table*, or waits. This module measures that table and loads it.

Method: ``k`` copies of the profiler's worker run the same stages at the same
configuration (batch, vcpus, GPU share) in separate processes. Each copy builds
its models, reports ready, and all start at one wall-clock time; every stage
gets a common slot in which each copy calls it back to back. The slowdown of
``co_runners = k - 1`` is the mean call time of the ``k`` copies over the mean
of one copy alone (``k = 1``), measured the same way. On a CPU, ``k`` copies
of ``vcpus`` threads want ``k * vcpus`` cores: beyond the machine's cores the
table measures time-slicing, and the run says so.

CSV (one row per stage, hardware, configuration and co-runner count)::

    stage,hardware,batch,vcpus,gpu_share,co_runners,alone_ms,corun_ms,slowdown
    detect,cpu,4,1,0,1,33.1,39.8,1.202
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from esg_prefect.exceptions import ProfileError

# The table's types live in the domain model (pure: the scheduler and the simulator read them);
# this module measures tables and keeps its historical names for them.
from esg_prefect.model.interference import FIELDS, CoRunRow, InterferenceTable

__all__ = ["FIELDS", "CoRunMeasurement", "CoRunRow", "InterferenceTable", "measure_interference"]


@dataclass(frozen=True, slots=True)
class CoRunMeasurement:
    """The table rows of one measurement and the other processes' CPU use during it (cores)."""

    rows: tuple[CoRunRow, ...]
    other_cores: dict[int, float | None]
    oversubscribed: bool


def _run_copies(
    k: int,
    job_for: Callable[[], object],
    progress: Callable[[str], None] | None,
) -> list[dict[str, list[float]]]:
    from esg_prefect.profiler.worker import READY, Job, ProfilerWorkerError, finish_worker, start_worker

    with tempfile.TemporaryDirectory(prefix="esg-corun-") as tmp:
        procs = []
        for i in range(k):
            job = job_for()
            assert isinstance(job, Job)
            out = Path(tmp) / f"copy{i}.json"
            procs.append((start_worker(job, out), out))
        for proc, _ in procs:  # wait until every copy has built its models
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == READY:
                    break
            else:
                raise ProfilerWorkerError(f"co-run copy exited with code {proc.wait()} before it was ready")
        start = time.time() + 0.5
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.close()
        return [finish_worker(proc, out, progress)["times"] for proc, out in procs]


def measure_interference(
    specs: Sequence[str],
    *,
    batch: int = 4,
    vcpus: int = 1,
    gpu_share: float = 0.0,
    device: str = "cpu",
    hardware: str = "cpu",
    co_runners: Sequence[int] = (1,),
    slot_s: float = 2.0,
    pool: int = 8,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> CoRunMeasurement:
    """Measure the co-run table of every stage of ``specs`` at one configuration (see the module docstring).

    Raises:
        ProfileError: on a co-runner count below 1 or a slot shorter than 0.05 s.
    """
    from esg_prefect.profiler.machine import CpuWatch
    from esg_prefect.profiler.worker import Job

    if not co_runners or min(co_runners) < 1:
        raise ProfileError(f"co_runners must be counts >= 1, got {list(co_runners)}")
    if slot_s < 0.05:
        raise ProfileError(f"slot_s must be >= 0.05 s, got {slot_s}")

    def job() -> Job:
        return Job(
            "corun",
            tuple(specs),
            vcpus,
            gpu_share,
            device,
            hardware,
            settings={"pool": pool, "seed": seed},
            args={"batch": batch, "slot_s": slot_s},
        )

    means: dict[int, dict[str, float]] = {}
    other: dict[int, float | None] = {}
    for k in [1, *sorted({c + 1 for c in co_runners})]:
        with CpuWatch(children=True) as watch:
            copies = _run_copies(k, job, progress)
        # our own k copies are children: what is left is the rest of the machine, in cores
        other[k] = watch.other_cores
        means[k] = {name: statistics.fmean(t for c in copies for t in c[name]) for name in copies[0]}
        if progress is not None:
            progress(f"co-run x{k}: done")
    rows = []
    for k, by_stage in means.items():
        if k == 1:
            continue
        for name, ms in by_stage.items():
            rows.append(CoRunRow(name, hardware, batch, vcpus, gpu_share, k - 1, means[1][name], ms))
    over = device == "cpu" and (1 + max(co_runners)) * vcpus > (os.cpu_count() or 1)
    return CoRunMeasurement(tuple(rows), other, over)
