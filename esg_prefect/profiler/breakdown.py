"""The Stash stall breakdown of every stage: differential runs, one source of delay at a time.

See :mod:`esg_prefect.profiler.stalls` for how each source is measured. Here
the runs are put together: one worker measures compute, the host-to-device
copy, the transfer from another worker and the queueing under a real trace;
:func:`~esg_prefect.profiler.interference.measure_interference` runs the
co-located copies; the worker start as the pool starts one is added to the
in-process cold start. The result is one :class:`StallRow` per stage, written
as CSV, stored with the profile, and drawn per pipeline by
:mod:`esg_prefect.profiler.report`.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from esg_prefect.exceptions import ProfileError
from esg_prefect.model.csv_rows import read_rows
from esg_prefect.profiler.interference import CoRunMeasurement, measure_interference
from esg_prefect.profiler.machine import CpuWatch, worker_start_ms
from esg_prefect.profiler.measure import MeasureSettings
from esg_prefect.profiler.stalls import DEFAULT_TRACE
from esg_prefect.profiler.worker import Job, run_worker

COMPONENTS: tuple[str, ...] = ("compute", "h2d", "interference", "transfer", "queueing", "cold_start")
"""The stall components, in the order Stash adds them."""


@dataclass(frozen=True, slots=True)
class StallRow:
    """One stage's stall breakdown at one configuration, in ms per batch (cold start: per cold worker).

    ``h2d_ms`` is None where it does not apply (CPU). ``interference_ms`` is
    ``compute_ms * (slowdown - 1)`` with ``co_runners`` tenants; ``queueing_ms``
    the mean wait of an item under the trace replay.
    """

    stage: str
    pipeline: str
    hardware: str
    batch: int
    vcpus: int
    gpu_share: float
    compute_ms: float
    h2d_ms: float | None
    co_runners: int
    slowdown: float
    interference_ms: float
    transfer_ms: float
    transfer_bytes: float
    queueing_ms: float
    queue_p95_ms: float
    queue_trace: str
    queue_utilisation: float
    cold_start_ms: float
    quiet: bool = True

    def component_ms(self, name: str) -> float:
        """One component by name (``h2d`` counts 0 where it does not apply).

        Raises:
            ProfileError: on an unknown component name.
        """
        if name not in COMPONENTS:
            raise ProfileError(f"unknown stall component {name!r}; known: {COMPONENTS}")
        value = getattr(self, f"{name}_ms")
        return 0.0 if value is None else float(value)

    @property
    def warm_total_ms(self) -> float:
        """Compute plus every warm stall (all but the cold start)."""
        return sum(self.component_ms(c) for c in COMPONENTS if c != "cold_start")


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Every stage's stall row, the co-run measurement, and the machine's other load meanwhile (cores)."""

    rows: tuple[StallRow, ...]
    corun: CoRunMeasurement
    other_cpu: float | None

    def pipelines(self) -> list[str]:
        """Pipelines present, in order of first appearance."""
        return list(dict.fromkeys(r.pipeline for r in self.rows))


def stall_breakdown(
    specs: Sequence[str],
    *,
    batch: int = 4,
    vcpus: int = 1,
    gpu_share: float = 0.0,
    device: str = "cpu",
    hardware: str = "cpu",
    co_runners: int = 1,
    trace: str = DEFAULT_TRACE,
    utilisation: float = 0.7,
    requests: int = 48,
    slot_s: float = 2.0,
    settings: MeasureSettings | None = None,
    worker_start_launches: int = 3,
    progress: Callable[[str], None] | None = None,
) -> Breakdown:
    """Measure the Stash breakdown of every stage of ``specs`` at one configuration (module docstring)."""
    s = settings or MeasureSettings()
    job = Job(
        "stalls",
        tuple(specs),
        vcpus,
        gpu_share,
        device,
        hardware,
        settings=asdict(s),
        args={"batch": batch, "trace": trace, "utilisation": utilisation, "requests": requests},
    )
    with CpuWatch(children=True) as watch:
        result = run_worker(job, progress)
        corun = measure_interference(
            specs,
            batch=batch,
            vcpus=vcpus,
            gpu_share=gpu_share,
            device=device,
            hardware=hardware,
            co_runners=(co_runners,),
            slot_s=slot_s,
            pool=min(s.pool, 8),
            seed=s.seed,
            progress=progress,
        )
    start_ms = worker_start_ms(vcpus, worker_start_launches)
    slow = {r.stage: r.slowdown for r in corun.rows if r.co_runners == co_runners}
    rows = []
    for d in result["rows"]:
        q = d["queue"]
        sd = slow.get(d["stage"], 1.0)
        rows.append(
            StallRow(
                stage=d["stage"],
                pipeline=d["pipeline"],
                hardware=hardware,
                batch=batch,
                vcpus=vcpus,
                gpu_share=gpu_share,
                compute_ms=d["compute_ms"],
                h2d_ms=d["h2d_ms"],
                co_runners=co_runners,
                slowdown=sd,
                interference_ms=max(sd - 1.0, 0.0) * d["compute_ms"],
                transfer_ms=d["transfer_ms"],
                transfer_bytes=d["transfer_bytes"],
                queueing_ms=q["mean_wait_ms"],
                queue_p95_ms=q["p95_wait_ms"],
                queue_trace=q["trace"],
                queue_utilisation=utilisation,
                cold_start_ms=d["cold_start_ms"] + start_ms,
                quiet=bool(d["quiet"]),
            )
        )
    return Breakdown(tuple(rows), corun, watch.other_cores)


def write_breakdown_csv(rows: Sequence[StallRow], path: Path) -> None:
    """One row per stage; ``h2d_ms`` is written ``n/a`` where it does not apply."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in fields(StallRow)]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=names)
        w.writeheader()
        for r in rows:
            d: dict[str, Any] = asdict(r)
            for k, v in d.items():
                if isinstance(v, float):
                    d[k] = f"{v:.4g}" if k in ("slowdown", "gpu_share", "queue_utilisation") else f"{v:.3f}"
            d["h2d_ms"] = "n/a" if r.h2d_ms is None else f"{r.h2d_ms:.3f}"
            w.writerow(d)


def read_breakdown_csv(path: Path) -> list[StallRow]:
    """Rows of a CSV written by :func:`write_breakdown_csv`.

    Raises:
        ProfileError: naming the file and line of a malformed row.
    """
    kinds = {f.name: f.type for f in fields(StallRow)}

    def row(r: dict[str, str]) -> StallRow:
        d: dict[str, Any] = {}
        for k, typ in kinds.items():
            v = r[k]
            if k == "h2d_ms":
                d[k] = None if v in ("", "n/a") else float(v)
            elif typ in ("int", int):
                d[k] = int(v)
            elif typ in ("float", float):
                d[k] = float(v)
            elif typ in ("bool", bool):
                d[k] = v in ("True", "1", "true")
            else:
                d[k] = v
        return StallRow(**d)

    return read_rows(
        path, row, required=tuple(kinds), kind="a stall-breakdown CSV (esg-prefect profile --breakdown writes one)"
    )
