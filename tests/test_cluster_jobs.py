"""Configurations, jobs and batches, and cluster snapshots: validation and small behaviours."""

from __future__ import annotations

import re
from typing import Any

import pytest

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model.cluster import ClusterSnapshot, Device, Node, Worker, cpu_cluster, gpu_cluster
from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.model.jobs import Batch, Job, QueueKey

Q = QueueKey("wf", "det")


def job(**over: Any) -> Job:
    """A valid job j1 of queue Q; keyword arguments override single fields."""
    fields: dict[str, Any] = {
        "job_id": "j1",
        "request_id": "r1",
        "run_id": "run1",
        "queue": Q,
        "arrival_ms": 0.0,
        "ready_ms": 5.0,
        "deadline_ms": 50.0,
        "e2e_deadline_ms": 100.0,
    }
    fields.update(over)
    return Job(**fields)


def gpu_worker(wid: str, share: float, vcpus: int = 1, node: str = "n0", device: str = "n0/g0") -> Worker:
    return Worker(wid, node, device, "T4", vcpus, share, "wf/det")


def cpu_worker(wid: str, vcpus: int, node: str = "n0") -> Worker:
    return Worker(wid, node, None, "cpu", vcpus, 0.0, "wf/det")


def busy_cpu_worker(wid: str, vcpus: int, node: str = "n0") -> Worker:
    return Worker(wid, node, None, "cpu", vcpus, 0.0, "wf/det", busy=True)


# ---- Config and ConfigSpace ---------------------------------------------------


def test_default_space_has_198_configs_in_documented_order() -> None:
    space = ConfigSpace()
    configs = list(space)
    assert len(space) == len(configs) == 198  # 6 batches * 3 vcpus * 11 shares
    assert len(set(configs)) == 198
    assert configs[0] == Config(1, 1, 0.0)
    assert configs[1] == Config(2, 1, 0.0)  # batch varies fastest
    assert configs[-1] == Config(32, 4, 1.0)
    assert space.max_batch == 32


def test_share_is_normalised_so_sums_name_the_same_config() -> None:
    assert 0.1 + 0.2 != 0.3
    assert Config(1, 1, 0.1 + 0.2) == Config(1, 1, 0.3)
    assert hash(Config(1, 1, 0.1 + 0.2)) == hash(Config(1, 1, 0.3))
    assert Config(1, 1, 0.1 + 0.2).gpu_share == 0.3


def test_config_small_behaviours() -> None:
    assert Config(2, 1).gpu_share == 0.0
    assert not Config(2, 1).uses_gpu
    assert Config(2, 1, 0.01).uses_gpu
    assert Config(2, 1, 0.5).with_batch(8) == Config(8, 1, 0.5)
    assert sorted([Config(2, 1), Config(1, 4), Config(1, 1, 0.5)]) == [Config(1, 1, 0.5), Config(1, 4), Config(2, 1)]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 1, 0.0), "batch must be an int >= 1, got 0"),
        ((True, 1, 0.0), "batch must be an int >= 1, got True"),
        ((2.0, 1, 0.0), "batch must be an int >= 1, got 2.0"),
        ((1, 0, 0.0), "vcpus must be an int >= 1, got 0"),
        ((1, False, 0.0), "vcpus must be an int >= 1, got False"),
        ((1, 1, 1.5), re.escape("gpu_share must be in [0, 1], got 1.5")),
        ((1, 1, -0.1), re.escape("gpu_share must be in [0, 1], got -0.1")),
        ((1, 1, float("nan")), re.escape("gpu_share must be in [0, 1], got nan")),
        ((1, 1, True), "gpu_share must be a number, got True"),
        ((1, 1, "0.5"), "gpu_share must be a number, got '0.5'"),
    ],
)
def test_bad_config_is_named(args: tuple[Any, Any, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Config(*args)


def test_config_space_sorts_deduplicates_and_normalises() -> None:
    space = ConfigSpace(batches=(4, 1, 4), vcpus=(2,), gpu_shares=(0.3, 0.1 + 0.2, 0.0))
    assert (space.batches, space.vcpus, space.gpu_shares) == ((1, 4), (2,), (0.0, 0.3))
    assert list(space) == [Config(1, 2), Config(4, 2), Config(1, 2, 0.3), Config(4, 2, 0.3)]
    assert len(space) == 4
    assert space.max_batch == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batches": ()}, "batches must not be empty"),
        ({"vcpus": ()}, "vcpus must not be empty"),
        ({"gpu_shares": ()}, "gpu_shares must not be empty"),
        ({"batches": (1, 0)}, "batches must hold ints >= 1, got 0"),
        ({"vcpus": (1, 2.5)}, "vcpus must hold ints >= 1, got 2.5"),
        ({"gpu_shares": (0.5, 2.0)}, re.escape("gpu_share must be in [0, 1], got 2.0")),
    ],
)
def test_bad_config_space_is_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ConfigSpace(**kwargs)


