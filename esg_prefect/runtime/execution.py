"""Running one batch on a worker so that a poison input or a dying worker costs only its own call.

* a batch whose function raises is split in halves and each half re-run on the
  same worker, down to single items: only the poison input's call fails, with
  the original error type, message and traceback;
* a worker that dies mid-batch is reported lost, and the batch's unfinished
  calls go back to their queue marked *solo*: whatever batch they join next,
  the other calls run first as one batch and then each solo call alone, so an
  input that kills its worker twice, alone, fails with
  :class:`~esg_prefect.exceptions.WorkerCrashedError` and the others complete;
* a batch that runs past its time limit (a stage stuck in a call that never
  returns) has its worker stopped, and counts as a worker that died: the input
  that hangs alone twice fails, the others complete.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from esg_prefect.control.calls import StageCall, StageResult
from esg_prefect.exceptions import StageFailedError, WorkerCrashedError
from esg_prefect.model.jobs import Job
from esg_prefect.runtime.batch_output import LogLine, loading, with_output
from esg_prefect.runtime.workers import (
    BatchOutcome,
    WorkerBackend,
    WorkerDiedError,
    WorkerHandle,
    WorkerLoadError,
    WorkerSpec,
)

logger = logging.getLogger(__name__)

LOAD_DEATHS = 3  # a call whose worker died while loading this often (no input ran) fails


@dataclass(slots=True)
class Pending:
    """A call the pool holds (queued or running), with its future and its crash history."""

    call: StageCall
    future: concurrent.futures.Future[StageResult]
    job: Job
    solo: bool = False  # after a crash: run alone, so a poison input finds itself
    crashes: int = 0
    load_deaths: int = 0  # workers that died loading this call's stage before any input ran


@dataclass(slots=True)
class Executed:
    """What became of a batch's calls: ``results[i]`` is (output, None) or (None, error); the rest go back."""

    handle: WorkerHandle | None
    results: dict[int, tuple[Any, BaseException | None]] = field(default_factory=dict)
    requeue: list[int] = field(default_factory=list)
    died: BaseException | None = None
    cold_ms: float = 0.0
    lines: dict[int, tuple[LogLine, ...]] = field(default_factory=dict)  # what each call's run printed or logged
    # The calls each succeeded call ran with (itself too): set with its output, so every success has its entry
    ran_with: dict[int, tuple[int, ...]] = field(default_factory=dict)


Measured = Callable[[list[int], float, float | None], None]
"""Of a batch that succeeded: (indices run together, its round trip in ms, the worker's own time in ms, None
for an in-process worker, whose round trip is its own time)."""


async def execute(
    backend: WorkerBackend,
    handle: WorkerHandle | None,
    spec: WorkerSpec,
    pendings: list[Pending],
    clock: Callable[[], float],
    measured: Measured,
    limit_s: float | None = None,
) -> Executed:
    """Run ``pendings`` on the worker ``spec`` (starting it when ``handle`` is None) with isolation.

    ``limit_s``: the longest one run of the batch (or of a part of it) may take
    before its worker is stopped; None for no limit.
    """
    out = Executed(handle)
    running: list[int] = []  # indices on the worker right now, to blame a crash on
    try:
        notes: tuple[LogLine, ...] = ()
        if out.handle is None:
            began = clock()
            out.handle = await backend.start(spec)
            out.cold_ms = clock() - began
            # These calls waited for the load: what it printed is theirs to see, failed or not.
            notes = loading(out.handle.load_lines)
        normal = [i for i, p in enumerate(pendings) if not p.solo]
        if normal:
            await _run_items(out, pendings, normal, running, clock, measured, limit_s, notes)
        for i in (i for i, p in enumerate(pendings) if p.solo):
            await _run_items(out, pendings, [i], running, clock, measured, limit_s, notes)
    except WorkerLoadError as exc:
        for i in range(len(pendings)):
            out.results.setdefault(i, (None, StageFailedError(str(exc), "WorkerLoadError")))
        out.died = exc
    except WorkerDiedError as exc:
        out.died = exc
        if out.handle is None:  # it died loading: no input ran, none is to blame
            for p in pendings:
                p.load_deaths += 1
    except Exception as exc:  # a backend's bug: every call of the batch is answered, none hangs
        for i in range(len(pendings)):
            out.results.setdefault(
                i, (None, StageFailedError(f"running the batch failed: {exc!r}", type(exc).__name__))
            )
    for i, p in enumerate(pendings):
        if i in out.results:
            continue
        # Not finished on a worker that died: back to the queue, to run alone next time.
        if p.solo and running == [i]:
            p.crashes += 1  # it was alone on the worker when it died
        if p.crashes >= 2 or p.load_deaths >= LOAD_DEATHS:
            what = (
                "twice while running this input alone"
                if p.crashes >= 2
                else f"{p.load_deaths} times while loading the stage's model"
            )
            crash = WorkerCrashedError(f"stage {p.call.stage!r}: the worker died {what} ({out.died})")
            out.results[i] = (None, crash)
        else:
            p.solo = True
            out.requeue.append(i)
    return out


