"""Idempotent call ids: a retried call joins the first one, or gets its stored outcome, exactly once.

A client that lost an answer retries with the same ``call_id``. While the
first call runs, the retry's future follows it; once it finished, the retry
gets its outcome for as long as the pool remembers it: the last ``memory``
calls, and of their outputs at most ``max_bytes`` (ten 10 MB outputs would
otherwise hold 100 MB for ever; the pool service keeps its own store of
outcomes for retries, bounded by its own limit). The same id naming another
call (another stage, request or input) is refused with
:class:`~esg_prefect.exceptions.CallConflictError`.
"""

from __future__ import annotations

import concurrent.futures
from collections import OrderedDict

from esg_prefect.control.calls import StageCall, StageResult
from esg_prefect.exceptions import CallConflictError

Future = concurrent.futures.Future[StageResult]


class CallIds:
    """The futures of calls in flight and of the last ``memory`` finished ones, by call id."""

    def __init__(self, memory: int = 2_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.memory = memory
        self.max_bytes = max_bytes
        self.inflight: dict[str, Future] = {}
        self.done: OrderedDict[str, Future] = OrderedDict()
        self._sizes: dict[str, int] = {}  # call id -> its output's bytes, for the finished ones
        self.held_bytes = 0
        self.identity: dict[str, tuple[str, ...]] = {}  # call id -> what it names (in flight or done)

    def join(self, call: StageCall, fut: Future) -> bool:
        """Chain ``fut`` to an earlier call with this id; False when the id is new.

        Raises:
            CallConflictError: when the id was used for another call.
        """
        first = self.inflight.get(call.call_id) or self.done.get(call.call_id)
        if first is None:
            return False
        if self.identity.get(call.call_id) != call.identity():
            raise CallConflictError(
                f"call id {call.call_id!r} was used for another call {self.identity.get(call.call_id)}; "
                f"this one is {call.identity()}"
            )
        _chain(first, fut)
        return True

    def start(self, call: StageCall, fut: Future) -> None:
        """A new call is in flight."""
        self.inflight[call.call_id] = fut
        self.identity[call.call_id] = call.identity()

    def forget(self, call_id: str, fut: Future) -> None:
        """A call that could not be queued after all holds no id."""
        if self.inflight.get(call_id) is fut:
            del self.inflight[call_id]
            self.identity.pop(call_id, None)

    def finish(self, call_id: str, fut: Future) -> None:
        """A call finished: its outcome is remembered for retries (the oldest forgotten first)."""
        self.inflight.pop(call_id, None)
        if fut.cancelled():  # its caller cancelled the future: no outcome to keep (a retry runs the call again)
            self.identity.pop(call_id, None)
            return
        self.done[call_id] = fut
        size = nbytes(fut.result().output) if fut.done() and fut.exception() is None else 0
        self._sizes[call_id] = size
        self.held_bytes += size
        while self.done and (len(self.done) > self.memory or self.held_bytes > self.max_bytes):
            old = self.done.popitem(last=False)[0]
            self.identity.pop(old, None)
            self.held_bytes -= self._sizes.pop(old, 0)


def _chain(src: Future, dst: Future) -> None:
    def _copy(f: Future) -> None:
        if dst.done():
            return
        if f.cancelled():  # the first caller cancelled its future: the joiner's ends alike, not never
            dst.cancel()
            return
        exc = f.exception()
        if exc is not None:
            dst.set_exception(exc)
        else:
            dst.set_result(f.result())

    src.add_done_callback(_copy)


def nbytes(obj: object, depth: int = 0) -> int:
    """About how many bytes ``obj`` holds: arrays and tensors by their data, containers by their items."""
    size = getattr(obj, "nbytes", None)  # numpy arrays, and torch tensors since 2.1
    if isinstance(size, int):
        return size
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    if depth < 4 and isinstance(obj, (list, tuple, set, frozenset)):
        return 64 + sum(nbytes(x, depth + 1) for x in obj)
    if depth < 4 and isinstance(obj, dict):
        return 64 + sum(nbytes(k, depth + 1) + nbytes(v, depth + 1) for k, v in obj.items())
    return 64