# ---- QueueKey, Job, Batch -----------------------------------------------------


def test_queue_key_str_and_order() -> None:
    assert str(Q) == "wf/det"
    assert sorted([QueueKey("b", "a"), QueueKey("a", "z")]) == [QueueKey("a", "z"), QueueKey("b", "a")]


@pytest.mark.parametrize(("wf", "stage"), [("", "det"), ("wf", "")])
def test_queue_key_needs_both_names(wf: str, stage: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(f"got ({wf!r}, {stage!r})")):
        QueueKey(wf, stage)


@pytest.mark.parametrize("field", ["job_id", "request_id", "run_id"])
def test_job_needs_ids(field: str) -> None:
    with pytest.raises(InvalidInputError, match=r"must be non-empty, got .*''"):
        job(**{field: ""})


@pytest.mark.parametrize("field", ["arrival_ms", "ready_ms", "deadline_ms", "e2e_deadline_ms"])
@pytest.mark.parametrize(("value", "shown"), [(float("nan"), "nan"), (float("inf"), "inf"), (True, "True")])
def test_job_times_must_be_finite_numbers(field: str, value: object, shown: str) -> None:
    with pytest.raises(InvalidInputError, match=f"{field} must be a finite number, got {shown}"):
        job(**{field: value})


def test_job_cannot_be_ready_before_arrival() -> None:
    with pytest.raises(InvalidInputError, match=re.escape("job j1: ready_ms 4.0 is before arrival_ms 5.0")):
        job(arrival_ms=5.0, ready_ms=4.0)


@pytest.mark.parametrize(("size", "match"), [(0.0, "input_size must be > 0, got 0.0"), (-1, "got -1")])
def test_job_input_size_must_be_positive(size: float, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        job(input_size=size)


def test_batch_of_matching_jobs() -> None:
    b = Batch("b1", Q, (job(job_id="j1"), job(job_id="j2")), Config(2, 1, 0.5), "T4")
    assert [j.job_id for j in b.jobs] == ["j1", "j2"]


def test_batch_needs_jobs() -> None:
    with pytest.raises(InvalidInputError, match="batch b1 has no jobs"):
        Batch("b1", Q, (), Config(1, 1), "cpu")


def test_batch_size_must_match_config() -> None:
    with pytest.raises(InvalidInputError, match=re.escape("batch b1: 1 jobs but config.batch=4")):
        Batch("b1", Q, (job(),), Config(4, 1), "cpu")


def test_batch_jobs_must_come_from_its_queue() -> None:
    other = QueueKey("wf", "cls")
    with pytest.raises(InvalidInputError, match="batch b1 for wf/det holds job j2 of wf/cls"):
        Batch("b1", Q, (job(job_id="j1"), job(job_id="j2", queue=other)), Config(2, 1), "cpu")


# ---- Node, Device, Worker -----------------------------------------------------


@pytest.mark.parametrize(("name", "vcpus", "match"), [("", 4, "got ''"), ("n0", 0, "got 0"), ("n0", True, "got True")])
def test_bad_node_is_named(name: str, vcpus: int, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        Node(name, vcpus)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", "n0", "T4"), re.escape("got ('', 'n0')")),
        (("d0", "n0", "cpu"), "device d0: hardware must be a GPU type, got 'cpu'"),
        (("d0", "n0", "T4", 0), "device d0: max_clients must be >= 1, got 0"),
    ],
)
def test_bad_device_is_named(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        Device(*args)


@pytest.mark.parametrize(
    ("device", "hardware", "share"),
    [(None, "cpu", 0.5), ("d0", "T4", 0.0), (None, "T4", 0.0), ("d0", "cpu", 0.5)],
)
def test_worker_device_hardware_and_share_must_agree(device: str | None, hardware: str, share: float) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(f"device_id={device!r}, hardware={hardware!r}")):
        Worker("w1", "n0", device, hardware, 1, share, None)


def test_worker_needs_vcpus() -> None:
    with pytest.raises(InvalidInputError, match="worker w1: vcpus must be an int >= 1, got 0"):
        Worker("w1", "n0", None, "cpu", 0, 0.0, None)


