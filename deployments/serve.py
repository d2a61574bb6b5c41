"""Serve the example deployments without a work pool, with the pool service started alongside.

The no-work-pool alternative to ``prefect deploy`` + ``prefect worker start``:
one process registers the deployments of ``deployments/prefect.yaml`` (same
names, entrypoints, parameters, schedules and tags) with ``prefect.serve`` and
runs each of their flow runs in a subprocess, as a process worker would. It
first starts the pool service (``esg-prefect pool serve``) as a subprocess of
its own, and stops it (and the service's worker processes) when serving ends::

    prefect server start                    # another terminal; and PREFECT_API_URL set, see README.md
    python deployments/serve.py             # Ctrl-C stops serving, then the pool service

Options: ``--port`` of the pool service (4270), ``--backend`` of its workers
(``process`` or ``inline``), ``--pool-url`` to use a pool service that is
already running instead of starting one, ``--limit`` on concurrent flow runs
(at least 1), ``--only NAME`` (repeatable) to serve some deployments only. A bad
one is refused in one line before any flow is loaded, and so is a Prefect API
(``PREFECT_API_URL``) that is not set or does not answer; a pool service that does
not answer within 180 s (the script says once that it waits) ends it in one line.

Shutting down: Ctrl-C (SIGINT) or ``kill`` (SIGTERM) stops serving: Prefect
pauses the schedules and cancels the flow runs still in progress (they end
Cancelled, "Runner is shutting down."; a Ctrl-C is handled as a ``kill``). A
Ctrl-C typed in its terminal reaches the runs' processes too (one process
group): a run it interrupts first ends Crashed instead. Then it stops the pool service (SIGINT,
killed if it has not exited within 30 s, or at a second Ctrl-C), each step
printed as it ends. A Ctrl-C before serving starts (the wait for the pool
service, the flows loading) ends the script in one line, exit code 130, and a
``kill`` then does the same with exit code 143: a pool service it started is
stopped either way, and one that has not answered yet is ended with SIGTERM,
silently (a SIGINT made it print the traceback of the import it interrupted). Started in
the background of a shell script (``python deployments/serve.py &``), the
script ignores SIGINT, as the shell has every background command of a script
do: stop it with ``kill``. ``kill -USR1 <pid>`` prints the stacks of every thread of the
script, to see what a slow shutdown waits on. The script skips the
interpreter's last garbage collection on the way out (:func:`exit_fast`): with
torch and Prefect loaded it is a large part of the shutdown.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILE = ROOT / "deployments" / "prefect.yaml"
ALLOW = "esg_prefect.examples"
"""The module prefix the pool service may import stage code from: the example pipelines."""


def deployment_specs(path: Path = SPEC_FILE) -> list[dict[str, Any]]:
    """The ``deployments:`` entries of a ``prefect.yaml`` (YAML anchors resolved)."""
    with path.open() as f:
        doc = yaml.safe_load(f)
    specs = doc.get("deployments") if isinstance(doc, dict) else None
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"{path} has no deployments")
    return specs


def schedule_of(item: dict[str, Any]) -> Any:
    """A ``prefect.schedules`` schedule from one ``schedules:`` item (cron, interval or rrule)."""
    from prefect.schedules import Cron, Interval, RRule

    common: dict[str, Any] = {"timezone": item.get("timezone"), "parameters": item.get("parameters") or None}
    if "cron" in item:
        return Cron(item["cron"], **common)
    if "interval" in item:
        return Interval(datetime.timedelta(seconds=float(item["interval"])), **common)
    if "rrule" in item:
        return RRule(item["rrule"], **common)
    raise ValueError(f"a schedule needs cron, interval or rrule, got {sorted(item)}")


def unknown_names(specs: Sequence[dict[str, Any]], only: Sequence[str]) -> list[str]:
    """The names in ``only`` that no spec has, sorted (empty when every one is known)."""
    return sorted(set(only) - {s["name"] for s in specs})


def build_deployments(specs: Sequence[dict[str, Any]], only: Sequence[str] = ()) -> list[Any]:
    """``RunnerDeployment`` objects for ``prefect.serve``, one per spec (or per name in ``only``).

    Raises:
        ValueError: a name in ``only`` that no spec has.
    """
    from prefect.flows import load_flow_from_entrypoint

    if unknown := unknown_names(specs, only):
        raise ValueError(f"no deployment named {unknown} in {SPEC_FILE.name}")
    out = []
    for spec in specs:
        if only and spec["name"] not in only:
            continue
        path, _, attr = spec["entrypoint"].partition(":")
        flow: Any = load_flow_from_entrypoint(f"{ROOT / path}:{attr}")
        out.append(
            flow.to_deployment(
                name=spec["name"],
                description=spec.get("description"),
                tags=spec.get("tags"),
                parameters=spec.get("parameters") or {},
                schedules=[schedule_of(s) for s in spec.get("schedules") or []],
            )
        )
    return out


WAIT_S = 180.0
"""How long the script waits for the pool service to answer its health check (it imports torch first)."""


class ServiceDown(RuntimeError):
    """The pool service did not answer its health check in time, or exited: :func:`main` says so in one line."""


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = WAIT_S) -> None:
    """Wait for ``GET url/healthz``; fails early if ``proc`` (the service) exits.

    Says once that it waits, when the first check finds nothing there yet: a service
    that is not up would otherwise leave the script silent for ``timeout_s``.

    Raises:
        ServiceDown: ``proc`` exited, or ``url`` did not answer within ``timeout_s``.
    """
    give_up = time.monotonic() + timeout_s
    said = False
    while True:
        if proc is not None and proc.poll() is not None:
            raise ServiceDown(f"the pool service exited with code {proc.returncode} before it answered at {url}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        if not said:  # before the deadline's test: a first check slower than the bound still says why it waits
            print(f"waiting up to {timeout_s:g} s for the pool service at {url} to answer", flush=True)
            said = True
        if time.monotonic() >= give_up:
            raise ServiceDown(f"the pool service at {url} did not answer GET /healthz within {timeout_s:g} s")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0, sig: int = signal.SIGINT, quiet: bool = False) -> None:
    """Signal a process started in a session of its own; kill what is left of its group after ``timeout_s``.

    A second Ctrl-C while it waits kills the group at once rather than leave the service running.
    ``quiet``: say nothing (a service that never answered was never announced either).
    """
    if proc.poll() is None:
        if not quiet:
            print(f"stopping the pool service (pid {proc.pid})", flush=True)
        proc.send_signal(sig)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its worker processes, should any outlive it
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def pool_service(port: int, backend: str, sets: Sequence[str] = (), wait_s: float = WAIT_S) -> Iterator[str]:
    """Run ``esg-prefect pool serve`` for the example stages on 127.0.0.1:``port``; yields its URL.

    ``sets`` are its ``--set KEY=VALUE`` overrides of the ESG settings (keep-alive, SLO percentile, ...);
    ``wait_s`` bounds the wait for it to answer (:func:`wait_healthy`).
    """
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "esg_prefect.cli", "pool", "serve", "--allow", ALLOW]
    cmd += ["--port", str(port), "--backend", backend]
    for pair in sets:
        cmd += ["--set", pair]
    # A session of its own: Ctrl-C reaches this script only, which stops serving first, then the service.
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        wait_healthy(url, proc, wait_s)
    except BaseException:  # Ctrl-C while it starts, or it exited or never answered (ServiceDown says so)
        # SIGTERM ends a service still importing without the traceback a SIGINT prints there.
        stop(proc, sig=signal.SIGTERM, quiet=True)
        raise
    print(f"pool service on {url} (pid {proc.pid})", flush=True)
    try:
        yield url
    finally:
        began = time.monotonic()
        stop(proc)
        print(f"pool service stopped in {time.monotonic() - began:.1f} s (exit code {proc.returncode})", flush=True)


def exit_fast() -> None:
    """Spare the interpreter its last full garbage collection: everything is closed, the OS frees the memory.

    Objects alive now move to the collector's permanent generation (:func:`gc.freeze`), which
    the collections run at interpreter exit skip; ``atexit`` callbacks (Prefect's flushing of
    events and logs) still run, and objects they create are collected as usual.
    """
    gc.freeze()


API_REMEDY = "start it with `prefect server start`, or point PREFECT_API_URL at it"
"""What to do about a Prefect API that does not answer, checked before the pool service starts.

