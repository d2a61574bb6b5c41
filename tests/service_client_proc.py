"""A separate process running concurrent toy flows against the pool service; prints its flow run ids as JSON.

Used by tests/test_service_processes.py: python -m tests.service_client_proc ADDRESS TOKEN N OFFSET GO_DIR.
After one warm-up run it creates ``GO_DIR/ready-OFFSET`` and waits for ``GO_DIR/go``, which the test
creates once every process is ready: the bursts start together on a condition, not at a wall-clock time.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.exceptions import PrefectHTTPStatusError

from esg_prefect import ESGTaskRunner
from tests.toy_stages import slow


def main() -> None:
    address, token, n, offset = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    go_dir = Path(sys.argv[5])
    runner: Any = ESGTaskRunner(address=address, token=token)

    @flow(task_runner=runner)
    def toy_flow(x: int) -> dict[str, Any]:
        from prefect.runtime import flow_run

        # "slow" holds its worker 0.2 s: calls arriving meanwhile queue, so batches form from whatever
        # arrived (from either process) whether or not the scheduler would wait for a fuller batch.
        return {"out": slow(x), "run": flow_run.id}

    def run(x: int) -> dict[str, Any]:
        # The test's Prefect API is SQLite-backed: bursts of flow-run writes can get a 503. That is
        # Prefect's server saying "retry", not a pool failure, so the flow call is retried.
        for attempt in range(5):
            try:
                return toy_flow(x)
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code != 503 or attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    run(offset)  # one run first: concurrent first runs race to set up the Prefect client
    (go_dir / f"ready-{offset}").touch()
    give_up = time.monotonic() + 600  # a ceiling: the test gives the word or fails first
    while not (go_dir / "go").exists():
        if time.monotonic() > give_up:
            raise SystemExit("no go from the test within 600 s")
        time.sleep(0.05)
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(run, range(offset + 1, offset + 1 + n)))
    assert [r["out"] for r in results] == [x + 1 for x in range(offset + 1, offset + 1 + n)]
    print(json.dumps([r["run"] for r in results]))


if __name__ == "__main__":
    main()
