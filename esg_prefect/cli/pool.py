"""``esg-prefect pool serve``: the pool service, shared by flow runs of many processes.

``esg-prefect pool pause`` / ``resume`` hold and release a running service's
dispatching (calls keep queueing; none is failed): to release a burst as one
decision, or to keep the queues while a device is serviced.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from esg_prefect.wording import counted

pool_app = typer.Typer(help="The pool service: one ESG pool for the flow runs of many processes.", no_args_is_help=True)


SHUTDOWN_GRACE_S = 10
"""How long Ctrl-C waits for open requests: a long poll holds one for up to ``wait_s`` (50 s); one still
waiting after it is answered 503, and its client posts the call again once a service is back."""


def unimportable(allow: Sequence[str]) -> list[str]:
    """The ``--allow`` prefixes whose top-level module cannot be imported in this process (a likely typo)."""
    out = []
    for prefix in allow:
        top = prefix.split(".")[0]
        if not top.isidentifier() or importlib.util.find_spec(top) is None:
            out.append(prefix)
    return out


def bind_error(host: str, port: int) -> str:
    """Why ``host:port`` cannot be listened on now ("" when it can, or for port 0), checked before the pool
    starts, so that a port in use is one line, not a traceback after the service said it was up."""
    if port == 0:
        return ""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a closing socket is no bar
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


LOG_LEVELS = ("debug", "info", "warning", "error")


def stop_message(in_flight: int) -> str:
    """What the first Ctrl-C says: what becomes of the calls in flight, and how to stop at once."""
    if not in_flight:
        return "stopping: no calls in flight"
    return (
        f"stopping: {in_flight} call{'s' * (in_flight != 1)} in flight; a request open gets its answer within "
        f"{SHUTDOWN_GRACE_S} s or a 503, and callers post their calls again once a service is back at this "
        "address; Ctrl-C again to stop at once"
    )


def announcing_server(config: Any, in_flight: Callable[[], int]) -> Any:
    """A uvicorn server whose first Ctrl-C (or SIGTERM) says what becomes of the calls in flight: without
    it the service is silent for the grace, then logs only uvicorn's 'Cancel N running task(s)'.

    A SIGTERM is not raised again once serving stops (uvicorn's own way, which killed the process before
    the pool and the stores were closed): ``terminated`` says it came, and the command exits 143 after
    its cleanup.
    """
    import uvicorn

    class Server(uvicorn.Server):
        terminated = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                typer.echo(stop_message(in_flight()), err=True)
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                self.terminated = True
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list) and sig in captured:
                    captured.remove(sig)

    return Server(config)


def register(app: typer.Typer) -> None:
    """Add the ``pool`` command group."""
    app.add_typer(pool_app, name="pool")


@pool_app.command("serve")
def serve(
    allow: list[str] = typer.Option(..., "--allow", help="Module prefix stage code may be imported from (repeat)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs a token."),
    port: int = typer.Option(4270, help="Port to bind."),
    token_env: str = typer.Option("ESG_PREFECT_TOKEN", help="Environment variable holding the bearer token."),
    backend: str = typer.Option(
        "process", help="'process' (worker processes), 'inline' (threads) or 'ray' (Ray actors; the ray extra)."
    ),
    ray_address: str = typer.Option(
        "auto",
        "--ray-address",
        help="Ray cluster for --backend ray: 'auto' (this machine's `ray start`), 'ray://host:10001', or 'local'.",
    ),
    scheduler: str = typer.Option("esg", help="Scheduler name (esg-prefect schedulers)."),
    profile: str = typer.Option(
        "",
        help="Latency profile CSV, or a shipped profile's name (nvidia_gpu, examples_cpu, ...; a name wins over "
        "a file of that name: write ./NAME for the file); default nvidia_gpu and examples_cpu merged.",
    ),
    results_db: str = typer.Option("", help="SQLite file keeping finished outcomes across restarts."),
    results_ttl_s: float = typer.Option(3600.0, "--results-ttl-s", help="Seconds a finished outcome is kept."),
    results_max_mb: float = typer.Option(256.0, "--results-max-mb", help="Most MB of kept outcomes; oldest go first."),
    max_pending: int = typer.Option(10_000, help="Calls in flight before new ones get 429."),
    hung_batch_s: float = typer.Option(
        60.0, "--hung-batch-s", help="Stop a worker whose batch ran this long and 20x its prediction; 0: never."
    ),
    ssl_certfile: str = typer.Option("", "--ssl-certfile", help="TLS certificate (PEM): serve HTTPS."),
    ssl_keyfile: str = typer.Option("", "--ssl-keyfile", help="TLS private key (PEM) of --ssl-certfile."),
    store: str = typer.Option("", help="Cost store URL (default: SQLite under PREFECT_HOME); off to disable."),
    artifacts: bool = typer.Option(
        True,
        help="Publish each flow run's cost artifacts and tags to the Prefect API at PREFECT_API_URL (unset: a "
        "temporary Prefect API that this service starts and that ends with it).",
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="Override an ESG setting, KEY=VALUE (repeat), e.g. --set keep_alive_s=10."
    ),
    log_level: str = typer.Option(
        "warning",
        "--log-level",
        help="warning (problems only), info (every batch, worker start and stop, and request), or debug.",
    ),
) -> None:
    """Serve one pool over HTTP until interrupted; stage modules are imported from the working directory too."""
    from esg_prefect.cli.workdir import import_from_cwd

    import_from_cwd()  # before the workers' fork server starts: they import the stages, and inherit the path
    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError

    from esg_prefect.cli.args import check_number, check_scheduler, parse_settings
    from esg_prefect.exceptions import ConfigError, ESGError, InvalidInputError
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import InlineBackend, LocalProcessBackend, WorkerBackend
    from esg_prefect.scheduling import ESGSettings
    from esg_prefect.service.app import PoolService, check_bind
    from esg_prefect.service.results import ResultCache
    from esg_prefect.store.engine import resolve_url, safe_url

    if not 0 <= port <= 65535:
        raise typer.BadParameter(f"must be a TCP port, 0 to 65535, got {port}", param_hint="--port")
    empty = [prefix for prefix in allow if not prefix.strip()]
    if empty:
        raise typer.BadParameter(
            f"give a module prefix stage code may be imported from (e.g. my_pipelines), got {empty[0]!r}",
            param_hint="--allow",
        )
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", param_hint="--log-level")
    check_number(results_ttl_s, "--results-ttl-s", "seconds a finished outcome is kept")
    check_number(results_max_mb, "--results-max-mb", "MB of kept outcomes")
    if not hung_batch_s >= 0:
        raise typer.BadParameter(f"must be seconds >= 0 (0: no limit), got {hung_batch_s}", param_hint="--hung-batch-s")
    if max_pending < 1:
        raise typer.BadParameter(f"must be at least 1 (calls in flight), got {max_pending}", param_hint="--max-pending")
    check_scheduler(scheduler)
    settings = parse_settings(ESGSettings(), sets)
    token = os.environ.get(token_env) or None
    try:
        check_bind(host, token)
    except InvalidInputError as exc:  # named by where the token comes from: --token-env's variable
        if token is None:
            why = (
                f"binding to {host!r} exposes the pool beyond this machine: it needs a token, and ${token_env} "
                "(--token-env) is not set"
            )
            raise typer.BadParameter(why, param_hint="--host") from None
        raise typer.BadParameter(str(exc), param_hint=f"${token_env} (--token-env)") from None
    taken = bind_error(host, port)
    if taken:
        raise typer.BadParameter(f"cannot listen on {host}:{port}: {taken}", param_hint="--port")
    if bool(ssl_certfile) != bool(ssl_keyfile):
        raise typer.BadParameter("--ssl-certfile and --ssl-keyfile go together")
    for hint, path in (("--ssl-certfile", ssl_certfile), ("--ssl-keyfile", ssl_keyfile)):
        if path and not Path(path).is_file():
            raise typer.BadParameter(f"no file {path!r}; give a PEM file", param_hint=hint)
    if host not in ("127.0.0.1", "localhost", "::1") and not ssl_certfile:
        typer.echo(
            f"warning: serving {host} over plain HTTP: the token travels in clear text. Use --ssl-certfile/"
            "--ssl-keyfile, or put the service behind a TLS proxy.",
            err=True,
        )
    if backend not in ("process", "inline", "ray"):
        raise typer.BadParameter(f"must be 'process', 'inline' or 'ray', got {backend!r}", param_hint="--backend")
    latency = None
    if profile:  # a shipped name wins over a file of that name: esg_prefect.model.profile_source
        from esg_prefect.model.profile_source import profile_path, read_profile

        try:
            csv = profile_path(profile)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--profile") from None
        try:  # as the simulator loads it: a shipped table with the shipped size model
            latency = read_profile(csv)
        except (OSError, InvalidInputError) as exc:
            raise typer.BadParameter(
                f"cannot read {profile!r} ({exc}); give a latency profile CSV (esg-prefect profile writes one)",
                param_hint="--profile",
            ) from None
    if store and store != "off":
        try:
            resolve_url(store)  # a URL the store cannot use: named with its option before any pool starts
        except ESGError as exc:
            raise typer.BadParameter(str(exc), param_hint="--store") from None
    try:
        cache = ResultCache(results_db or ":memory:", results_ttl_s, int(results_max_mb * 1024 * 1024))
    except (OSError, sqlite3.Error, InvalidInputError) as exc:
        raise typer.BadParameter(f"cannot open {results_db!r}: {exc}", param_hint="--results-db") from None
    be: WorkerBackend
    if backend == "ray":
        from esg_prefect.runtime.ray_backend import RayBackend

        try:
            be = RayBackend(address=None if ray_address == "local" else ray_address)
        except ImportError as exc:  # the optional extra is missing: say how to install it
            cache.close()
            raise typer.BadParameter(str(exc), param_hint="--backend") from exc
        except ConfigError as exc:  # no cluster at that address
            cache.close()
            remedy = "start one with `ray start --head`, or use --ray-address local" if ray_address == "auto" else ""
            raise typer.BadParameter(f"{exc}{'; ' + remedy if remedy else ''}", param_hint="--ray-address") from None
    else:
        be = InlineBackend() if backend == "inline" else LocalProcessBackend()
    pool = Pool(latency, scheduler=scheduler, settings=settings, backend=be, hung_batch_s=hung_batch_s or None)
    from esg_prefect.integration.api_check import api_error, prefect_api_url
    from esg_prefect.integration.recording import attach_recorders, flush_prefect_events, remember_deployment

    try:
        attach_recorders(pool, artifacts=artifacts, store=False if store == "off" else (store or True))
    except (ESGError, SQLAlchemyError) as exc:  # a store that cannot be opened: one line, not a traceback
        pool.close()
        cache.close()
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        where = safe_url(resolve_url(store or None)) if store != "off" else "off"
        raise typer.BadParameter(
            f"cannot open the cost store at {where}: {why}; give a reachable sqlite:// or postgresql:// URL, "
            "or --store off",
            param_hint="--store (or ESG_PREFECT_STORE_URL)" if not store else "--store",
        ) from None
    service = PoolService(pool, allow, token, cache, max_pending, on_call=remember_deployment)
    for prefix in unimportable(allow):
        typer.echo(
            f"warning: --allow {prefix!r}: no module {prefix.split('.')[0]!r} can be imported here (the working "
            "directory and PYTHONPATH are searched); calls to its stages will fail unless the workers can import "
            "it (a Ray runtime_env, for one)",
            err=True,
        )
    if artifacts and not prefect_api_url():
        typer.echo(
            "warning: no Prefect API is set (PREFECT_API_URL): each run's cost artifacts and tags go to a temporary "
            "Prefect API that this service starts and that ends with it, not to the API your flows report to; to "
            "see them in the UI, run `prefect server start` and set PREFECT_API_URL to it for this service and your "
            "flows, or pass --no-artifacts (the cost store records the runs either way)",
            err=True,
        )
    elif artifacts and (silent := api_error(prefect_api_url(), remedy=API_REMEDY, timeout_s=API_CHECK_S)):
        typer.echo(f"warning: {silent}", err=True)
    logging.getLogger("esg_prefect").setLevel(log_level.upper())
    scheme = "https" if ssl_certfile else "http"
    typer.echo(f"esg-prefect pool service on {scheme}://{host}:{port} (stages from {', '.join(allow)})")
    config = uvicorn.Config(
        service.app(),
        host=host,
        port=port,
        log_level=log_level,
        ssl_certfile=ssl_certfile or None,
        ssl_keyfile=ssl_keyfile or None,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = announcing_server(config, lambda: service.calls_in_flight)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
            server.run()
    finally:
        service.closing = True
        pool.close()  # publishes the runs still pending: their artifacts' events are sent before the exit
        cache.close()
        flush_prefect_events()
    if not server.started:  # it could not listen: uvicorn logged why
        raise typer.Exit(3)
    typer.echo("esg-prefect pool service stopped", err=True)
    if server.terminated:
        raise typer.Exit(128 + signal.SIGTERM)  # as a process the signal ended, after the cleanup


API_REMEDY = (
    "each run's cost artifacts and tags will not reach it until it does; start it with "
    "`prefect server start`, or set PREFECT_API_URL to the API your flows report to, or pass "
    "--no-artifacts (the cost store records the runs either way)"
)
"""What to do about a Prefect API that does not answer as the service starts.

