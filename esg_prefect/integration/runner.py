"""ESGTaskRunner: Prefect's thread-pool runner, plus a shared ESG pool for DNN stages.

Every task runs as under :class:`prefect.task_runners.ThreadPoolTaskRunner`
(states, retries, ``wait_for``, upstream futures, caching are Prefect's own).
Tasks made by :meth:`esg_prefect.Pipeline.stage` hand their item to the
runner's pool from inside their task run and wait; the pool batches the
calls of every flow run in the process (or, through the pool service, of many
processes) with the ESG scheduler.

Construction modes (checked in ``__init__``):

* ``ESGTaskRunner()``: the process-wide embedded pool for the given settings,
  made and started in the background when the first flow run starts (its workers
  start while the run gets to its first stage call), shared by all flow runs with
  equal settings;
* ``ESGTaskRunner(pool=my_pool)``: a pool object you manage;
* ``ESGTaskRunner(address="http://127.0.0.1:4270")``: the pool service
  (``esg-prefect pool serve``), shared by the flow runs of many processes
  (deployment runs each get their own process).

Prefect duplicates the runner once per flow run and may pickle it; the pool is
a process-level object, so duplicates share it and pickling drops it.

Example:
    >>> from prefect import flow
    >>> from esg_prefect import ESGTaskRunner
    >>> @flow(task_runner=ESGTaskRunner(backend="inline"))   # doctest: +SKIP
    ... def image_flow(img): ...
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from prefect.task_runners import ThreadPoolTaskRunner

from esg_prefect.control.calls import StagePool
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.integration.recording import (
    attach_recorders,
    check_store_option,
    close_before_prefect_stops,
    publishes,
    remember_run,
)
from esg_prefect.integration.run_views import cost_notice
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend, LocalProcessBackend
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.service.address import check_address

if TYPE_CHECKING:
    from esg_prefect.integration.blocks import ESGPool
    from esg_prefect.service.client import PoolClient

logger = logging.getLogger(__name__)

BackendName = Literal["process", "inline"]
SloFrom = Literal["arrival", "start"]

_shared: dict[tuple[Any, ...], Pool] = {}
_shared_lock = threading.Lock()  # guards _shared: flow runs in many threads ask for the pool at once
_warming: set[threading.Thread] = set()  # threads making and starting a shared pool ahead of its first call
_warming_lock = threading.Lock()  # guards _warming (not _shared_lock: a pool is made under that one)


def _resolve(value: Any, block_type: str) -> Any:
    """A saved block's name -> the block; a block -> the model object it describes."""
    from esg_prefect.integration import blocks

    if isinstance(value, str):
        import httpx
        from pydantic import ValidationError

        kind = getattr(blocks, block_type)
        try:
            value = kind.load(value)
        except httpx.TransportError as exc:  # httpx's traceback named neither the block nor the API
            from prefect.settings import get_current_settings

            raise InvalidInputError(
                f"cannot load the {kind.get_block_type_name()} block {value!r}: the Prefect API at "
                f"{get_current_settings().api.url} does not answer ({type(exc).__name__}); start it with "
                "`prefect server start`, or point PREFECT_API_URL at the server that holds the block"
            ) from None
        except RuntimeError as exc:  # Prefect's wrap of a ValidationError: saved, but not valid on this machine
            if not isinstance(exc.__cause__, ValidationError):
                raise
            why = "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in exc.__cause__.errors())
            raise InvalidInputError(
                f"the {kind.get_block_type_name()} block {value!r} is not valid here: {why}"
            ) from None
        except ValueError as exc:  # Prefect's "Unable to find block document named ..."
            if "Unable to find block document" not in str(exc):
                raise
            raise InvalidInputError(
                f"no {kind.get_block_type_name()} block named {value!r} on the Prefect API; save one "
                "(python blocks/create_defaults.py saves 'default'), or pass the object itself"
            ) from None
    if isinstance(value, blocks.ESGSchedulerSettings):
        return value.to_settings()
    if isinstance(value, blocks.ESGPriceSheet):
        return value.to_price_sheet()
    return value


