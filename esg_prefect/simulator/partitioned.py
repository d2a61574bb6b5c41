"""Partitioned control: a case served by independent controllers, each over its own GPU pool.

One controller decides every waiting queue of a fleet at every round, and its
placement questions read every device of a type; both grow with the fleet. A
platform that outgrows one controller splits it: each *partition* is a
controller (the same :class:`~esg_prefect.control.core.Core` and scheduler)
over a pool of nodes no other partition touches, and a front router sends
each request to one partition. Nothing is shared, so simulating partitions
one after another is the same as running them side by side, each on its own
core. What a partition cannot do is use another pool's idle GPU or warm
worker, or batch with another pool's requests: that is what partitioning costs.

Two ways to split (:func:`plan_partitions`):

``"workflow"``
    Groups of workflows, each with its own pool: workflows go, heaviest first,
    to the lightest group so far (longest processing time first), weighed by
    their share of the demand (requests times the per-item time of their
    stages) plus their share of the stages (queues to decide); a workflow
    heavier than a partition's fair share is cut into slices served by
    different partitions, its requests going to them in turn. Each GPU type's
    nodes are dealt to the groups in proportion to their demand. A partition
    decides only its workflows' queues.
``"pool"``
    Equal pools, each serving every workflow; each workflow's requests go to
    the pools in turn (round robin). Every partition decides every workflow's
    queues at a fraction of the rate, on a fraction of the devices.

:func:`simulate_partitioned` runs each partition with the control core timed
(:func:`~esg_prefect.simulator.timed.simulate_timed`) and keeps its figures;
:func:`~esg_prefect.simulator.timed.merge` adds them up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model.config import Config
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.simulator.case import Case, ClusterSpec
from esg_prefect.simulator.scale import largest_remainder
from esg_prefect.simulator.timed import Clock, PartitionResult, partition_result, simulate_timed

__all__ = [
    "Partition",
    "SplitBy",
    "partition_case",
    "plan_partitions",
    "simulate_partitioned",
    "split_arrivals",
    "workflow_demand",
]

SplitBy = Literal["workflow", "pool"]

_DEMAND_BATCH = 8  # per-item time at this batch (or the largest measured below it) stands for a stage's demand
_VCPUS_PER_GPU = 8.0  # a vCPU-second of a CPU stage weighs 1/8 of a GPU-second (eight-GPU nodes, 64-96 vCPUs)


@dataclass(frozen=True, slots=True)
class Partition:
    """One controller's share of a case.

    Attributes:
        index: 0, 1, ...
        workflows: names of the workflows it serves (all of them when split by pool; a
            workflow cut into slices is served by several partitions).
        nodes: names of the nodes of its pool.
        demand: its share of the case's estimated demand (the shares sum to 1).
    """

    index: int
    workflows: tuple[str, ...]
    nodes: tuple[str, ...]
    demand: float


def workflow_demand(case: Case, counts: dict[str, int]) -> dict[str, float]:
    """Per workflow: its requests times the per-item ms of its stages; a rough measure to size pools by.

    A stage's per-item time is taken at batch 8 (or the largest measured batch
    below it) on the first hardware it is profiled on in the order T4, V100,
    A100, cpu, on a whole GPU or one vCPU; a CPU stage's time weighs 1/8.
    """
    profile = case.load_profile()
    per_item: dict[str, float] = {}
    out = {}
    for wf in case.workflows:
        work = 0.0
        for s in wf.stages:
            if s not in per_item:
                per_item[s] = _per_item_ms(profile, s)
            work += per_item[s]
        out[wf.name] = counts.get(wf.name, 0) * work
    return out


def _per_item_ms(profile: LatencyProfile, stage: str) -> float:
    hws = profile.hardware_types(stage)
    for hw in ("T4", "V100", "A100", "cpu", *sorted(hws)):
        if hw not in hws:
            continue
        cpu = hw == "cpu"
        for batch in range(_DEMAND_BATCH, 0, -1):
            ms = profile.try_latency_ms(stage, Config(batch, 1, 0.0 if cpu else 1.0), hw, "mean")
            if ms is not None:
                return ms / batch / (_VCPUS_PER_GPU if cpu else 1.0)
    return 0.0


def plan_partitions(
    case: Case, k: int, arrivals: Sequence[tuple[float, str]], by: SplitBy = "workflow"
) -> tuple[Partition, ...]:
    """Split ``case`` into ``k`` partitions (module docstring); a function of the case, ``k``, the arrivals and ``by``.

    Nodes are dealt per kind (the set of GPU types a node holds) by largest
    remainder of the partitions' shares, in the cluster's order; a partition
    left without a node takes the last node of the one holding the most.

    Raises:
        ConfigError: when ``k`` is below 1 or above the number of nodes (or of
            workflows, split by workflow), or ``by`` is unknown.
    """
    names = [w.name for w in case.workflows]
    nodes = case.cluster.nodes
    if by not in ("workflow", "pool"):
        raise ConfigError(f"partitions split by 'workflow' or 'pool', got {by!r}")
    top = len(nodes) if by == "pool" else min(len(names), len(nodes))
    if not 1 <= k <= top:
        raise ConfigError(f"partitions must be in 1..{top} for this case split by {by}, got {k}")
    if by == "pool":
        groups = [list(names) for _ in range(k)]
        shares = [1.0 / k] * k
    else:
        groups, shares = _workflow_groups(case, k, arrivals)
    pools: list[list[str]] = [[] for _ in range(k)]
    by_kind: dict[tuple[str, ...], list[str]] = {}
    for n in nodes:
        by_kind.setdefault(tuple(sorted(set(n.gpus))), []).append(n.name)
    for kind_nodes in by_kind.values():
        dealt = iter(kind_nodes)
        for g, c in enumerate(largest_remainder(len(kind_nodes), [max(s, 1e-12) for s in shares])):
            pools[g].extend(next(dealt) for _ in range(c))
    for g in range(k):
        if not pools[g]:
            donor = max(range(k), key=lambda i: (len(pools[i]), -i))
            pools[g].append(pools[donor].pop())
    wf_order = {n: i for i, n in enumerate(names)}
    node_order = {n.name: i for i, n in enumerate(nodes)}
    return tuple(
        Partition(
            g,
            tuple(sorted(groups[g], key=wf_order.__getitem__)),
            tuple(sorted(pools[g], key=node_order.__getitem__)),
            shares[g],
        )
        for g in range(k)
    )


def _workflow_groups(case: Case, k: int, arrivals: Sequence[tuple[float, str]]) -> tuple[list[list[str]], list[float]]:
    """Longest processing time first over the workflows' slices; the groups and their demand shares.

    A workflow's weight is its share of the demand plus its share of the
    stages: a controller's rounds cost about one decision per waiting queue,
    so a group of many light workflows costs as much to decide as one hot one.
    A workflow heavier than a partition's fair share (the total over ``k``) is
    cut into the fewest slices that fit (at most ``k``): each slice carries
    its stages and an equal part of its demand, and goes to a different group.
    """
    names = [w.name for w in case.workflows]
    counts: dict[str, int] = {}
    for _, wf in arrivals:
        counts[wf] = counts.get(wf, 0) + 1
    demand = workflow_demand(case, counts)
    total_demand = sum(demand.values()) or 1.0
    total_stages = sum(len(w.stages) for w in case.workflows)
    fair = 2.0 / k  # the demand shares and the stage shares each sum to 1
    slices: list[tuple[float, int]] = []  # (weight of one slice, workflow index)
    n_slices: dict[str, int] = {}
    for i, w in enumerate(case.workflows):
        share, stages = demand[w.name] / total_demand, len(w.stages) / total_stages
        n = 1
        while n < k and share / n + stages > fair:
            n += 1
        n_slices[w.name] = n
        slices += [(share / n + stages, i)] * n
    groups: list[list[str]] = [[] for _ in range(k)]
    load = [0.0] * k
    for weight, i in sorted(slices, key=lambda s: (-s[0], s[1])):
        free = [j for j in range(k) if names[i] not in groups[j]]
        g = min(free, key=lambda j: (load[j], len(groups[j]), j))
        groups[g].append(names[i])
        load[g] += weight
    need = [sum(demand[n] / n_slices[n] for n in g) for g in groups]
    return groups, [x / total_demand for x in need] if sum(need) > 0 else [1.0 / k] * k


def partition_case(case: Case, part: Partition) -> Case:
    """The case one partition simulates: its workflows on its nodes, the rest of ``case`` unchanged."""
    keep, node_set, w = set(part.workflows), set(part.nodes), case.workload
    weights = None
    if w.weights is not None:
        weights = tuple(x for wf, x in zip(case.workflows, w.weights, strict=True) if wf.name in keep)
    return case.with_(
        name=f"{case.name}/p{part.index}",
        workflows=tuple(wf for wf in case.workflows if wf.name in keep),
        cluster=ClusterSpec(tuple(n for n in case.cluster.nodes if n.name in node_set)),
        workload=replace(w, weights=weights),
    )


def split_arrivals(parts: Sequence[Partition], arrivals: Sequence[tuple[float, str]]) -> list[list[tuple[float, str]]]:
    """Each partition's arrivals, in time order: a workflow's requests go to the partitions serving it in turn.

    Raises:
        InvalidInputError: for an arrival whose workflow no partition serves.
    """
    owners: dict[str, list[int]] = {}
    for p in parts:
        for wf in p.workflows:
            owners.setdefault(wf, []).append(p.index)
    turn: dict[str, int] = {}
    out: list[list[tuple[float, str]]] = [[] for _ in parts]
    for t, wf in arrivals:
        mine = owners.get(wf)
        if mine is None:
            raise InvalidInputError(f"arrival names workflow {wf!r}, which no partition serves")
        n = turn.get(wf, 0)
        turn[wf] = n + 1
        out[mine[n % len(mine)]].append((t, wf))
    return out


def simulate_partitioned(
    case: Case,
    k: int,
    *,
    by: SplitBy = "workflow",
    seed: int | None = None,
    clock: Clock | None = None,
    arrivals: Sequence[tuple[float, str]] | None = None,
    progress: Callable[[PartitionResult], None] | None = None,
) -> list[PartitionResult]:
    """Simulate ``case`` as ``k`` independent partitions, one after another; each one's figures.

    Each partition's run is reduced to its figures before the next starts, so
    memory holds one partition's records at a time. Every partition runs with
    the same ``seed`` (its service times). ``progress`` is called with each
    partition's figures as it ends.

    Raises:
        ConfigError: for a bad ``k`` or ``by`` (:func:`plan_partitions`).
    """
    seed = case.seed if seed is None else seed
    reqs = list(case.arrivals(seed) if arrivals is None else arrivals)
    parts = plan_partitions(case, k, reqs, by)
    out = []
    for part, mine in zip(parts, split_arrivals(parts, reqs), strict=True):
        sub = partition_case(case, part)
        run, times = simulate_timed(sub, mine, seed, clock)
        result = partition_result(part.index, sub, run, times)
        del run  # the records go before the next partition runs
        out.append(result)
        if progress is not None:
            progress(result)
    return out
