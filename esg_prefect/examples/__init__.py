"""Example DNN pipelines (image DAG, text chain, video fan-out) with seeded weights and measured CPU profiles.

Every stage is a real torch architecture whose weights are drawn from a fixed
seed, so the examples run anywhere with the latency of real models and never
download weights or data. See :mod:`esg_prefect.examples.catalog` for the
registry and the direct (no-Prefect) loop, the modules ``image``, ``text`` and
``video`` for each pipeline's data flow, and ``esg_prefect/data/profiles/
examples_cpu.csv`` for the measured latency profile
(``python -m esg_prefect.examples.measure`` re-measures it).
"""

from esg_prefect.examples.catalog import (
    PIPELINES,
    PipelineSpec,
    StageSpec,
    all_stages,
    critical_path_ms,
    get_pipeline,
    load_pipeline,
    run_pipeline_direct,
    suggest_slo_ms,
    trace_pipeline,
)

__all__ = [
    "PIPELINES",
    "PipelineSpec",
    "StageSpec",
    "all_stages",
    "critical_path_ms",
    "get_pipeline",
    "load_pipeline",
    "run_pipeline_direct",
    "suggest_slo_ms",
    "trace_pipeline",
]
