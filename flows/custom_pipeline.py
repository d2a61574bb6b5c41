"""A pipeline of your own, defined in a script: two small torch models, ESG-pooled across flow runs.

Stages defined in ``__main__`` work: worker processes find them through the script, which is
why the flow calls sit under ``if __name__ == "__main__"``. The SLO and the DAG are declared on
the Pipeline; a latency profile is required for ESG to plan (``esg-prefect profile`` measures one;
here a small one is written next to the script on first run).

    python flows/custom_pipeline.py
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

from esg_prefect.integration.api_check import ephemeral_api_defaults, require_prefect_api

if __name__ == "__main__":
    ephemeral_api_defaults()  # Prefect's temporary API in memory: its SQLite file locks under concurrent runs
    require_prefect_api()  # before Prefect and torch load: a server that is not up costs one line

import torch
from prefect import flow

from esg_prefect import ESGTaskRunner, Pipeline
from esg_prefect.model import LatencyProfile, ProfilePoint

PROFILE = Path(__file__).with_suffix(".profile.csv")
ocr = Pipeline("ocr", slo_ms=400, edges=[("embed", "read")])


def load_embed(device: str) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(8)
    ).eval()


def load_read(device: str) -> torch.nn.Module:
    torch.manual_seed(2)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16 * 64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 40)
    ).eval()


@ocr.stage(load=load_embed)
def embed(model: torch.nn.Module, pages: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return list(model(torch.stack(pages)))


@ocr.stage(load=load_read)
def read(model: torch.nn.Module, feats: list[torch.Tensor]) -> list[int]:
    with torch.inference_mode():
        return model(torch.stack(feats)).argmax(dim=1).tolist()


def measure_profile() -> LatencyProfile:
    """A quick measured profile of both stages on this CPU (1 and 2 threads, batches 1-16)."""
    points = []
    for name, load, make in (
        ("embed", load_embed, lambda b: torch.rand(b, 1, 64, 64)),
        ("read", load_read, lambda b: torch.rand(b, 16, 8, 8)),
    ):
        model = load("cpu")
        for v in (1, 2):
            torch.set_num_threads(v)
            for b in (1, 2, 4, 8, 16):
                x = make(b)
                with torch.inference_mode():
                    model(x)
                    t0 = time.perf_counter()
                    for _ in range(5):
                        model(x)
                points.append(ProfilePoint(name, "cpu", b, v, 0.0, (time.perf_counter() - t0) / 5 * 1000))
    prof = LatencyProfile(points, {("embed", "cpu"): 50.0, ("read", "cpu"): 50.0})
    prof.to_csv(PROFILE)
    return prof


@flow
def ocr_flow(seed: int) -> int:
    torch.manual_seed(seed)
    return read(embed(torch.rand(1, 64, 64)))


if __name__ == "__main__":
    if not PROFILE.exists():
        measure_profile()
    pooled = ocr_flow.with_options(task_runner=ESGTaskRunner(profile=PROFILE))
    pooled(seed=0)  # one run first: concurrent first runs would race to start Prefect's ephemeral API
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        print(list(ex.map(lambda s: pooled(seed=s), range(32))))
