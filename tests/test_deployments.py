"""deployments/: the example deployments, run by a process work-pool worker and by the serve script.

End to end against a real local server (``prefect server start`` in a subprocess,
one for the module's xdist group):

* the walkthrough of deployments/README.md: the pool service, ``prefect
  work-pool create``, ``prefect deploy --all`` of deployments/prefect.yaml,
  ``prefect worker start``; one run of the text deployment completes, its costs
  are in the cost store and its cost artifacts on the run;
* deployments/serve.py: it starts the pool service, serves the text deployment,
  runs it, and on SIGINT stops serving and the service;
* and, without a server, that serve.py builds the deployments prefect.yaml describes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml  # type: ignore[import-untyped]

from esg_prefect.integration.run_views import cost_column, money
from esg_prefect.store import CostStore
from tests.prefect_server import ROOT, PrefectServer, free_port, prefect_server, spawn, stop, tail, wait_http
from tests.scripts import load_script

pytestmark = [pytest.mark.service, pytest.mark.slow, pytest.mark.xdist_group("deployments")]

SPEC = ROOT / "deployments" / "prefect.yaml"
WORK_POOL = "esg-process"
TEXT = "text-every-5-minutes"
POOLED_STAGES = ["encode", "classify_text", "summarize"]  # tokenize is a plain task, run in the flow
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# A run's cost artifacts are posted once its cost is final: when the idle time after its batches has
# closed, that is when the pool service's workers reach their keep-alive (docs/decisions/one-cost.md).
# The service's `--set` makes that 5 s here, not the default 60 s.
SHORT_KEEP_ALIVE = ["--set", "keep_alive_s=5"]


@pytest.fixture(scope="session")  # one server for the group (one xdist worker), however its tests interleave
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with prefect_server(tmp_path_factory.mktemp("prefect-home")) as s:
        yield s


def load_serve_script() -> ModuleType:
    return load_script("esg_deployments_serve", "deployments/serve.py")


def yaml_deployments() -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in yaml.safe_load(SPEC.read_text())["deployments"]}


def run_cli(args: list[str], env: dict[str, str], log: Path, timeout_s: float = 300.0) -> str:
    """Run ``prefect ARGS`` from the repository root; returns its output, fails with it on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    out = done.stdout + done.stderr
    with log.open("a") as f:
        f.write(f"$ prefect {' '.join(args)}\n{out}\n")
    assert done.returncode == 0, f"prefect {' '.join(args)} failed ({done.returncode}):\n{out[-3000:]}{hint(out)}"
    return out


def hint(out: str) -> str:
    """What a known failure of ``prefect deploy`` means."""
    if "422" in out and "/workers/filter" in out:
        import fastapi

        return (
            f"\n\nKNOWN INCOMPATIBILITY: Prefect 3.8's client sends offset/limit as null to the server's "
            f"/work_pools/<pool>/workers/filter, which FastAPI >= 0.151 rejects (installed: {fastapi.__version__}); "
            "`prefect deploy` then fails after saving the first deployment. Install fastapi>=0.139,<0.151."
        )
    return ""


def wait_final(api: httpx.Client, run_id: str, timeout_s: float) -> dict[str, Any]:
    """The flow run once it is in a final state (or as it is when time runs out)."""
    give_up = time.monotonic() + timeout_s
    run: dict[str, Any] = {"state_type": "UNKNOWN"}
    while True:
        # A busy SQLite-backed server may answer slowly or 503 for a while: keep polling.
        with contextlib.suppress(httpx.TimeoutException):
            resp = api.get(f"/flow_runs/{run_id}")
            if resp.status_code == 200:
                run = resp.json()
        if run["state_type"] in FINAL or time.monotonic() > give_up:
            return run
        time.sleep(0.5)


def wait_deployment(api: httpx.Client, flow_name: str, name: str, timeout_s: float) -> dict[str, Any]:
    """The deployment once the serve script has registered it."""
    give_up = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < give_up, f"deployment {flow_name}/{name} did not appear within {timeout_s:.0f} s"
        with contextlib.suppress(httpx.TimeoutException):
            resp = api.get(f"/deployments/name/{flow_name}/{name}")
            if resp.status_code == 200:
                found: dict[str, Any] = resp.json()
                return found
        time.sleep(0.5)


