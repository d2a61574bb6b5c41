"""The pool's listeners: run listeners (a flow run ended) and batch listeners (batches completed).

Listeners run on one background thread of their own, never on the pool's
controller loop: a slow cost store or API client must not hold up scheduling.
Batches completed while the batch listeners are busy are handed over together
in their next call, so a slow listener (a remote database) does not fall behind.

When the pool closes, every listener (or the object a bound-method listener
belongs to) with a ``pool_closed()`` method is called once, after everything
it was handed: a run's cost is final only once the idle time after its
batches has closed, which for the last batches is the pool's close, so the
cost store and the artifact publisher write what was still pending then.

A run that ends here while the pool holds none of its calls (a pool service
restarted after the run's last call) is looked up: the first lookup (the cost
store's) that knows the run gives the records the run listeners get, on the
same thread, in order, as any ended run's.
At interpreter exit the thread is gone (``concurrent.futures`` stops its
threads before ``atexit`` callbacks such as the runner's close of its shared
pools run): what is handed over then, and the close, run on the closing thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from esg_prefect.control.records import BatchDone, BatchListener, RunListener, RunLookup, RunRecords

logger = logging.getLogger(__name__)


class Listeners:
    """Run and batch listeners, the background thread they run on, and which batches they have seen."""

    def __init__(self) -> None:
        self.runs: list[RunListener] = []
        self.batches: list[BatchListener] = []
        self.lookups: list[RunLookup] = []
        self._backlog: list[BatchDone] = []  # completed batches not yet handed to batch listeners
        self._lock = threading.Lock()  # the pool's loop appends, the listeners' thread drains
        self._drain_scheduled = False
        self._recorded: dict[str, concurrent.futures.Future[None]] = {}  # batch id -> done once listened to
        self._late: list[Callable[[], None]] = []  # work handed over after the thread stopped (interpreter exit)
        self._closed = False
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="esg-run-listeners")

    def _submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the listeners' thread; once that has stopped (interpreter exit), at :meth:`close`."""
        try:
            self._thread.submit(fn)
        except RuntimeError:  # cannot schedule new futures after (interpreter) shutdown
            with self._lock:
                self._late.append(fn)

    def run_ended(self, records: RunRecords) -> None:
        """Hand a finished run's records to every run listener."""
        for listener in self.runs:
            self._submit(functools.partial(_call, listener, records))

    def ended_unseen(self, run_id: str) -> None:
        """A run ended that the pool holds no call of: hand the run listeners its records, if a lookup has them."""
        if self.lookups and self.runs:
            self._submit(functools.partial(self._look_up, run_id))

    def _look_up(self, run_id: str) -> None:
        for lookup in self.lookups:
            try:
                records = lookup(run_id)
            except Exception:  # a store that cannot be read: the run stays as the store has it
                logger.exception("looking up ended flow run %s failed", run_id)
                continue
            if records is not None:
                for listener in self.runs:
                    _call(listener, records)
                return

    def expect(self, batch_id: str) -> None:
        """Before any caller hears of batch ``batch_id``: it may wait for the batch's records (:meth:`recorded`)."""
        if self.batches:
            with self._lock:
                self._recorded[batch_id] = concurrent.futures.Future()

    def batch_done(self, done: BatchDone) -> None:
        """Queue a completed batch for the batch listeners."""
        with self._lock:
            self._backlog.append(done)
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._submit(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batches, self._backlog = self._backlog, []
            self._drain_scheduled = False
        for listener in self.batches:
            _call(listener, batches)
        with self._lock:
            recorded = [self._recorded.pop(b.batch.batch_id, None) for b in batches]
        for fut in recorded:
            if fut is not None:
                fut.set_result(None)

    def recorded(self, batch_id: str) -> concurrent.futures.Future[None] | None:
        """A future done once batch ``batch_id`` was handed to the batch listeners (None: it was, or none listen)."""
        with self._lock:
            return self._recorded.get(batch_id)

    def closing(self) -> list[Callable[[], None]]:
        """The ``pool_closed`` methods of the listeners, once each, in the order the listeners were added."""
        seen: set[int] = set()
        out: list[Callable[[], None]] = []
        for listener in (*self.runs, *self.batches):
            owner = getattr(listener, "__self__", listener)
            hook = getattr(owner, "pool_closed", None)
            if callable(hook) and id(owner) not in seen:
                seen.add(id(owner))
                out.append(hook)
        return out

    def _close_listeners(self) -> None:
        with self._lock:
            late, self._late = self._late, []
        for fn in late:
            fn()
        for hook in self.closing():
            try:
                hook()
            except Exception:  # one listener's failure must not keep the others from their close
                logger.exception("listener %r failed when the pool closed", hook)

    def close(self, timeout_s: float) -> None:
        """Let the listeners finish what they were handed and tell them the pool closed.

        Waits up to ``timeout_s`` for them. At interpreter exit the listeners' thread
        has stopped (having run what it was handed): the rest runs on this thread.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            done = self._thread.submit(self._close_listeners)
        except RuntimeError:  # interpreter exit: the thread ran its queue and stopped
            self._close_listeners()
        else:
            with contextlib.suppress(concurrent.futures.TimeoutError):
                done.result(timeout_s)
        self._thread.shutdown(wait=False)


def _call(listener: Callable[[Any], None], records: RunRecords | list[BatchDone]) -> None:
    try:
        listener(records)
    except Exception:  # a listener's failure must not stop the pool or the other listeners
        logger.exception("listener %r failed for %s", listener, getattr(records, "run_id", "batches"))
