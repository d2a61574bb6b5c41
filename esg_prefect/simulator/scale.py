"""The scale case (issue #25): a platform team's fleet, many pipelines on a thousand GPUs.

What it is, and why each choice:

* **Stages**: the six DNN models of NVIDIA's published tables
  (``data/profiles/nvidia_gpu.csv``, on T4, V100 and A100) and the twelve CPU
  stages of the example pipelines measured by this project
  (``data/profiles/examples_cpu.csv``), in one profile
  (:func:`scale_profile`). GPU models have no CPU rows and CPU stages no GPU
  rows, as in the heterogeneous case.
* **Workflows** (:func:`scale_workflows`): drawn with a seeded random source.
  Each has 2-8 stages, at least one of them a GPU model; half are chains,
  half DAGs (every stage after the first takes its input from one or two
  earlier stages, and the stages nobody reads feed the last one, so a DAG has
  one entry and one exit, forks and joins). SLOs as the other cases set them:
  ``tightness`` times the batch-1 critical path (GPU stages on a whole T4,
  CPU stages on one vCPU, p95), rounded up to 10 ms.
* **Cluster** (:func:`scale_cluster`): GPUs of the price sheet's types that the
  shipped profile covers (T4, V100, A100; the sheet's A10, H100 and H200 have
  no published rows here, so no stage could run on them) in the standard
  cluster's proportions 4:1:1, on the eight-GPU machines of a public cloud
  (g4dn.metal, p3.16xlarge, p4d.24xlarge: 96, 64 and 96 vCPUs). The CPU
  stages run on those machines' vCPUs.
* **Workload**: the Azure Functions 2019 sample, workflow ``i`` playing the
  ``i``-th most-invoked http function. The whole sample is scaled by one
  factor, so each workflow keeps its function's share of the invocations
  (a skewed mix, as a fleet serves); equal shares would turn a rare
  function's few busy minutes into bursts of tens of thousands per second.
  The run starts at the sample's first minute and plays each trace minute in
  ``minute_s`` seconds (0.25 s: the 120 s case plays the whole 8-hour sample,
  so that every function's invocations, rare ones included, fall in it); the
  nominal rate is set so that the window played holds ``rate_per_s`` on
  average (:func:`window_rate_factor`; 1 for the whole sample).
* Prices :meth:`PriceSheet.default`; ESG's defaults with one vCPU per worker
  (the standard settings); the simulated platform's defaults.
"""

from __future__ import annotations

import itertools
import math
import random
from functools import lru_cache

from esg_prefect.exceptions import ConfigError
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.slo import critical_path
from esg_prefect.model.workflow import Workflow
from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, WorkloadSpec, resolve_profile
from esg_prefect.simulator.standard import STANDARD_TIGHTNESS, STANDARD_TRACE, standard_settings
from esg_prefect.workload import traces

__all__ = [
    "SCALE_DURATION_S",
    "SCALE_GPUS",
    "SCALE_GPU_MIX",
    "SCALE_RATE_PER_S",
    "SCALE_WORKFLOWS",
    "largest_remainder",
    "scale_case",
    "scale_cluster",
    "scale_profile",
    "scale_workflows",
    "window_rate_factor",
]

SCALE_GPUS = 1000
SCALE_WORKFLOWS = 100
SCALE_RATE_PER_S = 10_000.0
SCALE_DURATION_S = 120.0
SCALE_WARMUP_S = 20.0
SCALE_MINUTE_S = 0.25
"""Simulated seconds per trace minute: a 120 s run plays the sample's 480 minutes (08:00-16:00) once."""
SCALE_GPU_MIX: tuple[tuple[str, int, int], ...] = (("T4", 4, 96), ("V100", 1, 64), ("A100", 1, 96))
"""GPU types, their relative counts (the standard cluster's 8 T4 : 2 V100 : 2 A100) and the vCPUs of
their eight-GPU node (AWS g4dn.metal, p3.16xlarge, p4d.24xlarge)."""
GPUS_PER_NODE = 8
MIN_STAGES, MAX_STAGES = 2, 8


