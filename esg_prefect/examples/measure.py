"""Measure the CPU latency profile of every example stage and write it as a latency-profile CSV.

Usage::

    python -m esg_prefect.examples.measure --out esg_prefect/data/profiles/examples_cpu.csv
    python -m esg_prefect.examples.measure --quick --out /tmp/quick.csv   # 1 repetition, batches 1 and 2

Method. Each thread count runs in a fresh worker process (``torch.set_num_threads``
and one inter-op thread are set before any work, and ``OMP_NUM_THREADS`` matches),
so no thread pool outlives its setting. In a worker, for each pipeline:

1. ``--pool`` requests come from the pipeline's ``make_input`` (a fixed seed);
2. the pipeline runs once stage by stage (batches of 8); each stage's model is built
   as it is reached and its cold start timed: build plus first call on one real job;
3. for each stage and batch size: ``--warmup`` untimed calls, then timed calls
   (:func:`repetitions`), each on the next ``batch`` jobs of the stage's job pool,
   so text lengths and box counts vary between repetitions as they do in service.

The ``cold_start_ms`` column adds the start of a worker process as the pool starts
one (a fork of the pool's pre-imported fork server; a fresh interpreter importing
torch and the examples where there is no fork server; the median of three
launches) to the in-process build and first call: the cost of a cold start.

The CSV has the columns of :meth:`esg_prefect.model.LatencyProfile.from_csv`
(hardware ``cpu``, ``gpu_share`` 0, ``vcpus`` = threads) and is checked by loading
it back. The summary printed at the end gives the per-item speedup of batch 8
over batch 1 (``8 * mean(1) / mean(8)``).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
THREADS: tuple[int, ...] = (1, 2)
QUICK_BATCHES: tuple[int, ...] = (1, 2)
FIELDS = ("stage", "hardware", "batch", "vcpus", "gpu_share", "mean_ms", "p95_ms", "cold_start_ms")
_STARTUP_PROBE = "import torch, esg_prefect.examples"


@dataclass(frozen=True, slots=True)
class Row:
    """One measured (stage, batch, threads) point; ``cold_start_ms`` is in-process here (no worker start)."""

    stage: str
    batch: int
    vcpus: int
    mean_ms: float
    p95_ms: float
    cold_start_ms: float
    reps: int
    other_cpu: float = 0.0
    attempts: int = 1
    quiet: bool = True


def allowed_other_cpu(vcpus: int, max_other_cpu: float = 0.15, cpus: int | None = None) -> float:
    """Cores other processes may use during a point: the cores we leave free plus ``max_other_cpu``."""
    free = max((cpus or os.cpu_count() or 1) - vcpus, 0)
    return free + max_other_cpu


def is_quiet(other_cpu: float, wall_s: float, vcpus: int, max_other_cpu: float = 0.15) -> bool:
    """Whether others' CPU use (in cores) during ``wall_s`` left our ``vcpus`` cores alone.

    ``/proc/stat`` counts in 10 ms ticks, so two ticks of slack absorb the rounding on short points.
    """
    return other_cpu * wall_s <= max(allowed_other_cpu(vcpus, max_other_cpu) * wall_s, 0.02)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def repetitions(batch_ms: float, *, min_reps: int, max_reps: int, budget_s: float) -> int:
    """Timed calls for one point: as many as fit ``budget_s``, clamped to ``[min_reps, max_reps]``.

    Why a budget: a batch of 32 crops costs about half a second; fifteen of
    those for every stage and thread count would blow the few minutes the whole
    measurement may take, while cheap points get the extra repetitions for free.
    """
    if batch_ms <= 0:
        return max_reps
    return max(min_reps, min(max_reps, int(budget_s * 1000.0 / batch_ms)))


def measure_pipeline(
    name: str,
    *,
    vcpus: int,
    batches: Sequence[int] = BATCHES,
    pool: int = 32,
    warmup: int = 2,
    min_reps: int = 7,
    max_reps: int = 15,
    budget_s: float = 2.0,
    max_attempts: int = 4,
    max_other_cpu: float = 0.15,
    seed: int = 0,
) -> list[Row]:
    """Measure every stage of pipeline ``name`` in this process with its current torch thread settings.

    Args:
        name: pipeline name.
        vcpus: the thread count to record (the caller has set it in torch).
        batches: batch sizes to time.
        pool: requests generated per pipeline (their jobs are reused round robin).
        warmup: untimed calls before each point.
        min_reps, max_reps, budget_s: see :func:`repetitions`.
        max_attempts, max_other_cpu: a point is timed again (up to ``max_attempts`` times in
            all, keeping the quietest attempt) when other processes took more than the cores
            this process leaves free plus ``max_other_cpu`` of a core (:func:`is_quiet`).
            Why: on a shared 2-core machine one busy neighbour makes two-thread timings
            several times slower (the threads wait for each other at every barrier), which
            would poison the profile.
        seed: seed of the requests.
    """
    from esg_prefect.examples.catalog import StageSpec, get_pipeline, trace_pipeline

    spec = get_pipeline(name)
    rng = random.Random(f"{seed}-{name}")
    requests = [spec.make_input(rng) for _ in range(pool)]
    models: dict[str, Any] = {}
    cold_ms: dict[str, float] = {}

    def timed_load(stage: StageSpec, jobs: list[Any]) -> Any:
        gc.collect()
        t0 = time.perf_counter()
        model = stage.load("cpu")
        stage.run(model, jobs[:1])
        cold_ms[stage.name] = (time.perf_counter() - t0) * 1000.0
        models[stage.name] = model
        return model

    jobs, _ = trace_pipeline(name, requests, batch_size=8, loader=timed_load)
    rows: list[Row] = []
    for stage in spec.stages:
        stage_jobs, model = jobs[stage.name], models[stage.name]
        cursor = 0

        def next_batch(b: int, pool_jobs: list[Any] = stage_jobs) -> list[Any]:
            """The next ``b`` jobs of the stage's pool, round robin."""
            nonlocal cursor
            items = [pool_jobs[(cursor + k) % len(pool_jobs)] for k in range(b)]
            cursor = (cursor + b) % len(pool_jobs)
            return items

        for b in batches:
            best: tuple[float, list[float], float] | None = None
            attempts = 0
            while attempts < max(max_attempts, 1):
                attempts += 1
                gc.collect()
                busy0, own0, wall0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()
                est = float("inf")
                for _ in range(warmup):
                    items = next_batch(b)
                    t0 = time.perf_counter()
                    stage.run(model, items)
                    est = min(est, (time.perf_counter() - t0) * 1000.0)
                reps = repetitions(est if warmup else 0.0, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s)
                times = []
                for _ in range(reps):
                    items = next_batch(b)
                    t0 = time.perf_counter()
                    stage.run(model, items)
                    times.append((time.perf_counter() - t0) * 1000.0)
                busy1, own1, wall = _busy_cpu_s(), _own_cpu_s(), time.perf_counter() - wall0
                other = 0.0 if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
                if best is None or other < best[0]:
                    best = (other, times, wall)
                # /proc/stat counts in 10 ms ticks: allow two ticks of slack on short points.
                if is_quiet(other, wall, vcpus, max_other_cpu):
                    break
                time.sleep(0.5)
            assert best is not None
            rows.append(
                Row(
                    stage=stage.profile_name,
                    batch=b,
                    vcpus=vcpus,
                    mean_ms=statistics.fmean(best[1]),
                    p95_ms=float(np.percentile(best[1], 95)),
                    cold_start_ms=cold_ms[stage.name],
                    reps=len(best[1]),
                    other_cpu=best[0],
                    attempts=attempts,
                    quiet=is_quiet(best[0], best[2], vcpus, max_other_cpu),
                )
            )
    return rows


