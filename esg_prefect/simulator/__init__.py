"""The trace-driven simulator: the same schedulers as the runtime, on a simulated clock and cluster.

Modules, one concept each (STYLE.md, after AlpaServe's simulator):
:mod:`~esg_prefect.simulator.engine` (event loop), :mod:`~esg_prefect.simulator.cluster`
(workers, service times, billing), :mod:`~esg_prefect.simulator.controller`
(queues and ``decide`` calls), :mod:`~esg_prefect.simulator.case` (the experiment
description shared with the runtime), :mod:`~esg_prefect.simulator.run`
(``run_case``), :mod:`~esg_prefect.simulator.standard` (the standard case) and
:mod:`~esg_prefect.simulator.experiments` (E1-E7).
"""

from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, SimSpec, WorkloadSpec, resolve_profile
from esg_prefect.simulator.run import SimRun, run_case, simulate
from esg_prefect.simulator.standard import standard_case, tiny_case

__all__ = [
    "Case",
    "ClusterSpec",
    "NodeSpec",
    "SimRun",
    "SimSpec",
    "WorkloadSpec",
    "resolve_profile",
    "run_case",
    "simulate",
    "standard_case",
    "tiny_case",
]
