"""The README's install path: the CPU build of torch on a machine without a GPU, never CUDA packages there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent


def load_install() -> ModuleType:
    return load_script("esg_install", "scripts/install.py")


def report(*packages: tuple[str, str]) -> dict[str, object]:
    return {"install": [{"metadata": {"name": n, "version": v}} for n, v in packages]}


def test_cuda_packages_are_recognised_in_a_pip_report() -> None:
    inst = load_install()
    cpu = report(("torch", "2.13.0+cpu"), ("sympy", "1.14.0"), ("nvidia-ml-py", "13.615.71"))
    cuda = report(("torch", "2.13.0"), ("nvidia-cublas-cu12", "12.9.1"), ("triton", "3.5.0"))
    assert inst.cuda_packages(cpu) == []
    assert inst.cuda_packages(cuda) == ["nvidia-cublas-cu12==12.9.1", "triton==3.5.0"]
    assert inst.cuda_packages(report(("torch", "2.13.0+cu128"))) == ["torch==2.13.0+cu128"]


def test_the_cpu_build_comes_from_pytorchs_cpu_index_when_it_can_be_reached() -> None:
    inst = load_install()
    assert inst.torch_args("cpu", True) == ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]
    assert inst.torch_args("cpu", False) == ["torch==2.13.0"]  # checked by a dry run before it is used
    assert inst.torch_args("cuda", True) == ["torch==2.13.0"]


def test_a_cpu_install_that_would_pull_cuda_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    inst = load_install()
    monkeypatch.setattr(inst, "reachable", lambda url, timeout_s=5.0: False)
    monkeypatch.setattr(inst, "resolve", lambda args: report(("torch", "2.13.0"), ("nvidia-nccl-cu12", "2.27")))
    with pytest.raises(SystemExit, match="would install CUDA packages"):
        inst.plan_torch("cpu")


@pytest.mark.slow
def test_the_cpu_path_resolves_here_without_cuda_packages() -> None:
    # pip's own resolution (--dry-run --report) of what install.py would run for the CPU build.
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "install.py"), "--torch", "cpu", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "torch: cpu build" in out.stdout and "would run:" in out.stdout
