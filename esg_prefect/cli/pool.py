"""``esg-prefect pool serve``: the pool service, shared by flow runs of many processes.

``esg-prefect pool pause`` / ``resume`` hold and release a running service's
dispatching (calls keep queueing; none is failed): to release a burst as one
decision, or to keep the queues while a device is serviced.
"""

from __future__ import annotations

import os

import typer

pool_app = typer.Typer(help="The pool service: one ESG pool for the flow runs of many processes.", no_args_is_help=True)


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
    profile: str = typer.Option("", help="Latency profile CSV; default the shipped profiles."),
    results_db: str = typer.Option("", help="SQLite file keeping finished outcomes across restarts."),
    results_ttl_s: float = typer.Option(3600.0, "--results-ttl-s", help="Seconds a finished outcome is kept."),
    results_max_mb: float = typer.Option(256.0, "--results-max-mb", help="Most MB of kept outcomes; oldest go first."),
    max_pending: int = typer.Option(10_000, help="Calls in flight before new ones get 429."),
    ssl_certfile: str = typer.Option("", "--ssl-certfile", help="TLS certificate (PEM): serve HTTPS."),
    ssl_keyfile: str = typer.Option("", "--ssl-keyfile", help="TLS private key (PEM) of --ssl-certfile."),
    store: str = typer.Option("", help="Cost store URL (default: SQLite under PREFECT_HOME); off to disable."),
    artifacts: bool = typer.Option(True, help="Publish each flow run's cost artifacts to the Prefect API."),
) -> None:
    """Serve one pool over HTTP until interrupted."""
    import uvicorn

    from esg_prefect.exceptions import InvalidInputError
    from esg_prefect.model.profile import LatencyProfile
    from esg_prefect.runtime.pool import Pool
    from esg_prefect.runtime.workers import InlineBackend, LocalProcessBackend, WorkerBackend
    from esg_prefect.service.app import PoolService, check_bind
    from esg_prefect.service.results import ResultCache

    token = os.environ.get(token_env) or None
    try:
        check_bind(host, token)
        cache = ResultCache(results_db or ":memory:", results_ttl_s, int(results_max_mb * 1024 * 1024))
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc)) from None
    if bool(ssl_certfile) != bool(ssl_keyfile):
        raise typer.BadParameter("--ssl-certfile and --ssl-keyfile go together")
    if host not in ("127.0.0.1", "localhost", "::1") and not ssl_certfile:
        typer.echo(
            f"warning: serving {host} over plain HTTP: the token travels in clear text. Use --ssl-certfile/"
            "--ssl-keyfile, or put the service behind a TLS proxy.",
            err=True,
        )
    if backend not in ("process", "inline", "ray"):
        raise typer.BadParameter(f"backend must be 'process', 'inline' or 'ray', got {backend!r}")
    be: WorkerBackend
    if backend == "ray":
        from esg_prefect.runtime.ray_backend import RayBackend

        try:
            be = RayBackend(address=None if ray_address == "local" else ray_address)
        except ImportError as exc:  # the optional extra is missing: say how to install it
            raise typer.BadParameter(str(exc)) from exc
    else:
        be = InlineBackend() if backend == "inline" else LocalProcessBackend()
    pool = Pool(LatencyProfile.from_csv(profile) if profile else None, scheduler=scheduler, backend=be)
    from esg_prefect.integration.recording import attach_recorders, remember_deployment

    attach_recorders(pool, artifacts=artifacts, store=False if store == "off" else (store or True))
    service = PoolService(pool, allow, token, cache, max_pending, on_call=remember_deployment)
    scheme = "https" if ssl_certfile else "http"
    typer.echo(f"esg-prefect pool service on {scheme}://{host}:{port} (stages from {', '.join(allow)})")
    try:
        uvicorn.run(
            service.app(),
            host=host,
            port=port,
            log_level="warning",
            ssl_certfile=ssl_certfile or None,
            ssl_keyfile=ssl_keyfile or None,
        )
    finally:
        service.closing = True
        pool.close()
        cache.close()


def _admin(url: str, token_env: str, action: str) -> None:
    import httpx

    token = os.environ.get(token_env) or None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.post(f"{url.rstrip('/')}/v1/{action}", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        typer.echo(f"could not reach the pool service at {url!r}: {exc}", err=True)
        raise typer.Exit(1) from None
    if resp.status_code != 200:
        typer.echo(f"{action} refused by {url!r}: HTTP {resp.status_code} {resp.text}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{url}: {'paused' if resp.json()['paused'] else 'resumed'}")


def _admin_command(action: str, doc: str) -> None:
    """Register ``esg-prefect pool <action>`` (pause, resume): one POST to the running service."""

    def command(
        url: str = typer.Option("http://127.0.0.1:4270", help="The pool service's address."),
        token_env: str = typer.Option("ESG_PREFECT_TOKEN", help="Environment variable holding the bearer token."),
    ) -> None:
        _admin(url, token_env, action)

    command.__doc__ = doc
    pool_app.command(action)(command)


_admin_command("pause", "Hold a running service's dispatching: calls keep queueing until `resume`.")
_admin_command("resume", "Release a pause: what queued meanwhile is scheduled at once.")
