"""A flow run's first stage call: the runner's pool warmed up as the run starts, against made at that call.

Each sample is a fresh process (process backend, the toy stages of ``tests/toy_stages.py``):
``warm`` enters the runner as Prefect enters a flow run's (which makes and starts the shared pool on a
thread), does ``--work`` seconds of the run's own work, then makes one stage call; ``cold`` does the
same without entering the runner, so the call makes the pool, as before the warm-up. The two
alternate, side by side in one run.

    python bench/first_call.py --work 0.2,2,6 --samples 3

Ends with ``RESULT work_s=<w> warm_ms=<median> cold_ms=<median> cold_over_warm=<ratio>`` per work time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sample(mode: str, work_s: float) -> float:
    """One fresh process's first stage call, in ms (from the call to its result)."""
    from esg_prefect import ESGTaskRunner
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.integration.runner import close_shared_pools
    from tests.toy_stages import toy_profile

    csv = os.path.join(tempfile.mkdtemp(prefix="esg-first-call-"), "toy.csv")
    toy_profile().to_csv(csv)
    runner = ESGTaskRunner(artifacts=False, store=False, profile=csv).duplicate()
    if mode == "warm":
        runner.__enter__()  # as Prefect enters the flow run's runner: the shared pool starts on a thread
    try:
        time.sleep(work_s)  # the flow run's own work before its first stage call
        t0 = time.perf_counter()
        call = StageCall("c1", "double", "tests.toy_stages:double", WorkflowDecl("toy", 800), "r1", "r1", 21)
        out = runner.pool_client().submit(call).result(300)
        ms = (time.perf_counter() - t0) * 1000.0
    finally:
        if mode == "warm":
            runner.__exit__(None, None, None)
        close_shared_pools()
    if out.output != 42:
        raise SystemExit(f"the toy stage answered {out.output!r}, not 42")
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="0.2,2,6", help="seconds of the run's own work before its first call, a list")
    ap.add_argument("--samples", type=int, default=3, help="fresh processes per mode and work time")
    ap.add_argument("--sample", nargs=2, metavar=("MODE", "WORK_S"), help=argparse.SUPPRESS)  # one child process
    args = ap.parse_args()
    if args.sample:
        print(f"{sample(args.sample[0], float(args.sample[1])):.1f}", flush=True)
        return
    try:
        works = [float(w) for w in args.work.split(",")]
    except ValueError:
        ap.error(f"--work must be numbers separated by commas, got {args.work!r}")
    if args.samples < 1 or any(w < 0 for w in works):
        ap.error(f"--samples must be at least 1 and --work at least 0, got {args.samples} and {args.work!r}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for work in works:
        got: dict[str, list[float]] = {"warm": [], "cold": []}
        for _ in range(args.samples):
            for mode in ("warm", "cold"):  # alternated, so a change in the machine's load falls on both
                cmd = [sys.executable, __file__, "--sample", mode, str(work)]
                out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
                got[mode].append(float(out.stdout.strip().splitlines()[-1]))
        warm, cold = statistics.median(got["warm"]), statistics.median(got["cold"])
        print(
            f"work {work:g} s: warm {sorted(round(v) for v in got['warm'])} ms, "
            f"cold {sorted(round(v) for v in got['cold'])} ms"
        )
        print(
            f"RESULT work_s={work:g} warm_ms={warm:.0f} cold_ms={cold:.0f} cold_over_warm={cold / warm:.2f}", flush=True
        )


if __name__ == "__main__":
    main()
