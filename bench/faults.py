"""Faults with figures: a real pool service under worker and service kills, poison inputs and 429s.

    python bench/faults.py                       # 10,000 calls, 8 client processes (a few minutes)
    python bench/faults.py --calls 2000 --kills 8 --restarts 1    # shorter

Starts ``esg-prefect pool serve`` (worker processes, a results file, a low
``--max-pending``) on 127.0.0.1 with the stage of ``bench/chaos_stages.py``,
which logs every execution. Client processes send the calls through
:class:`~esg_prefect.service.client.PoolClient` (retries with the same call id)
while this process SIGKILLs worker processes at random moments and SIGKILLs and
restarts the service. 1 % of inputs are poison (the stage raises on them).
Runs of five calls each end through the client; the service keeps costs in a
cost store (a SQLite file, or ``--store URL`` such as PostgreSQL), checked at
the end against the execution log: no answered call missing, no batch billed
more often than it ran.

Counted from the clients' answers and the execution log: lost (answered with
neither the output nor the stage's own error), hung (no answer by the end),
wrong outputs, poison leaks (a poison input answered, or a healthy one failed
with the stage's error), duplicated executions (a call whose batch completed
more than once, not explained by a kill), and, apart, the calls re-run because
the service was killed while their batch ran (each at most twice). Ends with
``RESULT lost=.. duplicated_executions=.. wrong=.. poison_leaks=.. hung=..``.
Loopback only; bounded in calls and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "chaos-bench-token-0123456789abcdef"
STAGE = "chaos_stages:chaos"
RUN_CALLS = 5  # calls per flow run


def poisoned(cid: str) -> bool:
    return hash_of(cid) % 100 == 0


def hash_of(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


# ---- client processes ----------------------------------------------------------------------


def client_main(idx: int, n: int, url: str, out: str, threads: int, deadline_s: float) -> None:
    """Send ``n`` calls with ``threads`` in flight; write one JSON line per call to ``out``."""
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.exceptions import StageFailedError
    from esg_prefect.service.client import PoolClient

    client = PoolClient(url, TOKEN, deadline_s=deadline_s, threads=threads)
    rejected = [0]

    def count(resp: Any) -> None:
        if resp.status_code == 429:
            rejected[0] += 1

    client._http.event_hooks["response"].append(count)
    wf = WorkflowDecl("chaos", 5_000)
    sem = threading.Semaphore(threads)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    left = {f"r{idx}-{k}": min(RUN_CALLS, n - k * RUN_CALLS) for k in range((n + RUN_CALLS - 1) // RUN_CALLS)}

    def done(cid: str, x: int, t0: float, fut: Any) -> None:
        sem.release()
        run = f"r{idx}-{x // RUN_CALLS}"
        with lock:
            left[run] -= 1
            ended = left[run] == 0
        if ended:
            client.end_run(run)  # the service stores the run's costs (its batches are stored already)
        row: dict[str, Any] = {"id": cid, "x": x, "ms": (time.monotonic() - t0) * 1000.0}
        try:
            res = fut.result()
            row.update(kind="ok", output=res.output)
        except StageFailedError as exc:
            row.update(kind="stage_error", error=str(exc)[:200])
        except Exception as exc:  # answered with another failure: counted as lost
            row.update(kind="other", error=f"{type(exc).__name__}: {str(exc)[:200]}")
        with lock:
            rows.append(row)

    for i in range(n):
        cid = f"c{idx}-{i}"
        item = {"id": cid, "x": i, "poison": poisoned(cid)}
        call = StageCall(cid, "chaos", STAGE, wf, cid, f"r{idx}-{i // RUN_CALLS}", item)
        sem.acquire()
        t0 = time.monotonic()
        client.submit(call).add_done_callback(lambda f, cid=cid, x=i, t0=t0: done(cid, x, t0, f))
    for _ in range(threads):  # every call answered (or the client's deadline hit)
        sem.acquire()
    time.sleep(1.0)  # the last run-end notices go out in the background
    with open(out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write(json.dumps({"rejected_429": rejected[0]}) + "\n")
    client.close()


# ---- the service -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(port: int, work: Path, env: dict[str, str], max_pending: int, store: str) -> subprocess.Popen[bytes]:
    import httpx

    cmd = [sys.executable, "-m", "esg_prefect.cli", "pool", "serve", "--allow", "chaos_stages"]
    cmd += ["--port", str(port), "--backend", "process", "--profile", str(work / "profile.csv")]
    cmd += ["--results-db", str(work / "results.db"), "--max-pending", str(max_pending)]
    cmd += ["--store", store, "--no-artifacts"]
    log = open(work / "service.log", "ab")  # noqa: SIM115 (kept open for the child's life)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the pool service did not start; see {work / 'service.log'}")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def marker(log: Path, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def worker_pids(log: Path, service_pid: int, tail_bytes: int = 20_000) -> list[int]:
    """Live worker processes seen running the stage lately (from the execution log's tail)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    pids = {int(p[2]) for p in (ln.split() for ln in lines) if len(p) >= 4 and p[0] == "S" and p[2].isdigit()}
    return [p for p in pids if p != service_pid and Path(f"/proc/{p}").exists()]


# ---- analysis ----------------------------------------------------------------------------------


def analyse(log: Path, rows: list[dict[str, Any]], sent: list[str]) -> dict[str, Any]:
    starts: dict[str, tuple[int, list[str]]] = {}
    done_ok: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)  # call -> (log line, pid) per completed batch
    executions: defaultdict[str, int] = defaultdict(int)
    service_kills: list[int] = []
    worker_kills: dict[int, int] = {}  # pid -> line
    for n, line in enumerate(log.read_text().splitlines()):
        p = line.split()
        if p[0] == "S":
            starts[p[1]] = (int(p[2]), p[3].split(","))
            for cid in p[3].split(","):
                executions[cid] += 1
        elif p[0] == "E" and p[1] in starts:
            pid, ids = starts[p[1]]
            for cid in ids:
                done_ok[cid].append((n, pid))
        elif p[0] == "K":
            service_kills.append(n)
        elif p[0] == "W":
            worker_kills[int(p[1])] = n
    duplicated = rerun_service = rerun_worker = 0
    worst = 0
    for runs in done_ok.values():
        if len(runs) < 2:
            continue
        worst = max(worst, len(runs))
        (first, pid), (second, _) = runs[0], runs[1]
        if any(first < k < second for k in service_kills):
            rerun_service += 1
        elif worker_kills.get(pid, -1) > first:
            rerun_worker += 1
        else:
            duplicated += 1
    by_id = {r["id"]: r for r in rows if "id" in r}
    poison = [c for c in sent if poisoned(c)]
    ok = [r for r in by_id.values() if r["kind"] == "ok"]
    wrong = sum(1 for r in ok if r["output"] != {"id": r["id"], "y": r["x"] * 2 + 1})
    leaks = sum(1 for r in ok if poisoned(r["id"])) + sum(
        1 for r in by_id.values() if r["kind"] == "stage_error" and not poisoned(r["id"])
    )
    healthy = sorted(r["ms"] for r in ok if not poisoned(r["id"]))
    others = [r for r in by_id.values() if r["kind"] == "other"]
    return {
        "sent": len(sent),
        "completed_right": len(ok) - wrong,
        "poison_inputs": len(poison),
        "poison_failed_with_stage_error": sum(1 for c in poison if by_id.get(c, {}).get("kind") == "stage_error"),
        "lost": len(others),
        "lost_examples": [r["error"] for r in others[:3]],
        "hung": sum(1 for c in sent if c not in by_id),
        "wrong": wrong,
        "poison_leaks": leaks,
        "duplicated_executions": duplicated,
        "rerun_after_service_kill": rerun_service,
        "rerun_after_worker_kill": rerun_worker,
        "most_completed_runs_of_one_call": worst,
        "executions_per_call_mean": sum(executions.values()) / max(1, len(sent)),
        "healthy_p50_ms": healthy[len(healthy) // 2] if healthy else None,
        "healthy_p99_ms": healthy[min(len(healthy) - 1, int(0.99 * len(healthy)))] if healthy else None,
    }


def check_store(url: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost store after the faults: no answered call missing, no batch stored twice, every run costed.

    A dispatch whose worker died (idle, loading or mid-batch) is billed for the
    worker time it took, and its calls again in the batch that served them:
    two real costs, not one counted twice. Counted twice would be one batch
    stored under two ids (the same worker and times).
    """
    from sqlalchemy import select

    from esg_prefect.store import IDLE_KEY, CostStore
    from esg_prefect.store.tables import BatchRow, StageCallRow

    with CostStore(url) as store, store.engine.connect() as conn:
        ok_rows = {r[0] for r in conn.execute(select(StageCallRow.call_id).where(StageCallRow.ok))}  # type: ignore[arg-type]
        batches = list(conn.execute(select(BatchRow.worker_id, BatchRow.start_ms, BatchRow.end_ms)))  # type: ignore[call-overload]
        report = store.costs("run", idle_billing="separate")
    answered = {r["id"] for r in rows if r["kind"] == "ok"}
    runs_answered = {f"r{r['id'][1:].split('-')[0]}-{r['x'] // RUN_CALLS}" for r in rows if r["kind"] == "ok"}
    costed = {r.key for r in report if r.key != IDLE_KEY and r.cost > 0}
    return {
        "store": url.split(":", 1)[0],
        "cost_calls_lost": len(answered - ok_rows),
        "cost_batches_double": len(batches) - len({tuple(b) for b in batches}),
        "cost_runs_missing": len(runs_answered - costed),
        "cost_runs_stored": len(costed),
        "cost_total": sum(r.cost for r in report),
    }


# ---- the run -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=16, help="calls in flight per client")
    ap.add_argument("--kills", type=int, default=24, help="worker SIGKILLs to deliver")
    ap.add_argument("--restarts", type=int, default=2, help="service SIGKILLs and restarts")
    ap.add_argument("--max-pending", type=int, default=64)
    ap.add_argument("--time-limit-s", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", default="", help="cost store URL (default: a SQLite file in the work folder)")
    ap.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.client:
        idx, n, url, out, threads = opts.client
        client_main(int(idx), int(n), url, out, int(threads), deadline_s=opts.time_limit_s)
        return 0
    rng = random.Random(opts.seed)
    work = Path(tempfile.mkdtemp(prefix="esg-faults-"))
    log = work / "executions.log"
    store_url = opts.store or f"sqlite:///{work / 'costs.db'}"
    from esg_prefect.model import LatencyProfile, ProfilePoint

    batches = (1, 2, 4, 8, 16, 32)
    pts = [ProfilePoint("chaos", "cpu", b, v, 0.0, 4.0 + 0.6 * b, 5.0 + 0.7 * b) for v in (1, 2) for b in batches]
    LatencyProfile(pts, {("chaos", "cpu"): 50.0}).to_csv(work / "profile.csv")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ESG_PREFECT_TOKEN": TOKEN, "ESG_CHAOS_LOG": str(log)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench"), str(ROOT), env.get("PYTHONPATH", "")])
    began = time.monotonic()
    service = start_service(port, work, env, opts.max_pending, store_url)
    peak_rss = 0.0
    per = [opts.calls // opts.clients + (1 if i < opts.calls % opts.clients else 0) for i in range(opts.clients)]
    sent = [f"c{i}-{k}" for i in range(opts.clients) for k in range(per[i])]
    clients = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--time-limit-s",
                str(opts.time_limit_s),
                "--client",
                str(i),
                str(n),
                url,
                str(work / f"client{i}.jsonl"),
                str(opts.threads),
            ],
            cwd=ROOT,
            env=env,
        )
        for i, n in enumerate(per)
    ]
    kills = restarts = 0
    restart_at = [(k + 1) / (opts.restarts + 1) for k in range(opts.restarts)]
    while any(c.poll() is None for c in clients) and time.monotonic() - began < opts.time_limit_s:
        time.sleep(rng.uniform(0.3, 0.9))
        peak_rss = max(peak_rss, rss_mb(service.pid))
        progress = log.read_bytes().count(b"\nE ") / max(1, opts.calls / 6) if log.exists() else 0.0
        if restarts < len(restart_at) and progress >= restart_at[restarts]:
            marker(log, f"K service {service.pid}")
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()
            restarts += 1
            time.sleep(0.5)
            service = start_service(port, work, env, opts.max_pending, store_url)
            continue
        pids = worker_pids(log, service.pid)
        if kills < opts.kills and pids:
            pid = rng.choice(pids)
            marker(log, f"W {pid}")
            try:
                os.kill(pid, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
    for c in clients:
        try:
            c.wait(timeout=max(1.0, opts.time_limit_s - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            c.kill()
    peak_rss = max(peak_rss, rss_mb(service.pid))
    service.send_signal(signal.SIGINT)  # the end of the run is a normal shutdown: the store is drained
    with contextlib.suppress(subprocess.TimeoutExpired):
        service.wait(timeout=120)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(service.pid, signal.SIGKILL)
    service.wait()
    rows: list[dict[str, Any]] = []
    rejected = 0
    for i in range(opts.clients):
        path = work / f"client{i}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if "rejected_429" in row:
                    rejected += row["rejected_429"]
                else:
                    rows.append(row)
    figures = analyse(log, rows, sent)
    figures.update(check_store(store_url, rows))
    figures.update(
        worker_kills=kills,
        service_restarts=restarts,
        http_429=rejected,
        service_peak_rss_mb=round(peak_rss, 1),
        wall_s=round(time.monotonic() - began, 1),
        workdir=str(work),
    )
    for k, v in figures.items():
        print(f"{k:>34}: {v}")
    print(
        f"RESULT lost={figures['lost']} duplicated_executions={figures['duplicated_executions']} "
        f"wrong={figures['wrong']} poison_leaks={figures['poison_leaks']} hung={figures['hung']} "
        f"rerun_after_service_kill={figures['rerun_after_service_kill']} worker_kills={kills} "
        f"service_restarts={restarts} http_429={rejected} cost_calls_lost={figures['cost_calls_lost']} "
        f"cost_batches_double={figures['cost_batches_double']} "
        f"cost_runs_missing={figures['cost_runs_missing']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
