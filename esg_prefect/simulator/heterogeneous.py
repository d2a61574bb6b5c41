"""The heterogeneous case (experiment E8): T4, A100 and CPU nodes, ESG with and without PALDIA's features.

What it is, and why each choice:

* **Workflows**: the standard case's three (:mod:`esg_prefect.simulator.standard`),
  each behind a CPU front stage, because real pipelines start with host-side
  work and because it gives the CPU nodes real work: ``image-classify``:
  preprocess -> resnet50 -> resnext101; ``image-tag``: preprocess -> resnet50
  -> {resnext101, se-resnext101} -> bert-base; ``voice-reply``: tokenize ->
  bert-base -> transformer-xl -> fastpitch.
* **Latencies**: the GPU stages from NVIDIA's published tables
  (``data/profiles/nvidia_gpu.csv``; T4 and A100 rows are the ones used), the
  CPU stages from this project's CPU measurement of the example pipelines
  (``data/profiles/examples_cpu.csv``). No published CPU latency of the NVIDIA
  models is shipped (the only one at hand, INFless's, is GPL-3.0 data), so the
  GPU models have no CPU option: their hardware choice is T4 or A100, and the
  CPU stages run on CPUs. The selector's CPU-versus-GPU choice is shown in
  ``tests/test_hardware_select.py`` on a profile that has both.
* **Cluster**: two nodes with four T4 each, one with two A100, two CPU-only
  nodes; 32 vCPUs each. Prices: :meth:`PriceSheet.default` (T4 $0.35/h,
  A100 $3.67/h, vCPU $0.04/h). A100 is about 10x the price of a T4 and 2-5x
  its speed on these models: the cheap pool cannot carry every stage at the
  standard load, which is the situation hardware selection is for.
* **SLOs**: 5x each workflow's batch-1 critical path (whole T4, 1 vCPU for CPU stages).
* **Co-run physics**: ``SimSpec(corun="default")`` for every scheduler, so all
  pay the same slowdown beside busy tenants on a GPU
  (:class:`~esg_prefect.model.interference.CoRunModel`, 15 % per busy tenant
  on a GPU, sources in that module); only ESG with ``hybrid_sharing`` sees it
  when deciding. The standard case keeps its own 5 % linear model.
* **Workload**: the standard case's trace (Azure Functions 2019, three
  functions, one minute played in 10 s), 300 requests/s by default.

Variants: ``esg`` (the paper), ``esg+hw`` (hardware selection), ``esg+hybrid``
(hybrid sharing), ``esg+both``, and the prior-work baselines by registry name.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.slo import critical_path
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, SimSpec, WorkloadSpec, resolve_profile
from esg_prefect.simulator.standard import STANDARD_TRACE, WORKFLOW_SHAPES

__all__ = [
    "ESG_VARIANTS",
    "heterogeneous_case",
    "heterogeneous_cluster",
    "heterogeneous_profile",
    "heterogeneous_workflows",
]

CPU_FRONT = {"image-classify": "preprocess", "image-tag": "preprocess", "voice-reply": "tokenize"}
"""The CPU stage (from ``examples_cpu.csv``) put in front of each standard workflow."""

ESG_VARIANTS: dict[str, tuple[bool, bool]] = {
    "esg": (False, False),
    "esg+hw": (True, False),
    "esg+hybrid": (False, True),
    "esg+both": (True, True),
}
"""ESG's variants: label -> (``hardware_selection``, ``hybrid_sharing``)."""

HETERO_GPUS = ("T4", "A100")


@lru_cache(maxsize=1)
def heterogeneous_profile() -> LatencyProfile:
    """NVIDIA's T4 and A100 rows of the GPU stages, plus the measured CPU rows of the front stages."""
    gpu = resolve_profile("nvidia_gpu")
    cpu = resolve_profile("examples_cpu")
    fronts = set(CPU_FRONT.values())
    points = [p for p in gpu.points if p.hardware in HETERO_GPUS]
    points += [p for p in cpu.points if p.stage in fronts]
    cold = {(p.stage, p.hardware): src.cold_start_ms(p.stage, p.hardware) for src, p in _tagged(gpu, cpu, points)}
    return LatencyProfile(points, cold)


def _tagged(
    gpu: LatencyProfile, cpu: LatencyProfile, points: list[ProfilePoint]
) -> list[tuple[LatencyProfile, ProfilePoint]]:
    """Each point with the profile it came from (for its cold start)."""
    return [(cpu if p.hardware == "cpu" else gpu, p) for p in points]


def _reference_ms(profile: LatencyProfile, wf: Workflow) -> float:
    """Batch-1 critical path: GPU stages on a whole T4, CPU stages on one vCPU (p95)."""
    lat = {}
    for s in wf.stages:
        hw = "cpu" if s in CPU_FRONT.values() else "T4"
        lat[s] = profile.latency_ms(s, Config(1, 1, 0.0 if hw == "cpu" else 1.0), hw)
    return sum(lat[s] for s in critical_path(wf, wf.topological_order(), lat))


def heterogeneous_workflows(tightness: float = 5.0) -> tuple[Workflow, ...]:
    """The standard workflows behind their CPU front stage, SLO = ``tightness`` x batch-1 path, up to 10 ms."""
    prof = heterogeneous_profile()
    out = []
    for name, stages, edges in WORKFLOW_SHAPES:
        front = CPU_FRONT[name]
        all_stages = (front, *stages)
        all_edges = ((front, stages[0]), *edges)
        shape = Workflow(name, all_stages, all_edges, slo_ms=1.0)
        slo = math.ceil(tightness * _reference_ms(prof, shape) / 10.0) * 10.0
        out.append(Workflow(name, all_stages, all_edges, slo))
    return tuple(out)


def heterogeneous_cluster() -> ClusterSpec:
    """Two nodes of 4 T4, one of 2 A100, two CPU-only nodes; 32 vCPUs each."""
    return ClusterSpec(
        (
            NodeSpec("t4-a", 32, ("T4",) * 4),
            NodeSpec("t4-b", 32, ("T4",) * 4),
            NodeSpec("a100", 32, ("A100",) * 2),
            NodeSpec("cpu-a", 32),
            NodeSpec("cpu-b", 32),
        )
    )


def heterogeneous_case(
    variant: str = "esg",
    *,
    rate_per_s: float = 300.0,
    duration_s: float = 60.0,
    warmup_s: float = 20.0,
    seed: int = 0,
    tightness: float = 5.0,
) -> Case:
    """The heterogeneous case for an ESG variant (:data:`ESG_VARIANTS`) or a registered baseline's name.

    Raises:
        ConfigError: via the case's own checks (e.g. warm-up not below the duration).
    """
    hw, hybrid = ESG_VARIANTS.get(variant, (False, False))
    scheduler = "esg" if variant in ESG_VARIANTS else variant
    settings = replace(ESGSettings(config_space=ConfigSpace(vcpus=(1,))), hardware_selection=hw, hybrid_sharing=hybrid)
    return Case(
        name=f"heterogeneous/{variant}",
        workflows=heterogeneous_workflows(tightness),
        profile=heterogeneous_profile(),
        prices=PriceSheet.default(),
        cluster=heterogeneous_cluster(),
        workload=WorkloadSpec(STANDARD_TRACE, rate_per_s, minute_s=10.0),
        duration_s=duration_s,
        scheduler=scheduler,
        settings=settings,
        seed=seed,
        sim=SimSpec(corun="default"),
        warmup_s=min(warmup_s, duration_s / 2),
    )
