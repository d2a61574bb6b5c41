"""GPU discovery, share enforcement settings and, on a CUDA machine, a real pooled GPU worker.

Discovery and the environment of a worker bound to a share are checked here against a fake
NVML (this machine has no GPU); the ``gpu``-marked test runs the real path (a worker process on
a GPU share, CUDA_VISIBLE_DEVICES, memory fraction, MPS or not) wherever CUDA is present.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from esg_prefect.runtime import gpu as gpu_module
from esg_prefect.runtime.gpu import discover_gpus, hardware_type, mps_active, share_environment


@pytest.mark.parametrize(
    "name,hw",
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("Tesla T4", "T4"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Quadro RTX 6000", "Quadro-RTX-6000"),
    ],
)
def test_driver_names_map_to_price_sheet_types(name: str, hw: str) -> None:
    assert hardware_type(name) == hw


class _NVMLError(Exception):
    pass


def fake_nvml(gpus: list[tuple[str, int]], fail_init: bool = False) -> Any:
    """A stand-in for pynvml with ``gpus`` as (name, memory in MiB)."""

    def init() -> None:
        if fail_init:
            raise _NVMLError("Driver Not Loaded")

    return SimpleNamespace(
        NVMLError=_NVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: gpus[h][0].encode(),  # older bindings return bytes
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=gpus[h][1] << 20),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:04d}",
    )


def test_discovery_lists_devices_with_types_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([("NVIDIA H100 80GB HBM3", 81559), ("Tesla T4", 15360)]))
    got = discover_gpus()
    assert [(g.index, g.hardware, g.memory_mib, g.uuid) for g in got] == [
        (0, "H100", 81559, "GPU-0000"),
        (1, "T4", 15360, "GPU-0001"),
    ]


def test_no_driver_means_no_devices(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], fail_init=True))
    with caplog.at_level(logging.INFO, logger=gpu_module.__name__):
        assert discover_gpus() == []
    assert "Driver Not Loaded" in caplog.text and "CPU workers only" in caplog.text
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert discover_gpus() == []


def test_mps_is_detected_by_its_control_pipe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps_active()
    (tmp_path / "control").touch()
    assert mps_active()


def test_worker_environment_pins_the_device_and_caps_threads_under_mps() -> None:
    assert share_environment(None, 0.0, use_mps=True) == {"CUDA_VISIBLE_DEVICES": ""}
    assert share_environment(1, 0.25, use_mps=False) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert share_environment(1, 0.25, use_mps=True) == {
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert share_environment(0, 0.001, use_mps=True)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_backend_offers_discovered_gpus_and_says_once_that_shares_are_logical_without_mps(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from esg_prefect.runtime import workers

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([("NVIDIA H100 80GB HBM3", 81559)] * 2))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))  # no control pipe: no MPS
    with caplog.at_level(logging.INFO, logger=workers.__name__):
        backend = workers.LocalProcessBackend(vcpus=2, spares=0, node_name="n0")
    assert [(d.device_id, d.node, d.hardware) for d in backend.devices()] == [
        ("n0/gpu0", "n0", "H100"),
        ("n0/gpu1", "n0", "H100"),
    ]
    assert caplog.text.count("no MPS daemon found") == 1
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], fail_init=True))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=workers.__name__):
        assert workers.LocalProcessBackend(vcpus=2, spares=0).devices() == ()
    assert caplog.text.count("no GPU found") == 1


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pooled_stage_runs_on_a_gpu_share() -> None:
    """The GPU path for real: ESG places batches on a half share of the first GPU, in a worker process
    that sees only that device and caps its memory; the outputs match the same model run here."""
    from esg_prefect.control.calls import StageCall, WorkflowDecl
    from esg_prefect.model import ConfigSpace, LatencyProfile, PriceSheet, ProfilePoint
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import LocalProcessBackend
    from esg_prefect.scheduling import ESGSettings
    from tests.gpu_stages import gpu, load_mlp

    backend = LocalProcessBackend(vcpus=2, spares=0)
    hw = backend.devices()[0].hardware
    points = [ProfilePoint("mlp", hw, b, 1, 0.5, 2.0 + 0.1 * b, 3.0 + 0.1 * b) for b in (1, 2, 4, 8)]
    prices = PriceSheet(1e-5, {hw: 1e-3})
    space = ConfigSpace((1, 2, 4, 8), (1,), (0.5,))
    pool = Pool(LatencyProfile(points, {("mlp", hw): 5000.0}), prices, settings=ESGSettings(config_space=space),
                backend=backend)  # fmt: skip
    decl = WorkflowDecl("gpu", 5_000, ())
    gen = torch.Generator().manual_seed(1)
    items = [torch.randn(512, generator=gen).tolist() for _ in range(16)]
    try:
        futs = [
            pool.submit(StageCall(f"c{i}", "mlp", "tests.gpu_stages:mlp", decl, f"r{i}", f"r{i}", x))
            for i, x in enumerate(items)
        ]
        results = [f.result(300) for f in futs]
        workers = pool.snapshot().workers
    finally:
        pool.close()
    want = gpu.stages["mlp"].run(load_mlp("cpu"), items)  # the batch function, on the CPU, in this process
    for r, expected in zip(results, want, strict=True):
        assert (r.hardware, r.gpu_share) == (hw, 0.5)
        assert r.output == pytest.approx(expected, rel=1e-3, abs=1e-3)
    (enforced,) = {w.enforcement for w in workers}
    assert "CUDA_VISIBLE_DEVICES=0" in enforced and "memory fraction 0.50" in enforced
    assert ("MPS active threads 50%" in enforced) == mps_active()
    print("GPU worker:", enforced, "; batch sizes:", sorted({r.batch_size for r in results}))
