"""A runner's pool closes at exit before Prefect's event worker stops, whenever the pool was made.

A shared pool is made by the runner's warm-up as a flow run starts, which can be before
Prefect registers its event worker's exit hook (at the run's first task event). Threading's
exit hooks run in reverse order of registration, so a pool whose only exit hook dates from
its making closed after that worker had stopped, and every artifact published at its close
logged "Error emitting event ... can't register atexit after shutdown" with a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.toy_stages import toy_profile

SCRIPT = """
import sys, threading
from esg_prefect.integration import runner as r

runner = r.ESGTaskRunner(profile=sys.argv[1], backend="inline", artifacts=False, store=sys.argv[2])
pool = r.shared_pool(**runner._config)  # as the warm-up does when the flow run starts
close = pool.close
pool.close = lambda *a, **k: (print("pool closed", flush=True), close(*a, **k))
# Prefect's event worker, registered at the run's first task event, after the pool was made:
threading._register_atexit(lambda: print("prefect event worker stopped", flush=True))
assert runner.pool_client() is pool  # the run's first stage call
"""


def test_the_pool_closes_before_prefects_event_worker_stops(tmp_path: Path) -> None:
    csv = tmp_path / "toy.csv"
    toy_profile().to_csv(csv)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(csv), f"sqlite:///{tmp_path / 'costs.db'}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line in ("pool closed", "prefect event worker stopped")]
    assert lines[:2] == ["pool closed", "prefect event worker stopped"], done.stdout
