"""Tiny stages for runtime tests: cheap, deterministic, with a poison input and a crashing input.

Worker processes import this module by path (``tests.toy_stages``), so it must stay importable.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from esg_prefect.integration.stage import Pipeline
from esg_prefect.model import LatencyProfile, ProfilePoint
from esg_prefect.runtime.clock import PoolClock

POISON = 13  # makes the batch function raise
CRASH = 666  # kills the worker process
UNPICKLABLE = 777  # its output is a lock, which cannot travel back from a worker process
HANG = 888  # the batch function never returns

toy = Pipeline("toy", slo_ms=800, edges=[("double", "inc")])
learned = Pipeline("learned", slo_ms=800)  # no edges: the pool learns them


def load_double(device: str) -> dict[str, Any]:
    return {"factor": 2, "device": device}


def load_inc(device: str) -> dict[str, Any]:
    return {"step": 1}


@toy.stage(load=load_double)
def double(model: dict[str, Any], items: list[int]) -> list[int]:
    time.sleep(0.002)
    return [model["factor"] * x for x in items]


@toy.stage(load=load_inc, retries=0)
def inc(model: dict[str, Any], items: list[int]) -> list[int]:
    if CRASH * 2 in items:
        os._exit(3)  # a hard crash, as a segfaulting native library would do
    if POISON * 2 in items:
        raise ValueError(f"poison input {POISON * 2}")
    if HANG * 2 in items:
        time.sleep(3600)
    time.sleep(0.002)
    return [threading.Lock() if x == UNPICKLABLE * 2 else x + model["step"] for x in items]


@learned.stage(load=load_double, name="first")
def first(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x * 10 for x in items]


@learned.stage(load=load_inc, name="second")
def second(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + 1 for x in items]


@learned.stage(load=load_inc, name="third")
def third(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + 2 for x in items]


def toy_profile() -> LatencyProfile:
    """Batching pays: 5 ms + 0.5 ms per item; 2 vCPUs run 1.5x faster."""
    points = []
    for stage in STAGES:
        for v in (1, 2):
            for b in (1, 2, 4, 8, 16, 32):
                lat = (5.0 + 0.5 * b) / (1.5 if v == 2 else 1.0)
                points.append(ProfilePoint(stage, "cpu", b, v, 0.0, lat, lat * 1.1))
    return LatencyProfile(points, {(s, "cpu"): 20.0 for s in STAGES})


STAGES = (
    "double",
    "inc",
    "first",
    "second",
    "third",
    "flaky",
    "slow",
    "heavy",
    "classify",
    "fragile",
    "meet",
    "chatty",
    "loud",
)


talk = Pipeline("talk", slo_ms=5_000)
chatty_log = logging.getLogger("tests.chatty")


@talk.stage(load=load_inc, name="chatty")
def chatty(model: dict[str, Any], items: list[int]) -> list[int]:
    """A stage that prints, logs and writes to stderr, and fails on POISON after saying so."""
    print(f"chatty got {len(items)} item(s)")
    chatty_log.warning("chatty saw %s", sorted(items))
    sys.stderr.write("chatty to stderr\n")
    if POISON in items:
        print("about to fail on the poison")
        raise ValueError("poison")
    if RUN_LOGGER in items:
        from prefect import get_run_logger

        get_run_logger().info("a run logger, where there is no run")
    return [x + 1 for x in items]


RUN_LOGGER = 42  # makes chatty call Prefect's get_run_logger(), which has no run context on a worker


burst = Pipeline("burst", slo_ms=5_000)


@burst.stage(load=load_inc, name="slow")
def slow(model: dict[str, Any], items: list[int]) -> list[int]:
    """A stage that keeps its worker busy, so that calls arriving meanwhile queue and batch."""
    time.sleep(0.2)
    return [x + 1 for x in items]


warmup = Pipeline("warmup", slo_ms=5_000)


def load_slowly(device: str) -> dict[str, Any]:
    """A model that takes 0.2 s to load, so that a worker is seen while it starts."""
    time.sleep(0.2)
    return {"step": 1}


@warmup.stage(load=load_slowly, name="heavy")
def heavy(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + model["step"] for x in items]


drift = Pipeline("drift", slo_ms=5_000)
# How much slower than its profile the "lagging" stage runs (inline backend: same process), and, when a
# test sets "clock", the FakeClock it advances instead of sleeping (so nothing depends on load).
LAG: dict[str, Any] = {"factor": 1.0, "clock": None}


class FakeClock(PoolClock):
    """Milliseconds that move only when told (:meth:`advance`, by a stage or the test): a pool's ``clock``.

    Its timers fire once time has reached them, never by the wall clock, and
    ``deterministic`` gives the scheduler no wall-clock time budget: what a pool
    on this clock decides and measures depends on nothing but its calls, however
    slowly a loaded machine runs them.
    """

    deterministic = True

    def __init__(self, start_ms: float = 1.7e12) -> None:
        self.ms = start_ms
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        return self.ms

    def call_at(self, t_ms: float, callback: Callable[..., object], *args: object) -> _FakeTimer:
        self._loop = asyncio.get_running_loop()
        timer = _FakeTimer(callback, args)
        with self._lock:
            if t_ms > self.ms:
                self._seq += 1
                heapq.heappush(self._timers, (t_ms, self._seq, timer))
                return timer
        self._loop.call_soon(timer.fire)
        return timer

    def advance(self, ms: float) -> None:
        """Move time on by ``ms`` (from any thread); the timers now due run on the pool's loop."""
        with self._lock:
            self.ms += ms
            due = []
            while self._timers and self._timers[0][0] <= self.ms:
                due.append(heapq.heappop(self._timers)[2])
        for timer in due:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(timer.fire)


