"""Wiring a pool to the artifact publisher and the cost store, once per pool.

:class:`~esg_prefect.integration.runner.ESGTaskRunner` calls
:func:`attach_recorders` for every pool it hands stage calls to (the shared
embedded pools when they are created, and a ``pool=`` given to it on first
use). Stores are opened here, lazily, never in the runner's ``__init__``: the
runner must stay cheap to build and picklable. One :class:`CostStore` per URL
serves every pool of the process.

Both write a flow run's cost when it is final, which for the last runs is
when the pool closes (the idle time after their batches closes then): the
runner closes its shared pools at interpreter exit, and the pool's listeners
write what was still pending then (``runtime/listeners.py``). A pool given
recorders is also closed at exit by a hook registered with threading's exit
hooks: those run before non-daemon threads are joined and before ``atexit``
callbacks, in reverse order of registration. The hook is registered when the
recorders are attached and again at the pool's first stage call from a flow run
(:func:`close_before_prefect_stops`): a shared pool is made by the runner's
warm-up as the flow run starts, before Prefect's event worker is registered at
the run's first task event, and a hook registered then would run after that
worker has stopped. Registered at the first stage call, it runs while the event
worker still sends, the listeners' thread still takes work and an ephemeral API
still answers. Run later, Prefect's client cannot start a new event worker and
logs a traceback per artifact.
"""

from __future__ import annotations

import atexit
import logging
import threading
import uuid
import weakref
from collections import OrderedDict
from typing import Any

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.integration.artifacts import api_client, attach_publisher
from esg_prefect.runtime.pool import Pool
from esg_prefect.store import CostStore, attach_store

logger = logging.getLogger(__name__)

_lock = threading.Lock()  # guards the registries below: flow runs of many threads call in
_attached: weakref.WeakSet[Pool] = weakref.WeakSet()
_closes_at_exit: weakref.WeakSet[Pool] = weakref.WeakSet()  # attached pools that record: closed at exit
_closed_before_prefect: weakref.WeakSet[Pool] = weakref.WeakSet()  # those whose late exit hook is registered
_publishing: weakref.WeakSet[Pool] = weakref.WeakSet()  # the attached pools that publish artifacts
_stores: dict[str | None, CostStore] = {}
_deployments: dict[uuid.UUID, str] = {}  # deployment id -> name
_run_deployments: OrderedDict[str, uuid.UUID] = OrderedDict()  # flow run id -> deployment id, until recorded
_RUN_MEMORY = 100_000  # runs whose deployment is remembered before the oldest are forgotten


def check_store_option(store: object) -> None:
    """``store`` must be True (default SQLite), a URL string, or False/None (off).

    Raises:
        InvalidInputError: naming the bad value.
    """
    if not (store is None or isinstance(store, (bool, str))) or store == "":
        raise InvalidInputError(f"store must be True, False, None or a database URL, got {store!r}")


def store_for(store: str | bool | None) -> CostStore | None:
    """The process's store for a runner's ``store`` option (None when off); opened on first use.

    Raises:
        ConfigError: an explicit URL that cannot be opened. The default store
            (``True``) that cannot be opened is logged and left off instead, so
            that a read-only home does not fail every flow run.
    """
    check_store_option(store)
    if store is None or store is False:
        return None
    url = store if isinstance(store, str) else None
    with _lock:
        found = _stores.get(url)
        if found is None:
            try:
                found = CostStore(url)
            except (ConfigError, OSError) as exc:
                if url is not None:
                    raise
                logger.warning("cost store disabled: the default store cannot be opened (%s)", exc)
                return None
            _stores[url] = found
        return found


def remember_run(flow_run: Any) -> str:
    """Note a flow run's deployment (seen in its context, at no API cost); returns the run's id.

    Its name needs no note here: each stage call carries it to the pool that runs
    it (``StageCall.run_name``), whose run records hand it to the cost store.
    """
    run_id = str(flow_run.id)
    deployment_id = getattr(flow_run, "deployment_id", None)
    if deployment_id is not None:
        with _lock:
            _run_deployments[run_id] = deployment_id
            if len(_run_deployments) > _RUN_MEMORY:
                _run_deployments.popitem(last=False)
    return run_id


def remember_deployment(call: Any) -> None:
    """Note the deployment a stage call's flow run came from (the pool service's ``on_call``)."""
    if not call.deployment_id:
        return
    with _lock:
        if call.run_id not in _run_deployments:
            _run_deployments[call.run_id] = uuid.UUID(call.deployment_id)
            if len(_run_deployments) > _RUN_MEMORY:
                _run_deployments.popitem(last=False)