@lru_cache(maxsize=1)
def scale_profile() -> LatencyProfile:
    """NVIDIA's GPU rows of the six models and the measured CPU rows of the example stages, with cold starts."""
    gpu = resolve_profile("nvidia_gpu")
    cpu = resolve_profile("examples_cpu")
    points = [*gpu.points, *(p for p in cpu.points if p.hardware == "cpu")]
    cold = {
        (p.stage, p.hardware): (cpu if p.hardware == "cpu" else gpu).cold_start_ms(p.stage, p.hardware) for p in points
    }
    return LatencyProfile(points, cold)


def _stage_pools(profile: LatencyProfile) -> tuple[list[str], list[str]]:
    """GPU stages and CPU stages of the profile, sorted (a seeded draw must not depend on set order)."""
    gpu = sorted(s for s in profile.stages() if "cpu" not in profile.hardware_types(s))
    cpu = sorted(s for s in profile.stages() if profile.hardware_types(s) == {"cpu"})
    return gpu, cpu


def _reference_ms(profile: LatencyProfile, wf: Workflow) -> float:
    """Batch-1 critical path: GPU stages on a whole T4, CPU stages on one vCPU (p95)."""
    lat = {}
    for s in wf.stages:
        cpu = "cpu" in profile.hardware_types(s)
        lat[s] = profile.latency_ms(s, Config(1, 1, 0.0 if cpu else 1.0), "cpu" if cpu else "T4")
    return sum(lat[s] for s in critical_path(wf, wf.topological_order(), lat))


def _dag_edges(stages: list[str], rng: random.Random) -> list[tuple[str, str]]:
    """One or two earlier inputs per stage; stages nobody reads feed the last stage (one entry, one exit)."""
    edges: set[tuple[str, str]] = set()
    for j in range(1, len(stages)):
        for i in rng.sample(range(j), min(j, rng.choice((1, 2)))):
            edges.add((stages[i], stages[j]))
    last = stages[-1]
    for s in stages[:-1]:
        if not any(u == s for u, _ in edges):
            edges.add((s, last))
    return sorted(edges)


