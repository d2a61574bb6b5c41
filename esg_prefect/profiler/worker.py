"""The profiler's worker process: one configuration, fixed before any torch work, then a task.

Every configuration (vcpus, GPU share) is measured in a fresh process, so no
thread pool or CUDA context outlives its setting: ``torch.set_num_threads``
and one inter-op thread are set first (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``
match, from the parent); on a GPU the parent sets ``CUDA_VISIBLE_DEVICES`` and,
where an MPS control daemon runs, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (both
must precede CUDA's initialisation), and the worker caps its memory with
``torch.cuda.set_per_process_memory_fraction(share)``, as pool workers do.

The parent writes a JSON job file and runs ``python -m esg_prefect.profiler.worker JOB``;
the worker prints progress lines (``@@ <text>``) and writes its result as JSON to
``job["out"]``. Tasks: ``profile`` (every stage at every batch size), ``points``
(chosen (stage, batch) points, for validation), ``stalls`` (the Stash runs but
co-location) and ``corun`` (one copy of a co-location run; see
:mod:`esg_prefect.profiler.interference`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from esg_prefect.exceptions import ESGError, InvalidInputError
from esg_prefect.profiler.machine import thread_env

PROGRESS = "@@ "
FAILED = "@@! "  # the worker's last line when its job raised: one line for the user, the traceback above it
READY = "@@ready"


class ProfilerWorkerError(ESGError):
    """A profiler worker process failed; the message carries its exit code and the end of its output."""


@dataclass(frozen=True, slots=True)
class Job:
    """One worker run: the configuration, the targets and the task with its arguments."""

    task: str
    specs: tuple[str, ...]
    vcpus: int
    gpu_share: float = 0.0
    device: str = "cpu"
    hardware: str = "cpu"
    settings: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in ("profile", "points", "stalls", "corun"):
            raise InvalidInputError(f"unknown worker task {self.task!r}")
        if self.vcpus < 1:
            raise InvalidInputError(f"vcpus must be >= 1, got {self.vcpus}")
        if not 0.0 <= self.gpu_share <= 1.0:
            raise InvalidInputError(f"gpu_share must be in [0, 1], got {self.gpu_share}")
        if (self.device == "cpu") != (self.gpu_share == 0.0):
            raise InvalidInputError(f"device {self.device!r} does not fit gpu_share {self.gpu_share}")


def gpu_environment(device: str, gpu_share: float) -> dict[str, str]:
    """Variables a GPU worker needs before CUDA starts: visible device, MPS share where MPS runs."""
    if device == "cpu":
        return {}
    from esg_prefect.runtime.gpu import mps_active, share_environment

    index = int(device.split(":", 1)[1]) if ":" in device else 0
    return share_environment(index, gpu_share, mps_active())


def _apply(job: Job) -> str:
    """Fix the configuration's resources in this process; returns the device name for torch."""
    import torch

    torch.set_num_threads(job.vcpus)
    with contextlib.suppress(RuntimeError):  # already set by an import that ran torch work
        torch.set_num_interop_threads(1)
    if job.device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise InvalidInputError(f"job asks for {job.device!r} but CUDA is not available in the worker")
    if 0 < job.gpu_share < 1:
        torch.cuda.set_per_process_memory_fraction(job.gpu_share, 0)
    return "cuda"  # CUDA_VISIBLE_DEVICES leaves the worker one device


def _say(text: str) -> None:
    print(PROGRESS + text, flush=True)


def run_job(job: Job) -> dict[str, Any]:
    """Run ``job`` in this process (the worker's body); returns the JSON-able result."""
    from esg_prefect.profiler import stalls
    from esg_prefect.profiler.measure import MeasureSettings, measure_point, measure_stages
    from esg_prefect.profiler.targets import prepare

    device = _apply(job)
    raw = dict(job.settings)
    if "batches" in raw:
        raw["batches"] = tuple(raw["batches"])
    settings = MeasureSettings(**raw)
    t0 = time.perf_counter()
    stages = prepare(job.specs, device=device, pool=settings.pool, seed=settings.seed)
    _say(f"prepared {len(stages)} stage(s) in {time.perf_counter() - t0:.1f} s")
    common: dict[str, Any] = {
        "vcpus": job.vcpus,
        "gpu_share": job.gpu_share,
        "hardware": job.hardware,
        "device": device,
    }
    if job.task == "profile":
        points, samples = measure_stages(stages, settings=settings, progress=_say, **common)
        return {"points": [p.to_dict() for p in points], "samples": [asdict(s) for s in samples]}
    if job.task == "points":
        out, samples_out = [], []
        for name, batch in job.args["points"]:
            p, sm = measure_point(stalls.stage_by_name(stages, name), int(batch), settings=settings, **common)
            out.append(p.to_dict())
            samples_out += [asdict(s) for s in sm]
            _say(f"point {name} b{batch} v{job.vcpus} g{job.gpu_share:g}: {p.mean_ms:.1f} ms")
        return {"points": out, "samples": samples_out}
    if job.task == "stalls":
        return _stalls(job, stages, settings, device, common)
    return _corun(job, stages, device)


