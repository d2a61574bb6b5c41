"""Time for the pool: the wall clock and timers on its asyncio loop, replaceable by a controllable clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


def wall_ms() -> float:
    """Wall-clock time in ms: comparable across the processes of one machine."""
    return time.time() * 1000.0


def perf_ms() -> float:
    """Monotonic time in ms, injected into the scheduler for its time budget."""
    return time.perf_counter() * 1000.0


class Cancellable(Protocol):
    """A timer that can be called off."""

    def cancel(self) -> None: ...


class PoolClock:
    """The time the pool gives the core, and its timers, on the pool's asyncio loop: the wall clock.

    A test drives a pool on a controllable clock by passing a subclass
    (``deterministic``: the scheduler then gets no wall clock for its time
    budget either, so its decisions depend on nothing but the events).
    """

    deterministic = False

    def now(self) -> float:
        """The time in ms."""
        return wall_ms()

    def call_at(self, t_ms: float, callback: Callable[..., object], *args: object) -> Cancellable:
        """Run ``callback(*args)`` on the running loop at ``t_ms``."""
        delay = max(0.0, t_ms - self.now()) / 1000.0
        return asyncio.get_running_loop().call_later(delay, callback, *args)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` once the running loop's current events are handled."""
        asyncio.get_running_loop().call_soon(callback)
