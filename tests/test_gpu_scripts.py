"""The GPU kit's scripts (docs/gpu.md) parse and refuse an unknown step; the real runs need a GPU machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["scripts/gpu_session.sh", "scripts/gpu_wheels.sh"])
def test_script_parses(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_session_script_refuses_an_unknown_step_and_names_it(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_session.sh"), "benchmark"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "unknown step benchmark" in done.stdout
    assert (tmp_path / "out").is_dir()  # results folder made before anything runs


def test_bench_step_needs_the_profile_measured_there(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_session.sh"), "bench"], capture_output=True, text=True, env=env
    )
    assert done.returncode != 0
    assert "bench needs the profile CSV" in done.stderr
