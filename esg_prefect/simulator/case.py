"""One experiment description ("case"), for the simulator and the live runtime alike.

A :class:`Case` names everything a run depends on: the workflows with their
SLOs, the latency profile, the prices, the cluster, the workload (a trace, a
rate, a duration), the scheduler and its settings, and the seed. The simulator
runs it with :func:`esg_prefect.simulator.run_case`; the live runtime can run
the very same object (its arrivals come from :meth:`Case.arrivals`, its
deadlines from the scheduler's tables, its report from the shared
:func:`~esg_prefect.model.report.summarize`). Only :class:`SimSpec` is read by
the simulator alone: it says how the simulated platform behaves where the
live one simply does (service-time noise, interference, network, draining).

Cases round-trip through plain dicts (:meth:`Case.to_dict`,
:meth:`Case.from_dict`) so a CLI or a runner can load them from JSON; a case
whose profile is an in-memory object (tests) cannot be written out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from dataclasses import fields as fields_of
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model.cluster import ClusterSnapshot, Device, Node
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.profile_source import profile_path, read_profile
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator.case_json import (
    NODE_KEYS,
    WORKFLOW_KEYS,
    check_parts,
    check_seed,
    check_weights,
    known_keys,
    shaped,
)
from esg_prefect.workload.arrivals import Arrival, arrivals
from esg_prefect.workload.sizes import check_size_source, request_sizes

ServiceTime = Literal["sampled", "mean", "p95"]


def _positive(owner: str, name: str, value: float, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{owner}: {name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A machine: its vCPUs, its GPUs (one entry per device, by type) and its worker slots.

    Args:
        name: node name.
        vcpus: vCPUs busy workers may use at once.
        gpus: GPU type of each device.
        max_clients: MPS clients per GPU.
        max_workers: worker processes the node holds, busy or idle (None: no limit).

    Examples:
        >>> NodeSpec("n0", 16, ("T4", "T4")).gpus
        ('T4', 'T4')
    """

    name: str
    vcpus: int
    gpus: tuple[str, ...] = ()
    max_clients: int = 48
    max_workers: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        Node(self.name, self.vcpus, self.max_workers)  # validates name, vcpus and max_workers
        if self.max_clients < 1:
            raise ConfigError(f"node {self.name}: max_clients must be >= 1, got {self.max_clients}")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The cluster's nodes; device ``j`` of node ``n`` is called ``"n/gpu<j>"``."""

    nodes: tuple[NodeSpec, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise ConfigError("a cluster needs at least one node")
        self.snapshot()  # validates names

    def snapshot(self) -> ClusterSnapshot:
        """The empty cluster (no workers yet)."""
        nodes = [Node(n.name, n.vcpus, n.max_workers) for n in self.nodes]
        devices = [
            Device(f"{n.name}/gpu{j}", n.name, hw, n.max_clients) for n in self.nodes for j, hw in enumerate(n.gpus)
        ]
        return ClusterSnapshot(nodes, devices)

    def gpu_counts(self) -> dict[str, int]:
        """How many GPUs of each type."""
        out: dict[str, int] = {}
        for n in self.nodes:
            for hw in n.gpus:
                out[hw] = out.get(hw, 0) + 1
        return out


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Where requests come from (see :func:`esg_prefect.workload.arrivals`), and how large each is.

    ``sizes`` names the source of relative request sizes
    (:func:`esg_prefect.workload.sizes.request_sizes`; ``"none"``: all typical).
    """

    trace: str
    rate_per_s: float
    start_s: float | None = None
    minute_s: float = 60.0
    weights: tuple[float, ...] | None = None
    sizes: str = "none"

    def __post_init__(self) -> None:
        _positive("workload", "rate_per_s", self.rate_per_s)
        _positive("workload", "minute_s", self.minute_s)
        if self.start_s is not None:  # checked here, before a note or a run reads the trace from it
            _positive("workload", "start_s", self.start_s, allow_zero=True)
        try:
            check_size_source(self.sizes)
        except InvalidInputError as exc:
            raise ConfigError(f"workload: {exc}") from exc
        if self.weights is not None:
            ok = isinstance(self.weights, (list, tuple)) and all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
                for w in self.weights
            )
            if not ok:
                raise ConfigError(
                    f"workload: weights must be a list of finite numbers >= 0, one per workflow in the case's order, "
                    f"got {self.weights!r:.80}"
                )
            object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))


@dataclass(frozen=True, slots=True)
class SimSpec:
    """How the simulated platform behaves (the live runtime ignores this).

    Attributes:
        service_time: ``"sampled"`` draws each batch's latency from a
            log-normal with the profile's mean and p95 (the mean alone where
            no p95 is published); ``"mean"`` / ``"p95"`` use that statistic.
        interference_per_corunner: slowdown of a batch per other busy worker on
            the same GPU when it starts (0.05: 5 % each). Not in the profile,
            so schedulers do not see it (an assumption; see docs/results.md).
        network_latency_ms: added once when a batch fetches inputs from other nodes.
        network_gbps: bandwidth between nodes.
        payload_kb: size of one job's input when it comes from another node.
        drain_s: after the last arrival, how long requests may still finish;
            those still unfinished then count as failed.
        round_interval_ms: least time between two scheduling rounds; events
            closer than that to the previous round wait for the next one (a
            controller needs time to decide; ESG's rounds take milliseconds).
        corun: a co-run table for the slowdown of batches beside busy workers
            on a GPU, instead of ``interference_per_corunner``: ``"default"``
            (the shipped table and the documented GPU model of
            :mod:`esg_prefect.model.interference`) or a CSV path; None (the
            default) keeps the linear model. The simulator also uses it when
            the scheduler's ``hybrid_sharing`` knob is on, so that the
            scheduler and the simulated platform agree on the physics.
        run_overhead_ms: the orchestrator's time from a request's arrival to
            its first stage calls (Prefect creating and starting the flow run;
            0, the default, has the calls reach the pool as the request arrives).
        call_overhead_ms: its time from a stage call becoming ready (its
            upstream calls finished) to its reaching the pool (Prefect's task
            run). The SLO clock starts at the arrival either way, as the live
            pool's does; docs/simulator.md says how to measure both.
    """

    service_time: ServiceTime = "sampled"
    interference_per_corunner: float = 0.05
    network_latency_ms: float = 0.5
    network_gbps: float = 10.0
    payload_kb: float = 150.0
    drain_s: float = 60.0
    round_interval_ms: float = 1.0
    corun: str | None = None
    run_overhead_ms: float = 0.0
    call_overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.service_time not in ("sampled", "mean", "p95"):
            raise ConfigError(f"service_time must be 'sampled', 'mean' or 'p95', got {self.service_time!r}")
        _positive("sim", "interference_per_corunner", self.interference_per_corunner, allow_zero=True)
        _positive("sim", "network_latency_ms", self.network_latency_ms, allow_zero=True)
        _positive("sim", "network_gbps", self.network_gbps)
        _positive("sim", "payload_kb", self.payload_kb, allow_zero=True)
        _positive("sim", "drain_s", self.drain_s, allow_zero=True)
        _positive("sim", "round_interval_ms", self.round_interval_ms, allow_zero=True)
        _positive("sim", "run_overhead_ms", self.run_overhead_ms, allow_zero=True)
        _positive("sim", "call_overhead_ms", self.call_overhead_ms, allow_zero=True)
        if self.corun is not None and (not isinstance(self.corun, str) or not self.corun):
            raise ConfigError(f"sim: corun must be None, 'default' or a CSV path, got {self.corun!r}")


@lru_cache(maxsize=16)
def _load_profile(path: str) -> LatencyProfile:
    return read_profile(Path(path))  # as pool serve loads it: the same size model


def resolve_profile(profile: str | LatencyProfile) -> LatencyProfile:
    """A profile object from a shipped profile's name (``"nvidia_gpu"``), a CSV path, or the object itself.

    A shipped name wins over a file of that name, and a file loads as ``pool
    serve`` loads it, size model included (one rule and one loader for every
    command: :mod:`esg_prefect.model.profile_source`); loaded once per process per file.

    Raises:
        ConfigError: naming the value and the shipped names when it is neither a shipped name nor a file.
    """
    if isinstance(profile, LatencyProfile):
        return profile
    return _load_profile(str(profile_path(profile).resolve()))


@dataclass(frozen=True, slots=True)
class Case:
    """An experiment: what runs, on what, under which load, scheduled by whom.

    Args:
        name: a label for reports.
        workflows: the workflows (names unique), each with its SLO.
        profile: a shipped profile's name, a CSV path (a name wins), or a LatencyProfile.
        prices: the price sheet.
        cluster: nodes and GPUs.
        workload: trace and rate.
        duration_s: length of the arrival window.
        scheduler: a registered scheduler name.
        settings: ESG's knobs (baselines read the ones they share with ESG).
        seed: default seed of :func:`~esg_prefect.simulator.run_case`.
        sim: simulated-platform behaviour.
        warmup_s: requests arriving earlier, and what was billed earlier, are
            left out of the report (:func:`~esg_prefect.model.window.after_warmup`):
            a run starts with no warm worker, a platform in service does not.

    Raises:
        ConfigError: on duplicate workflow names, a seed that is not an integer >= 0, or a bad duration.
    """

    name: str
    workflows: tuple[Workflow, ...]
    profile: str | LatencyProfile
    prices: PriceSheet
    cluster: ClusterSpec
    workload: WorkloadSpec
    duration_s: float
    scheduler: str = "esg"
    settings: ESGSettings = field(default_factory=ESGSettings)
    seed: int = 0
    sim: SimSpec = field(default_factory=SimSpec)
    warmup_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "workflows", tuple(self.workflows))
        names = [w.name for w in self.workflows]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"a case needs workflows with unique names, got {names}")
        check_seed(self.seed)  # here, so a case built in Python, by with_ or from JSON is checked alike
        _positive(f"case {self.name!r}", "duration_s", self.duration_s)
        _positive(f"case {self.name!r}", "warmup_s", self.warmup_s, allow_zero=True)
        if self.warmup_s >= self.duration_s:
            raise ConfigError(
                f"case {self.name!r}: warmup_s {self.warmup_s} must be below duration_s {self.duration_s}"
            )

    def with_(self, **changes: Any) -> Case:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

    def workflow_map(self) -> dict[str, Workflow]:
        """Workflows by name."""
        return {w.name: w for w in self.workflows}

    def load_profile(self) -> LatencyProfile:
        """The latency profile (loaded once per process per file)."""
        return resolve_profile(self.profile)

    def unused_gpu_types(self) -> list[str]:
        """The cluster's GPU types on which no stage of the case's workflows has a latency profile.

        No scheduler places work on them, so their GPUs sit unused: most often a
        type's name spelled otherwise than in the profile (``"a100"``, ``"A100-80G"``).
        """
        return sorted(set(self.cluster.gpu_counts()) - set(self.profiled_hardware()))

    def profiled_hardware(self) -> list[str]:
        """The hardware types on which some stage of the case's workflows has a latency profile."""
        profile = self.load_profile()
        return sorted({hw for wf in self.workflows for s in wf.stages for hw in profile.hardware_types(s)})

    def request_sizes(self, count: int, seed: int | None = None) -> list[float]:
        """Relative sizes of the case's first ``count`` requests (1.0: typical), seeded."""
        return request_sizes(self.workload.sizes, count, self.seed if seed is None else seed)

    def arrivals(self, seed: int | None = None) -> list[Arrival]:
        """The requests of this case: ``(arrival_ms, workflow)`` in time order."""
        w = self.workload
        return arrivals(
            w.trace,
            [wf.name for wf in self.workflows],
            w.rate_per_s,
            self.duration_s,
            self.seed if seed is None else seed,
            start_s=w.start_s,
            minute_s=w.minute_s,
            weights=w.weights,
        )

    # ---- plain dicts ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON.

        Raises:
            ConfigError: when the profile is an in-memory object.
        """
        if not isinstance(self.profile, str):
            raise ConfigError(f"case {self.name!r}: an in-memory profile cannot be written out; use a CSV path")
        w = self.workload
        return {
            "name": self.name,
            "workflows": [
                {"name": wf.name, "stages": list(wf.stages), "edges": [list(e) for e in wf.edges], "slo_ms": wf.slo_ms}
                for wf in self.workflows
            ],
            "profile": self.profile,
            "prices": {
                "price_per_vcpu_s": self.prices.price_per_vcpu_s,
                "price_per_gpu_s": dict(self.prices.price_per_gpu_s),
            },
            "cluster": [
                {
                    "name": n.name,
                    "vcpus": n.vcpus,
                    "gpus": list(n.gpus),
                    "max_clients": n.max_clients,
                    "max_workers": n.max_workers,
                }
                for n in self.cluster.nodes
            ],
            "workload": {
                "trace": w.trace,
                "rate_per_s": w.rate_per_s,
                "start_s": w.start_s,
                "minute_s": w.minute_s,
                "weights": None if w.weights is None else list(w.weights),
                "sizes": w.sizes,
            },
            "duration_s": self.duration_s,
            "scheduler": self.scheduler,
            "settings": self.settings.to_dict(),
            "seed": self.seed,
            "warmup_s": self.warmup_s,
            "sim": {
                "service_time": self.sim.service_time,
                "interference_per_corunner": self.sim.interference_per_corunner,
                "network_latency_ms": self.sim.network_latency_ms,
                "network_gbps": self.sim.network_gbps,
                "payload_kb": self.sim.payload_kb,
                "drain_s": self.sim.drain_s,
                "round_interval_ms": self.sim.round_interval_ms,
                "corun": self.sim.corun,
                "run_overhead_ms": self.sim.run_overhead_ms,
                "call_overhead_ms": self.sim.call_overhead_ms,
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: naming a missing or unknown key, or weights that do not fit the workflows.
        """
        known = {
            "name",
            "workflows",
            "profile",
            "prices",
            "cluster",
            "workload",
            "duration_s",
            "scheduler",
            "settings",
            "seed",
            "sim",
            "warmup_s",
        }
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown case keys {sorted(unknown)}; known: {sorted(known)}")
        for key, shape in (("workflows", list), ("cluster", list), ("prices", dict), ("workload", dict)):
            shaped(key, data.get(key, shape()), shape)
        for key, fields in (("workflows", WORKFLOW_KEYS), ("cluster", NODE_KEYS)):
            for i, item in enumerate(data.get(key, ())):
                shaped(f"{key}[{i}]", item, dict)
                known_keys(f"{key}[{i}]", item, fields)
        for key in ("settings", "sim"):
            shaped(key, data.get(key, {}), dict)
        known_keys("workload", data.get("workload", {}), (f.name for f in fields_of(WorkloadSpec)))
        known_keys("sim", data.get("sim", {}), (f.name for f in fields_of(SimSpec)))
        check_parts(data)
        seed = data.get("seed", 0)
        check_seed(seed)  # with the JSON's other shapes, before a missing key is named
        try:
            wl = dict(data["workload"])
            if wl.get("weights") is not None:
                wl["weights"] = tuple(wl["weights"])
            case = cls(
                name=data["name"],
                workflows=tuple(
                    Workflow(w["name"], w["stages"], [tuple(e) for e in w["edges"]], w["slo_ms"])
                    for w in data["workflows"]
                ),
                profile=data["profile"],
                prices=PriceSheet(data["prices"]["price_per_vcpu_s"], data["prices"]["price_per_gpu_s"]),
                cluster=ClusterSpec(
                    tuple(
                        NodeSpec(
                            n["name"], n["vcpus"], tuple(n["gpus"]), n.get("max_clients", 48), n.get("max_workers")
                        )
                        for n in data["cluster"]
                    )
                ),
                workload=WorkloadSpec(**wl),
                duration_s=data["duration_s"],
                scheduler=data.get("scheduler", "esg"),
                settings=ESGSettings.from_dict(dict(data.get("settings", {}))),
                seed=seed,
                sim=SimSpec(**data.get("sim", {})),
                warmup_s=data.get("warmup_s", 0.0),
            )
        except KeyError as exc:
            raise ConfigError(f"case is missing the key {exc.args[0]!r}") from None
        # Here, not in WorkloadSpec or Case: a partition's sub-case keeps the weights of its own workflows only.
        check_weights(case.workload.weights, [w.name for w in case.workflows])
        return case