def create_run(api: httpx.Client, flow_name: str, name: str, timeout_s: float = 180.0) -> dict[str, Any]:
    """Start a run of a deployment, retrying while the server is busy (503) or the deployment is being
    registered again (404: serving upserts it); the last answer is in the failure message."""
    give_up = time.monotonic() + timeout_s
    while True:
        deployment = wait_deployment(api, flow_name, name, timeout_s=max(1.0, give_up - time.monotonic()))
        with contextlib.suppress(httpx.TimeoutException):
            resp = api.post(f"/deployments/{deployment['id']}/create_flow_run", json={})
            if resp.status_code in (200, 201):
                run: dict[str, Any] = resp.json()
                return run
            assert resp.status_code in (404, 409, 503), f"create_flow_run answered {resp.status_code}: {resp.text}"
            assert time.monotonic() < give_up, f"create_flow_run kept answering {resp.status_code}: {resp.text}"
        time.sleep(0.5)


def run_pids(api: httpx.Client, run_ids: list[str]) -> dict[str, int]:
    """The process id each deployment run logged (deployments/flows.py logs it first thing)."""
    pids: dict[str, int] = {}
    give_up = time.monotonic() + 120  # logs reach the API in batches, shortly after the run
    while len(pids) < len(run_ids) and time.monotonic() < give_up:
        for i in range(0, len(run_ids), 4):  # a few runs a query: the API returns 200 log lines at most
            body = {"logs": {"flow_run_id": {"any_": run_ids[i : i + 4]}}, "limit": 200}
            for entry in api.post("/logs/filter", json=body).json():
                found = re.fullmatch(r"deployment run in process (\d+)", entry["message"])
                if found:
                    pids[entry["flow_run_id"]] = int(found.group(1))
        time.sleep(0.5)
    return pids


def stop_serving(serving: subprocess.Popen[bytes], timeout_s: float = 240.0) -> None:
    """SIGINT the serve script, as Ctrl-C: serving stops, then the pool service; wait for it to exit.

    It exits within seconds (2 to 6 s here, most of it the interpreters' exits). It once did not,
    240 s after its SIGINT, idle: the suite had been started in the background of a script, so
    SIGINT was ignored in every process it started (spawn() now resets it). The ceiling is generous;
    past it the script prints every thread's stack into its log (SIGUSR1, see deployments/serve.py)
    before it is killed, so that the failure shows what it waited on.
    """
    if serving.poll() is None:
        serving.send_signal(signal.SIGINT)
        try:
            serving.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(serving.pid, signal.SIGUSR1)
            time.sleep(2)
    stop(serving)  # what is left of its process group


def delete_deployments(server: PrefectServer) -> None:
    """A clean slate: the two end-to-end tests make deployments of the same names."""
    with server.api() as api:
        for d in api.post("/deployments/filter", json={}).json():
            api.delete(f"/deployments/{d['id']}").raise_for_status()


def wait_costs(store_url: str, run_id: str, timeout_s: float) -> Any:
    """The cost row of a run, once the pool service has recorded it (after the run ends)."""
    give_up = time.monotonic() + timeout_s
    while True:
        with contextlib.closing(CostStore(store_url)) as store:
            rows = {r.key: r for r in store.costs("run")}
        if run_id in rows or time.monotonic() > give_up:
            return rows.get(run_id)
        time.sleep(0.5)


