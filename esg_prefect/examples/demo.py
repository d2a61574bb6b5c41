"""The demo: many concurrent flow runs of the example pipelines, pooled by ESG, then the same under Prefect's default.

Arrivals come from a real trace slice shipped with esg-prefect (Azure
Functions 2019 by default; see ``esg_prefect/data/traces/README.md``), scaled
to the requested rate. Each request is one flow run of one of the example
pipelines. The same arrivals then run under Prefect's
:class:`~prefect.task_runners.ThreadPoolTaskRunner`, where every stage call
runs its model on a batch of one inside the flow's process.

Both runners first serve one request per workflow, unmeasured, so that models
are loaded (and, under ESG, workers warm) before the measured workload.

Costs: under ESG, each worker is billed for what it holds: its vCPUs while it
runs a batch or loads (an idle worker process holds none), and a GPU share, if
it has one, for its whole life (``docs/decisions/idle-vcpus.md``); each flow run's cost is its one cost figure
(:mod:`esg_prefect.model.attribution`, ``docs/decisions/one-cost.md``): its
shares of its batches' busy time and of the idle time they caused, read once
the pool has closed, when the last idle intervals have closed too, so that it
is the figure the run's artifacts and ``esg-prefect costs`` show. Under the
thread pool, each stage call is billed for its own duration times the threads
torch uses, the per-invocation model of serverless platforms.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esg_prefect.examples.driver import RequestOutcome, run_workload
from esg_prefect.integration.api_check import ephemeral_api_defaults
from esg_prefect.model.attribution import RunCost
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.report import Report


@dataclass(frozen=True, slots=True)
class DemoRun:
    """One runner's pass over the workload."""

    runner: str
    outcomes: tuple[RequestOutcome, ...]
    wall_s: float
    cost_total: float
    report: Report | None = None
    per_run_cost: tuple[tuple[str, str, RunCost], ...] = ()  # (flow run id, workflow, its cost, busy/idle split)
    cost_busy: float = 0.0  # the busy part of cost_total: batches only, no warm idle time
    cost_unit: str = "$"
    batches: int = 0  # batches the pool ran (ESG only)
    mixed_batches: int = 0  # of those, batches holding calls of more than one flow run

    @property
    def slo_met(self) -> float:
        """Fraction of requests that ended ok within their workflow's SLO."""
        from esg_prefect.examples.pipelines import SLO_MS

        if not self.outcomes:
            return 0.0
        return sum(1 for o in self.outcomes if o.ok and o.latency_ms <= SLO_MS[o.workflow]) / len(self.outcomes)

    @property
    def cost_per_request(self) -> float:
        """The whole bill over the measured requests."""
        return self.cost_total / len(self.outcomes) if self.outcomes else 0.0


def cost_ratio_line(esg: DemoRun, threadpool: DemoRun) -> str:
    """The demo's closing line: what the thread pool costs per unit of ESG's cost, two ways.

    Why two: the thread pool is billed per call (the calls' own time, as a
    per-invocation platform bills), ESG per worker, idle keep-alive included
    (ESG-SPEC section 6): a worker's GPU share is billed while it idles, its
    vCPUs are not (it holds none then). On the calls' busy time alone (the
    paper's cost model, the simulator's "batch $/req") the two are compared
    like for like; the second figure adds what ESG's warm workers cost while
    idle, which on a GPU is most of a light load's bill and on CPU workers
    only their pre-warm loads. Printing only one would hide the other.
    """
    busy = f"{threadpool.cost_busy / esg.cost_busy:.2f}" if esg.cost_busy > 0 else "n/a"
    total = f"{threadpool.cost_total / esg.cost_total:.2f}" if esg.cost_total > 0 else "n/a"
    return (
        f"cost ratio threadpool / esg = {busy} on the calls' busy time (the paper's cost model); "
        f"{total} with ESG's warm idle workers billed too (keep-alive)"
    )


def verdict_line(esg: DemoRun, threadpool: DemoRun) -> str:
    """ESG against the thread pool on the two figures the demo is for: SLO met and whole bill per request."""
    slo = "more" if esg.slo_met > threadpool.slo_met else "fewer" if esg.slo_met < threadpool.slo_met else "as many"
    if esg.cost_per_request > 0 and threadpool.cost_per_request > 0:
        ratio = threadpool.cost_per_request / esg.cost_per_request
        cost = f"{ratio:.2f}x cheaper" if ratio >= 1 else f"{1 / ratio:.2f}x dearer"
    else:
        cost = "not comparable (a cost of 0)"
    return (
        f"ESG met {esg.slo_met:.0%} of SLOs against the thread pool's {threadpool.slo_met:.0%} ({slo}), "
        f"and was {cost} per request (ESG billed for its workers' vCPUs while they compute or load and "
        "GPU shares for their whole life; the thread pool for its calls' own time x torch's threads)"
    )


def demo_arrivals(requests: int, rate_per_s: float, seed: int, trace: str) -> list[tuple[float, str]]:
    """The first ``requests`` arrivals of the three example workflows from ``trace`` at ``rate_per_s``."""
    from esg_prefect.workload import arrivals

    duration = requests / rate_per_s * 1.5 + 5.0
    out = arrivals(trace, ["image", "text", "video"], rate_per_s, duration, seed, start_s=None)
    return out[:requests]


