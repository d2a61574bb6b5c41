"""Entrypoints of the example deployments: the example pipelines, pooled through the pool service.

A deployment run (process work pool, or ``flow.serve``) runs in a process of its
own, so an embedded pool would serve one flow run only. These flows run the
bodies of the example flows of :mod:`esg_prefect.examples.pipelines` with a task
runner pointed at the pool service (``esg-prefect pool serve``), which batches
the stage calls of every deployment run:

* ``ESG_PREFECT_POOL_URL``: the service's address (default ``http://127.0.0.1:4270``);
* ``ESG_PREFECT_TOKEN``: its bearer token, when it has one.

Both are read when Prefect loads this file in the flow run's process, so they
come from the worker's (or the serve script's) environment.

The flows are defined here, not made with ``example.with_options(...)``: a
deployment built from a flow object (``flow.to_deployment``, ``serve``) records
the file and name of the flow's *function* as its entrypoint, and that must be
the pooled flow of this file, not the example's. Each keeps its example's flow
name and parameters and runs the example's body as its own (one flow run, whose
stage calls are its task runs).

Example:
    >>> sorted(FLOWS)
    ['image', 'text', 'video']
    >>> FLOWS["text"].name
    'text-pipeline'
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow, get_run_logger

from esg_prefect import ESGTaskRunner
from esg_prefect.examples import pipelines
from esg_prefect.service.address import check_address

DEFAULT_POOL_URL = "http://127.0.0.1:4270"
"""Where ``esg-prefect pool serve`` listens unless told otherwise."""

POOL_URL = os.environ.get("ESG_PREFECT_POOL_URL") or DEFAULT_POOL_URL
"""The pool service these flows send their stage calls to."""

# Checked here, named by the variable a worker's environment sets: the runner would name its `address`.
check_address(POOL_URL, "ESG_PREFECT_POOL_URL")

PROCESS_LOG = "deployment run in process %d"
"""Logged at the start of every run: which process ran it (each deployment run has its own)."""

# A deployment run's SLO counts from when it started running: the worker (or served runner) picks it
# up seconds after its slot and starts a process for it, which no stage can win back.
_RUNNER: Any = ESGTaskRunner(address=POOL_URL, token=os.environ.get("ESG_PREFECT_TOKEN") or None, slo_from="start")


@flow(name=pipelines.image_flow.name, task_runner=_RUNNER)
def image(request_seed: int) -> dict[str, Any]:
    """Detect, classify and caption one image (a scene branch joins at the caption); pooled by the service."""
    get_run_logger().info(PROCESS_LOG, os.getpid())
    return pipelines.image_flow.fn(request_seed)


@flow(name=pipelines.text_flow.name, task_runner=_RUNNER)
def text(request_seed: int) -> dict[str, Any]:
    """Encode a text, classify its topic and summarise it; pooled by the service."""
    get_run_logger().info(PROCESS_LOG, os.getpid())
    return pipelines.text_flow.fn(request_seed)


@flow(name=pipelines.video_flow.name, task_runner=_RUNNER)
def video(request_seed: int) -> dict[str, Any]:
    """Split a clip into frames, run the frame model per frame, aggregate; pooled by the service."""
    get_run_logger().info(PROCESS_LOG, os.getpid())
    return pipelines.video_flow.fn(request_seed)


FLOWS = {"image": image, "text": text, "video": video}
"""The deployment entrypoints by workflow name (the ``:name`` part of ``deployments/flows.py:name``)."""