def _stalls(job: Job, stages: Sequence[Any], settings: Any, device: str, common: dict[str, Any]) -> dict[str, Any]:
    from esg_prefect.profiler import stalls
    from esg_prefect.profiler.measure import measure_point

    a = job.args
    rows = []
    with stalls.TransferProbe() as probe:
        for st in stages:
            batch = int(a.get("batch", 4))
            point, _ = measure_point(st, batch, settings=settings, **common)
            h2d = stalls.h2d_ms(st, batch, device, reps=max(settings.min_reps, 3))
            compute = point.mean_ms if h2d is None else h2d[0]
            transfer, nbytes = stalls.transfer_ms(st, batch, probe, reps=int(a.get("transfer_reps", 5)))
            queue = stalls.replay_queue(
                st,
                batch,
                point.mean_ms,
                trace=str(a.get("trace", stalls.DEFAULT_TRACE)),
                utilisation=float(a.get("utilisation", 0.7)),
                requests=int(a.get("requests", 48)),
                seed=settings.seed,
                device=device,
            )
            rows.append(
                {
                    "stage": st.name,
                    "pipeline": st.target.pipeline,
                    "batch": batch,
                    "compute_ms": compute,
                    "host_compute_ms": point.mean_ms if h2d is None else h2d[1],
                    "h2d_ms": None if h2d is None else max(h2d[1] - h2d[0], 0.0),
                    "transfer_ms": transfer,
                    "transfer_bytes": nbytes,
                    "queue": asdict(queue),
                    "cold_start_ms": st.cold_start_ms,
                    "other_cpu": point.other_cpu,
                    "quiet": point.quiet,
                }
            )
            _say(f"{st.name}: compute {compute:.1f} ms, transfer {transfer:.2f} ms, queue {queue.mean_wait_ms:.1f} ms")
    return {"rows": rows}


def _corun(job: Job, stages: Sequence[Any], device: str) -> dict[str, Any]:
    from esg_prefect.profiler import stalls

    a = job.args
    batch, slot_s = int(a["batch"]), float(a["slot_s"])
    names = list(a.get("stages") or [s.name for s in stages])
    chosen = [stalls.stage_by_name(stages, n) for n in names]
    for st in chosen:  # warm every stage before the slots start
        st.target.run(st.model, st.next_batch(batch))
    print(READY, flush=True)
    start = float(sys.stdin.readline())
    out: dict[str, list[float]] = {}
    for j, st in enumerate(chosen):
        slot0 = start + j * slot_s
        time.sleep(max(0.0, slot0 - time.time()))
        out[st.name] = stalls.corun_slot(st, batch, slot0 + 0.85 * slot_s, device)
    return {"times": out}


def start_worker(job: Job, out: Path) -> subprocess.Popen[str]:
    """Start a worker process for ``job`` writing to ``out`` (stdout and stdin piped)."""
    spec = asdict(job)
    spec["out"] = str(out)
    job_file = out.with_suffix(".job.json")
    job_file.write_text(json.dumps(spec), encoding="utf-8")
    env = thread_env(job.vcpus, gpu_environment(job.device, job.gpu_share))
    return subprocess.Popen(
        [sys.executable, "-m", "esg_prefect.profiler.worker", str(job_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def finish_worker(proc: subprocess.Popen[str], out: Path, progress: Callable[[str], None] | None) -> dict[str, Any]:
    """Relay the worker's progress lines until it exits; its result, or :class:`ProfilerWorkerError`."""
    tail: list[str] = []
    failed = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith(FAILED):
            failed = line[len(FAILED) :]
        elif line.startswith(PROGRESS) and progress is not None:
            progress(line[len(PROGRESS) :])
        elif not line.startswith(PROGRESS):
            tail = ([*tail, line])[-30:]
    code = proc.wait()
    if failed:  # the job raised: its one line (the traceback stays out of the user's way)
        raise ProfilerWorkerError(f"profiler worker failed: {failed}")
    if code != 0 or not out.exists():
        raise ProfilerWorkerError(f"profiler worker exited with code {code}; its output ended:\n" + "\n".join(tail))
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def run_worker(job: Job, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``job`` in a fresh worker process and return its result."""
    with tempfile.TemporaryDirectory(prefix="esg-profile-") as tmp:
        out = Path(tmp) / "result.json"
        proc = start_worker(job, out)
        assert proc.stdin is not None
        proc.stdin.close()
        return finish_worker(proc, out, progress)


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python -m esg_prefect.profiler.worker JOB.json")
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    out = Path(spec.pop("out"))
    spec["specs"] = tuple(spec["specs"])
    job = Job(**spec)
    try:
        result = run_job(job)
    except Exception as exc:
        traceback.print_exc(file=sys.stdout)
        why = str(exc) if isinstance(exc, ESGError) else f"{type(exc).__name__}: {exc}"  # ours name what failed
        print(FAILED + " ".join(why.split()), flush=True)
        return 1
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