def quiet_prefect() -> None:
    """Keep run logs in the API (the UI shows them) but off this console; a fast throw-away API.

    Call it before anything imports prefect: Prefect reads its settings once.
    It changes this process's environment and loggers for good, so only entry
    points call it (``esg-prefect demo`` and the bench scripts), never a library.
    The temporary API gets an in-memory database
    (:func:`~esg_prefect.integration.api_check.ephemeral_api_defaults`: on the
    2-core development machine, 60 trivial 8-task flow runs at 2/s took a p95
    of 34 s on Prefect's default SQLite file, against 1.6 s in memory).
    """
    ephemeral_api_defaults()
    if not os.environ.get("PREFECT_API_URL") and "PREFECT_LOGGING_SETTINGS_PATH" not in os.environ:
        os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = str(quiet_sqlalchemy_logging())
    os.environ.setdefault("PREFECT_LOGGING_TO_CONSOLE", "false")
    # Run logs go to the API (the UI shows them) through their own handler; the console handler
    # shows warnings only. Set here: Prefect configures its loggers from its logging.yml at import.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    import logging

    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL)  # as the file above does for the API's process


def quiet_sqlalchemy_logging() -> Path:
    """Prefect's own logging config with SQLAlchemy's loggers at CRITICAL, written for the temporary API; its path.

    At exit Prefect stops the temporary API's server while its consumers hold
    the in-memory database, and SQLAlchemy's pool logs the cancelled rollback
    as an error with a 20-line traceback (2 of 5 fresh demo runs) though
    nothing is lost: the database is a throw-away. SQLAlchemy gives its top
    logger a level of its own (WARNING), so a quiet root level does not reach
    it; a logger entry in the config the server process reads does. Prefect's
    file is copied as text, its ``${...}`` settings left for Prefect to fill.
    The file is created anew (mode 0600, a name no other user can foresee, as
    :func:`tempfile.mkstemp` makes it) and removed at exit: Prefect runs the
    factories such a file names, so a file another user could plant or edit
    would run their code.
    """
    import atexit
    import importlib.util
    import tempfile

    spec = importlib.util.find_spec("prefect")  # without importing it: it reads its settings once
    assert spec is not None and spec.submodule_search_locations
    text = (Path(next(iter(spec.submodule_search_locations))) / "logging" / "logging.yml").read_text()
    text = text.replace("\nloggers:\n", "\nloggers:\n  sqlalchemy:\n    level: CRITICAL\n\n", 1)
    fd, name = tempfile.mkstemp(prefix="esg-prefect-demo-logging-", suffix=".yml")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    atexit.register(Path(name).unlink, missing_ok=True)
    return Path(name)


