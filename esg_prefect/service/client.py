"""The client of the pool service: the same ``submit(call) -> Future`` as an in-process pool.

``ESGTaskRunner(address=...)`` hands stage calls to this client instead of an
embedded pool. Each call is an HTTP request that the service holds for up to
``poll_s`` and answers with the outcome, or with ``202`` while the call is still
queued or running (a busy or paused pool); the client then asks again by the
call's id and digest, without its body (``GET /v1/calls/{id}``), and posts the
body again only if the service no longer holds the call (a restart). Connection
errors, timeouts, ``429`` and ``503`` are retried with the same call id (the
service joins a retried id or answers it from its stored outcomes, across its
own restarts with a results file), honouring ``Retry-After`` with jitter, until the service has not answered for
``deadline_s``; a call it reports pending waits on, however long. When the
client gives up it asks the service to withdraw the call, so that it is not run
and billed for nobody. A ``409`` (the id names another call) is raised as
:class:`~esg_prefect.exceptions.CallConflictError`.

Answers are read defensively: a ``Retry-After`` that is no number of seconds
(an HTTP date from a proxy, say) falls back to the backoff, and an answer the
wire format cannot read fails its call with :class:`StageRejectedError`.
Requests to a loopback address ignore proxy settings (``HTTP_PROXY``): the
token and inputs stay on the machine; a token sent over plain HTTP beyond it
is warned about.

A service that has never answered this client (nor held one of its requests
for a second: one killed while it held the client's first calls was there) is
most likely not started, or the address is wrong: a refused, timed-out or at
once dropped connection is then retried for ``connect_grace_s`` only (a service
started at the same time gets there), with a warning at the first naming the
address.

A flow run's end (:meth:`PoolClient.end_run`) is the one notice that is retried, in the
background, on the same answers as a call, for up to :data:`END_DEADLINE_S`: only it closes
the run in the service (its cost row, its artifacts).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx

from esg_prefect.control.calls import StageCall, StageResult
from esg_prefect.exceptions import (
    CallConflictError,
    InvalidInputError,
    PoolClosedError,
    StageCallError,
    StageRejectedError,
)
from esg_prefect.service.address import check_address
from esg_prefect.service.guards import is_loopback
from esg_prefect.service.wire import JITTER, MAX_WAIT_S, call_body, parse_result

__all__ = ["PoolClient", "call_body", "parse_result"]

logger = logging.getLogger(__name__)


MAX_PATH_ID = 200
"""Longest call id joined by ``GET /v1/calls/{id}``; a longer one is posted again with its body each poll."""


def script_stage_message(stage_path: str) -> str:
    """Why a stage of the running script cannot go to the pool service, and what to do instead."""
    script = getattr(sys.modules.get("__main__"), "__file__", None) or "the script"
    name = stage_path.partition(":")[2]
    return (
        f"stage {name!r} is defined in the script being run ({script}), which the pool service cannot import "
        "(it imports stage code by module name, from its --allow'ed modules): define the stages in a module "
        f"of their own (stages.py), import them from the script, and serve with --allow stages"
    )


def _call_path(call_id: str) -> str | None:
    """The service's path of ``call_id`` (percent-encoded), or None where no path segment can name it."""
    segment = _segment(call_id)
    return None if segment is None else "/v1/calls/" + segment


def _segment(ident: str) -> str | None:
    """``ident`` as one percent-encoded path segment, or None where none can name it.

    Any character travels percent-encoded (the ids of flow runs' calls hold a
    ``:``), but the service decodes ``%2F`` before routing, and an id of dots
    alone is a dot segment that clients and proxies collapse.
    """
    if "/" in ident or not ident.strip("."):
        return None
    return urllib.parse.quote(ident, safe="")


MAX_POLL_S = MAX_WAIT_S
"""The longest the service holds a request: a longer ``poll_s`` would get 400 on every call."""

READ_MARGIN_S = 30.0
"""How much longer than ``poll_s`` a request may take to answer before it counts as unanswered."""