def check_embedded(scheduler: str, settings: Any, profile: str | Path | None, prices: Any) -> Any:
    """Refuse what an embedded pool would fail on at the first stage call, naming it; a dict of
    settings becomes :class:`ESGSettings` (its keys and values checked)."""
    from esg_prefect.integration import blocks
    from esg_prefect.scheduling.registry import scheduler_names

    names = scheduler_names()
    if scheduler not in names:
        raise InvalidInputError(f"unknown scheduler {scheduler!r}; known: {', '.join(names)} (esg-prefect schedulers)")
    if isinstance(settings, dict):
        settings = ESGSettings.from_dict(settings)
    elif settings is not None and not isinstance(settings, (ESGSettings, blocks.ESGSchedulerSettings, str)):
        raise InvalidInputError(
            "settings must be ESGSettings, a dict of them, an ESGSchedulerSettings block or a saved one's name, "
            f"got {type(settings).__name__}"
        )
    if prices is not None and not isinstance(prices, (PriceSheet, blocks.ESGPriceSheet, str)):
        raise InvalidInputError(
            f"prices must be a PriceSheet, an ESGPriceSheet block or a saved one's name, got {type(prices).__name__}"
        )
    if profile is not None and not Path(profile).is_file():
        raise InvalidInputError(f"no profile file {str(profile)!r}; write one with `esg-prefect profile`")
    return settings


def shared_pool(
    scheduler: str = "esg",
    settings: ESGSettings | Any | None = None,
    profile: str | None = None,
    backend: BackendName = "process",
    prices: PriceSheet | Any | None = None,
    artifacts: bool = True,
    store: str | bool | None = True,
    switch_interval_s: float | None = 0.001,
) -> Pool:
    """The process-wide pool for these settings, created on first use.

    ``settings`` and ``prices`` may also be blocks or names of saved block documents.
    A new pool gets the artifact publisher (``artifacts``) and the cost store
    (``store``: True for the default one, a URL, False/None for none).
    """
    settings = _resolve(settings, "ESGSchedulerSettings") or ESGSettings()
    prices = _resolve(prices, "ESGPriceSheet")
    key = (scheduler, settings, profile, backend, prices, artifacts, store, switch_interval_s)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None:
            prof = LatencyProfile.from_csv(profile) if profile else None
            be = InlineBackend() if backend == "inline" else LocalProcessBackend()
            pool = Pool(prof, prices, scheduler, settings, be, switch_interval_s)
            attach_recorders(pool, artifacts=artifacts, store=store)
            _shared[key] = pool
        return pool


TOKEN_ENV = "ESG_PREFECT_TOKEN"
"""Where a runner with a service address and no ``token`` finds the service's bearer token."""

_clients: dict[tuple[str, str | None], PoolClient] = {}


def shared_client(address: str, token: str | None) -> PoolClient:
    """The process-wide client of the pool service at ``address``."""
    from esg_prefect.service.client import PoolClient

    with _shared_lock:
        client = _clients.get((address, token))
        if client is None:
            client = PoolClient(address, token)
            _clients[(address, token)] = client
        return client


def _warm_up(config: dict[str, Any]) -> None:
    """Make the shared pool for ``config`` and start it: its loop, and its backend's spare workers.

    Run on a thread of its own when a runner starts, so that the first stage call
    finds the pool made and the process backend's workers starting (the fork
    server's imports take seconds). A failure is logged at debug level and left to
    the first stage call, which makes the pool again and raises it where it is
    seen; a runner that never calls a stage never fails on it.
    """
    try:
        shared_pool(**config).start()
    except Exception as exc:  # a block not saved, a closed pool: the first stage call reports it
        logger.debug("esg-prefect: the shared pool was not started ahead of the first stage call: %r", exc)
    finally:
        with _warming_lock:
            _warming.discard(threading.current_thread())