A warning, not a refusal: the server may come up after the service, and the cost store records
the runs either way. Without it the first sign was a failed post, after the runs' logs had said
their cost was published as an artifact.
"""

API_CHECK_S = 2.0
"""How long the service's start waits for the Prefect API's health check."""


def _headline(url: str, body: dict[str, Any]) -> str:
    """``pool status``'s first line: paused or not, calls in flight, batches and calls so far, the bill."""
    totals = body.get("totals", {})
    batches, calls = sum(totals.get("batches", {}).values()), sum(totals.get("calls", {}).values())
    return (
        f"{url}: {'[yellow]paused[/]' if body.get('paused') else 'dispatching'}; "
        f"{counted(body.get('calls_in_flight', 0), 'call')} in flight; {counted(batches, 'batch', 'batches')} of "
        f"{counted(calls, 'call')} so far; {bill_text(totals)}"
    )


def _admin(url: str, token_env: str, action: str) -> None:
    resp = _ask(url, token_env, "POST", f"/v1/{action}", action)
    typer.echo(f"{url}: {'paused' if resp.json()['paused'] else 'resumed'}")


def _ask(url: str, token_env: str, method: str, path: str, what: str) -> Any:
    """One request to the running service with its token: the 200 answer, or one line and exit 1."""
    import httpx

    from esg_prefect.service.address import address_refusal

    if refusal := address_refusal(url):  # a value to correct, not a service to start
        raise typer.BadParameter(refusal, param_hint="--url (or ESG_PREFECT_POOL_URL)")
    token = os.environ.get(token_env) or None
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        resp = httpx.request(
            method, f"{url.rstrip('/')}{path}", headers=headers, timeout=httpx.Timeout(30.0, connect=5.0)
        )
    except httpx.HTTPError as exc:
        raise _unreachable(url, exc) from None
    if resp.status_code != 200:
        typer.echo(f"{what} refused by {url!r}: HTTP {resp.status_code} {resp.text}", err=True)
        raise typer.Exit(1)
    return resp