Serving against a server that is not up started the service, loaded the flows, then ended in
httpx's traceback (``ConnectError``) naming no URL.
"""


def make_parser() -> argparse.ArgumentParser:
    """The script's options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=4270, help="port of the pool service to start")
    parser.add_argument("--backend", choices=("process", "inline"), default="process", help="pool service workers")
    parser.add_argument("--pool-url", default=None, help="use this running pool service instead of starting one")
    parser.add_argument("--limit", type=int, default=None, help="most flow runs at once (default: no limit)")
    parser.add_argument("--only", action="append", default=[], help="serve only this deployment (repeat)")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ESG setting of the pool service it starts (repeat), e.g. --set keep_alive_s=10",
    )
    return parser


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Refuse a bad option in one line (``parser.error``, exit code 2); the deployments' specs otherwise."""
    if not 1 <= args.port <= 65535:  # as `esg-prefect pool serve` checks it; 0 (any free port) leaves no URL here
        parser.error(f"--port: must be a TCP port, 1 to 65535, got {args.port}")
    if args.limit is not None and args.limit < 1:  # 0 served nothing, ever ("at capacity"); < 0 was a traceback
        parser.error(f"--limit: must be at least 1 flow run at once (leave it out for no limit), got {args.limit}")
    if args.pool_url is not None:
        from esg_prefect.exceptions import InvalidInputError
        from esg_prefect.service.address import check_address

        try:
            check_address(args.pool_url, "--pool-url")
        except InvalidInputError as exc:
            parser.error(str(exc))
    if args.pool_url and args.sets:
        parser.error("--set applies to the pool service this script starts; it cannot change one at --pool-url")
    if args.sets:  # refused here in one line, not by the service once it has started
        import typer

        from esg_prefect.cli.args import parse_settings
        from esg_prefect.scheduling import ESGSettings

        try:
            parse_settings(ESGSettings(), args.sets)
        except typer.BadParameter as exc:
            parser.error(f"--set: {exc.message}")
    specs = deployment_specs()
    if unknown := unknown_names(specs, args.only):
        names = ", ".join(s["name"] for s in specs)
        parser.error(
            f"--only: no deployment named {', '.join(map(repr, unknown))} in {SPEC_FILE.name} (it has: {names})"
        )

    from esg_prefect.cli.pool import bind_error

    if not args.pool_url and (why := bind_error("127.0.0.1", args.port)):
        # Else the service started here exits at once, and the one already there answers its health check.
        parser.error(
            f"--port {args.port}: cannot listen on 127.0.0.1:{args.port} ({why}); give another --port, "
            "or --pool-url to use the service there"
        )
    return specs