def close_shared_pools() -> None:
    """Close every shared pool (at interpreter exit, and in tests), after the warm-ups under way."""
    with _warming_lock:
        warming = list(_warming)
    for t in warming:  # a pool made after the close would be left running
        t.join(30.0)
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
        clients = list(_clients.values())
        _clients.clear()
    for p in pools:
        p.close()
    for c in clients:
        c.close()


atexit.register(close_shared_pools)


def _check_types(max_workers: Any, switch_interval_s: Any, token: Any, profile: Any) -> None:
    """Refuse runner options of the wrong type or range when the runner is made, not at the first call."""
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
    ):
        raise InvalidInputError(f"max_workers must be an int >= 1 (or None), got {max_workers!r}")
    if switch_interval_s is not None and (
        isinstance(switch_interval_s, bool)
        or not isinstance(switch_interval_s, (int, float))
        or not 0 < switch_interval_s < 1
    ):
        raise InvalidInputError(
            f"switch_interval_s must be a number of seconds in (0, 1), or None, got {switch_interval_s!r}"
        )
    if token is not None and not isinstance(token, str):
        raise InvalidInputError(f"token must be a string, got {type(token).__name__}")
    if profile is not None and not isinstance(profile, (str, Path)):
        raise InvalidInputError(f"profile must be a CSV path (str or Path), got {profile!r}")


