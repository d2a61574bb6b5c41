"""Install esg-prefect into the active environment, with the right build of PyTorch for this machine.

    python scripts/install.py            # the package and the demo
    python scripts/install.py --dev      # plus what the tests need

PyPI's ``torch`` for Linux is the CUDA build (several GB of NVIDIA packages). On a
machine without an NVIDIA GPU this installs the CPU build from PyTorch's own CPU
wheel index, as pytorch.org's install page gives it
(``pip install torch --index-url https://download.pytorch.org/whl/cpu``). Where that
index cannot be reached (an offline mirror), it falls back to the plain pin, but only
after ``pip install --dry-run --report`` shows that the pin resolves to a build that
pulls no CUDA package. ``--torch cuda`` takes PyPI's CUDA build; ``--torch skip``
keeps the torch you installed yourself. ``ESG_TORCH`` sets the default of ``--torch``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

TORCH = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ROOT = Path(__file__).resolve().parent.parent


def has_nvidia_gpu() -> bool:
    """Whether ``nvidia-smi`` lists a GPU here."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def reachable(url: str, timeout_s: float = 5.0) -> bool:
    """Whether ``url`` answers at all (any HTTP status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def cuda_packages(report: dict[str, object]) -> list[str]:
    """The CUDA packages a ``pip install --report`` would install (NVIDIA libraries, or a CUDA torch)."""
    found = []
    for item in report.get("install", []):  # type: ignore[union-attr]
        meta = item["metadata"]  # type: ignore[index]
        name, version = str(meta["name"]).lower(), str(meta["version"])
        nvidia_cuda = name.startswith("nvidia-") and name != "nvidia-ml-py"  # NVML bindings are no CUDA
        if nvidia_cuda or name == "triton" or (name == "torch" and "+cu" in version):
            found.append(f"{name}=={version}")
    return found


def resolve(args: list[str]) -> dict[str, object]:
    """What ``pip install ARGS`` would install, from pip's own dry-run report."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report", str(path)]
        subprocess.run([*cmd, *args], check=True)
        return dict(json.loads(path.read_text()))


def torch_args(kind: str, cpu_index_reachable: bool) -> list[str]:
    """The pip arguments that install torch of ``kind`` (``cpu`` or ``cuda``)."""
    if kind == "cuda" or not cpu_index_reachable:
        return [TORCH]
    return [TORCH, "--index-url", CPU_INDEX]


def plan_torch(kind: str) -> list[str] | None:
    """The pip arguments for torch here, checked; None for ``skip``.

    Raises:
        SystemExit: when the CPU build was asked for and cannot be had without CUDA packages.
    """
    if kind == "skip":
        return None
    if kind == "auto":
        kind = "cuda" if has_nvidia_gpu() else "cpu"
    args = torch_args(kind, kind == "cpu" and reachable(f"{CPU_INDEX}/torch/"))
    if kind == "cpu":
        pulled = cuda_packages(resolve(args))
        if pulled:
            raise SystemExit(
                f"install.py: {' '.join(args)} would install CUDA packages ({', '.join(pulled[:4])}, ...) and "
                f"PyTorch's CPU index {CPU_INDEX} cannot be reached from here: install a CPU build of torch "
                "yourself, then run install.py --torch skip"
            )
    print(f"torch: {kind} build ({' '.join(args)})", flush=True)
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", choices=("auto", "cpu", "cuda", "skip"), default=os.environ.get("ESG_TORCH", "auto"))
    parser.add_argument("--dev", action="store_true", help="also install what the tests need")
    parser.add_argument("--dry-run", action="store_true", help="decide and check, install nothing")
    opts = parser.parse_args(argv)
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    torch = plan_torch(opts.torch)
    steps = [[*pip, "--upgrade", "pip"]]
    if torch is not None:
        steps.append([*pip, *torch])
    steps.append([*pip, "-e", f"{ROOT}[dev]" if opts.dev else str(ROOT)])
    for step in steps:
        if opts.dry_run:
            print("would run:", " ".join(step))
        else:
            subprocess.run(step, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