INTERRUPTED = 130
"""The exit code of a Ctrl-C that reaches the script itself (128 + SIGINT), as a shell reports one."""

TERMINATED = 143
"""The exit code of a ``kill`` (SIGTERM) that reaches the script itself (128 + SIGTERM)."""


class Terminated(BaseException):
    """A SIGTERM before Prefect's serving took the signal over: unwinds as a Ctrl-C does.

    SIGTERM's default ends the process where it stands, leaving the pool service it
    started (a session of its own) running; raised instead, it passes through
    :func:`pool_service`, which stops the service, and :func:`main` ends in one line.
    """


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def _stop_like_kill(signum: int, frame: object) -> None:
    """Ctrl-C while serving: stop as a ``kill`` does, so that the runs in progress end Cancelled.

    Prefect's serving stops on SIGTERM through its runner's handler (installed as serving starts),
    which cancels every run in progress ("Runner is shutting down."). A Ctrl-C only unwound its
    event loop: the runs' processes ended with it and their runs stayed Running on the API, for
    good. Before that handler is there, or at a second Ctrl-C, it interrupts as ever.
    """
    handler = signal.getsignal(signal.SIGTERM)
    runner = getattr(handler, "__self__", None)
    if runner is None or not getattr(runner, "started", False) or getattr(runner, "stopping", True):
        raise KeyboardInterrupt
    print("Ctrl-C: stopping serving, the flow runs in progress are cancelled (Ctrl-C again: at once)", flush=True)
    handler(signal.SIGTERM, frame)


