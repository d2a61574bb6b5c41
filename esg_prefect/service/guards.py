"""Who may talk to the pool service: the bind rule, the bearer token and browsers.

* Off loopback the service needs a token (:func:`check_bind`); a token is
  printable ASCII with no spaces, long enough to guess at no rate
  (:func:`check_token`), compared in constant time (:class:`BearerAuth`).
* Without a token (loopback only) any local process may call it, but a web page
  the user opens must not: a page can send a cross-site POST to 127.0.0.1, or
  rebind its own host name to 127.0.0.1 and read the answers.
  :class:`BrowserGuard` refuses requests that carry an ``Origin`` header (every
  browser sends one on cross-site and on non-GET requests; the pool client and
  curl do not) and requests whose ``Host`` is not a loopback name.
"""

from __future__ import annotations

import hmac
import re

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from esg_prefect.exceptions import InvalidInputError

__all__ = ["LOOPBACK_HOSTS", "BearerAuth", "BrowserGuard", "check_bind", "check_token", "is_loopback"]

MIN_TOKEN_CHARS = 16
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space: what an HTTP header carries as is


def is_loopback(host: str) -> bool:
    """Is ``host`` (a name or address, IPv6 with or without brackets) this machine's loopback?"""
    return host.strip("[]").lower() in LOOPBACK_HOSTS


def check_token(token: str | None) -> None:
    """Refuse a token too short, or with characters an HTTP header cannot carry (None: no token).

    Raises:
        InvalidInputError: saying what a token needs, without echoing it.
    """
    if token is not None and (len(token) < MIN_TOKEN_CHARS or not _TOKEN_CHARS.fullmatch(token)):
        # What is wrong, never which characters: the message must not echo the secret.
        bad = sorted(
            {
                "a space" if c == " " else "a control or non-ASCII character"
                for c in token
                if not _TOKEN_CHARS.fullmatch(c)
            }
        )
        got = f"{len(token)} characters" + (f", with {', '.join(bad)}" if bad else "")
        raise InvalidInputError(
            f"the bearer token must be at least {MIN_TOKEN_CHARS} characters, printable ASCII with no spaces "
            f"(got {got}); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token.

    Raises:
        InvalidInputError: naming the host.
    """
    if not is_loopback(host) and not token:
        raise InvalidInputError(
            f"binding to {host!r} exposes the pool beyond this machine: set a token "
            "(--token-env VAR, with the token in that environment variable)"
        )
    check_token(token)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":  # no websocket endpoint exists: close before accepting
        await send({"type": "websocket.close", "code": 1008})
        return
    await JSONResponse({"error": message}, status_code=status)(scope, receive, send)


class BearerAuth:
    """ASGI middleware: every endpoint but ``GET /healthz`` needs the bearer token (when one is set)."""

    def __init__(self, app: ASGIApp, token: bytes | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.token is not None and scope["path"] != "/healthz":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given, self.token):
                await _refuse(scope, receive, send, 401, "missing or wrong bearer token")
                return
        await self.app(scope, receive, send)


class BrowserGuard:
    """ASGI middleware for a service with no token: refuse browsers' requests and foreign host names."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope["headers"])
            if b"origin" in headers:
                await _refuse(
                    scope, receive, send, 403, "requests from web pages are refused (an Origin header was sent)"
                )
                return
            host = headers.get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # drop the port
            if host and not is_loopback(name):
                await _refuse(
                    scope,
                    receive,
                    send,
                    403,
                    f"host {host!r} is not this machine's loopback; a service reached by other names needs a token",
                )
                return
        await self.app(scope, receive, send)
