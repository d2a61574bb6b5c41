"""Long-polled calls whose callers stopped asking, withdrawn by one periodic sweep.

A caller that long-polls (``wait_s``) asks again at once after each ``202``; one
that has not asked for ``ABANDONED_POLLS`` times ``wait_s`` plus
``ABANDON_MARGIN_S`` is gone (killed, say), and its call would run and be billed
for nobody: it is withdrawn if still queued (one already running finishes). Any
request for the call counts as asking, and one waiting on it (a POST without
``wait_s`` waits until the call is done) keeps it. One task sweeps all watched
calls, every ``wait_s`` of the most eager of them but at most once a second,
instead of one task a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

ABANDONED_POLLS = 3
ABANDON_MARGIN_S = 30.0
"""A long-polled call whose caller has not asked for 3 x wait_s + 30 s is withdrawn."""
SWEEP_MIN_S = 1.0
"""The shortest time between sweeps: a call polled every millisecond does not make each sweep busy."""


@dataclasses.dataclass
class _Watched:
    wait_s: float
    limit_s: float
    asked: float  # when a request for the call last came or left
    waiting: int = 0  # requests waiting on the call now


class PollWatch:
    """The long-polled calls in flight and when their callers last asked.

    Args:
        withdraw: called with the id of a call whose caller stopped asking (the pool's ``cancel``).
        clock: monotonic seconds (injected, so that tests can move time).
    """

    def __init__(self, withdraw: Callable[[str], None], clock: Callable[[], float]) -> None:
        self._withdraw = withdraw
        self._clock = clock
        self._calls: dict[str, _Watched] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._period = math.inf  # how long the sweeper sleeps between sweeps now

    def watch(self, call_id: str, wait_s: float) -> None:
        """Watch a call just posted with ``wait_s`` (on the event loop): withdrawn once its caller stops asking."""
        limit = ABANDONED_POLLS * wait_s + ABANDON_MARGIN_S
        self._calls[call_id] = _Watched(wait_s, limit, self._clock())
        loop = asyncio.get_running_loop()
        if self._sweeper is None or self._sweeper.done() or self._sweeper.get_loop() is not loop:
            self._wake, self._period = asyncio.Event(), _period(wait_s)
            self._sweeper = loop.create_task(self._sweep_every(self._wake))
        elif _period(wait_s) < self._period:  # the sleeping sweeper would look too late at this call
            self._wake.set()

    @contextlib.contextmanager
    def asking(self, call_id: str) -> Iterator[None]:
        """A request for the call, for as long as it waits on it: the call is kept meanwhile and counts as
        asked for when the request comes and when it leaves. A call not watched is left alone."""
        watched = self._calls.get(call_id)
        if watched is None:
            yield
            return
        watched.asked, watched.waiting = self._clock(), watched.waiting + 1
        try:
            yield
        finally:
            watched.asked, watched.waiting = self._clock(), watched.waiting - 1

    def forget(self, call_id: str) -> None:
        """The call finished: nothing to withdraw."""
        self._calls.pop(call_id, None)

    def sweep(self) -> list[str]:
        """Withdraw each call no request waits on whose caller has not asked for its limit; their ids."""
        now = self._clock()
        gone = [cid for cid, w in self._calls.items() if not w.waiting and now - w.asked > w.limit_s]
        for call_id in gone:
            watched = self._calls.pop(call_id)
            logger.info("call %s: its caller stopped asking for %g s; withdrawn if queued", call_id, watched.limit_s)
            self._withdraw(call_id)
        return gone

    async def _sweep_every(self, wake: asyncio.Event) -> None:
        """Sweep every ``wait_s`` of the most eager call watched (sooner when one more eager comes), until none."""
        while self._calls:
            self._period = _period(min(w.wait_s for w in self._calls.values()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self._period)
            wake.clear()
            self.sweep()


def _period(wait_s: float) -> float:
    """How often to sweep for a call polled every ``wait_s``."""
    return max(wait_s, SWEEP_MIN_S)
