"""The input-size case (Cypress): the text pipeline on CPU nodes with prompts of real, varied length.

What it is, and why each part:

* Workflow: the example text pipeline (``tokenize -> encode -> classify_text
  -> summarize``, :mod:`esg_prefect.examples.text`) with its SLO (990 ms),
  profiled on this project's CPU (``data/profiles/profiler_examples_cpu.csv``).
  The profiler run's per-call samples (``..._samples.csv``) carry each call's
  input size, from which :class:`~esg_prefect.model.size_model.SizeModel`
  fits how a batch's time grows with its items' sizes: the encoder's time
  triples from the shortest to the longest prompts, the summarizer's barely
  moves (its decoder writes a fixed-length summary).
* Sizes: prompt lengths of the Azure LLM 2023 conversation trace
  (:func:`esg_prefect.workload.sizes.request_sizes`), so a batch of eight
  may hold 20-token and 300-token prompts alike.
* Arrivals: the same trace's arrival times (steady), at ``rate_per_s``.
* Cluster: four CPU nodes of 8 vCPUs, workers of 1 or 2 vCPUs.
* The simulated platform's service times follow the size model for every
  scheduler (the truth); only the scheduler's *use* of it differs:
  ``size_aware=True`` packs batches by predicted time
  (:mod:`esg_prefect.scheduling.packing`), ``False`` counts items as the
  paper's ESG does.

``bench/size_aware.py`` runs both side by side (and the same comparison on
the live runtime); tests/test_packing.py checks the gain on a short run.
"""

from __future__ import annotations

from dataclasses import replace

from esg_prefect.model.config import ConfigSpace
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, WorkloadSpec

SIZED_PROFILE = "profiler_examples_cpu"
SIZED_SOURCE = "azure_llm_conv"
SIZED_RATE_PER_S = 12.0
TEXT_STAGES = ("tokenize", "encode", "classify_text")
TEXT_SLO_MS = 200.0


def text_workflow(slo_ms: float = TEXT_SLO_MS) -> Workflow:
    """The example text pipeline as a chain with its SLO."""
    return Workflow.chain("text-classify", list(TEXT_STAGES), slo_ms=slo_ms)


def sized_case(
    size_aware: bool = True,
    *,
    scheduler: str = "esg",
    sizes: str = SIZED_SOURCE,
    rate_per_s: float = SIZED_RATE_PER_S,
    duration_s: float = 120.0,
    warmup_s: float = 20.0,
    slo_ms: float = TEXT_SLO_MS,
    seed: int = 0,
) -> Case:
    """The input-size case (module docstring); ``size_aware`` is ESG's packing knob."""
    settings = ESGSettings(config_space=ConfigSpace(vcpus=(1, 2), gpu_shares=(0.0,)), size_aware=size_aware)
    return Case(
        name=f"sized-{'aware' if size_aware else 'count'}",
        workflows=(text_workflow(slo_ms),),
        profile=SIZED_PROFILE,
        prices=PriceSheet.default(),
        cluster=ClusterSpec(tuple(NodeSpec(f"cpu-{i}", 8, ()) for i in range(4))),
        workload=WorkloadSpec(SIZED_SOURCE, rate_per_s, sizes=sizes),
        duration_s=duration_s,
        scheduler=scheduler,
        settings=settings,
        seed=seed,
        warmup_s=min(warmup_s, duration_s / 2),
    )


def with_sizes(case: Case, sizes: str) -> Case:
    """``case`` with its requests' sizes drawn from ``sizes`` (``"none"``: all typical)."""
    return replace(case, workload=replace(case.workload, sizes=sizes))
