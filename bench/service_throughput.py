"""Service throughput: the image pipeline from N flow-run processes through the pool service vs the in-process pool.

Two set-ups serve the same requests (image-pipeline flow runs, arrivals from the
Azure Functions 2019 trace slice shipped with esg-prefect), side by side:

* in-process: one process runs every flow run with ``ESGTaskRunner()`` and its
  embedded pool (the default);
* service: ``esg-prefect pool serve`` owns the pool and its workers; N client
  processes run their share of the flow runs with ``ESGTaskRunner(address=...)``,
  their stage calls crossing HTTP (JSON + raw tensor buffers) both ways.

Both talk to one Prefect API server started here (``prefect server start`` on a
free port, an in-memory database, a temporary ``PREFECT_HOME``), so that the
clients' flow runs are recorded in one place, as under deployments.

Reported: throughput (requests/s from the common start to the last flow run's
return), p50/p95 latency, and for the service the fraction of multi-run batches
that held calls from more than one client process (``GET /v1/batches``).

The default rate (20/s for 60 requests) is a burst far above what this 2-core
machine serves, so both set-ups run saturated and throughput measures capacity.

Run:  python bench/service_throughput.py [--processes 2] [--requests 60] [--rate 20]
Ends with: RESULT service_overhead_vs_inprocess=<x> cross_process_mixed_batches=<fraction>
(overhead = in-process throughput / service throughput; target <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---- the client process ------------------------------------------------------------------------


def client(args: argparse.Namespace) -> None:
    """Run this process's share of the arrivals and print one JSON line of outcomes."""
    from esg_prefect.examples import demo as d

    d.quiet_prefect()
    from esg_prefect.examples.driver import run_workload
    from esg_prefect.examples.pipelines import image_flow
    from esg_prefect.integration.runner import ESGTaskRunner

    runner: Any = ESGTaskRunner(address=args.address) if args.address != "inprocess" else ESGTaskRunner()
    flow = image_flow.with_options(task_runner=runner)
    arrivals = json.loads(Path(args.arrivals).read_text())
    run_ids: dict[int, str] = {}

    def call(i: int, _workflow: str) -> Any:
        state = flow(request_seed=i + args.offset, return_state=True)
        run_ids[i] = str(state.state_details.flow_run_id)
        return state.result()

    with d.latency_settings():
        call(-1 - args.offset, "image")  # warm: the Prefect client, and the models in the pool
        time.sleep(max(0.0, args.start_at - time.time()))
        t0 = time.time()
        outcomes = run_workload([(a, "image") for a in arrivals], call, max_concurrency=64)
    from esg_prefect.integration.runner import close_shared_pools

    close_shared_pools()  # the in-process pool publishes its last runs' artifacts before exit
    print(
        json.dumps(
            {
                "start": t0,
                "end": max(t0 + o.end_ms / 1000.0 for o in outcomes),
                "latency_ms": [o.latency_ms for o in outcomes if o.ok],
                "failed": sum(not o.ok for o in outcomes),
                "runs": list(run_ids.values()),
            }
        ),
        flush=True,
    )


# ---- the driver --------------------------------------------------------------------------------


def run_clients(
    address: str, shares: list[list[float]], env: dict[str, str], tmp: Path, warm_s: float
) -> list[dict[str, Any]]:
    start_at = time.time() + warm_s
    procs = []
    for k, share in enumerate(shares):
        path = tmp / f"arrivals_{address.rsplit(':', 1)[-1]}_{k}.json"
        path.write_text(json.dumps(share))
        cmd = [sys.executable, __file__, "--client", "--address", address, "--arrivals", str(path)]
        cmd += ["--offset", str(100_000 * (k + 1)), "--start-at", str(start_at)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE))
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"a client process failed with code {p.returncode}")
        out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return out


def summarize(label: str, outs: list[dict[str, Any]]) -> float:
    from esg_prefect.examples.driver import percentile

    lat = [x for o in outs for x in o["latency_ms"]]
    wall = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    thr = len(lat) / wall
    failed = sum(o["failed"] for o in outs)
    print(
        f"{label:<22} {len(lat):>5} ok {failed:>3} failed  {thr:6.2f} req/s  "
        f"p50 {percentile(lat, 50):7.0f} ms  p95 {percentile(lat, 95):7.0f} ms",
        flush=True,
    )
    return thr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="client processes for the service run")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rate", type=float, default=20.0, help="total arrival rate, requests/s (default: a burst)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", default="", help=argparse.SUPPRESS)
    parser.add_argument("--arrivals", default="", help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args)
        return

    from esg_prefect.workload import arrivals as trace_arrivals

    duration = args.requests / args.rate * 1.5 + 5
    times = [a for a, _ in trace_arrivals("azure_functions_2019", ["image"], args.rate, duration, args.seed)]
    times = times[: args.requests]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        api_port, pool_port = free_port(), free_port()
        env = {
            **os.environ,
            "PREFECT_HOME": str(tmp / "prefect"),
            "PREFECT_API_URL": f"http://127.0.0.1:{api_port}/api",
            "PREFECT_API_DATABASE_CONNECTION_URL": "sqlite+aiosqlite:///:memory:",
            "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
            "PREFECT_LOGGING_TO_CONSOLE": "false",
            "ESG_PREFECT_STORE_URL": f"sqlite:///{tmp / 'costs.db'}",
        }
        print(f"starting a Prefect server on port {api_port} (in-memory database: about 20 s)", flush=True)
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--port", str(api_port), "--no-ui"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        service = None
        try:
            wait_http(f"http://127.0.0.1:{api_port}/api/health", server, 180, "the Prefect server")
            print(f"{'set-up':<22} {'requests':>8}            throughput     latency", flush=True)
            inproc = run_clients("inprocess", [times], env, tmp, warm_s=25.0)
            thr_in = summarize("in-process pool", inproc)

            serve = ["pool", "serve", "--allow", "esg_prefect.examples", "--port", str(pool_port)]
            service = subprocess.Popen(
                [sys.executable, "-m", "esg_prefect.cli", *serve],
                cwd=ROOT,
                env=env,
            )
            address = f"http://127.0.0.1:{pool_port}"
            wait_http(f"{address}/healthz", service, 120, "the pool service")
            shares = [times[k :: args.processes] for k in range(args.processes)]
            served = run_clients(address, shares, env, tmp, warm_s=30.0)
            thr_svc = summarize(f"service, {args.processes} processes", served)
            batches = httpx.get(f"{address}/v1/batches?limit=100000", timeout=30).json()["batches"]
        finally:
            if service is not None:
                stop(service)
            stop(server)
    proc_of = {run: k for k, o in enumerate(served) for run in o["runs"]}
    multi = [b for b in batches if len(set(b["runs"])) > 1]
    mixed = [b for b in multi if len({proc_of.get(r) for r in b["runs"]} - {None}) > 1]
    print(
        f"service batches: {len(batches)}, holding more than one run: {len(multi)}, "
        f"of these mixing client processes: {len(mixed)}"
    )
    print(
        f"RESULT service_overhead_vs_inprocess={thr_in / thr_svc:.2f} "
        f"cross_process_mixed_batches={len(mixed) / max(1, len(multi)):.3f}"
    )


if __name__ == "__main__":
    main()