def _worker(args: argparse.Namespace) -> None:
    """Entry of a worker process: set the threads before any torch work, measure, dump JSON rows."""
    import torch

    torch.set_num_threads(args.worker)
    torch.set_num_interop_threads(1)
    from esg_prefect.examples.catalog import PIPELINES

    settings = _settings(args.quick)
    rows: list[Row] = []
    for name in PIPELINES:
        t0 = time.perf_counter()
        rows += measure_pipeline(name, vcpus=args.worker, seed=args.seed, **settings)
        print(f"  [{args.worker} thread(s)] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    Path(args.worker_out).write_text(json.dumps([asdict(r) for r in rows]), encoding="utf-8")


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"batches": QUICK_BATCHES, "pool": 2, "warmup": 1, "min_reps": 1, "max_reps": 1, "max_attempts": 1}
    return {"batches": BATCHES, "pool": 32, "warmup": 2, "min_reps": 7, "max_reps": 15, "budget_s": 2.0}


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _started(conn: Any) -> None:
    conn.send("up")


def worker_start_ms(threads: int, launches: int = 3) -> float:
    """Median wall time to start a worker the way the pool does, before its model loads.

    Where multiprocessing has a fork server (Linux, macOS), the pool forks workers
    from a server that has imported torch, prefect and the stage modules already
    (:class:`~esg_prefect.runtime.workers.LocalProcessBackend`): timed here the
    same way, once that server runs. Elsewhere, a fresh interpreter importing them.
    """
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        times = []
        for _ in range(launches):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", _STARTUP_PROBE], check=True, env=_env(threads))
            times.append((time.perf_counter() - t0) * 1000.0)
        return statistics.median(times)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "prefect", "esg_prefect.examples.pipelines", "esg_prefect.runtime.worker_main"]
    )
    times = []
    for i in range(launches + 1):  # the first launch starts the fork server itself: not timed
        parent, child = ctx.Pipe()
        t0 = time.perf_counter()
        proc = ctx.Process(target=_started, args=(child,))
        proc.start()
        parent.recv()
        if i:
            times.append((time.perf_counter() - t0) * 1000.0)
        proc.join()
        parent.close()
        child.close()
    return statistics.median(times)


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux ``/proc/stat``), or None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_for_quiet(vcpus: int, max_wait_s: float, settle_s: int = 3) -> float:
    """Wait until other processes leave ``vcpus`` cores free for ``settle_s`` seconds in a row.

    Returns:
        The seconds waited (``max_wait_s`` at most; then the measurement goes ahead and
        the per-point checks of :func:`measure_pipeline` do what they can).
    """
    t0 = time.perf_counter()
    calm = 0
    while calm < settle_s and time.perf_counter() - t0 < max_wait_s:
        busy0 = _busy_cpu_s()
        time.sleep(1.0)
        busy1 = _busy_cpu_s()
        if busy0 is None or busy1 is None:
            break
        calm = calm + 1 if is_quiet(busy1 - busy0, 1.0, vcpus) else 0
    return time.perf_counter() - t0


