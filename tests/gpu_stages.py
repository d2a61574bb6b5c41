"""A small CUDA stage for the GPU path's test: a seeded 2-layer MLP on whatever device the worker got.

Worker processes import this module by path (``tests.gpu_stages``), so it must stay importable
on machines without CUDA; only running it needs a GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from esg_prefect.integration.stage import Pipeline

gpu = Pipeline("gpu", slo_ms=5_000)


def load_mlp(device: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(512, 2048, generator=gen) / 512**0.5
    w2 = torch.randn(2048, 16, generator=gen) / 2048**0.5
    return {"w1": w1.to(device), "w2": w2.to(device), "device": device}


@gpu.stage(load=load_mlp, name="mlp")
def mlp(model: dict[str, Any], items: list[list[float]]) -> list[list[float]]:
    """One forward pass per batch; returns each item's 16 outputs (on the CPU)."""
    x = torch.tensor(items, dtype=torch.float32, device=model["device"])
    y = torch.relu(x @ model["w1"]) @ model["w2"]
    return [row.tolist() for row in y.cpu()]