@contextlib.contextmanager
def latency_settings() -> Iterator[None]:
    """Prefect settings for flow runs with latency SLOs, for the flow runs started inside.

    Prefect 3.8's synchronous flow engine sends heartbeats from a thread that
    sleeps in 1 s steps and joins it when the run ends: every flow run pays
    0.5 s on average at exit (measured here: a 5-task flow took 1.2 s with
    heartbeats, 0.6 s without). Heartbeats let a server notice crashed
    *deployment* runs; flow runs started in-process, as here, need none.
    Async flows do not wait for the thread.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def warm_prefect() -> None:
    """Start Prefect's API (the ephemeral one when no server is configured) before the burst.

    A temporary API's server process inherits this process's environment at
    its start: it gets a root log level of CRITICAL (its services log errors
    as the in-memory database goes at exit) and the logging config of
    :func:`quiet_sqlalchemy_logging`. This process's own logging was set up
    at import and keeps its levels.
    """
    from prefect import flow

    @flow(name="esg-demo-warm-up")
    def warm_up() -> int:
        return 1

    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_LOGGING_ROOT_LEVEL", "CRITICAL")
    warm_up()


def warm_requests(call: Callable[[int, str], Any]) -> None:
    """One request per workflow before the measured workload: models loaded, workers warm."""
    for k, wf in enumerate(("image", "text", "video")):
        call(-1 - k, wf)


def run_esg(
    arrivals: Sequence[tuple[float, str]],
    on_done: Callable[[RequestOutcome], None] | None = None,
    backend: str = "process",
    max_concurrency: int = 64,
    before_close: Callable[[Any], None] | None = None,
    vcpus: int | None = None,
    profile: str | None = None,
    on_warm: Callable[[], None] | None = None,
) -> DemoRun:
    """The workload under :class:`ESGTaskRunner` with a fresh embedded pool.

    ``before_close(pool)`` runs after the workload, while the pool and its workers
    are still up (benchmarks read the workers' CPU time there). ``vcpus``: the
    cores busy workers may use at once (default: all but one, left to the flows).
    ``profile``: a latency-profile CSV to plan with instead of the shipped ones
    (on a GPU machine, the one ``esg-prefect profile`` measured there: the shipped
    tables hold the example stages on this project's CPU only). ``on_warm()`` runs
    when the warm-up requests are done and the measured workload starts.
    """
    from esg_prefect.examples.pipelines import FLOWS
    from esg_prefect.integration.runner import ESGTaskRunner
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import InlineBackend, LocalProcessBackend

    be: Any = (
        InlineBackend()
        if backend == "inline"
        else LocalProcessBackend(vcpus, preload=("torch", "prefect", "esg_prefect.examples.pipelines"))
    )
    from esg_prefect.model.profile import LatencyProfile

    pool = Pool(LatencyProfile.from_csv(profile) if profile else None, backend=be, switch_interval_s=0.001)
    runner: Any = ESGTaskRunner(pool=pool, store=str(demo_store_path()))
    flows = {wf: f.with_options(task_runner=runner) for wf, f in FLOWS.items()}
    run_ids: dict[int, str] = {}

    def call(i: int, workflow: str) -> Any:
        state = flows[workflow](request_seed=i, return_state=True)
        run_ids[i] = str(state.state_details.flow_run_id)
        return state.result()

    try:
        with latency_settings():
            warm_requests(call)
            if on_warm is not None:
                on_warm()
            t0 = time.perf_counter()
            outcomes = run_workload(arrivals, call, max_concurrency, on_done)
            wall = time.perf_counter() - t0
        report = pool.report()
        snap = pool.snapshot()
        if before_close is not None:
            before_close(pool)
    finally:
        pool.close()  # the last idle intervals close: every run's cost is final
    from esg_prefect.model.attribution import attribute_costs
    from esg_prefect.runtime.pool_records import final_records

    batches, idles = final_records(pool) or ([], [])
    costs = attribute_costs(batches, idles, pool.prices, pool.settings.cost_split, pool.settings.idle_billing)
    wf_of = {r.run_id: r.workflow for r in snap.requests.values()}
    measured = {rid for i, rid in run_ids.items() if i >= 0}  # the warm-up runs are not billed to the workload
    per_run = tuple(
        sorted(
            ((rid, wf_of.get(rid, "?"), costs.run_cost(rid)) for rid in costs.per_run if rid in measured),
            key=lambda x: x[0],
        )
    )
    total = sum(c.total for _, _, c in per_run) + costs.idle_unattributed
    busy_total = sum(c.busy for _, _, c in per_run)
    mixed = sum(1 for b in batches if len({item.run_id for item in b.items}) > 1)
    return DemoRun("esg", tuple(outcomes), wall, total, report, per_run, busy_total, costs.unit, len(batches), mixed)


def demo_store_path() -> Path:
    """The demo's own cost store, beside the default one: demo runs never mix with a project's runs."""
    from esg_prefect.store.engine import default_store_path

    return default_store_path().with_name("demo-costs.db")


def threadpool_call() -> Callable[[int, str], Any]:
    """``call(index, workflow)``: one request of the example flows under Prefect's ThreadPoolTaskRunner."""
    from prefect.task_runners import ThreadPoolTaskRunner

    from esg_prefect.examples.pipelines import FLOWS

    # The same interpreter switch interval an ESG pool sets (see Pool's switch_interval_s), so that
    # the comparison does not depend on which runner ran first in this process.
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
    threads: Any = ThreadPoolTaskRunner()
    flows = {wf: f.with_options(task_runner=threads) for wf, f in FLOWS.items()}
    return lambda i, wf: flows[wf](request_seed=i)


def run_threadpool(
    arrivals: Sequence[tuple[float, str]],
    on_done: Callable[[RequestOutcome], None] | None = None,
    prices: PriceSheet | None = None,
    max_concurrency: int = 64,
    on_warm: Callable[[], None] | None = None,
) -> DemoRun:
    """The workload under Prefect's ThreadPoolTaskRunner: one model call per item, in the flow's process."""
    from esg_prefect.integration import stage

    prices = prices or PriceSheet.default()
    call = threadpool_call()
    with latency_settings():
        warm_requests(call)
        if on_warm is not None:
            on_warm()
        stage.local_call_log.clear()
        t0 = time.perf_counter()
        outcomes = run_workload(arrivals, call, max_concurrency, on_done)
        wall = time.perf_counter() - t0
    busy_ms = sum(ms for _, ms in stage.local_call_log)
    cost = busy_ms / 1000.0 * local_price_per_s(prices)
    return DemoRun("threadpool", tuple(outcomes), wall, cost, cost_busy=cost)


def local_price_per_s(prices: PriceSheet) -> float:
    """What a second of a stage call in the flow's process costs: torch's threads, and the whole GPU if it runs on one.

    Raises:
        PriceError: when the process's GPU type has no price on the sheet.
    """
    import torch

    from esg_prefect.integration.stage import local_device
    from esg_prefect.runtime.gpu import hardware_type

    threads = torch.get_num_threads()
    device = local_device()
    if device.startswith("cuda"):
        hw = hardware_type(torch.cuda.get_device_name(torch.device(device)))
        return prices.rate_per_s(threads, 1.0, hw)
    return threads * prices.price_per_vcpu_s