def check_costs_and_artifacts(api: httpx.Client, store_url: str, run_id: str, logs: str) -> float:
    """The run's cost row (one call per pooled stage, a positive cost) and its two artifacts; returns its cost."""
    row = wait_costs(store_url, run_id, timeout_s=120)
    assert row is not None, f"no cost record of run {run_id}\n{logs}"
    assert row.runs == 1 and row.stage_calls == len(POOLED_STAGES)
    assert row.cost > 0
    keys = {f"esg-cost-{run_id}", f"esg-summary-{run_id}"}
    # Posted once the run's cost is final: after the service's workers' keep-alive (SHORT_KEEP_ALIVE).
    give_up = time.monotonic() + 300
    while True:
        arts = api.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
        if keys <= {a["key"] for a in arts} or time.monotonic() > give_up:
            break
        time.sleep(0.5)
    assert keys <= {a["key"] for a in arts}, f"artifacts of run {run_id}: {[a['key'] for a in arts]}\n{logs}"
    data = next(a for a in arts if a["type"] == "table")["data"]
    rows = json.loads(data) if isinstance(data, str) else data  # posted as a JSON string
    assert [r["stage"] for r in rows] == [*POOLED_STAGES, "total"]
    final = wait_costs(store_url, run_id, timeout_s=120)  # the store has the idle time the artifact counts
    # The table's total row: the run's cost to three significant digits, its unit in the header.
    assert final is not None and rows[-1][cost_column("cost", final.unit)] == money(final.cost), (rows[-1], final)
    return float(final.cost)


