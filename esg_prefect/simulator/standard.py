"""The standard case of the project's results, and small cases for tests and demos.

The standard case (``bench/simulator.py`` and docs/results.md report on it):

* Workflows (stage models profiled in ``data/profiles/nvidia_gpu.csv``):
  ``image-classify``: resnet50 -> resnext101;
  ``image-tag``: resnet50 -> {resnext101, se-resnext101} -> bert-base (a fork-join);
  ``voice-reply``: bert-base -> transformer-xl -> fastpitch.
* SLOs: ``tightness`` (default 5) times the workflow's critical path at batch
  1 on a whole T4 (p95 latencies), rounded up to 10 ms: 80, 170 and 220 ms.
* Workload: the Azure Functions 2019 trace, its three most-invoked http
  functions mapped to the three workflows in that order, 300 requests/s in
  all (100 per workflow), each trace minute played in 10 s (so the run
  covers 6 minutes of each function's shape).
* Cluster: four nodes of 32 vCPUs: two with four T4 each, one with two V100,
  one with two A100 (12 GPUs); prices: :meth:`PriceSheet.default` (on-demand
  list prices, vCPU $0.04/h, T4 $0.35/h, V100 $2.48/h, A100 $3.67/h).
* ESG settings: the defaults, except ``vcpus=(1,)`` in the configuration
  space because the GPU profiles have no vCPU dimension (NVIDIA times GPU work
  only; see :mod:`esg_prefect.workload.gpu_profiles`).
* Simulated platform: :class:`~esg_prefect.simulator.case.SimSpec` defaults
  (log-normal service times from mean and p95, 5 % interference per busy
  co-runner on a GPU, 10 Gb/s network with 0.5 ms latency, 150 KB per input).
* Duration 60 s, of which the first 20 s are a warm-up left out of the
  report (the cluster starts with no worker); seed 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from esg_prefect.exceptions import ConfigError
from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.slo import critical_path
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, WorkloadSpec, resolve_profile

STANDARD_PROFILE = "nvidia_gpu"
STANDARD_TIGHTNESS = 5.0
STANDARD_RATE_PER_S = 300.0
STANDARD_DURATION_S = 60.0
STANDARD_WARMUP_S = 20.0
STANDARD_TRACE = "azure_functions_2019"

WORKFLOW_SHAPES: tuple[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], ...] = (
    ("image-classify", ("resnet50", "resnext101"), (("resnet50", "resnext101"),)),
    (
        "image-tag",
        ("resnet50", "resnext101", "se-resnext101", "bert-base"),
        (
            ("resnet50", "resnext101"),
            ("resnet50", "se-resnext101"),
            ("resnext101", "bert-base"),
            ("se-resnext101", "bert-base"),
        ),
    ),
    (
        "voice-reply",
        ("bert-base", "transformer-xl", "fastpitch"),
        (("bert-base", "transformer-xl"), ("transformer-xl", "fastpitch")),
    ),
)


def reference_path_ms(profile: LatencyProfile, workflow: Workflow, hardware: str = "T4") -> float:
    """Critical path of ``workflow`` at batch 1 on a whole GPU of ``hardware`` (p95 latencies)."""
    lat = {s: profile.latency_ms(s, Config(1, 1, 1.0), hardware) for s in workflow.stages}
    return sum(lat[s] for s in critical_path(workflow, workflow.topological_order(), lat))


def standard_workflows(tightness: float = STANDARD_TIGHTNESS, profile: str = STANDARD_PROFILE) -> tuple[Workflow, ...]:
    """The three workflows with SLO = ``tightness`` x their T4 batch-1 critical path, rounded up to 10 ms.

    Raises:
        ConfigError: when ``profile`` has no T4 timings for the workflows' stages (a profile of
            other stages, ``examples_cpu``), naming them and what to give instead.
    """
    prof = resolve_profile(profile)
    used = sorted({s for _, names, _ in WORKFLOW_SHAPES for s in names})
    missing = [s for s in used if "T4" not in prof.hardware_types(s)]
    if missing:
        raise ConfigError(
            f"profile {str(profile)!r} has no T4 timings for the standard case's stages {', '.join(missing)} "
            "(its workflows' SLOs are set from them): the standard case takes a profile of its models "
            "(nvidia_gpu, nvidia_gpu_container); for other stages write a case file with your own workflows "
            "(--case, docs/simulator.md)"
        )
    out = []
    for name, stages, edges in WORKFLOW_SHAPES:
        shape = Workflow(name, stages, edges, slo_ms=1.0)
        slo = math.ceil(tightness * reference_path_ms(prof, shape) / 10.0) * 10.0
        out.append(Workflow(name, stages, edges, slo))
    return tuple(out)


def standard_cluster() -> ClusterSpec:
    """Two nodes with 4 T4, one with 2 V100, one with 2 A100; 32 vCPUs each."""
    return ClusterSpec(
        (
            NodeSpec("t4-a", 32, ("T4",) * 4),
            NodeSpec("t4-b", 32, ("T4",) * 4),
            NodeSpec("v100", 32, ("V100",) * 2),
            NodeSpec("a100", 32, ("A100",) * 2),
        )
    )


def standard_settings() -> ESGSettings:
    """ESG's defaults with one vCPU per worker (the GPU profiles have no vCPU dimension)."""
    return ESGSettings(config_space=ConfigSpace(vcpus=(1,)))


def standard_case(
    scheduler: str = "esg",
    *,
    rate_per_s: float = STANDARD_RATE_PER_S,
    tightness: float = STANDARD_TIGHTNESS,
    trace: str = STANDARD_TRACE,
    duration_s: float = STANDARD_DURATION_S,
    warmup_s: float = STANDARD_WARMUP_S,
    seed: int = 0,
    minute_s: float = 10.0,
    profile: str = STANDARD_PROFILE,
) -> Case:
    """The standard case (module docstring), with the usual knobs of the experiments."""
    return Case(
        name="standard",
        workflows=standard_workflows(tightness, profile),
        profile=profile,
        prices=PriceSheet.default(),
        cluster=standard_cluster(),
        workload=WorkloadSpec(trace, rate_per_s, minute_s=minute_s),
        duration_s=duration_s,
        scheduler=scheduler,
        settings=standard_settings(),
        seed=seed,
        warmup_s=min(warmup_s, duration_s / 2),
    )


def tiny_case(scheduler: str = "esg", workflows: Sequence[Workflow] | None = None) -> Case:
    """A small, quick case: one 2-stage chain on one T4 node, Poisson arrivals, 5 s."""
    wfs = tuple(workflows) if workflows else (Workflow.chain("classify", ["resnet50", "resnext101"], 150.0),)
    return Case(
        name="tiny",
        workflows=wfs,
        profile=STANDARD_PROFILE,
        prices=PriceSheet.default(),
        cluster=ClusterSpec((NodeSpec("n0", 8, ("T4", "T4")),)),
        workload=WorkloadSpec("poisson", 40.0),
        duration_s=5.0,
        scheduler=scheduler,
        settings=standard_settings(),
        seed=0,
    )