_HINTS = {
    "MissingContextError": (
        " (a batch function serves many task runs and has no Prefect run context: log with "
        "logging.getLogger(...) or print, which are replayed on each task run it served)"
    ),
}
"""Per error type of a batch function, what to do instead: the mistakes its model invites."""


async def _run_items(
    out: Executed,
    pendings: list[Pending],
    idx: list[int],
    running: list[int],
    clock: Callable[[], float],
    measured: Measured,
    limit_s: float | None = None,
    notes: tuple[LogLine, ...] = (),
) -> None:
    """Run items as one batch on ``out.handle``; on a batch error, bisect until the failing inputs are alone.

    ``notes``: lines each call's log gets ahead of its batch's own, in its
    result or, failed, its error's traceback: the output of the model load it
    waited for, and a warning per split it went through, so that a batch
    function that fails only in batches (one output per batch, say) shows in
    every task run it slowed, not only in the pool's log.
    """
    handle = out.handle
    assert handle is not None
    results = out.results
    running[:] = idx
    began = clock()
    run = handle.execute([pendings[i].call.item for i in idx])
    try:
        outcome: BatchOutcome = await (run if limit_s is None else asyncio.wait_for(run, limit_s))
    except TimeoutError:
        await handle.stop()  # the stage's code does not return: only stopping its worker frees the others
        raise WorkerDiedError(f"the batch ran past its limit of {limit_s:g} s; its worker was stopped") from None
    running.clear()
    if outcome.ok:
        measured(idx, clock() - began, outcome.elapsed_ms if handle.out_of_process else None)
        group = tuple(idx)
        for i, value in zip(idx, outcome.outputs, strict=True):
            results[i] = (value, None)
            out.lines[i], out.ran_with[i] = notes + outcome.lines, group
        return
    if len(idx) == 1:
        stage = pendings[idx[0]].call.stage
        hint = _HINTS.get(outcome.error_type, "")
        results[idx[0]] = (
            None,
            StageFailedError.raised(
                f"stage {stage!r} raised {outcome.error_type}: {outcome.error_message}{hint}",
                outcome.error_type,
                with_output(outcome.error_traceback, notes + outcome.lines),
            ),
        )
        return
    stage = pendings[idx[0]].call.stage
    why = (outcome.error_message.splitlines() or [""])[0][:300]
    text = (
        f"stage {stage!r}: a batch of {len(idx)} raised {outcome.error_type}: {why}; split in halves and run "
        "again to find the input at fault (a batch function that fails only in batches has every batch split)"
    )
    logger.warning(text)
    notes = (*notes, (logging.WARNING, __name__, text))
    mid = len(idx) // 2
    await _run_items(out, pendings, idx[:mid], running, clock, measured, limit_s, notes)
    await _run_items(out, pendings, idx[mid:], running, clock, measured, limit_s, notes)
