"""Baselines behind the same scheduler interface as ESG, registered by name on import.

======================  ===============================================================
name                    models
======================  ===============================================================
``per-invocation``      Prefect's default: each stage call alone, whole GPU, FCFS
``triton``              Triton dynamic batching (max batch, max queue delay), whole GPUs
``infless``             INFless: per-function batch/resources, even SLO split, rate scaling
``fast-gshare``         FaST-GShare: cheapest GPU share per function, no batching
``llama``               Llama: per-invocation slack targets, batch and hardware, whole GPUs
``esg-noshare``         ESG ablation: whole GPUs only
``esg-greedy``          ESG ablation: one stage at a time, even SLO split
``esg-fastest``         ESG ablation: the spec's best effort (fastest option)
``esg-unpruned``        ESG ablation: no pruning (registered by the core)
======================  ===============================================================

Each module's docstring says what its baseline models and what it leaves out.
"""

from esg_prefect.scheduling.baselines.ablations import (
    GreedyESGScheduler,
    make_fastest,
    make_noshare,
    no_share_settings,
)
from esg_prefect.scheduling.baselines.common import BaselineBase, even_split_deadline_ms, stage_budget_ms
from esg_prefect.scheduling.baselines.llama import LlamaScheduler
from esg_prefect.scheduling.baselines.rate_based import FaSTGShareScheduler, INFlessScheduler
from esg_prefect.scheduling.baselines.simple import PerInvocationScheduler, TritonScheduler
from esg_prefect.scheduling.registry import register_scheduler, scheduler_names

BASELINES: tuple[str, ...] = ("per-invocation", "triton", "infless", "fast-gshare", "llama")
"""The prior-work baselines, in the order reports list them."""

ABLATIONS: tuple[str, ...] = ("esg-noshare", "esg-greedy", "esg-fastest", "esg-unpruned")
"""ESG with one idea removed."""


def _register() -> None:
    entries = (
        ("per-invocation", PerInvocationScheduler, "baseline: Prefect's default, each call alone on a whole GPU"),
        ("triton", TritonScheduler, "baseline: Triton dynamic batching (max 8, 10 ms delay) on whole GPUs"),
        ("infless", INFlessScheduler, "baseline: INFless, per-function batch/resources, even SLO split"),
        ("fast-gshare", FaSTGShareScheduler, "baseline: FaST-GShare, cheapest GPU share per function, no batching"),
        ("llama", LlamaScheduler, "baseline: Llama, per-invocation slack targets, whole GPUs"),
        ("esg-noshare", make_noshare, "ESG ablation: whole GPUs only (no sharing)"),
        ("esg-greedy", GreedyESGScheduler, "ESG ablation: one stage at a time with an even SLO split"),
        ("esg-fastest", make_fastest, "ESG ablation: best effort on the fastest option (the spec's rule)"),
    )
    known = set(scheduler_names())
    for name, factory, description in entries:
        if name not in known:  # importing twice (e.g. under another module name) is harmless
            register_scheduler(name, factory, description)


_register()

__all__ = [
    "ABLATIONS",
    "BASELINES",
    "BaselineBase",
    "FaSTGShareScheduler",
    "GreedyESGScheduler",
    "INFlessScheduler",
    "LlamaScheduler",
    "PerInvocationScheduler",
    "TritonScheduler",
    "even_split_deadline_ms",
    "make_fastest",
    "make_noshare",
    "no_share_settings",
    "stage_budget_ms",
]
