"""GPU discovery (pynvml) and how a worker's GPU share can be enforced here.

Shares are enforced where the platform can (ARCHITECTURE.md, "Workers and GPU
shares"): ``CUDA_VISIBLE_DEVICES`` pins a worker to its GPU; with an MPS
control daemon running, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps its SMs;
``torch.cuda.set_per_process_memory_fraction`` caps its memory. Without MPS,
the compute share is logical (time-slicing) and the pool says so once. On a
machine without NVIDIA GPUs or without the driver library, discovery returns
no devices and the pool runs CPU workers, saying so once.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_FAMILIES = ("H200", "H100", "A100", "A10G", "A10", "A30", "A40", "L40S", "L40", "L4", "T4", "V100", "P100", "K80")


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as the driver reports it."""

    index: int
    name: str
    hardware: str
    memory_mib: int
    uuid: str


def hardware_type(name: str) -> str:
    """The price-sheet type of a GPU from its driver name, e.g. 'NVIDIA H100 80GB HBM3' -> 'H100'."""
    upper = name.upper()
    for fam in _FAMILIES:
        if re.search(rf"(^|[^A-Z0-9]){fam}([^0-9]|$)", upper):
            return fam
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "GPU"


def discover_gpus() -> list[GpuInfo]:
    """GPUs visible through NVML; an empty list where there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py is a dependency, but be kind to trimmed installs
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        logger.info("no NVIDIA driver reachable (%s): CPU workers only", exc)
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            out.append(GpuInfo(i, name, hardware_type(name), int(mem.total) // (1 << 20), uuid))
        return out
    finally:
        pynvml.nvmlShutdown()


def mps_active() -> bool:
    """Whether an MPS control daemon is reachable (its pipe directory holds a control pipe)."""
    pipe_dir = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    return (pipe_dir / "control").exists()


def share_environment(gpu_index: int | None, gpu_share: float, use_mps: bool) -> dict[str, str]:
    """Environment for a worker process bound to ``gpu_share`` of GPU ``gpu_index``.

    Returns:
        Variables to set before CUDA initialises in the worker: the visible
        device, and the MPS active-thread percentage when MPS runs.
    """
    if gpu_index is None:
        return {"CUDA_VISIBLE_DEVICES": ""}
    env = {"CUDA_VISIBLE_DEVICES": str(gpu_index)}
    if use_mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(gpu_share * 100)))
    return env
