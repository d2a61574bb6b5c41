"""Workloads: request arrivals from real traces, and the per-queue arrival-rate estimator.

Used by the simulator and by the live runtime's demo alike, so that one case
sends the same requests to both.

Example:
    >>> from esg_prefect.workload import arrivals
    >>> a = arrivals("poisson", ["w"], rate_per_s=100.0, duration_s=1.0, seed=1)
    >>> 50 < len(a) < 150
    True
"""

from esg_prefect.workload.arrivals import TRACES, Arrival, TraceInfo, arrivals, trace_available, trace_names
from esg_prefect.workload.rate import ArrivalRateEWMA
from esg_prefect.workload.traces import TraceUnavailableError, shared_traces_dir

__all__ = [
    "TRACES",
    "Arrival",
    "ArrivalRateEWMA",
    "TraceInfo",
    "TraceUnavailableError",
    "arrivals",
    "shared_traces_dir",
    "trace_available",
    "trace_names",
]
