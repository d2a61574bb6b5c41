"""flows/*.py: ``--help`` describes the script and its options, and runs nothing.

``--help`` of flows/custom_pipeline.py was ignored: it ran the whole workload (33
flow runs) and wrote its measured profile into the checkout. The other scripts'
help listed ``--requests REQUESTS`` with no word on the warm-up run that makes
``--requests 24`` run 25 flow runs. Each script answers ``--help`` before Prefect
or torch is imported, so these run in a second or two.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from esg_prefect.integration.api_check import requests_parser

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "flows").glob("*.py"))


def test_the_requests_option_says_a_warm_up_run_comes_first() -> None:
    parser = requests_parser(24, "What the script does.")
    text = parser.format_help()
    assert "What the script does." in text and "--requests N" in text
    assert "one warm-up run alone (N + 1 flow runs in all); default 24" in " ".join(text.split())
    assert parser.parse_args([]).requests == 24 and parser.parse_args(["--requests", "3"]).requests == 3


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_the_script_and_runs_nothing(script: str, tmp_path: Path) -> None:
    before = sorted((REPO / "flows").iterdir())
    done = subprocess.run(
        [sys.executable, str(REPO / "flows" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    first = (REPO / "flows" / script).read_text().split('"""')[1].splitlines()[0]
    help_text = " ".join(done.stdout.split())
    assert " ".join(first.split()) in help_text and "N + 1 flow runs in all" in help_text, done.stdout
    assert sorted((REPO / "flows").iterdir()) == before  # nothing written beside the scripts
    assert list(tmp_path.iterdir()) == []  # nor where it ran
    if script == "custom_pipeline.py":
        assert "--profile PATH" in help_text and "temporary folder" in help_text
