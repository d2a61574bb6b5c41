"""A pipeline of your own, defined in a script: two small torch models, ESG-pooled across flow runs.

Stages defined in ``__main__`` work: worker processes find them through the script, which is
why the flow calls sit under ``if __name__ == "__main__"``. The SLO and the DAG are declared on
the Pipeline; a latency profile is required for ESG to plan (``esg-prefect profile`` measures one;
here a small one is measured on this CPU first, into a temporary folder, or read from and kept at
``--profile PATH``).

    python flows/custom_pipeline.py --requests 32 [--profile ocr.profile.csv]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from pathlib import Path

from esg_prefect.integration.api_check import requests_parser, script_args

if __name__ == "__main__":
    # --help, a bad option, an API that is not up: answered here, before Prefect and torch load (so
    # defined here, above the imports). Prefect's temporary API gets an in-memory database (its
    # SQLite file locks under concurrent runs).

    def profile_option(text: str) -> Path:
        """A ``--profile`` path: a profile CSV that exists, or a new file in a folder that does."""
        path = Path(text).expanduser()
        if path.is_dir() or not (path.exists() or path.parent.is_dir()):
            raise argparse.ArgumentTypeError(f"give a profile CSV, or a new file in an existing folder, got {text!r}")
        return path

    parser = requests_parser(32, __doc__)
    parser.add_argument(
        "--profile",
        type=profile_option,
        default=None,
        metavar="PATH",
        help="latency profile CSV: read if it exists, else measured and written there; "
        "default: measured into a temporary folder, removed at the end",
    )
    ARGS = script_args(parser)

import torch
from prefect import flow

from esg_prefect import ESGTaskRunner, Pipeline
from esg_prefect.model import LatencyProfile, ProfilePoint

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


def measure_profile(path: Path) -> LatencyProfile:
    """A quick measured profile of both stages on this CPU (1 and 2 threads, batches 1-16), written to ``path``."""
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
    prof.to_csv(path)
    return prof


@flow
def ocr_flow(seed: int) -> int:
    torch.manual_seed(seed)
    return read(embed(torch.rand(1, 64, 64)))


def main(requests: int, profile: Path | None) -> None:
    """One warm-up flow run, then ``requests`` at once, planned with ``profile`` (measured first if missing)."""
    with tempfile.TemporaryDirectory(prefix="esg-custom-pipeline-") as tmp:
        path = profile or Path(tmp) / "ocr.profile.csv"
        if not path.exists():
            measure_profile(path)
        pooled = ocr_flow.with_options(task_runner=ESGTaskRunner(profile=path))
        pooled(seed=0)  # one run first: concurrent first runs would race to start Prefect's ephemeral API
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            print(list(ex.map(lambda s: pooled(seed=s), range(requests))))


if __name__ == "__main__":
    main(ARGS.requests, ARGS.profile)
