"""Is the Prefect API there? Asked once, up front, so that a server that is not up yet costs one line.

Without this check a flow run against a ``PREFECT_API_URL`` that does not
answer retries for about a minute and ends in a traceback hundreds of lines
long. :func:`check_prefect_api` asks the API's health endpoint once, with a
short timeout, and :func:`require_prefect_api` turns a failure into one line on
stderr (the URL, and what to run) and exit code 2, for scripts such as
``flows/*.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from esg_prefect.exceptions import InvalidInputError

DEFAULT_TIMEOUT_S = 5.0


def prefect_api_url() -> str | None:
    """The Prefect API URL in force: ``$PREFECT_API_URL``, else the active Prefect profile's; None if neither.

    None means Prefect starts a temporary API of its own, which needs no check.
    """
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


UNSET_OR_START = "start it with `prefect server start`, or unset PREFECT_API_URL to let Prefect start a temporary one"
"""What to do about an API that does not answer, where Prefect's own temporary API would do as well."""


def check_prefect_api(url: str | None, timeout_s: float = DEFAULT_TIMEOUT_S, remedy: str = UNSET_OR_START) -> None:
    """Refuse, in one message, a Prefect API at ``url`` that does not answer its health check in ``timeout_s``.

    ``url`` None or empty passes: Prefect then starts its own API. ``remedy`` ends the message: what to
    run (a caller that needs this very server says so instead of offering a temporary API).

    Raises:
        InvalidInputError: naming the URL and what to run.
    """
    if not url:
        return
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        raise InvalidInputError(
            f"the Prefect API at PREFECT_API_URL={url} does not answer ({type(exc).__name__}): {remedy}"
        ) from None


def api_error(url: str | None, remedy: str = UNSET_OR_START, timeout_s: float = DEFAULT_TIMEOUT_S) -> str | None:
    """Why the Prefect API at ``url`` does not answer (:func:`check_prefect_api`'s message), or None when it does.

    For a caller that words the outcome itself: a refusal of its own, or a warning where the
    server may still come up later.
    """
    try:
        check_prefect_api(url, timeout_s=timeout_s, remedy=remedy)
    except InvalidInputError as exc:
        return str(exc)
    return None


def require_prefect_api(timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """For scripts: check the API in force (:func:`prefect_api_url`); if it does not answer, one line and exit 2."""
    try:
        check_prefect_api(prefect_api_url(), timeout_s)
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


EPHEMERAL_DB = "sqlite+aiosqlite:///:memory:"


def ephemeral_api_defaults() -> None:
    """When Prefect will start its own temporary API, give it an in-memory database; call before importing prefect.

    With no ``PREFECT_API_URL``, Prefect starts a temporary API whose default
    database is a SQLite file. Under tens of concurrent flow runs that file's
    writers collide (``database is locked``), the API answers 503 and, once the
    client's retries are spent, flow runs fail. An in-memory database serialises
    the API's transactions through one connection instead. Its runs are gone
    when the process exits; to keep and browse them, start a server
    (``prefect server start``) and set ``PREFECT_API_URL``. Settings already in
    the environment win.
    """
    if os.environ.get("PREFECT_API_URL"):
        return
    os.environ.setdefault("PREFECT_API_DATABASE_CONNECTION_URL", EPHEMERAL_DB)
    # An in-memory database is migrated at every start (about 20 s on 2 cores), past Prefect's 20 s default.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # Its services log errors when the database vanishes at shutdown; nothing is lost that would be kept.
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EPHEMERAL_DB",
    "UNSET_OR_START",
    "api_error",
    "check_prefect_api",
    "ephemeral_api_defaults",
    "prefect_api_url",
    "requests_parser",
    "require_prefect_api",
    "script_args",
    "script_requests",
]


def requests_parser(default: int, description: str | None = None) -> argparse.ArgumentParser:
    """The options of a ``flows/`` script: ``--requests`` (with ``default``), under ``description`` (its docstring).

    Each script runs one flow run alone first, then ``--requests`` at once: concurrent
    first runs would race to start Prefect's temporary API. The help says so, since the
    run count a user sees is one more than asked.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--requests",
        type=int,
        default=default,
        metavar="N",
        help=f"flow runs at once, after one warm-up run alone (N + 1 flow runs in all); default {default}",
    )
    return parser


def script_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """A ``flows/`` script's options (``--requests`` checked: one line for a bad one), with Prefect's API made ready.

    Called before Prefect and torch are imported: :func:`ephemeral_api_defaults`
    then :func:`require_prefect_api`, as every script that runs many flows needs;
    ``--help`` and a bad option end the script before either.
    """
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.exit(2, f"{parser.prog}: error: --requests must be at least 1, got {args.requests}\n")
    ephemeral_api_defaults()  # Prefect's temporary API in memory: its SQLite file locks under concurrent runs
    require_prefect_api()  # before Prefect and torch load: a server that is not up costs one line
    return args


def script_requests(default: int, description: str | None = None) -> int:
    """A ``flows/`` script's ``--requests`` (:func:`requests_parser`, :func:`script_args`)."""
    requests: int = script_args(requests_parser(default, description)).requests
    return requests
