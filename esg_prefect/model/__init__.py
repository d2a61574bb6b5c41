"""Domain model: workflows, SLO segments, configurations, latency and cost.

Pure data and arithmetic. This package imports neither prefect, torch,
asyncio nor an HTTP library (a test checks it), so the scheduler and the
simulator can use it anywhere.
"""

from esg_prefect.model.attribution import (
    BatchItem,
    BatchRecord,
    CostReport,
    IdleRecord,
    attribute_costs,
)
from esg_prefect.model.cluster import ClusterSnapshot, Device, Node, Worker, cpu_cluster, gpu_cluster
from esg_prefect.model.config import CPU, Config, ConfigSpace
from esg_prefect.model.jobs import Batch, Job, QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.slo import Segment, SLODistribution, critical_path, dominator_segments
from esg_prefect.model.workflow import Workflow

__all__ = [
    "CPU",
    "Batch",
    "BatchItem",
    "BatchRecord",
    "ClusterSnapshot",
    "Config",
    "ConfigSpace",
    "CostReport",
    "Device",
    "IdleRecord",
    "Job",
    "LatencyProfile",
    "Node",
    "PriceSheet",
    "ProfilePoint",
    "QueueKey",
    "SLODistribution",
    "Segment",
    "Worker",
    "Workflow",
    "attribute_costs",
    "cpu_cluster",
    "critical_path",
    "dominator_segments",
    "gpu_cluster",
]