def run_worker(threads: int, out: Path, seed: int, quick: bool) -> tuple[list[Row], float | None]:
    """Measure in a fresh process with ``threads`` threads.

    Returns:
        The rows and the CPU seconds other processes used meanwhile (None where unknown):
        the check that nothing else competed for the cores.
    """
    cmd = [sys.executable, "-m", "esg_prefect.examples.measure", "--worker", str(threads), "--worker-out", str(out)]
    cmd += ["--seed", str(seed)] + (["--quick"] if quick else [])
    busy0, ours0 = _busy_cpu_s(), _children_cpu_s()
    subprocess.run(cmd, check=True, env=_env(threads))
    busy1, ours1 = _busy_cpu_s(), _children_cpu_s()
    other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (ours1 - ours0))
    return [Row(**r) for r in json.loads(out.read_text(encoding="utf-8"))], other


def write_csv(rows: Sequence[Row], start_ms: dict[int, float], out: Path) -> None:
    """Write ``rows`` in the latency-profile CSV format, adding the worker start to each cold start."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow(
                {
                    "stage": r.stage,
                    "hardware": "cpu",
                    "batch": r.batch,
                    "vcpus": r.vcpus,
                    "gpu_share": 0,
                    "mean_ms": f"{r.mean_ms:.3f}",
                    "p95_ms": f"{r.p95_ms:.3f}",
                    "cold_start_ms": f"{r.cold_start_ms + start_ms.get(r.vcpus, 0.0):.1f}",
                }
            )


def read_csv_rows(path: Path) -> list[Row]:
    """Rows of a CSV written by :func:`write_csv` (cold starts as written: worker start included; reps unknown, 0)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [
            Row(
                stage=r["stage"],
                batch=int(r["batch"]),
                vcpus=int(r["vcpus"]),
                mean_ms=float(r["mean_ms"]),
                p95_ms=float(r["p95_ms"]),
                cold_start_ms=float(r["cold_start_ms"]),
                reps=0,
            )
            for r in csv.DictReader(fh)
        ]