@contextlib.contextmanager
def ctrl_c_stops_like_kill() -> Iterator[None]:
    """While serving, a Ctrl-C stops as a ``kill`` does (:func:`_stop_like_kill`); the handler before it is put back.

    Not where SIGINT is ignored: started in the background of a shell script, the script has
    it ignored, and a Ctrl-C typed for the work in the foreground stopped serving and cancelled
    its runs. Nor where its handler was not set from Python (``getsignal`` gives None), since
    that one could not be put back; nor outside the main thread, where no handler can be set.
    """
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or before is None or before is signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, _stop_like_kill)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def ending(exc: KeyboardInterrupt | Terminated, serving: bool) -> tuple[int, str]:
    """The exit code and one line for a Ctrl-C or a SIGTERM that Prefect's serving did not handle."""
    code, word = (TERMINATED, "terminated") if isinstance(exc, Terminated) else (INTERRUPTED, "interrupted")
    return code, word if serving else f"{word} before serving started"


def main(argv: Sequence[str] | None = None, wait_s: float = WAIT_S) -> None:
    """Start the pool service (unless ``--pool-url``), then serve the deployments until interrupted.

    Bad options are refused in one line before any flow is loaded or service started;
    ``wait_s`` bounds the wait for the pool service to answer (a parameter for tests).
    A Ctrl-C before serving starts (imports, the wait for the pool service, the flows
    loading) ends it in one line, exit code 130, a SIGTERM likewise with 143, the pool
    service stopped: once serving, Prefect's ``serve`` handles both. The SIGTERM handler
    is set here, and the one before it restored on the way out.
    """
    parser = make_parser()
    args = parser.parse_args(argv)
    serving = False
    # Until Prefect's serve installs its own SIGTERM handler (it stops serving, then the stack below unwinds).
    main_thread = threading.current_thread() is threading.main_thread()  # where a handler can be set
    before = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        specs = check_options(parser, args)
        from prefect import serve
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            parser.error("PREFECT_API_URL is not set: start `prefect server start` and point PREFECT_API_URL at it")
        from esg_prefect.integration.api_check import api_error

        if why := api_error(PREFECT_API_URL.value(), remedy=API_REMEDY):  # else the service started, then a traceback
            parser.error(why)
        url = (args.pool_url or f"http://127.0.0.1:{args.port}").rstrip("/")
        if args.pool_url:  # before the flows load (seconds of imports): a service that is not there costs one line
            try:
                wait_healthy(url, timeout_s=wait_s)
            except ServiceDown as exc:
                parser.error(f"--pool-url: {exc}; start `esg-prefect pool serve` there, or leave --pool-url out")
        # Set before the flows are loaded; the flow runs' processes inherit it, and deployments/flows.py
        # reads it when Prefect loads the flow there.
        os.environ["ESG_PREFECT_POOL_URL"] = url
        deployments = build_deployments(specs, args.only)
        with contextlib.ExitStack() as stack:
            if not args.pool_url:
                stack.enter_context(pool_service(args.port, args.backend, args.sets, wait_s))
            serving = True
            with ctrl_c_stops_like_kill():
                serve(*deployments, limit=args.limit)
            print("serving stopped", flush=True)
    except ServiceDown as exc:  # the service it started exited (its own output says why) or never answered
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    except (KeyboardInterrupt, Terminated) as exc:  # the pool service it started, if any, is stopped by now
        code, line = ending(exc, serving)
        parser.exit(code, f"{parser.prog}: {line}\n")
    finally:
        if before is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <pid>: where is it waiting?
    main()
    exit_fast()
