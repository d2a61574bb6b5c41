"""The Ray backend on a local one-node Ray cluster: actors serve pooled calls, report their resources, and a
killed actor loses no call; node discovery is checked against a fake ``ray.nodes()``. Across several nodes:
tests/test_ray_multinode.py, which also holds the cluster and the ``held`` stage used here."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.runtime import ray_backend, worker_main
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.ray_backend import RayBackend, RayPlacement
from esg_prefect.runtime.stages import resolve_stage
from esg_prefect.runtime.workers import WorkerDiedError, WorkerLoadError, WorkerSpec
from esg_prefect.scheduling import ESGSettings
from tests.test_ray_multinode import Gates, LocalCluster, held_call, local_cluster, wait_for
from tests.toy_calls import PRICES, TOY, toy_call
from tests.toy_stages import POISON, settle, toy_profile

ray = pytest.importorskip("ray")

# One Ray instance per test process: keep this module's tests on one xdist worker (with --dist loadgroup).
pytestmark = [pytest.mark.service, pytest.mark.xdist_group("ray")]

# A ceiling on each call's answer, not a timing: the assertions do not depend on how long calls take.
CEILING_S = 300


def call(i: int, stage: str, wf: WorkflowDecl = TOY, prefix: str = "") -> StageCall:
    return toy_call(i, stage, call_id=f"{prefix}{stage}-{i}", run=f"{prefix}run{i}", wf=wf)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[LocalCluster]:
    """A one-node Ray cluster with 2 CPUs whose workers can import the tests' stages (skipped where Ray
    cannot start here, with the reason)."""
    with local_cluster(2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ray_pool(local_ray: LocalCluster) -> Iterator[Pool]:
    profile = toy_profile().aliased({"held": "slow"})  # the held stage, planned as the toy "slow" one
    pool = Pool(profile, PRICES, settings=ESGSettings(wait_for_batch=False), backend=RayBackend())
    assert not pool.settings.idle_vcpus  # "busy" reservation (the default): idle actors hold no Ray CPUs
    try:
        yield pool
    finally:
        pool.close()


# ---- without a cluster -------------------------------------------------------------------------


def _fake_ray(nodes: list[dict[str, Any]]) -> Any:
    return SimpleNamespace(is_initialized=lambda: True, nodes=lambda: nodes, remote=lambda cls: cls)


def _node(node_id: str, host: str, alive: bool = True, **resources: float) -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerHostname": host, "Resources": resources, "Labels": {}}


def test_ray_nodes_become_nodes_and_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    head = _node("a" * 56, "head", CPU=0.0)  # a head started with --num-cpus=0 takes no workers
    gpu = _node("b" * 56, "gpu-box", CPU=16.0, GPU=2.0, **{"accelerator_type:A100-80G": 1.0})
    twin = _node("c" * 56, "gpu-box", CPU=8.0, GPU=1.0)  # a second raylet on the same host
    twin["Labels"] = {"ray.io/accelerator-type": "T4"}
    nodes = [head, gpu, twin]
    monkeypatch.setattr(ray_backend, "import_ray", lambda: _fake_ray(nodes))
    be = RayBackend(max_workers_per_node=4)
    assert [(n.name, n.vcpus, n.max_workers) for n in be.nodes()] == [
        ("gpu-box", 16, 4),
        ("gpu-box-cccccccc", 8, 4),
    ]
    assert [(d.device_id, d.node, d.hardware) for d in be.devices()] == [
        ("gpu-box/gpu0", "gpu-box", "A100"),
        ("gpu-box/gpu1", "gpu-box", "A100"),
        ("gpu-box-cccccccc/gpu0", "gpu-box-cccccccc", "T4"),
    ]
    # A node that leaves is offered no more (the pool keeps it while a batch of its runs there) but keeps
    # its name; a start still aimed at it fails at once, as a worker lost (its calls go back to the queue).
    twin["Alive"] = False
    be.refresh()
    assert [n.name for n in be.nodes()] == ["gpu-box"]
    assert [d.node for d in be.devices()] == ["gpu-box", "gpu-box"]
    assert be.node_ids()["gpu-box-cccccccc"] == "c" * 56
    spec = WorkerSpec("w1", "tests.toy_stages:double", "gpu-box-cccccccc", None, "cpu", 1, 0.0)
    with pytest.raises(WorkerDiedError, match="has left the cluster"):
        asyncio.run(be.start(spec))
    with pytest.raises(WorkerLoadError, match=r"no Ray node called 'elsewhere'"):
        asyncio.run(be.start(WorkerSpec("w2", spec.stage_path, "elsewhere", None, "cpu", 1, 0.0)))


def test_ray_backend_arguments_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "import_ray", lambda: _fake_ray([_node("a" * 56, "h", CPU=2.0)]))
    with pytest.raises(InvalidInputError, match="'always'"):
        RayBackend(cpu_reservation="always")
    with pytest.raises(InvalidInputError, match=r"max_workers_per_node.*0"):
        RayBackend(max_workers_per_node=0)
    monkeypatch.setattr(ray_backend, "import_ray", lambda: _fake_ray([_node("a" * 56, "h", CPU=0.0)]))
    with pytest.raises(WorkerLoadError, match="no live node with a CPU"):
        RayBackend()


def test_no_ray_cluster_at_the_address_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from esg_prefect.cli import main
    from esg_prefect.exceptions import ConfigError

    def init(**kwargs: Any) -> None:
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to by setting `--address`."
        )

    fake = SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setattr(ray_backend, "import_ray", lambda: fake)
    with pytest.raises(ConfigError, match=r"cannot join the Ray cluster at 'auto': Could not find any running Ray"):
        RayBackend(address="auto")
    assert main(["pool", "serve", "--allow", "tests", "--backend", "ray"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "--ray-address" in err and "ray start --head" in err and "`--address`" not in err, err


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'esg-prefect\[ray\]'"):
        RayBackend()


def test_an_actors_batch_time_leaves_out_compacting_the_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the process worker leaves out pickling them: the rest of the round trip is the per-batch overhead."""
    now = [0.0]  # a clock that moves only while the outputs are compacted
    monkeypatch.setattr(ray_backend, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def slow_compact(obj: Any) -> Any:
        now[0] += 1.0
        return obj

    monkeypatch.setattr(worker_main, "compact", slow_compact)
    actor = ray_backend.StageActor("tests.toy_stages:inc", 1, 0.0)
    actor.spec = resolve_stage("tests.toy_stages:inc")
    actor.model = actor.spec.load("cpu")
    status, outputs, elapsed_ms, _ = actor.run([1, 2, 3])
    assert (status, outputs, now[0]) == ("ok", [2, 3, 4], 3.0)
    assert elapsed_ms == 0.0


# ---- on a local Ray instance ----------------------------------------------------------------------


def test_ray_worker_loads_runs_and_reports_its_resources(local_ray: LocalCluster) -> None:
    be = RayBackend(cpu_reservation="lifetime")
    assert be.holds_idle_vcpus  # the pool bills its workers' idle vCPUs (tests/test_idle_vcpus.py)
    (node,) = be.nodes()
    assert node.vcpus == 2 and be.devices() == ()

    async def scenario() -> None:
        spec = WorkerSpec("w1", "tests.toy_stages:inc", node.name, None, "cpu", 1, 0.0)
        worker = await be.start(spec)
        assert "Ray actor" in worker.enforcement and "num_cpus=1 (held for its life)" in worker.enforcement
        assert "num_gpus=0" in worker.enforcement and "1 torch thread(s)" in worker.enforcement
        assert worker.load_ms > 0
        pid = await asyncio.wrap_future(worker.actor.pid.remote().future())
        assert be.placements() == {"w1": RayPlacement(node.name, be.node_ids()[node.name], pid)}
        ok = await worker.execute([1, 2, 3])
        assert ok.ok and ok.outputs == [2, 3, 4]
        bad = await worker.execute([POISON * 2])  # the batch function raises: reported, the actor lives on
        assert not bad.ok and bad.error_type == "ValueError" and "poison" in bad.error_message
        assert (await worker.execute([5])).outputs == [6]
        await worker.stop()
        assert be.actors() == {}

        with pytest.raises(WorkerLoadError, match="cannot import module 'no_such_module_xyz'") as err:
            await be.start(WorkerSpec("w2", "no_such_module_xyz:stage", node.name, None, "cpu", 1, 0.0))
        assert "no_such_module_xyz:stage" in str(err.value) and node.name in str(err.value)
        assert be.actors() == {}  # the failed actor was killed, its CPU given back

    asyncio.run(scenario())
    asyncio.run(be.close())


def test_pool_on_ray_batches_calls_of_many_runs(ray_pool: Pool) -> None:
    doubled = settle([ray_pool.submit(call(i, "double")) for i in range(30)], timeout=CEILING_S)
    assert [r.output for r in doubled if isinstance(r, StageResult)] == [2 * i for i in range(30)]
    items = [i for i in range(31) if i != POISON * 2]
    incs = settle([ray_pool.submit(call(i, "inc")) for i in items], timeout=CEILING_S)
    assert [r.output for r in incs if isinstance(r, StageResult)] == [i + 1 for i in items]
    snap = ray_pool.snapshot()
    assert sum(len(b.items) for b in snap.batches) == 60  # every call ran exactly once
    assert max(len(b.items) for b in snap.batches) > 1  # and they were batched
    assert snap.workers and all(w.enforcement.startswith("Ray actor on node") for w in snap.workers)


def test_a_ray_actors_batch_output_comes_back_with_each_result(ray_pool: Pool) -> None:
    talk = WorkflowDecl("talk", 5_000, ())
    ok, bad = settle([ray_pool.submit(call(i, "chatty", talk, "talk-")) for i in (3, POISON)], timeout=CEILING_S)
    assert isinstance(ok, StageResult) and ok.output == 4, ok
    assert (20, "", "chatty got 1 item(s)") in ok.lines  # alone, or again alone after its batch with the poison
    assert (30, "", "chatty to stderr") in ok.lines
    assert (30, "tests.chatty", "chatty saw [3]") in ok.lines
    assert "about to fail on the poison" in getattr(bad, "remote_traceback", ""), bad


def test_killed_actor_mid_batch_loses_nothing(ray_pool: Pool, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    backend: RayBackend = ray_pool.backend  # type: ignore[assignment]
    gates = Gates(tmp_path)
    items = [gates.item(f"k{i}") for i in range(8)]
    futs = [ray_pool.submit(held_call(item, "kill")) for item in items]
    # Held until the gates open: a batch is surely running when its actor is killed, however slow the machine.
    started = gates.wait_started(items[:1])
    (victim,) = [wid for wid, p in backend.placements().items() if p.pid == started[items[0]]]
    in_batch = [i for i, pid in gates.pids(items).items() if pid == started[items[0]]]
    with caplog.at_level(logging.WARNING, logger="esg_prefect.runtime.pool"):
        ray.kill(backend.actors()[victim])
        # ray.kill only asks: open the gates once the pool has seen the actor die, not before its batch ended.
        wait_for("the killed actor's batch lost", lambda: victim not in backend.placements())
        gates.open(items)
        results = settle(futs, timeout=CEILING_S)
    assert [r.output for r in results if isinstance(r, StageResult)] == [Path(i).name for i in items], results
    rerun = [r for r in results if isinstance(r, StageResult) and r.call_id in {Path(i).name for i in in_batch}]
    assert rerun and all(r.worker_id != victim for r in rerun)  # the killed batch's calls ran again elsewhere
    ok_ids = [c.call_id for c in ray_pool.snapshot().calls if c.ok and c.call_id.startswith("k")]
    assert sorted(ok_ids) == sorted(Path(i).name for i in items)  # none lost, none delivered twice
    assert any("lost" in rec.getMessage() and "died" in rec.getMessage() for rec in caplog.records)