def scale_workflows(
    count: int = SCALE_WORKFLOWS, seed: int = 0, tightness: float = STANDARD_TIGHTNESS
) -> tuple[Workflow, ...]:
    """``count`` workflows drawn from the profile's stages (module docstring), names ``wf000``, ``wf001``...

    Raises:
        ConfigError: when ``count`` is not positive.
    """
    if count < 1:
        raise ConfigError(f"scale case: workflows must be >= 1, got {count}")
    profile = scale_profile()
    gpu, cpu = _stage_pools(profile)
    rng = random.Random(f"scale-workflows:{seed}")
    out = []
    for k in range(count):
        n = rng.randint(MIN_STAGES, MAX_STAGES)
        n_gpu = rng.randint(1, min(n, len(gpu)))
        stages = rng.sample(gpu, n_gpu) + rng.sample(cpu, n - n_gpu)
        rng.shuffle(stages)
        dag = n >= 3 and rng.random() < 0.5
        edges = _dag_edges(stages, rng) if dag else list(itertools.pairwise(stages))
        name = f"wf{k:03d}"
        shape = Workflow(name, stages, edges, slo_ms=1.0)
        slo = math.ceil(tightness * _reference_ms(profile, shape) / 10.0) * 10.0
        out.append(Workflow(name, stages, edges, slo))
    return tuple(out)


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (Hamilton's method; ties to the earlier entry)."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def scale_cluster(gpus: int = SCALE_GPUS) -> ClusterSpec:
    """``gpus`` GPUs in the mix :data:`SCALE_GPU_MIX`, eight per node (a type's last node may hold fewer).

    Raises:
        ConfigError: when ``gpus`` is not positive.
    """
    if gpus < 1:
        raise ConfigError(f"scale case: gpus must be >= 1, got {gpus}")
    weights = [float(w) for _, w, _ in SCALE_GPU_MIX]
    if gpus % GPUS_PER_NODE == 0:  # whole nodes of one type each
        counts = [GPUS_PER_NODE * n for n in largest_remainder(gpus // GPUS_PER_NODE, weights)]
    else:
        counts = largest_remainder(gpus, weights)
    nodes = []
    for (hw, _, vcpus), n in zip(SCALE_GPU_MIX, counts, strict=True):
        for j in range(math.ceil(n / GPUS_PER_NODE)):
            held = min(GPUS_PER_NODE, n - j * GPUS_PER_NODE)
            nodes.append(NodeSpec(f"{hw.lower()}-{j:03d}", vcpus, (hw,) * held))
    return ClusterSpec(tuple(nodes))


def function_weights(count: int) -> tuple[float, ...]:
    """Invocations of the ``count`` most-invoked http functions over the sample: each workflow's share.

    Raises:
        ConfigError: when the sample has fewer http functions than ``count``.
    """
    funcs = traces.http_functions()
    if count > len(funcs):
        raise ConfigError(f"scale case: the Azure Functions sample has {len(funcs)} http functions, {count} asked")
    return tuple(float(f.total) for f in funcs[:count])


def window_rate_factor(count: int, duration_s: float, minute_s: float = SCALE_MINUTE_S) -> float:
    """Mean invocations per minute over the whole sample / over the window a run plays (from minute 0).

    The functions trace scales each function to its share of the nominal rate
    over the whole 8-hour sample; a run plays only its first minutes, which may
    be quieter or busier. Multiplying the nominal rate by this factor makes the
    played window hold the target rate on average.
    """
    funcs = traces.http_functions()[:count]
    minutes = len(funcs[0].counts)
    played = max(1, math.ceil(duration_s / minute_s))
    full_minutes = [min(minute_s, duration_s - m * minute_s) / minute_s for m in range(played)]
    window = sum(f.counts[m % minutes] * full_minutes[m] for f in funcs for m in range(played))
    sample = sum(f.total for f in funcs)
    return (sample / minutes) / (window / sum(full_minutes))


def scale_case(
    scheduler: str = "esg",
    *,
    gpus: int = SCALE_GPUS,
    workflows: int = SCALE_WORKFLOWS,
    rate_per_s: float = SCALE_RATE_PER_S,
    duration_s: float = SCALE_DURATION_S,
    warmup_s: float = SCALE_WARMUP_S,
    seed: int = 0,
    tightness: float = STANDARD_TIGHTNESS,
    minute_s: float = SCALE_MINUTE_S,
    workflow_seed: int = 0,
) -> Case:
    """The scale case (module docstring); ``rate_per_s`` is what the played window holds on average.

    ``seed`` picks the arrivals and service times; ``workflow_seed`` the drawn
    workflows, so that seeds vary the load on one fleet of pipelines.

    Raises:
        ConfigError: on a non-positive size, or more workflows than the sample has functions.
    """
    nominal = rate_per_s * window_rate_factor(workflows, duration_s, minute_s)
    return Case(
        name=f"scale/{gpus}gpu-{workflows}wf",
        workflows=scale_workflows(workflows, workflow_seed, tightness),
        profile=scale_profile(),
        prices=PriceSheet.default(),
        cluster=scale_cluster(gpus),
        workload=WorkloadSpec(
            STANDARD_TRACE, nominal, start_s=0.0, minute_s=minute_s, weights=function_weights(workflows)
        ),
        duration_s=duration_s,
        scheduler=scheduler,
        settings=standard_settings(),
        seed=seed,
        warmup_s=min(warmup_s, duration_s / 2),
    )