HELD_S = 1.0
"""A request dropped after being open this long was held by a service (one killed mid-call): its client waits
for a restart. One dropped sooner is a listener that is not the service (a wrong port, ``http://`` to TLS)."""


FIRST_WAIT_S = 0.2
"""The first wait before a request is posted again; it doubles with each retry."""

MAX_BACKOFF_S = 5.0
"""The longest wait between retries of the client's own backoff (a ``Retry-After`` may say up to 60 s)."""

JITTER_MAX = 1.5
"""A retry's wait is stretched by a random factor in [1, JITTER_MAX]."""

END_DEADLINE_S = 30.0
"""How long a run's end is retried at most (less when ``deadline_s`` is shorter).

Long enough for a prompt Ctrl-C restart of the service (its 10 s shutdown grace, then its start) and a
busy service's ``Retry-After``; short, because the client's threads are joined at interpreter exit:
a flow process whose service is gone for good waits this long to exit, not ``deadline_s`` (600 s).
"""

END_LOST = "the end of flow run %s did not reach the pool service at %s (%s): the run is not published"
"""The warning of a run end given up: its records stay open there, its cost row provisional."""


class PoolClient:
    """Talks to ``esg-prefect pool serve``.

    Args:
        address: base URL, e.g. ``http://127.0.0.1:4270``.
        token: bearer token, if the service has one.
        deadline_s: how long a call waits for a service that does not answer (down, restarting,
            refusing with 429/503), retries included; a call the service reports pending waits on.
        threads: calls waiting at once (each holds one HTTP request open).
        poll_s: how long the service holds one request before it answers "still pending".
        connect_grace_s: how long refused connections are retried before the
            service has answered once (after that, ``deadline_s``: it may be restarting).
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        deadline_s: float = 600.0,
        threads: int = 256,
        connect_grace_s: float = 30.0,
        poll_s: float = 50.0,
    ) -> None:
        check_address(address)
        if isinstance(poll_s, bool) or not (isinstance(poll_s, (int, float)) and 0 < poll_s <= MAX_POLL_S):
            raise InvalidInputError(f"poll_s must be a number of seconds in (0, {MAX_POLL_S:g}], got {poll_s!r}")
        self._connect_grace_s = connect_grace_s
        self._answered = False  # has the service answered this client, or taken its connection, at all?
        self._warned = False
        self._outage_warned = False  # warned of the current outage of a service that answered before
        self.address = address.rstrip("/")
        local = is_loopback(httpx.URL(self.address).host)
        if token and not local and self.address.startswith("http://"):
            logger.warning("the pool service token goes to %s over plain HTTP: use https beyond this machine", address)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
        self._http = httpx.Client(
            base_url=self.address,
            headers=headers,
            limits=limits,
            timeout=httpx.Timeout(30.0, read=poll_s + READ_MARGIN_S),
            trust_env=not local,  # no proxy between this process and a service on the same machine
        )
        self._deadline_s = deadline_s
        self._poll = {"wait_s": f"{poll_s:g}"}
        self._executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="esg-pool-client")
        self._lock = threading.Lock()  # guards closing against new submissions
        self._closed = False
        self._stop = threading.Event()  # set by close(): a run end's retries stop waiting

    def submit(self, call: StageCall) -> concurrent.futures.Future[StageResult]:
        """Send a call; the future resolves when the service answers (after retries).

        A stage defined in the script being run (``__main__:...``) fails here: the service
        imports stage code by module name, and a script run as ``python x.py`` has none.
        """
        fut: concurrent.futures.Future[StageResult] = concurrent.futures.Future()
        if call.stage_path.startswith("__main__:"):
            fut.set_exception(StageRejectedError(script_stage_message(call.stage_path)))
            return fut
        with self._lock:
            if self._closed:
                fut.set_exception(PoolClosedError("the pool client is closed"))
                return fut
            return self._executor.submit(self._wait_for, call_body(call))

    def _wait_for(self, body: dict[str, Any]) -> StageResult:
        start = time.monotonic()
        give_up = start + self._deadline_s
        wait = FIRST_WAIT_S
        call_id = str(body.get("call_id", ""))
        path = _call_path(call_id) if len(call_id) <= MAX_PATH_ID else None  # None: posted again each poll
        digest = ""  # from the service's first 202: later polls join by id and digest, without the body
        while True:
            sent = time.monotonic()
            try:
                if digest and path:
                    resp = self._http.get(path, params={**self._poll, "digest": digest})
                else:
                    resp = self._http.post("/v1/calls", json=body, params=self._poll)
            except httpx.TransportError as exc:  # connection refused or reset, timeout: the service may restart
                last = f"{type(exc).__name__}: {exc}"
                connected = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if connected and time.monotonic() - sent >= HELD_S:
                    self._answered = True  # a service held the call, then went (killed): wait for its restart
                if not self._answered:  # refused, or dropped at once (a wrong port, http to https): the address?
                    self._never_answered(last, start)
                elif not self._outage_warned:  # once per outage: the flow's log says why it waits
                    self._outage_warned = True
                    logger.warning(
                        "the pool service at %s does not answer (%s); retrying until %s s after the call",
                        self.address,
                        last,
                        f"{self._deadline_s:g}",
                    )
            else:
                self._answered, self._outage_warned = True, False
                if resp.status_code == 200:
                    return _answer(resp)
                if resp.status_code == 202:  # still queued or running: ask again at once, the service is alive
                    give_up, wait = time.monotonic() + self._deadline_s, FIRST_WAIT_S
                    digest = _digest(resp) if path else ""
                    continue
                if resp.status_code == 404 and digest:  # the service lost the call (a restart): post it again
                    digest = ""
                    continue
                if resp.status_code == 409:
                    raise CallConflictError(f"pool service refused the call (409): {resp.text[:500]}")
                if resp.status_code not in (429, 503):
                    raise StageRejectedError(f"pool service refused the call ({resp.status_code}): {resp.text[:500]}")
                last = f"{resp.status_code}: {resp.text[:200]}"
                wait = _retry_after_s(resp.headers.get("retry-after"), wait)
            if time.monotonic() + wait > give_up:
                # Given up on a service that may still hold the call queued: it withdraws the call. Not on
                # other failures: a service that never answered holds nothing, and an answer ends the call.
                self.cancel(call_id)
                raise PoolClosedError(
                    f"pool service at {self.address} gave the call no answer for {self._deadline_s:g} s ({last})"
                )
            wait = _backoff(wait, time.sleep)

    def _never_answered(self, why: str, start: float) -> None:
        """No answer from a service that never answered (refused, timed out, or dropped at once): warn once,
        give up after the grace."""
        hint = "start it with `esg-prefect pool serve --allow MODULE`, or check the address"
        if time.monotonic() - start >= self._connect_grace_s:
            raise PoolClosedError(
                f"no pool service answers at {self.address}: no answer for {self._connect_grace_s:g} s ({why}); {hint}"
            ) from None
        if not self._warned:
            self._warned = True
            logger.warning(
                "no pool service answers at %s yet (%s); retrying for up to %g s: %s",
                self.address,
                why,
                self._connect_grace_s,
                hint,
            )

    def cancel(self, call_id: str) -> None:
        """The caller stopped waiting for a call (its task timed out): the service withdraws it if still queued."""
        path = _call_path(call_id)  # None (an id with a '/'): no cancel route names it, the call runs
        if path is not None:
            self._notify(f"{path}/cancel")  # lost: the call runs and its answer is dropped

    def end_run(self, run_id: str) -> None:
        """Tell the service a flow run ended, in the background, retried for up to :data:`END_DEADLINE_S`.

        Only the end closes the run there: its cost row gets its finish and SLO outcome, its
        artifacts and tags are published, and its records leave the service's memory. So an end
        met by a refused connection, a timeout, ``429`` or ``503`` (a service restarting, shutting
        down, busy) is posted again as a call is (``Retry-After``, jittered backoff), until a ``2xx``,
        :meth:`close`, or the bound; the service ends a run once however often it is told. Given
        up, one warning names the run and the address. A service that never answered this client
        holds nothing of the run: its end is posted once.

        At interpreter exit ``concurrent.futures`` joins the client's threads before ``atexit``
        callbacks (the runner's close of its clients) run: an end still retrying holds the exit
        until it is delivered or its bound passes. A :meth:`close` called before stops it at once.
        """
        with self._lock:
            if not self._closed:
                self._executor.submit(self._deliver_end, run_id)

    def _deliver_end(self, run_id: str) -> None:
        segment = _segment(run_id)
        if segment is None:  # no route can name it: the service keeps the run open
            logger.warning(END_LOST, run_id, self.address, "no URL path segment can name this run id")
            return
        path = f"/v1/runs/{segment}/end"
        bound = min(self._deadline_s, END_DEADLINE_S)
        once = not self._answered  # a service never reached holds none of the run's calls: one try
        give_up = time.monotonic() + bound
        wait = FIRST_WAIT_S
        while True:
            try:
                resp = self._http.post(path, timeout=min(max(give_up - time.monotonic(), 1.0), 30.0))
            except (httpx.TransportError, RuntimeError) as exc:  # RuntimeError: the client closed meanwhile
                last = f"{type(exc).__name__}: {exc}"
                if once:
                    logger.debug("the end of flow run %s did not reach %s (%s)", run_id, self.address, last)
                    return
            else:
                if resp.is_success:
                    return
                last = f"{resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in (429, 503):  # refused for good (a token, a route): again changes nothing
                    logger.warning(END_LOST, run_id, self.address, f"it answered {last}")
                    return
                once = False  # a service is there, busy or shutting down
                wait = _retry_after_s(resp.headers.get("retry-after"), wait)
            if time.monotonic() + wait * JITTER_MAX > give_up:  # the bound holds with the longest jitter too
                logger.warning(END_LOST, run_id, self.address, f"no answer for {bound:g} s; last: {last}")
                return
            wait = _backoff(wait, self._stop.wait)
            if self._stop.is_set():
                logger.warning(END_LOST, run_id, self.address, f"the client closed while retrying; last: {last}")
                return

    def _notify(self, path: str) -> None:
        """POST ``path`` in the background, best effort: a notice, not a call."""

        def _post() -> None:
            with contextlib.suppress(httpx.HTTPError):
                self._http.post(path)

        with self._lock:
            if not self._closed:
                self._executor.submit(_post)

    def close(self) -> None:
        """Stop sending; calls in flight finish, and a run end still being retried stops at once (warned)."""
        with self._lock:
            self._closed = True
        self._stop.set()
        self._executor.shutdown(wait=False)
        self._http.close()


def _answer(resp: httpx.Response) -> StageResult:
    """The call's result from a 200 answer; the stage's own error raised as is; anything unreadable, rejected."""
    try:
        return parse_result(resp.json())
    except StageCallError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not the wire's shape
        raise StageRejectedError(
            f"pool service sent an answer this client cannot read ({type(exc).__name__}: {exc}); "
            "is the service the same esg-prefect version?"
        ) from None


def _digest(resp: httpx.Response) -> str:
    """The call's digest in a ``202`` answer ("" from a service that sends none: the client keeps posting)."""
    try:
        value = resp.json().get("digest", "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def _backoff(wait: float, sleep: Callable[[float], object]) -> float:
    """Sleep ``wait`` stretched by up to half at random (rejected callers do not retry in lockstep); the next
    wait, doubled up to :data:`MAX_BACKOFF_S`."""
    sleep(wait * JITTER.uniform(1.0, JITTER_MAX))
    return min(wait * 2, MAX_BACKOFF_S)


def _retry_after_s(value: str | None, fallback: float) -> float:
    """Seconds to wait from a ``Retry-After`` header: a number of seconds within :data:`FIRST_WAIT_S`-60, else
    ``fallback``. Never less than the first backoff: a ``0`` (from a proxy) would retry in a busy loop, since
    the backoff doubles the last wait."""
    try:
        seconds = float(value) if value is not None else fallback
    except ValueError:  # an HTTP date, or garbage
        return fallback
    return min(max(seconds, FIRST_WAIT_S), 60.0) if seconds == seconds else fallback  # NaN: fallback