class _FakeTimer:
    def __init__(self, callback: Callable[..., object], args: tuple[object, ...]) -> None:
        self.callback, self.args, self.cancelled = callback, args, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.callback(*self.args)


def lagging_ms(batch: int) -> float:
    """The "lagging" stage's profiled batch time: 40 ms + 5 ms per item."""
    return 40.0 + 5.0 * batch


@drift.stage(load=load_inc, name="lagging")
def lagging(model: dict[str, Any], items: list[int]) -> list[int]:
    """Runs LAG["factor"] times its profiled time: a test sets the factor to inject a slowdown."""
    ms = LAG["factor"] * lagging_ms(len(items))
    if LAG["clock"] is not None:
        LAG["clock"].advance(ms)
    else:
        time.sleep(ms / 1000.0)
    return [x + 1 for x in items]


def lagging_profile() -> LatencyProfile:
    """The "lagging" stage's profile, mean = p95 = :func:`lagging_ms`, on 1 and 2 vCPUs."""
    points = [
        ProfilePoint("lagging", "cpu", b, v, 0.0, lagging_ms(b), lagging_ms(b))
        for v in (1, 2)
        for b in (1, 2, 4, 8, 16, 32)
    ]
    return LatencyProfile(points, {("lagging", "cpu"): 20.0})


flaky_seen: set[int] = set()  # items that already failed once (inline backend: same process)


@toy.stage(load=load_inc, name="flaky", retries=2, retry_delay_seconds=0)
def flaky(model: dict[str, Any], items: list[int]) -> list[int]:
    """Fails the first time it sees an item: a Prefect retry then succeeds."""
    fresh = [x for x in items if x not in flaky_seen]
    if fresh:
        flaky_seen.update(fresh)
        raise RuntimeError(f"transient failure on {fresh}")
    return [x + 100 for x in items]


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Poll ``cond`` until it holds (True) or ``timeout_s`` passes (False): a wait on a condition, not a time."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def settle(futs: list[Any], timeout: float = 60) -> list[object]:
    """Each future's result, or the exception it raised (for assertions on mixed outcomes)."""
    out: list[object] = []
    for f in futs:
        try:
            out.append(f.result(timeout))
        except Exception as exc:  # collected for assertions
            out.append(exc)
    return out


# Two pipelines that each have a stage called "classify", running different code: their calls
# must never run on each other's workers.
vision = Pipeline("vision", slo_ms=800)
speech = Pipeline("speech", slo_ms=800)


@vision.stage(load=load_inc, name="classify", import_path="tests.toy_stages:classify_vision")
def classify_vision(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + 1000 for x in items]


@speech.stage(load=load_inc, name="classify", import_path="tests.toy_stages:classify_speech")
def classify_speech(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + 2000 for x in items]


# A stage whose worker process dies while loading its model as often as FRAGILE_DEATHS says
# ("<died>:<wanted>", counted in the file since each load runs in a new process), then loads:
# a worker lost mid-load, not a bad loader. A file, not an environment variable: worker processes
# may fork from a server started before the test set anything.
FRAGILE_DEATHS = Path(__file__).with_name(".fragile_deaths")
fragile_pipe = Pipeline("fragile", slo_ms=10_000)


def load_or_die(device: str) -> dict[str, Any]:
    if FRAGILE_DEATHS.exists():
        died, _, wanted = FRAGILE_DEATHS.read_text().partition(":")
        if int(died) < int(wanted):
            FRAGILE_DEATHS.write_text(f"{int(died) + 1}:{wanted}")
            os._exit(9)  # as a SIGKILL during the load would
    return {"step": 1}


@fragile_pipe.stage(load=load_or_die, name="fragile")
def fragile(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + model["step"] for x in items]


renamed = Pipeline("renamed", slo_ms=800)


@renamed.stage(load=load_inc, name="tally", profile_name="inc")  # new code, planned with the profile of "inc"
def tally(model: dict[str, Any], items: list[int]) -> list[int]:
    return [x + 100 * model["step"] for x in items]


together = Pipeline("together", slo_ms=60_000)
MEETING = threading.Barrier(10, timeout=30)  # passed only when 10 batches run at the same time


@together.stage(load=load_inc, name="meet")
def meet(model: dict[str, Any], items: list[int]) -> list[int]:
    """Waits until nine other batches of it are running: a pool that caps its concurrent batches never finishes."""
    MEETING.wait()
    return items


def load_loudly(device: str) -> dict[str, Any]:
    """A model whose load prints and warns, as loaders that report missing weights do."""
    print("loading the loud model")
    chatty_log.warning("loud: 2 weights were not found")
    return {"step": 1}


@talk.stage(load=load_loudly, name="loud")
def loud(model: dict[str, Any], items: list[int]) -> list[int]:
    """Adds the model's step; fails on POISON, so that a failure can follow its load."""
    if POISON in items:
        raise ValueError("poison")
    return [x + model["step"] for x in items]


@toy.stage(load=load_inc, name="lumped", profile_name="inc", retries=0)
def lumped(model: dict[str, Any], items: list[int]) -> list[int]:
    """A common bug: one output for the whole batch (right only for a batch of one)."""
    return [items[0] + model["step"]]