ADDRESS_HELP = "The pool service's address, as ESGTaskRunner(address=...) takes it."


def _admin_command(action: str, doc: str) -> None:
    """Register ``esg-prefect pool <action>`` (pause, resume): one POST to the running service."""

    def command(
        url: str = typer.Option(
            "http://127.0.0.1:4270", "--url", "--address", envvar="ESG_PREFECT_POOL_URL", help=ADDRESS_HELP
        ),
        token_env: str = typer.Option("ESG_PREFECT_TOKEN", help="Environment variable holding the bearer token."),
    ) -> None:
        _admin(url, token_env, action)

    command.__doc__ = doc
    pool_app.command(action)(command)


_admin_command("pause", "Hold a running service's dispatching: calls keep queueing until `resume`.")
_admin_command("resume", "Release a pause: what queued meanwhile is scheduled at once.")


@pool_app.command("status")
def status(
    url: str = typer.Option(
        "http://127.0.0.1:4270", "--url", "--address", envvar="ESG_PREFECT_POOL_URL", help=ADDRESS_HELP
    ),
    token_env: str = typer.Option("ESG_PREFECT_TOKEN", help="Environment variable holding the bearer token."),
    as_json: bool = typer.Option(False, "--json", help="Print the service's /metrics JSON as it is."),
) -> None:
    """What a running service holds now: queues, workers, and the bill so far."""
    import json

    body = _get_metrics(url, token_env)
    if as_json:
        typer.echo(json.dumps(body, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(_headline(url, body), highlight=False)
    queues = Table("queue (workflow/stage)", "waiting", title="queues")
    for key, depth in sorted(body.get("queue_depths", {}).items()):
        queues.add_row(key, str(depth))
    workers = Table("worker", "stage", "hardware", "share", "vCPUs", "state", title="workers")
    for w in body.get("workers", []):
        share = f"{w.get('gpu_share', 0.0):g}" if w.get("hardware") != "cpu" else "-"
        state = "busy" if w.get("busy") else "idle"
        workers.add_row(str(w.get("worker_id")), str(w.get("stage")), str(w.get("hardware")), share,
                        str(w.get("vcpus")), state)  # fmt: skip
    console.print(queues if queues.row_count else "no queued calls", highlight=False)
    console.print(workers if workers.row_count else "no workers", highlight=False)


def bill_text(totals: dict[str, Any]) -> str:
    """The bill so far, split as the run artifacts and ``esg-prefect costs`` split it: busy + idle.

    Busy includes the cold starts of batches (a batch's worker start is billed in
    its batch, as the artifacts bill it); their part of it is shown beside it. Idle
    is the warm idle time, closed and still open.

    Example:
        >>> bill_text({"bill_dollars": {"busy": 1.5, "cold_start": 0.5, "idle": 0.75}, "calls": {"s": 4}})
        'bill $2.75 (busy $2.00 + idle $0.750; cold starts $0.500 of the busy part), $0.688 per call'
    """
    from esg_prefect.model.attribution import COST_UNIT
    from esg_prefect.model.money import money_column

    bill = totals.get("bill_dollars", {})
    cold = bill.get("cold_start", 0.0)
    busy = bill.get("busy", 0.0) + cold
    idle = bill.get("idle", 0.0) + totals.get("open_idle_dollars", 0.0)
    calls = sum(totals.get("calls", {}).values())
    whole = busy + idle
    # The line's figures in one notation, as a table's column: never 0.00000107 beside 5.86e-7.
    w, b, i, c, per_call = money_column([whole, busy, idle, cold, whole / calls if calls else 0.0], COST_UNIT)
    text = f"bill {w} (busy {b} + idle {i}; cold starts {c} of the busy part)"
    return text + (f", {per_call} per call" if calls else "")


def _get_metrics(url: str, token_env: str) -> dict[str, Any]:
    """The service's ``/metrics`` JSON, or one line naming the address and exit 1."""
    body: dict[str, Any] = _ask(url, token_env, "GET", "/metrics", "status").json()
    return body


def _unreachable(url: str, exc: Exception) -> typer.Exit:
    """Say, in one line, that no service answers at ``url`` and how to start one; the exit to raise."""
    typer.echo(
        f"could not reach the pool service at {url!r} ({exc or type(exc).__name__}): start it with "
        "`esg-prefect pool serve --allow MODULE`, or give its address with --url",
        err=True,
    )
    return typer.Exit(1)
