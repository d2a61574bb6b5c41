"""The Ray backend across nodes, on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``).

The cluster: a head with no CPUs (it takes no workers, as docs/multi-node.md
advises), node ``one`` with 1 CPU and node ``two`` with 2; some tests add a
node of their own. The pool places workers on several nodes as their CPUs
allow, a node removed while a batch runs there loses no call, and a call goes
to the warm worker on the node that holds its input. The module is skipped,
with the reason, where Ray cannot start a cluster or a worker process here.

Nothing depends on the machine's speed: a batch that must be running when
something happens is held by the ``held`` stage until the test opens its
gate, and every wait is on a condition with a generous ceiling. This module
also holds what tests/test_ray_backend.py shares with it (the ``held`` stage,
gates, the local cluster); Ray's workers import it by path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.model import LatencyProfile, PriceSheet, ProfilePoint
from esg_prefect.model.cluster import Node
from esg_prefect.model.config import ConfigSpace
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.stages import StageSpec
from esg_prefect.runtime.workers import InlineBackend, WorkerDiedError, WorkerHandle, WorkerSpec
from esg_prefect.scheduling import ESGSettings

# One Ray instance per test process: keep the Ray modules on one xdist worker (with --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")

ROOT = Path(__file__).resolve().parents[1]
# A ceiling on each condition waited for, never a timing: how long anything takes is not asserted.
CEILING_S = 300
PRICES = PriceSheet(1e-5, {})
HELD_PATH = "tests.test_ray_multinode:HELD"

# Ray's settings for the tests' clusters. Ray starts its worker processes at nice 15: beside four
# CPU-bound processes on two cores they got almost no CPU, and no actor started within 300 s
# (docs/results.md, the suite beside a CPU hog). At the tests' own priority they get their share. A worker
# that registers late is then waited for, not killed and started again.
RAY_SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0, "worker_register_timeout_seconds": CEILING_S}
# Every node: a small object store (batches here are a few integers), no dashboard, and the repository
# on the workers' import path (they import the stages by path).
NODE_ARGS: dict[str, Any] = {
    "object_store_memory": 80 * 1024 * 1024,
    "include_dashboard": False,
    "env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])},
}

# One vCPU per worker, so that a node's CPUs bound how many batches run on it; batches go at once (no
# waiting for fuller ones); warm workers stay for the whole test (a fixed hour: the histogram policy may
# retire a stage's second worker quickly); no pre-warm starts, so every worker is one a batch asked for.
SETTINGS = ESGSettings(
    config_space=ConfigSpace((1, 2, 4, 8), (1,), (0.0,)),
    wait_for_batch=False,
    keep_alive_s=3600.0,
    keep_alive_policy="fixed",
    prewarm=False,
)


# ---- the held stage and its gates ------------------------------------------------------------


def _load_nothing(device: str) -> dict[str, Any]:
    return {}


def _held(model: dict[str, Any], items: list[str]) -> list[str]:
    """Each item is a path: say the batch started (``<path>.started`` holds this process's id), then wait
    until the test creates ``<path>.go``; each output is the path's file name."""
    for item in items:
        tmp = Path(f"{item}.{os.getpid()}.tmp")
        tmp.write_text(str(os.getpid()))
        tmp.replace(f"{item}.started")  # whole or absent: the test may read it at any moment
    deadline = time.monotonic() + 2 * CEILING_S  # a gate never opened ends the batch, not the worker's life
    while not all(os.path.exists(f"{item}.go") for item in items):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gates of {items} were never opened")
        time.sleep(0.01)
    return [Path(item).name for item in items]


HELD = StageSpec("held", _load_nothing, _held, HELD_PATH)


@dataclass(frozen=True)
class Gates:
    """Gate files of held calls under one directory."""

    root: Path

    def item(self, name: str) -> str:
        """The input of a held call called ``name`` (its gate closed until :meth:`open`)."""
        return str(self.root / name)

    def open(self, items: Iterable[str]) -> None:
        for item in items:
            Path(f"{item}.go").touch()

    def pids(self, items: Iterable[str]) -> dict[str, int]:
        """The process each started item runs in (its latest start)."""
        out = {}
        for item in items:
            marker = Path(f"{item}.started")
            if marker.exists():
                out[item] = int(marker.read_text())
        return out

    def wait_started(self, items: Sequence[str]) -> dict[str, int]:
        """Wait until every item's batch is running; the process of each."""
        wait_for(f"batches of {[Path(i).name for i in items]} running", lambda: len(self.pids(items)) == len(items))
        return self.pids(items)


def held_profile(stages: Sequence[str]) -> LatencyProfile:
    """Batching pays for each of ``stages``: 5 ms + 0.5 ms per item on 1 vCPU, a 20 ms cold start."""
    points = [ProfilePoint(s, "cpu", b, 1, 0.0, 5.0 + 0.5 * b, 5.5 + 0.5 * b) for s in stages for b in (1, 2, 4, 8)]
    return LatencyProfile(points, {(s, "cpu"): 20.0 for s in stages})


def held_call(item: str, workflow: str, upstream: tuple[str, ...] = (), stage: str = "held") -> StageCall:
    """A call of the held stage, its own request; its id is also its task run id (what ``upstream`` names)."""
    name = Path(item).name
    wf = WorkflowDecl(workflow, 600_000)
    return StageCall(name, stage, HELD_PATH, wf, name, name, item, upstream=upstream, task_run_id=name)


def wait_for(what: str, check: Callable[[], bool], ceiling_s: float = CEILING_S) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` past the ceiling."""
    deadline = time.monotonic() + ceiling_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {ceiling_s} s")
        time.sleep(0.05)


# ---- a local Ray cluster -----------------------------------------------------------------------


@dataclass
class LocalCluster:
    """Ray nodes on this machine, the test process connected as the driver; nodes by label."""

    ray: Any
    cluster: Any
    nodes: dict[str, Any] = field(default_factory=dict)

    def node_id(self, label: str) -> str:
        return str(self.nodes[label].node_id)

    def alive(self, label: str) -> bool:
        node_id = self.node_id(label)
        return any(n["NodeID"] == node_id and n["Alive"] for n in self.ray.nodes())

    def add(self, label: str, **node_args: Any) -> str:
        """Start a node (``num_cpus``, ``num_gpus``, ``resources``...) and wait until it is up; its id."""
        self.nodes[label] = self.cluster.add_node(wait=False, **NODE_ARGS, **node_args)
        wait_for(f"Ray node {label!r} alive", lambda: self.alive(label))
        return self.node_id(label)

    def remove(self, label: str) -> None:
        """Stop a node's processes (its raylet and workers), as a machine leaving; wait until Ray sees it gone."""
        node = self.nodes.pop(label)
        self.cluster.remove_node(node)
        wait_for(
            f"Ray node {label!r} gone",
            lambda: not any(n["NodeID"] == node.node_id and n["Alive"] for n in self.ray.nodes()),
        )

    def probe(self, labels: Iterable[str]) -> None:
        """Run a task on each node: Ray can start a worker process there (its first is the slowest)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        where = self.ray.remote(num_cpus=0)(_node_of_this_worker)
        refs = [
            where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id(x), soft=False)).remote()
            for x in labels
        ]
        assert self.ray.get(refs, timeout=CEILING_S) == [self.node_id(x) for x in labels]


def _node_of_this_worker() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


@contextlib.contextmanager
def local_cluster(head_cpus: int, **workers: int) -> Iterator[LocalCluster]:
    """A Ray cluster of a head with ``head_cpus`` CPUs and one node per ``label=cpus``, the driver connected.

    Skips the calling test, with the reason, when Ray cannot start it or a worker process on it.
    """
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    local = LocalCluster(ray, Cluster())
    try:
        try:
            # The head: no autoscaler monitor and no log monitor (log_to_driver is off), 2 processes fewer.
            head = local.cluster.add_node(
                wait=False,
                num_cpus=head_cpus,
                no_monitor=True,
                include_log_monitor=False,
                _system_config=RAY_SYSTEM_CONFIG,
                **NODE_ARGS,
            )
            local.nodes["head"] = head
            # The cluster wrote its address where a plain ray.init() looks: a Ray test started meanwhile by
            # someone else on this machine would join this cluster instead of starting its own.
            with contextlib.suppress(Exception):
                from ray._common.utils import reset_ray_address

                reset_ray_address()
            ray.init(address=local.cluster.address, namespace="esg-prefect-tests", log_to_driver=False)
            wait_for("the Ray head alive", lambda: local.alive("head"))
            for label, cpus in workers.items():
                local.add(label, num_cpus=cpus)
            local.probe([*(["head"] if head_cpus else []), *workers])
        except Exception as exc:  # whatever Ray's start-up raised: it cannot run here, which is not a test failure
            pytest.skip(f"Ray could not start a local cluster with a worker process on each node here: {exc!r}")
        yield local
    finally:
        ray.shutdown()
        local.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """The module's cluster: a head with no CPUs, node ``one`` with 1 CPU, node ``two`` with 2."""
    with local_cluster(0, one=1, two=2) as c:
        yield c


def names_by_label(backend: Any, cluster: LocalCluster) -> dict[str, str]:
    """The name the backend (and the scheduler) gives each node of ``cluster``."""
    by_id = {node_id: name for name, node_id in backend.node_ids().items()}
    return {label: by_id[cluster.node_id(label)] for label in cluster.nodes}


# ---- the pool's side of a node leaving, without Ray ------------------------------------------------


class _Leaving(InlineBackend):
    """Three nodes of one vCPU; a test takes nodes away, as Ray nodes leaving the cluster."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = [Node(name, 1, 4) for name in ("a", "b", "c")]
        self.node_of: dict[str, str] = {}
        self.refused: list[str] = []  # starts aimed at a node that had left

    def nodes(self) -> tuple[Node, ...]:
        return tuple(self.listed)

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        if spec.node not in {n.name for n in self.listed}:
            self.refused.append(spec.worker_id)
            raise WorkerDiedError(f"node {spec.node} has left")
        self.node_of[spec.worker_id] = spec.node
        return await super().start(spec)


def test_pool_drops_idle_workers_of_a_node_that_left_and_keeps_busy_ones_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _Leaving()
    gates = Gates(tmp_path)
    pool = Pool(held_profile(["held", "other"]), PRICES, settings=SETTINGS, backend=backend)
    try:
        # Two stages in one round: a worker each, on two nodes. The one of stage "other" stays busy (held);
        # the one of stage "held" finishes and waits, idle and warm.
        pool.pause()
        busy, idle = gates.item("busy"), gates.item("idle")
        busy_fut = pool.submit(held_call(busy, "wf-busy", stage="other"))
        idle_fut = pool.submit(held_call(idle, "wf-idle"))
        pool.resume()
        gates.wait_started([busy, idle])
        gates.open([idle])
        idle_worker = idle_fut.result(CEILING_S).worker_id
        (busy_worker,) = set(backend.node_of) - {idle_worker}
        wait_for(
            "the worker idle", lambda: not any(w.busy for w in pool.snapshot().workers if w.worker_id == idle_worker)
        )
        left = {backend.node_of[idle_worker], backend.node_of[busy_worker]}
        (stays,) = {"a", "b", "c"} - left

        # Both nodes leave. The next call of stage "held" must go neither to the idle worker (its node is
        # gone) nor to a new worker beside the busy one (that node stays in the view, full, while its batch runs).
        backend.listed = [n for n in backend.listed if n.name == stays]
        with caplog.at_level(logging.WARNING, logger="esg_prefect.runtime.pool"):
            after = gates.item("after")
            gates.open([after])
            res = pool.submit(held_call(after, "wf-idle")).result(CEILING_S)
        assert backend.node_of[res.worker_id] == stays and res.cold_start
        assert backend.refused == []  # nothing was placed on a node that had left
        assert idle_worker not in {w.worker_id for w in pool.snapshot().workers}
        assert any(f"worker {idle_worker} dropped" in r.getMessage() for r in caplog.records)

        # The busy worker's batch still ends well (a thread cannot die with its node); then it is dropped too.
        gates.open([busy])
        assert busy_fut.result(CEILING_S).output == "busy"
        wait_for(
            "the gone node's last worker dropped",
            lambda: [w.worker_id for w in pool.snapshot().workers] == [res.worker_id],
        )
        assert backend.refused == []
    finally:
        pool.close()


# ---- on a local multi-node Ray cluster --------------------------------------------------------------


@pytest.mark.service
def test_pool_places_workers_on_ray_nodes_as_their_cpus_allow(cluster: LocalCluster, tmp_path: Path) -> None:
    from esg_prefect.runtime.ray_backend import RayBackend

    backend = RayBackend(refresh_s=0.2)
    name = names_by_label(backend, cluster)
    offered = {n.name: n.vcpus for n in backend.nodes()}
    assert offered == {name["one"]: 1, name["two"]: 2}  # the head (no CPUs) takes no workers
    gates = Gates(tmp_path)
    pool = Pool(held_profile(["held"]), PRICES, settings=SETTINGS, backend=backend)
    try:
        # Three queues of one stage, dispatched in one round: three batches at once need three workers of
        # one vCPU each, and only node "two" has room for two of them.
        pool.pause()
        items = [gates.item(f"spread{i}") for i in range(3)]
        gates.open(items)  # nothing to hold: where each batch goes is decided in that one round
        futs = [pool.submit(held_call(item, f"spread{i}")) for i, item in enumerate(items)]
        pool.resume()
        results = [f.result(CEILING_S) for f in futs]
        assert [r.output for r in results] == [Path(i).name for i in items]
        placed = {wid: p.node for wid, p in backend.placements().items()}
        assert sorted(placed.values()) == sorted([name["one"], name["two"], name["two"]])
        assert {r.worker_id for r in results} == set(placed)
        # Ray put every actor where the pool asked: on the node the actor itself reports.
        actors = backend.actors()
        for wid, node in placed.items():
            assert cluster.ray.get(actors[wid].node_id.remote(), timeout=CEILING_S) == backend.node_ids()[node]
            assert f"Ray actor on node {node}:" in next(
                w.enforcement for w in pool.snapshot().workers if w.worker_id == wid
            )
    finally:
        pool.close()


@pytest.mark.service
def test_dispatch_prefers_the_warm_worker_on_the_node_holding_the_input(cluster: LocalCluster, tmp_path: Path) -> None:
    from esg_prefect.runtime.ray_backend import RayBackend

    backend = RayBackend(refresh_s=0.2)
    name = names_by_label(backend, cluster)
    gates = Gates(tmp_path)
    pool = Pool(held_profile(["held"]), PRICES, settings=SETTINGS, backend=backend)
    try:
        # A warm worker of the stage on each node: two queues in one round (node "one" fits one batch).
        pool.pause()
        first = [gates.item("up0"), gates.item("up1")]
        gates.open(first)
        futs = [pool.submit(held_call(item, f"near{i}")) for i, item in enumerate(first)]
        pool.resume()
        ups = [f.result(CEILING_S) for f in futs]
        node_of = {wid: p.node for wid, p in backend.placements().items()}
        assert sorted(node_of.values()) == sorted([name["one"], name["two"]])
        worker_on = {node: wid for wid, node in node_of.items()}
        output_on = {node_of[r.worker_id]: r.call_id for r in ups}  # a call whose output each node holds

        # Each call consumes an output held on one node: the warm worker there serves it, although the other
        # warm worker was idle more recently (after the first call, every call goes against that order).
        homes = ["two", "one", "two", "one"]
        served: list[StageResult] = []
        for k, home in enumerate(homes):
            item = gates.item(f"next{k}")
            gates.open([item])
            served.append(pool.submit(held_call(item, "near0", (output_on[name[home]],))).result(CEILING_S))
        assert [r.worker_id for r in served] == [worker_on[name[h]] for h in homes]
        assert not any(r.cold_start for r in served)
        # With no input's node, the most recently idle warm worker serves: the one on "one", used last.
        item = gates.item("anywhere")
        gates.open([item])
        assert pool.submit(held_call(item, "near0")).result(CEILING_S).worker_id == worker_on[name["one"]]
        assert {wid: p.node for wid, p in backend.placements().items()} == node_of  # none started or stopped
    finally:
        pool.close()


@pytest.mark.service
def test_node_removed_mid_batch_loses_no_call(
    cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from esg_prefect.runtime.ray_backend import RayBackend

    cluster.add("three", num_cpus=1)
    try:
        backend = RayBackend(refresh_s=0.2)
        name = names_by_label(backend, cluster)
        assert name["three"] in {n.name for n in backend.nodes()}
        gates = Gates(tmp_path)
        pool = Pool(held_profile(["held"]), PRICES, settings=SETTINGS, backend=backend)
        try:
            # Two queues in one round: best fit puts them on the two 1-CPU nodes, "one" and "three".
            pool.pause()
            queued = [(gates.item(f"gone{q}-{k}"), f"gone{q}") for q in range(2) for k in range(2)]
            items = [item for item, _ in queued]
            futs = [pool.submit(held_call(item, workflow)) for item, workflow in queued]
            pool.resume()
            pids = gates.wait_started(items)  # every call's batch is running, held
            placed = backend.placements()
            doomed = {wid for wid, p in placed.items() if p.node == name["three"]}
            on_three = [i for i in items if pids[i] in {placed[w].pid for w in doomed}]
            assert on_three, f"no batch runs on node three: {placed}"

            with caplog.at_level(logging.WARNING):
                cluster.remove("three")  # its raylet and the actor in the middle of its batch are gone
                wait_for("the batch on node three lost", lambda: not doomed & set(backend.placements()))
                gates.open(items)
                results = [f.result(CEILING_S) for f in futs]
            assert [r.output for r in results] == [Path(i).name for i in items]  # every call answered, well
            rerun = [r for r in results if r.call_id in {Path(i).name for i in on_three}]
            assert rerun and all(r.worker_id not in doomed for r in rerun)  # ran again on a worker elsewhere
            ok = [c.call_id for c in pool.snapshot().calls if c.ok]
            assert sorted(ok) == sorted(Path(i).name for i in items)  # none lost, none delivered twice
            messages = [r.getMessage() for r in caplog.records]
            assert any(f"Ray node {name['three']} (" in m and "left the cluster" in m for m in messages)
            assert any("lost" in m and "requeued" in m for m in messages)

            # Node three is offered no more, and no worker of the pool is left there.
            wait_for("node three no longer offered", lambda: name["three"] not in {n.name for n in backend.nodes()})
            assert name["three"] not in {p.node for p in backend.placements().values()}
            item = gates.item("after")
            gates.open([item])
            after = pool.submit(held_call(item, "gone0")).result(CEILING_S)
            assert backend.placements()[after.worker_id].node != name["three"]
            assert not any(f"on node {name['three']}:" in w.enforcement for w in pool.snapshot().workers)
        finally:
            pool.close()
    finally:
        if "three" in cluster.nodes:
            cluster.remove("three")


@pytest.mark.service
def test_gpu_share_is_a_fractional_ray_gpu_on_the_gpu_node(cluster: LocalCluster, tmp_path: Path) -> None:
    from esg_prefect.runtime.ray_backend import RayBackend

    # A node with one (logical) GPU whose type Ray reports as a resource, as it does for real ones.
    cluster.add("gpu", num_cpus=1, num_gpus=1, resources={"accelerator_type:T4": 1.0})
    try:
        backend = RayBackend(refresh_s=0.2)
        node = names_by_label(backend, cluster)["gpu"]
        assert [(d.device_id, d.hardware) for d in backend.devices()] == [(f"{node}/gpu0", "T4")]
        gates = Gates(tmp_path)
        item = gates.item("g")
        gates.open([item])

        async def scenario() -> tuple[Any, list[Any]]:
            spec = WorkerSpec("g1", HELD_PATH, node, f"{node}/gpu0", "T4", 1, 0.5)
            worker = await backend.start(spec)
            outcome = await worker.execute([item])
            return worker, outcome.outputs

        worker, outputs = asyncio.run(scenario())
        assert outputs == ["g"]
        assert f"Ray actor on node {node}: num_cpus=0" in worker.enforcement
        assert "num_gpus=0.5" in worker.enforcement and "Ray GPU id(s) 0" in worker.enforcement
        assert cluster.ray.get(worker.actor.node_id.remote(), timeout=CEILING_S) == cluster.node_id("gpu")
        asyncio.run(backend.close())
    finally:
        cluster.remove("gpu")