def test_worker_serves_only_its_stage_and_resources() -> None:
    w = Worker("w1", "n0", "n0/g0", "T4", 2, 0.1 + 0.2, "wf/det")
    assert w.gpu_share == 0.3
    assert w.serves("wf/det", Config(8, 2, 0.3), "T4")
    assert not w.serves("wf/cls", Config(8, 2, 0.3), "T4")
    assert not w.serves("wf/det", Config(8, 1, 0.3), "T4")
    assert not w.serves("wf/det", Config(8, 2, 0.4), "T4")
    assert not w.serves("wf/det", Config(8, 2, 0.3), "A100")


# ---- ClusterSnapshot ----------------------------------------------------------


def snapshot(*workers: Worker) -> ClusterSnapshot:
    """Nodes n0 (8 vcpus, GPU n0/g0) and n1 (4 vcpus, GPU n1/g0)."""
    nodes = [Node("n0", 8), Node("n1", 4)]
    devices = [Device("n0/g0", "n0", "T4"), Device("n1/g0", "n1", "T4")]
    return ClusterSnapshot(nodes, devices, workers)


def test_full_but_not_over_subscribed_snapshot_is_valid() -> None:
    # n0: 1 + 3 + 4 = 8 vcpus of 8; n0/g0: 0.3 + 0.3 + 0.4 = 1.0 share of 1.0
    ws = [gpu_worker("a", 0.3), gpu_worker("b", 0.3, 3), gpu_worker("c", 0.4, 4)]
    snap = snapshot(*ws)
    assert snap.workers == tuple(ws)
    assert snap.node("n1") == Node("n1", 4)
    assert snap.hardware_types() == frozenset({"cpu", "T4"})


@pytest.mark.parametrize(
    ("nodes", "devices", "match"),
    [
        ([Node("n0", 2), Node("n0", 4)], [], re.escape("duplicate node names in ['n0', 'n0']")),
        ([Node("n0", 2)], [Device("g", "n0", "T4"), Device("g", "n0", "T4")], "duplicate device ids in"),
        ([Node("n0", 2)], [Device("g", "n9", "T4")], "device g is on unknown node 'n9'"),
    ],
)
def test_bad_nodes_or_devices_are_named(nodes: list[Node], devices: list[Device], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        ClusterSnapshot(nodes, devices)


@pytest.mark.parametrize(
    ("workers", "match"),
    [
        ([cpu_worker("a", 1), cpu_worker("a", 1)], "duplicate worker id 'a'"),
        ([cpu_worker("a", 1, node="n9")], "worker a is on unknown node 'n9'"),
        ([gpu_worker("a", 0.5, device="n0/g7")], "worker a names device 'n0/g7'"),
        ([gpu_worker("a", 0.5, device="n1/g0")], "worker a names device 'n1/g0' .* not on node 'n0'"),
        ([Worker("a", "n0", "n0/g0", "A100", 1, 0.5, None)], re.escape("names device 'n0/g0' (A100)")),
        ([busy_cpu_worker("a", 5), busy_cpu_worker("b", 4)], "node n0: busy workers hold 9 vcpus of 8"),
        ([gpu_worker("a", 0.6), gpu_worker("b", 0.5)], "device n0/g0: workers hold share 1.10 > 1.0"),
    ],
)
def test_bad_workers_are_named(workers: list[Worker], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        snapshot(*workers)


def test_unknown_node_lookup_is_named() -> None:
    with pytest.raises(InvalidInputError, match="unknown node 'n5'"):
        snapshot().node("n5")


def test_cpu_cluster() -> None:
    snap = cpu_cluster()
    assert snap == ClusterSnapshot([Node("node0", 2)])
    assert cpu_cluster(3, 4).nodes == (Node("node0", 4), Node("node1", 4), Node("node2", 4))
    assert snap.hardware_types() == frozenset({"cpu"})
    with pytest.raises(InvalidInputError, match="nodes must be >= 1, got 0"):
        cpu_cluster(0)


def test_gpu_cluster() -> None:
    snap = gpu_cluster(2, 2, "A100")
    assert snap.nodes == (Node("node0", 32), Node("node1", 32))
    assert [d.device_id for d in snap.devices] == ["node0/gpu0", "node0/gpu1", "node1/gpu0", "node1/gpu1"]
    assert {(d.node, d.hardware) for d in snap.devices} == {("node0", "A100"), ("node1", "A100")}
    assert snap.workers == ()
    assert gpu_cluster(1, 0, "T4").devices == ()
    with pytest.raises(InvalidInputError, match="got 1, -1"):
        gpu_cluster(1, -1, "T4")
    with pytest.raises(InvalidInputError, match="hardware must be a GPU type, got 'cpu'"):
        gpu_cluster(1, 1, "cpu")