def summary(rows: Sequence[Row]) -> str:
    """A text table: per stage and threads, batch 1 and 8 means, per-item speedup at 8, batch 32, cold start."""
    by = {(r.stage, r.vcpus, r.batch): r for r in rows}
    stages = list(dict.fromkeys(r.stage for r in rows))
    threads = sorted({r.vcpus for r in rows})
    head = f"{'stage':<14}{'thr':>4}{'b1 mean':>10}{'b1 p95':>10}{'b8 mean':>10}{'b8 p95':>10}{'x/item@8':>10}"
    head += f"{'b32 mean':>10}{'cold(in-proc)':>15}"
    lines = [head, "-" * len(head)]
    for s in stages:
        for t in threads:
            b1, b8, b32 = by.get((s, t, 1)), by.get((s, t, 8)), by.get((s, t, 32))
            if b1 is None:
                continue

            def f(r: Row | None, attr: str) -> str:
                return f"{getattr(r, attr):10.2f}" if r is not None else f"{'-':>10}"

            speed = f"{8 * b1.mean_ms / b8.mean_ms:10.2f}" if b8 is not None else f"{'-':>10}"
            lines.append(
                f"{s:<14}{t:>4}{f(b1, 'mean_ms')}{f(b1, 'p95_ms')}{f(b8, 'mean_ms')}{f(b8, 'p95_ms')}{speed}"
                f"{f(b32, 'mean_ms')}{b1.cold_start_ms:15.1f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in one worker process per thread count, write and verify the CSV, print a summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("esg_prefect/data/profiles/examples_cpu.csv"))
    parser.add_argument("--quick", action="store_true", help="1 repetition, batches 1 and 2 (for tests)")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-wait-s", type=float, default=120.0, help="wait up to this long for other processes to quiet down"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of the existing --out file for thread counts not measured now",
    )
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0

    import torch

    from esg_prefect.model import LatencyProfile

    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, load {load:.2f}")
    if load > 0.5:
        print(f"warning: load average {load:.2f} before measuring: other processes will add noise", file=sys.stderr)
    rows: list[Row] = []
    start_ms: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in args.threads:
            start_ms[t] = worker_start_ms(t, launches=1 if args.quick else 3)
            if not args.quick:
                waited = wait_for_quiet(t, args.max_wait_s)
                if waited > 5:
                    print(f"{t} thread(s): waited {waited:.0f} s for other processes to leave {t} core(s) free")
            t0 = time.perf_counter()
            worker_rows, other_s = run_worker(t, Path(tmp) / f"rows_{t}.json", args.seed, args.quick)
            rows += worker_rows
            if other_s is not None:
                wall = time.perf_counter() - t0
                print(
                    f"{t} thread(s): other processes used {other_s:.1f} CPU-s in {wall:.0f} s "
                    f"({other_s / wall:.0%} of a core)"
                )
    measured = list(rows)
    if args.merge and args.out.exists():
        rows += [r for r in read_csv_rows(args.out) if r.vcpus not in args.threads]
    order = {s: i for i, s in enumerate(dict.fromkeys(r.stage for r in measured))}
    rows.sort(key=lambda r: (order.get(r.stage, len(order)), r.stage, r.vcpus, r.batch))
    write_csv(rows, start_ms, args.out)
    profile = LatencyProfile.from_csv(args.out)  # the check that the file is a valid profile
    print(summary(rows))
    print(f"worker start (as the pool starts one), ms: {', '.join(f'{t} thr {ms:.0f}' for t, ms in start_ms.items())}")
    print(f"repetitions per point: {min(r.reps for r in measured)}..{max(r.reps for r in measured)}")
    noisy = [r for r in measured if not r.quiet]
    print(
        f"points timed again for interference: {sum(r.attempts > 1 for r in measured)}; "
        f"still noisy after {max(r.attempts for r in measured)} attempts: "
        + (", ".join(f"{r.stage}/b{r.batch}/t{r.vcpus} ({r.other_cpu:.2f} cores)" for r in noisy) or "none")
    )
    print(f"wrote {args.out}: {len(profile.points)} points, {len(profile.stages())} stages")
    print(f"load average at end {os.getloadavg()[0]:.2f}; wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