def deployment_name(run_id: str) -> str | None:
    """The name of the deployment a remembered flow run came from (one API read per deployment), else None."""
    with _lock:
        deployment_id = _run_deployments.pop(run_id, None)
        name = _deployments.get(deployment_id) if deployment_id is not None else None
    if deployment_id is None or name is not None:
        return name
    name = api_client().read_deployment(deployment_id).name
    with _lock:
        _deployments[deployment_id] = name
    return name


def attach_recorders(pool: Pool, *, artifacts: bool = True, store: str | bool | None = True) -> None:
    """Attach the artifact publisher and the cost store to ``pool``, the first time it is seen.

    Args:
        pool: the pool.
        artifacts: publish each flow run's table and markdown artifacts.
        store: True for the default store, a URL, or False/None for none.
    """
    if pool in _attached:  # the common case, on every stage call: no lock
        return
    cost_store = store_for(store)
    with _lock:
        if pool in _attached:
            return
        _attached.add(pool)
        if artifacts:
            _publishing.add(pool)
    # The store first: listeners run in order on one thread, and costs matter more than artifacts.
    # The publisher hands the store the idle time it learns of when it checks for expired keep-alives,
    # so that a run's artifacts and `esg-prefect costs` show the same figure from the moment it is final.
    attachment = attach_store(pool, cost_store, deployment_of=deployment_name) if cost_store is not None else None
    # It also reads back a run's calls that an earlier instance of a restarted pool service stored,
    # so that the run's artifacts show the store's figure, not this instance's part.
    if artifacts:
        if attachment is not None:
            attach_publisher(pool, on_idles=attachment.store_idles, complete=attachment.with_earlier)
        else:
            attach_publisher(pool)
    if cost_store is not None or artifacts:
        _closes_at_exit.add(pool)
        at_exit_before_threads_stop(_close_at_exit, weakref.ref(pool))


def publishes(pool: Pool) -> bool:
    """Does ``pool`` publish its flow runs' cost artifacts (it was given recorders with ``artifacts``)?"""
    return pool in _publishing


def at_exit_before_threads_stop(fn: Any, *args: Any) -> None:
    """Call ``fn(*args)`` at interpreter exit, before threads are joined and before ``atexit`` callbacks.

    Uses ``threading._register_atexit`` (what ``concurrent.futures`` uses, as does
    Prefect for its services); where it is missing or exit has begun, ``atexit``.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(fn, *args)
            return
        except RuntimeError:  # the interpreter is already shutting down
            pass
    atexit.register(fn, *args)


def close_before_prefect_stops(pool: Pool) -> None:
    """Close ``pool`` at exit before Prefect's event worker stops; called at each flow run's first stage call.

    The hook :func:`attach_recorders` registered may predate Prefect's event worker
    (a shared pool is made as the flow run starts): registered again here, after the
    run's first task event started that worker, it runs first. Closing twice is a no-op.
    """
    if pool in _closed_before_prefect or pool not in _closes_at_exit:  # the common case, once per flow run: no lock
        return
    with _lock:
        if pool in _closed_before_prefect:
            return
        _closed_before_prefect.add(pool)
    at_exit_before_threads_stop(_close_at_exit, weakref.ref(pool))


def _close_at_exit(ref: weakref.ref[Pool]) -> None:
    """Close a pool at interpreter exit (idempotent), so its runs' final costs are written while the API is up."""
    pool = ref()
    if pool is not None:
        pool.close()


def flush_prefect_events(timeout_s: float = 10.0) -> bool:
    """Wait, at most ``timeout_s``, until Prefect's event workers have sent what they hold; True if they did.

    A pool closing publishes its last runs' artifacts, and Prefect's client emits an
    event for each: a process that exits right after leaves them to the event worker's
    exit drain, which sends them but logs "Still processing items" (noise after Ctrl-C).
    Only workers already started are waited on (``EventsWorker.instance()`` would start
    one, and with no API set a temporary API for it), as Prefect's own task runner does.
    Bounded: a worker whose API stopped answering holds its queue.
    """
    from prefect.events.worker import EventsWorker

    started = dict(getattr(EventsWorker, "_instances", {}))  # Prefect's services share one registry
    workers = [w for w in started.values() if isinstance(w, EventsWorker)]
    if not workers:
        return True
    done = threading.Event()

    def wait() -> None:
        for worker in workers:
            worker.wait_until_empty()
        done.set()

    threading.Thread(target=wait, name="esg-flush-events", daemon=True).start()  # daemon: a stuck queue holds no exit
    return done.wait(timeout_s)


def close_stores() -> None:
    """Release the process's stores (tests; the engines close at exit anyway)."""
    with _lock:
        stores = list(_stores.values())
        _stores.clear()
    for s in stores:
        s.close()
