"""The stage of bench/faults.py: doubles its input, raises on poison ones, and logs every execution.

Each batch appends ``S <token> <pid> <ids>`` when it starts and ``E <token>`` when it
returns (``X <token>`` when it raises) to the file named by ``ESG_CHAOS_LOG``, with
O_APPEND writes, so the bench can count how often each call really ran and where.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from esg_prefect import Pipeline

chaos_pipe = Pipeline("chaos", slo_ms=5_000)


def _log(line: str) -> None:
    fd = os.open(os.environ["ESG_CHAOS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def load(device: str) -> dict[str, Any]:
    return {"factor": 2}


@chaos_pipe.stage(load=load, name="chaos", retries=0)
def chaos(model: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    token = uuid.uuid4().hex[:12]
    _log(f"S {token} {os.getpid()} {','.join(i['id'] for i in items)}")
    time.sleep(0.003 + 0.0005 * len(items))  # some work, so that kills land mid-batch
    bad = [i["id"] for i in items if i["poison"]]
    if bad:
        _log(f"X {token}")
        raise ValueError(f"poison input {bad}")
    _log(f"E {token}")
    return [{"id": i["id"], "y": i["x"] * model["factor"] + 1} for i in items]