class ESGTaskRunner(ThreadPoolTaskRunner):  # type: ignore[type-arg]
    """Runs tasks in threads; pools DNN stage calls across flow runs with ESG.

    Args:
        pool: a :class:`~esg_prefect.runtime.pool.Pool` to use; default the shared embedded pool. An
            ``ESGPool`` block (or the name of a saved one) stands for the options it holds (address,
            token, backend, scheduler, profile), which are then not given again here.
        address: URL of a pool service (``esg-prefect pool serve``) instead of an embedded pool.
        token: bearer token of the pool service; default ``$ESG_PREFECT_TOKEN`` (read at the first
            call, in the process that runs the flow, as ``esg-prefect pool serve`` reads it).
        scheduler: scheduler name for the embedded pool (``esg-prefect schedulers``).
        settings: ESG knobs for the embedded pool: :class:`ESGSettings`, a dict of them, an
            ``ESGSchedulerSettings`` block, or the name of a saved one (loaded on first use).
        profile: path of a latency profile CSV; default the profiles shipped with esg-prefect.
        backend: ``"process"`` (worker processes, the default) or ``"inline"`` (threads).
        prices: price sheet: :class:`PriceSheet`, an ``ESGPriceSheet`` block or a saved one's name;
            default :meth:`PriceSheet.default`.
        max_workers: threads for tasks; stage calls wait in threads, so the default is large.
        artifacts: publish a cost table and a summary artifact on each flow run.
        store: record each flow run in the cost store: True for
            ``$PREFECT_HOME/esg_prefect/costs.db`` (or ``$ESG_PREFECT_STORE_URL``),
            a database URL, or False/None for none. Both also apply to a given
            ``pool=``, the first time a runner hands it calls.
        switch_interval_s: the interpreter's thread switch interval the embedded
            pool sets when it starts (``Pool``'s option; None leaves it alone):
            many flow runs share this process, and the pool's controller must
            not wait 5 ms slices behind their threads.
        slo_from: where each flow run's SLO starts: ``"arrival"`` (its request's arrival: when the run
            was created, or its scheduled slot) or ``"start"`` (when it started running). Deployment
            runs wait seconds for a worker to pick them up and start their process; ``"start"``
            plans their stages against the time left after that (``deployments/flows.py``).

    Examples:
        Before::

            @flow(task_runner=ThreadPoolTaskRunner())
            def image_flow(img): ...

        After::

            @flow(task_runner=ESGTaskRunner())
            def image_flow(img): ...
    """

    def __init__(
        self,
        pool: Pool | ESGPool | str | None = None,
        *,
        address: str | None = None,
        token: str | None = None,
        scheduler: str = "esg",
        settings: ESGSettings | Any | None = None,
        profile: str | Path | None = None,
        backend: BackendName = "process",
        prices: PriceSheet | Any | None = None,
        max_workers: int | None = None,
        artifacts: bool = True,
        store: str | bool | None = True,
        switch_interval_s: float | None = 0.001,
        slo_from: SloFrom = "arrival",
    ) -> None:
        from esg_prefect.integration.blocks import ESGPool

        if slo_from not in ("arrival", "start"):
            raise InvalidInputError(f"slo_from must be 'arrival' or 'start', got {slo_from!r}")
        if isinstance(pool, str):  # a saved ESGPool block's name
            pool = _resolve(pool, "ESGPool")
        if isinstance(pool, ESGPool):  # the block's fields, as if given here
            named = {"address": address, "token": token, "profile": profile}
            again = [n for n, v in named.items() if v is not None]
            again += ["scheduler"] if scheduler != "esg" else []
            again += ["backend"] if backend != "process" else []
            if again:
                raise InvalidInputError(f"the ESGPool block already sets {', '.join(again)}: give them in one place")
            block, pool = pool, None
            address, scheduler, backend = block.address or None, block.scheduler, block.backend
            token = block.token.get_secret_value() if block.token is not None else None
            profile = block.profile_path or None
        _check_types(max_workers, switch_interval_s, token, profile)
        super().__init__(max_workers=max_workers if max_workers is not None else 1024)
        if backend not in ("process", "inline"):
            raise InvalidInputError(f"backend must be 'process' or 'inline', got {backend!r}")
        if pool is not None and not isinstance(pool, Pool):
            raise InvalidInputError(
                f"pool must be an esg_prefect Pool, an ESGPool block or a saved one's name, got {type(pool).__name__}"
            )
        if pool is not None and (settings is not None or profile is not None or prices is not None):
            raise InvalidInputError("give either pool= or the settings of an embedded pool, not both")
        if not isinstance(artifacts, bool):
            raise InvalidInputError(f"artifacts must be True or False, got {artifacts!r}")
        check_store_option(store)
        if address is not None and pool is not None:
            raise InvalidInputError("give either pool= or address= (the pool service), not both")
        if address is not None:
            given = [n for n, v in (("settings", settings), ("profile", profile), ("prices", prices)) if v is not None]
            given += ["scheduler"] if scheduler != "esg" else []
            given += ["backend"] if backend != "process" else []
            if given:
                raise InvalidInputError(
                    f"{', '.join(given)} {'configure' if len(given) > 1 else 'configures'} an embedded pool; the "
                    f"pool service at {address} has its own "
                    "(esg-prefect pool serve --set KEY=VALUE, --scheduler, --profile): give either address= or them"
                )
        if address is not None:
            check_address(address)
        elif token:  # the block's empty field is no token
            raise InvalidInputError(
                "token is the bearer token of a pool service; the embedded pool (no address) takes none: "
                "give address= too, or drop token"
            )
        settings = check_embedded(scheduler, settings, profile, prices)
        self._pool: StagePool | None = pool
        self._warm = [False]  # shared with the duplicates: the first to start warms the shared pool up
        self._run_id: str | None = None  # the flow run this duplicate serves, seen on its first stage call
        self._run_logger: Any = None  # that flow run's logger, for the line its cost notice is (__exit__)
        self._address = address
        self._token = token
        self.slo_from: SloFrom = slo_from
        self._config: dict[str, Any] = {
            "scheduler": scheduler,
            "settings": settings,
            "profile": str(profile) if profile is not None else None,
            "backend": backend,
            "prices": prices,
            "artifacts": artifacts,
            "store": store,
            "switch_interval_s": switch_interval_s,
        }

    def pool_client(self) -> StagePool:
        """Where stage calls go: a pool, or a client of the pool service (created on first use)."""
        if self._pool is None:
            if self._address is not None:
                token = self._token if self._token is not None else (os.environ.get(TOKEN_ENV) or None)
                self._pool = shared_client(self._address, token)
            else:
                self._pool = shared_pool(**self._config)
        elif isinstance(self._pool, Pool):  # a given pool: recorders attached once per pool object
            attach_recorders(self._pool, artifacts=self._config["artifacts"], store=self._config["store"])
        if self._run_id is None:  # this flow run's first stage call
            if isinstance(self._pool, Pool):  # the pool's exit hook again, now after Prefect's event worker's
                close_before_prefect_stops(self._pool)
            from prefect.context import FlowRunContext

            ctx = FlowRunContext.get()
            if ctx is not None and ctx.flow_run is not None:
                from prefect.logging.loggers import flow_run_logger

                self._run_id = remember_run(ctx.flow_run)  # and its deployment, for the cost store
                self._run_logger = flow_run_logger(ctx.flow_run, ctx.flow)
        return self._pool

    def duplicate(self) -> Self:
        dup = type(self)(max_workers=self._max_workers, slo_from=self.slo_from, **self._config)
        dup._pool, dup._address, dup._token = self._pool, self._address, self._token
        dup._warm = self._warm
        return dup

    def __enter__(self) -> Self:
        """Start as Prefect's runner does; an embedded shared pool is made and started in the background.

        Prefect enters a duplicate of the flow's runner for each flow run: the
        first one starts the warm-up (:func:`_warm_up`), on a thread, as this may
        load blocks from the API and runs on the async engine's event loop. Runners
        with ``pool=`` or ``address=`` start nothing here.
        """
        super().__enter__()
        if self._pool is None and self._address is None and not self._warm[0]:
            self._warm[0] = True
            with _warming_lock:
                t = threading.Thread(target=_warm_up, args=(dict(self._config),), name="esg-pool-warm-up", daemon=True)
                _warming.add(t)
            t.start()
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        from prefect.context import FlowRunContext

        # Prefect enters the runner before the flow run context and exits it after: the run id
        # comes from the first stage call, when the context was there.
        ctx = FlowRunContext.get()
        run_id = self._run_id or (str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else None)
        if self._pool is not None and run_id is not None:
            self._pool.end_run(run_id)  # non-blocking: posts to the pool's loop
        if self._run_logger is not None and self._run_id is not None and (notice := self._cost_notice(self._run_id)):
            self._run_logger.info(notice)
        super().__exit__(exc_type, exc_value, traceback)

    def _cost_notice(self, run_id: str) -> str | None:
        """Where and when the ended run's cost appears (:func:`cost_notice`); None when it is not published."""
        if self._address is not None:  # the service publishes, with its own options
            return cost_notice(run_id, service=self._address)
        pool = self._pool
        if not isinstance(pool, Pool) or not publishes(pool):
            return None
        keep_alive_s = max(pool.keep_alive_ms().values()) / 1000.0  # CPU always among them
        return cost_notice(run_id, keep_alive_s=keep_alive_s, settled=pool.settings.idle_billing == "separate")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ESGTaskRunner):
            return False
        return (
            self._config == other._config
            and self._address == other._address
            and self.slo_from == other.slo_from
            and (self._pool is other._pool or self._address is not None)
        )

    def __hash__(self) -> int:  # from what __eq__ compares that is always hashable
        return hash((self._address, self._config["scheduler"], self._config["backend"], self._config["profile"]))

    def __getstate__(self) -> dict[str, Any]:
        # The pool holds threads, processes and an event loop: a copy in another process
        # re-resolves its own shared pool from the settings instead.
        state = super().__getstate__()
        state["_pool"] = None
        state["_run_logger"] = None
        state["_warm"] = [False]  # the copy's process has pools of its own to warm up
        return state
