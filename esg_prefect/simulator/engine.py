"""The discrete-event loop: a simulated clock and a heap of timed events.

No global loop and no wall clock: each run owns one :class:`EventLoop`, whose
``now_ms`` moves only when an event is taken off the heap. Events at the same
instant are handled together and then ``settle(now_ms)`` runs once, so the
controller makes one scheduling round per instant however many arrivals and
completions it holds (the cheapest way to keep the scheduler's view whole).

Heap entries are ``(time_ms, kind, seq, payload)``: ``kind`` orders the events
of one instant (lower first), the running ``seq`` breaks the remaining ties in
insertion order, so payloads are never compared and a run is deterministic.

Example:
    >>> loop = EventLoop()
    >>> seen = []
    >>> loop.at(5.0, 1, "b"); loop.at(5.0, 0, "a"); loop.at(9.0, 0, "c")
    >>> loop.run(lambda kind, p: seen.append(p), lambda t: seen.append(t))
    >>> seen
    ['a', 'b', 5.0, 'c', 9.0]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from esg_prefect.exceptions import InvalidInputError


class EventLoop:
    """A heap of ``(time_ms, kind, seq, payload)`` events and the simulated clock."""

    __slots__ = ("_heap", "_seq", "events", "now_ms")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.now_ms = 0.0
        self.events = 0

    def at(self, time_ms: float, kind: int, payload: object = None) -> None:
        """Schedule an event; it may not lie in the simulated past.

        Raises:
            InvalidInputError: when ``time_ms`` is before ``now_ms`` or not finite.
        """
        if not time_ms >= self.now_ms or not math.isfinite(time_ms):
            raise InvalidInputError(f"event at {time_ms!r} ms is before the simulated now ({self.now_ms} ms)")
        self._seq += 1
        heapq.heappush(self._heap, (time_ms, kind, self._seq, payload))

    def __len__(self) -> int:
        return len(self._heap)

    def stop(self) -> None:
        """Drop every pending event: the run ends after the current instant."""
        self._heap.clear()

    def next_time(self) -> float | None:
        """Time of the next event, None when the heap is empty."""
        return self._heap[0][0] if self._heap else None

    def run(
        self,
        handle: Callable[[int, object], None],
        settle: Callable[[float], None],
        until_ms: float = math.inf,
    ) -> None:
        """Process events in time order until the heap is empty or the next one is after ``until_ms``.

        Args:
            handle: called with ``(kind, payload)`` for each event.
            settle: called once per instant, after its last event.
            until_ms: stop before events later than this.
        """
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until_ms:
            t = heap[0][0]
            self.now_ms = t
            while heap and heap[0][0] == t:
                _, kind, _, payload = pop(heap)
                self.events += 1
                handle(kind, payload)
            settle(t)