def test_serve_script_builds_the_deployments_of_prefect_yaml() -> None:
    serve = load_serve_script()
    specs = yaml_deployments()
    built = {d.name: d for d in serve.build_deployments(serve.deployment_specs())}
    assert set(built) == set(specs)
    for name, d in built.items():
        spec = specs[name]
        assert d.entrypoint.endswith(spec["entrypoint"])  # the pooled flow of deployments/flows.py
        assert d.parameters == spec["parameters"]
        assert d.tags == spec["tags"]
        assert len(d.schedules) == len(spec["schedules"])
        for got, want in zip(d.schedules, spec["schedules"], strict=True):
            if "cron" in want:
                assert got.schedule.cron == want["cron"]
            else:
                assert got.schedule.interval.total_seconds() == want["interval"]
            assert (got.parameters or {}) == want.get("parameters", {})
    with pytest.raises(ValueError, match="no deployment named"):
        serve.build_deployments(serve.deployment_specs(), only=["nope"])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--set", "keep_alive_s=-3"], "keep_alive_s"),
        (["--set", "no_such_knob=1"], "no_such_knob"),
        (["--pool-url", "http://127.0.0.1:1", "--set", "keep_alive_s=5"], "--pool-url"),
    ],
)
def test_serve_script_refuses_a_bad_set_in_one_line(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    serve = load_serve_script()
    with pytest.raises(SystemExit) as exc:
        serve.main(argv)  # before any Prefect API, service or deployment is touched
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and named in err.splitlines()[-1], err


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_serve_script_refuses_a_port_out_of_range_in_one_line(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    serve = load_serve_script()
    with pytest.raises(SystemExit) as exc:
        serve.main(["--port", port])  # was an OverflowError traceback from bind()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1].endswith(f" error: --port: must be a TCP port, 1 to 65535, got {port}"), err


def test_serve_script_refuses_a_port_another_service_holds(capsys: pytest.CaptureFixture[str]) -> None:
    """Not "pool service on ... (pid N)" while the service it started exits with "Address already in use"
    and the one already on that port (another --allow, other settings) answers its health check."""
    serve = load_serve_script()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            serve.main(["--port", str(port), "--backend", "inline"])  # before any Prefect API or service
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"--port {port}" in err.splitlines()[-1] and "--pool-url" in err, err


def test_text_deployment_runs_through_a_process_worker(server: PrefectServer, tmp_path: Path) -> None:
    started = time.monotonic()
    store_url = f"sqlite:///{tmp_path}/costs.db"
    log = tmp_path / "cli.log"
    pool_port = free_port()
    env = server.env | {
        "ESG_PREFECT_POOL_URL": f"http://127.0.0.1:{pool_port}",
        "ESG_PREFECT_STORE_URL": store_url,
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # poll for runs every second, not every 10
    }
    delete_deployments(server)
    with contextlib.ExitStack() as procs:
        # The pool service: inline workers (threads) keep the test light; the README's uses processes.
        service_log = tmp_path / "pool-service.log"
        service = spawn(
            [sys.executable, "-m", "esg_prefect.cli", "pool", "serve", "--allow", "esg_prefect.examples",
             "--port", str(pool_port), "--backend", "inline", "--store", store_url, *SHORT_KEEP_ALIVE],
            env, service_log,
        )  # fmt: skip
        procs.callback(stop, service)
        wait_http(f"http://127.0.0.1:{pool_port}/healthz", service, service_log, 180, "pool service")

        run_cli(["work-pool", "create", WORK_POOL, "--type", "process"], env, log)
        worker_log = tmp_path / "worker.log"
        worker = spawn(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--limit", "2"], env, worker_log
        )
        procs.callback(stop, worker)
        out = run_cli(["deploy", "--all", "--prefect-file", str(SPEC.relative_to(ROOT))], env, log)

        specs = yaml_deployments()
        with server.api() as api:
            by_name = {d["name"]: d for d in api.post("/deployments/filter", json={}).json()}
            assert set(by_name) == set(specs), out
            for name, d in by_name.items():
                assert d["work_pool_name"] == WORK_POOL
                assert d["entrypoint"] == specs[name]["entrypoint"]
                assert d["parameters"] == specs[name]["parameters"]
                assert len(d["schedules"]) == len(specs[name]["schedules"])
                assert all(s["active"] for s in d["schedules"])

            run = create_run(api, "text-pipeline", TEXT)
            run_id = run["id"]
            assert run["parameters"] == {"request_seed": 11}
            final = wait_final(api, run_id, timeout_s=300)
            logs = f"worker:\n{tail(worker_log)}\nservice:\n{tail(service_log)}"
            assert final["state_type"] == "COMPLETED", f"flow run ended {final['state_type']}\n{logs}"
            cost = check_costs_and_artifacts(api, store_url, run_id, logs)
        with contextlib.closing(CostStore(store_url)) as store:
            by_deployment = {r.key: r.cost for r in store.costs("deployment")}
    assert by_deployment.get(TEXT, 0.0) > 0, by_deployment  # the service learns the deployment from the call
    print(f"work-pool run {run_id} completed, cost {cost:.6g}; costs by deployment: {by_deployment}")
    print(f"took {time.monotonic() - started:.1f} s")


def test_serve_script_serves_with_the_pool_service_alongside(server: PrefectServer, tmp_path: Path) -> None:
    started = time.monotonic()
    store_url = f"sqlite:///{tmp_path}/costs.db"
    pool_port = free_port()
    env = server.env | {"ESG_PREFECT_STORE_URL": store_url}  # the service it starts records there
    log = tmp_path / "serve.log"
    delete_deployments(server)
    cmd = [sys.executable, "deployments/serve.py", "--port", str(pool_port), "--backend", "inline", "--only", TEXT]
    cmd += SHORT_KEEP_ALIVE
    serving = spawn(cmd, env, log)
    try:
        with server.api() as api:
            deployment = wait_deployment(api, "text-pipeline", TEXT, timeout_s=180)
            assert deployment["work_pool_name"] is None  # served: no work pool
            assert len(deployment["schedules"]) == len(yaml_deployments()[TEXT]["schedules"])
            wait_http(f"http://127.0.0.1:{pool_port}/healthz", serving, log, 120, "the serve script's pool service")
            run_id = create_run(api, "text-pipeline", TEXT)["id"]
            final = wait_final(api, run_id, timeout_s=300)
            assert final["state_type"] == "COMPLETED", f"flow run ended {final['state_type']}\n{tail(log)}"
            cost = check_costs_and_artifacts(api, store_url, run_id, tail(log))
        found = re.search(r"pool service on \S+ \(pid (\d+)\)", log.read_text())
        assert found, tail(log)
        service_pid = int(found.group(1))
    finally:
        stop_serving(serving)
    assert serving.returncode == 0, tail(log, 8000)
    assert not Path(f"/proc/{service_pid}").exists(), "the pool service outlived the serve script"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{pool_port}/healthz", timeout=2)
    print(f"served run {run_id} completed, cost {cost:.6g}; took {time.monotonic() - started:.1f} s")


def test_two_served_deployments_batch_calls_of_runs_in_separate_processes(
    server: PrefectServer, tmp_path: Path
) -> None:
    """Concurrent runs of two served deployments, each run in a process of its own: the pool service's
    batches mix calls of different runs (so of different processes).

    The service is paused while the runs start (eight processes importing torch start seconds apart on
    a loaded machine, and calls that never overlap cannot share a batch), then resumed once every run's
    first call is queued: the first batches must hold calls of several runs."""
    started = time.monotonic()
    pool_port = free_port()
    pool_url = f"http://127.0.0.1:{pool_port}"
    log = tmp_path / "serve.log"
    delete_deployments(server)
    served = {"text-pipeline": TEXT, "image-pipeline": "image-every-2-minutes"}
    cmd = [sys.executable, "deployments/serve.py", "--port", str(pool_port), "--backend", "inline", "--limit", "8"]
    for name in served.values():
        cmd += ["--only", name]
    env = server.env | {"PREFECT_RUNNER_POLL_FREQUENCY": "1"}  # pick new runs up within a second
    serving = spawn(cmd, env, log)
    runs_per_deployment = 4
    try:
        with server.api() as api:
            wait_http(f"{pool_url}/healthz", serving, log, 180, "the serve script's pool service")
            assert httpx.post(f"{pool_url}/v1/pause", timeout=30).json() == {"paused": True}
            run_ids: dict[str, str] = {}  # run id -> flow name
            for _ in range(runs_per_deployment):
                for flow_name, name in served.items():
                    run_ids[create_run(api, flow_name, name)["id"]] = flow_name
            # Each run blocks on its first stage call: wait until, for both workflows, some entry
            # stage's queue holds a call of every run.
            depths: dict[str, int] = {}
            full: set[str] = set()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                depths = httpx.get(f"{pool_url}/metrics", timeout=30).json()["queue_depths"]
                full = {key.split("/")[0] for key, n in depths.items() if n >= runs_per_deployment}
                if len(full) == len(served):
                    break
                time.sleep(0.5)
            assert httpx.post(f"{pool_url}/v1/resume", timeout=30).json() == {"paused": False}
            assert len(full) == len(served), f"not every run's first call reached the service: {depths}\n{tail(log)}"
            finals = {rid: wait_final(api, rid, timeout_s=300) for rid in run_ids}
            states = {rid: f["state_type"] for rid, f in finals.items()}
            assert set(states.values()) == {"COMPLETED"}, f"{states}\n{tail(log)}"
            batches = httpx.get(f"{pool_url}/v1/batches?limit=1000", timeout=30).json()["batches"]
            pids = run_pids(api, list(run_ids))
    finally:
        stop_serving(serving)
    # Served runs are separate processes: each run logged a process id of its own, not the serve script's.
    assert set(pids) == set(run_ids) and len(set(pids.values())) == len(run_ids), pids
    assert serving.pid not in pids.values()
    ours = [b for b in batches if set(b["runs"]) <= set(run_ids)]
    assert len(ours) == len(batches) and ours, batches
    runs_seen = {r for b in ours for r in b["runs"]}
    assert runs_seen == set(run_ids)  # every run's calls went through the service
    mixed = [b for b in ours if len(b["runs"]) >= 2]
    assert mixed, f"no batch mixed calls of two runs: {[(b['size'], len(b['runs'])) for b in ours]}"
    for b in mixed:  # a batch holds one stage's calls: those runs are of the same deployment
        assert len({run_ids[r] for r in b["runs"]}) == 1
    items = sum(b["size"] for b in ours)
    mixed_items = sum(b["size"] for b in mixed)
    print(
        f"{len(run_ids)} runs of {len(served)} deployments: {len(ours)} batches, "
        f"{len(mixed)} mixing runs ({mixed_items}/{items} calls in mixed batches); "
        f"took {time.monotonic() - started:.1f} s"
    )
