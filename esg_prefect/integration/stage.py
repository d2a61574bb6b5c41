"""Declaring DNN stages on Prefect tasks.

A :class:`Pipeline` names a workflow and its end-to-end SLO (and, optionally,
its DAG); ``@pipeline.stage(load=...)`` turns a *batch function*
``run(model, items) -> outputs`` into a Prefect task that takes *one* item.
Each call of that task stays a real Prefect task run (states, retries,
caching, logs, graph edges in the UI); inside it, the call is handed to the
ESG pool of the flow's :class:`~esg_prefect.integration.runner.ESGTaskRunner`,
which batches it with the same stage's calls from other flow runs, and waits
for its output. Without an ESG runner (another task runner, or no flow at all)
the task runs its batch function on a batch of one, with the model loaded once
per process: the same code works with and without pooling.

Routing happens in the task body, not in the runner's ``submit``, so direct
calls (``detect(x)``), ``.submit`` and ``.map`` are pooled alike.

Example:
    Before, one model call per flow run::

        @task
        def detect(image): return model(image[None])[0]

    After, batched across flow runs::

        image = Pipeline("image", slo_ms=800)

        @image.stage(load=load_detector)
        def detect(model, images: list) -> list:
            return list(model(torch.stack(images)))

        @flow(task_runner=ESGTaskRunner())
        def image_flow(img): return detect(img)
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from esg_prefect.control.calls import StageCall, StagePool, StageResult, WorkflowDecl, shortened_run_name
from esg_prefect.exceptions import InvalidInputError, WorkflowError
from esg_prefect.model.workflow import seconds_slo_hint
from esg_prefect.runtime.batch_output import STDERR_LEVEL
from esg_prefect.runtime.stages import BatchFn, LoadFn, SizeFn, StageSpec, run_checked


@dataclass(frozen=True, slots=True)
class _Options:
    request_id: str | None = None
    input_size: float | None = None


_NO_OPTIONS = _Options()
_WAIT_SLICE_S = 0.25  # a stage task with a timeout waits for its call in slices this long
_options: contextvars.ContextVar[_Options] = contextvars.ContextVar("esg_options", default=_NO_OPTIONS)


@contextlib.contextmanager
def esg_options(*, request_id: str | None = None, input_size: float | None = None) -> Iterator[None]:
    """Per-call options for the stage calls made inside the block.

    Args:
        request_id: the request these calls belong to. By default a request is
            a flow run; a flow that serves many requests (e.g. one ``.map`` per
            request) names each so that deadlines and costs follow requests.
        input_size: size of the input in its profile's unit (tokens, crops), overriding the stage's size function.

    Example:
        >>> with esg_options(request_id="req-42"):   # doctest: +SKIP
        ...     caption(detect(img))
    """
    if input_size is not None and not input_size > 0:
        raise InvalidInputError(f"input_size must be > 0, got {input_size!r}")
    token = _options.set(_Options(request_id, input_size))
    try:
        yield
    finally:
        _options.reset(token)


class Pipeline:
    """A workflow of DNN stages with an end-to-end latency SLO.

    Args:
        name: workflow (application) name; one AFW queue per (name, stage).
        slo_ms: end-to-end latency objective of one request, in ms.
        edges: ``(upstream, downstream)`` stage names; leave None to let the
            pool learn the DAG from the runs (from which task outputs feed which task).

    Raises:
        InvalidInputError: on an empty name or a non-positive SLO.
    """

    def __init__(self, name: str, slo_ms: float, edges: Sequence[tuple[str, str]] | None = None) -> None:
        self.decl = WorkflowDecl(name, slo_ms, tuple(edges) if edges is not None else None)
        hint = seconds_slo_hint(slo_ms)
        if hint is not None:  # most likely seconds: Prefect's own time per run uses it up, silently
            warnings.warn(
                f"pipeline {name!r}: slo_ms={slo_ms:g} is {slo_ms:g} ms, which Prefect's own time per flow run "
                f"already uses up (every call is served best effort); {hint}",
                UserWarning,
                stacklevel=2,
            )
        self.stages: dict[str, StageSpec] = {}
        self._edges_checked = False

    def check_edges(self) -> None:
        """Refuse edges that name a stage this pipeline has not decorated (checked at its first call, once
        the module has defined every stage).

        Raises:
            WorkflowError: naming the unknown stages and the pipeline's own.
        """
        if self._edges_checked or self.decl.edges is None:
            return
        named = {x for e in self.decl.edges for x in e}
        unknown = sorted(named - set(self.stages))
        if unknown:
            raise WorkflowError(
                f"pipeline {self.name!r}: its edges name stages it does not have: {', '.join(map(repr, unknown))} "
                f"(its stages: {', '.join(map(repr, self.stages)) or 'none'})"
            )
        self._edges_checked = True

    @property
    def name(self) -> str:
        """The workflow's name."""
        return self.decl.name

    def stage(
        self,
        *,
        load: LoadFn,
        name: str | None = None,
        profile_name: str | None = None,
        import_path: str | None = None,
        size_of: SizeFn | None = None,
        **task_kwargs: Any,
    ) -> Callable[[BatchFn], Any]:
        """Decorate a batch function ``run(model, items) -> outputs`` into a one-item Prefect task.

        The task's ``.aio`` is its async twin (same stage, options and pool), for
        ``await stage.aio(item)`` in an async flow: a sync task there would block the
        event loop while its call waits, and no other run's call could join its batch.
        ``stage.with_options(...)`` returns such a stage too, its ``.aio`` with the same options.

        Args:
            load: ``load(device) -> model``, run once per worker.
            name: stage name (default: the function's name); also the task's name.
            profile_name: the stage's name in the latency profile (default: ``name``).
            import_path: where workers find the stage (default: the function's
                ``module:qualname``; the decorated object must live there).
            size_of: ``size_of(item) -> float``, one input's size in the unit its
                profile's size model uses (Cypress packing and ``input_size`` cost
                splits); the generic :func:`~esg_prefect.runtime.stages.input_size`
                (words of a text, elements of a tensor, ...) by default.
            **task_kwargs: passed to ``prefect.task`` (retries, tags, ...). The cache policy
                defaults to ``NO_CACHE``, under which Prefect persists no result (hashing large
                tensor inputs costs more than caching saves), unless a ``cache_key_fn``,
                ``persist_result=True``, ``result_storage``, ``result_storage_key`` or
                ``result_serializer`` is given: then Prefect's own default applies. A flow's
                ``persist_result=True`` or ``PREFECT_RESULTS_PERSIST_BY_DEFAULT`` does not reach a
                stage under ``NO_CACHE``. (``stage.with_options(...)`` keeps the ``NO_CACHE``: give
                ``cache_policy`` there too; with ``cache_key_fn`` Prefect warns that the key wins.)
        """
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        def decorate(run: BatchFn) -> Any:
            stage_name: str = name or str(getattr(run, "__name__", ""))
            _check_batch_fn(stage_name, run, import_path)
            path = import_path or f"{run.__module__}:{run.__qualname__}"
            spec = StageSpec(stage_name, load, run, path, str(profile_name or stage_name), size_of)
            if stage_name in self.stages:
                raise InvalidInputError(f"pipeline {self.name!r} already has a stage named {stage_name!r}")
            self.stages[stage_name] = spec
            decl = self.decl

            def one_item(item: Any) -> Any:
                self.check_edges()
                return call_stage(spec, decl, item)

            functools.update_wrapper(one_item, run)
            # Prefect reads the parameters from the signature: one item, not (model, items).
            one_item.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [inspect.Parameter("item", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            )
            task_kwargs.setdefault("name", stage_name)
            # Inference inputs are large tensors: hashing them for a cache key costs more than it saves.
            # Not where the user set a cache key function (their cache policy) or asked for the result to
            # be persisted: Prefect persists nothing under NO_CACHE, and would ignore them silently.
            if not _ASKS_TO_PERSIST.intersection(k for k, v in task_kwargs.items() if v not in (None, False)):
                task_kwargs.setdefault("cache_policy", NO_CACHE)
            prefect_task = task(**task_kwargs)(one_item)

            async def one_item_async(item: Any) -> Any:
                self.check_edges()
                return await acall_stage(spec, decl, item)

            functools.update_wrapper(one_item_async, run)
            one_item_async.__signature__ = one_item.__signature__  # type: ignore[attr-defined]
            aio = _stage_task(task(**task_kwargs)(one_item_async), spec, self, None)
            return _stage_task(prefect_task, spec, self, aio)

        return decorate


def _stage_task(prefect_task: Any, spec: StageSpec, pipeline: Pipeline, aio: Any | None) -> Any:
    """Mark a Prefect task as ``spec``'s: its ``esg_stage``, ``esg_pipeline`` and (the sync one) its ``.aio`` twin.

    Its ``with_options`` keeps all three, the twin given the same options:
    Prefect's builds a plain ``Task``, which would lose them, so that
    ``stage.with_options(retries=2).aio`` would not exist.
    """
    prefect_task.esg_stage, prefect_task.esg_pipeline = spec, pipeline
    if aio is not None:
        prefect_task.aio = aio
    plain = prefect_task.with_options

    @functools.wraps(plain)
    def with_options(**options: Any) -> Any:
        twin = aio.with_options(**options) if aio is not None else None
        return _stage_task(plain(**options), spec, pipeline, twin)

    prefect_task.with_options = with_options  # this task's own: Prefect's method on its class is untouched
    return prefect_task


_ASKS_TO_PERSIST = frozenset(
    {"cache_key_fn", "persist_result", "result_storage", "result_storage_key", "result_serializer"}
)
"""Task options that keep a stage's cache policy Prefect's (no ``NO_CACHE`` default): each asks for a result."""


def _check_batch_fn(stage: str, run: Any, import_path: str | None) -> None:
    """Refuse, at decoration, a batch function workers could not call or find.

    Raises:
        InvalidInputError: it does not take ``(model, items)``, or it is defined
            inside a function (workers import stages by path) with no ``import_path``.
    """
    if not callable(run):
        raise InvalidInputError(f"stage {stage!r}: the decorated object must be a function, got {run!r}")
    if inspect.iscoroutinefunction(run) or inspect.isasyncgenfunction(run):
        raise InvalidInputError(
            f"stage {stage!r}: the batch function {getattr(run, '__name__', run)!r} is async; workers call it "
            "in a thread of their own and need its outputs back: make it a plain def"
        )
    try:
        sig = inspect.signature(run)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        sig = None
    if sig is not None:
        try:
            sig.bind(None, [])
        except TypeError:
            raise InvalidInputError(
                f"stage {stage!r}: its batch function must take (model, items), got {stage}{sig}"
            ) from None
    if import_path is None and "<locals>" in getattr(run, "__qualname__", ""):
        raise InvalidInputError(
            f"stage {stage!r} is defined inside a function ({run.__qualname__}): worker processes import "
            "stages by path, so define it at module level, or pass import_path='module:attribute' naming a "
            "module-level stage"
        )


_local_models: dict[str, Any] = {}
_local_lock = threading.Lock()  # guards _local_models: tasks of one process load each model once
local_call_log: collections.deque[tuple[str, float]] = collections.deque(maxlen=1_000_000)
"""(stage, ms) of each call run outside a pool, for per-invocation cost comparisons."""


def local_device() -> str:
    """Where a stage runs outside a pool: ``$ESG_PREFECT_LOCAL_DEVICE``, else ``cuda`` when torch sees a GPU.

    Why: under Prefect's own task runners a stage is an ordinary task in the
    flow's process, and a user with a GPU runs their models there; comparing
    ESG's pooled GPU workers with a thread pool held to the CPU would flatter ESG.
    """
    import os

    chosen = os.environ.get("ESG_PREFECT_LOCAL_DEVICE", "").strip()
    if chosen:
        return chosen
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_locally(spec: StageSpec, item: Any) -> Any:
    """Run one item through the stage in this process (no pool), loading its model once (on :func:`local_device`)."""
    with _local_lock:
        model = _local_models.get(spec.import_path)
        if model is None:
            model = spec.load(local_device())
            _local_models[spec.import_path] = model
    t0 = time.perf_counter()
    out = run_checked(spec, model, [item])[0]
    local_call_log.append((spec.name, (time.perf_counter() - t0) * 1000.0))
    return out


def _runner_of_current_flow() -> Any:
    """The flow run's ESG task runner, or None when it runs under another runner (or no flow)."""
    from prefect.context import FlowRunContext

    from esg_prefect.integration.runner import ESGTaskRunner

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None) if ctx is not None else None
    return runner if isinstance(runner, ESGTaskRunner) else None


def _pool_of_current_flow() -> Any:
    runner = _runner_of_current_flow()
    return runner.pool_client() if runner is not None else None


def request_arrival_ms(flow_run: Any, slo_from: str = "arrival") -> float:
    """Where a flow run's SLO starts (wall clock, ms): when its request arrived, or when it started running.

    ``"arrival"`` (the default) is the run's expected start time (a scheduled
    run's slot; for a run started by calling the flow, when it was created),
    else its creation time; never later than when it started running. Not the
    start time alone: creating a flow run and setting it running costs Prefect's
    API a few round trips (0.2-0.5 s on a busy 2-core machine), spent against
    the SLO before the first stage call, and a pool that did not count it
    planned later deadlines than the caller measures.

    ``"start"`` is when the run started running (``ESGTaskRunner(slo_from="start")``):
    for deployment runs, whose worker or served runner picks a run up seconds
    after its slot and starts a process for it, time no stage can win back.
    """
    if flow_run is None:
        return time.time() * 1000.0
    if slo_from == "start":
        start = getattr(flow_run, "start_time", None)
        return start.timestamp() * 1000.0 if start is not None else time.time() * 1000.0
    marks = [getattr(flow_run, name, None) for name in ("expected_start_time", "created", "start_time")]
    stamps = [m.timestamp() * 1000.0 for m in marks if m is not None]
    if not stamps:
        return time.time() * 1000.0
    arrival = stamps[0]
    start = getattr(flow_run, "start_time", None)
    return float(min(arrival, start.timestamp() * 1000.0)) if start is not None else float(arrival)


def call_stage(spec: StageSpec, decl: WorkflowDecl, item: Any) -> Any:
    """The body of every stage task: pool the call if an ESG runner is active, else run it here."""
    pool = _pool_of_current_flow()
    if pool is None:
        return run_locally(spec, item)
    from prefect.context import TaskRunContext

    task_ctx = TaskRunContext.get()
    timeout_s = getattr(getattr(task_ctx, "task", None), "timeout_seconds", None)
    return _finish(spec, _wait(pool, _stage_call(spec, decl, item), timeout_s))


async def acall_stage(spec: StageSpec, decl: WorkflowDecl, item: Any) -> Any:
    """The body of a stage's ``.aio`` task: :func:`call_stage` that awaits its call instead of blocking.

    An async flow's event loop goes on while the call waits, so the concurrent
    async flow runs of one process share batches. A cancelled wait (Prefect's
    task timeout, the flow cancelled) withdraws a call still queued.
    """
    pool = _pool_of_current_flow()
    if pool is None:
        return await asyncio.to_thread(run_locally, spec, item)
    call = _stage_call(spec, decl, item)
    fut = pool.submit(call)
    waiting = asyncio.wrap_future(fut)
    waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning once abandoned
    try:
        # Shielded: a cancelled wait must not cancel the pool's future (the pool answers it), it withdraws the call.
        result = await asyncio.shield(waiting)
    except BaseException:
        if not fut.done():
            pool.cancel(call.call_id)
        raise
    return _finish(spec, result)


def _finish(spec: StageSpec, result: StageResult) -> Any:
    """Log the call's batch on its task run, replay what the batch printed, and return the output."""
    from prefect import get_run_logger

    logger = get_run_logger()
    logger.info("%s: %s", spec.name, result.describe())
    replay_lines(result, logger)
    return result.output


def _stage_call(spec: StageSpec, decl: WorkflowDecl, item: Any) -> StageCall:
    """The pool call of this task run: its ids, request, upstream calls and arrival."""
    from prefect.client.schemas.objects import TaskRunResult
    from prefect.context import FlowRunContext, TaskRunContext

    flow_ctx = FlowRunContext.get()
    task_ctx = TaskRunContext.get()
    opts = _options.get()
    run_id = str(flow_ctx.flow_run.id) if flow_ctx and flow_ctx.flow_run else f"local-{uuid.uuid4()}"
    task_run_id = str(task_ctx.task_run.id) if task_ctx else str(uuid.uuid4())
    attempt = task_ctx.task_run.run_count if task_ctx else 0
    upstream: list[str] = []
    if task_ctx is not None:
        for inputs in task_ctx.task_run.task_inputs.values():
            upstream.extend(str(i.id) for i in inputs if isinstance(i, TaskRunResult))
    runner = _runner_of_current_flow()
    slo_from = runner.slo_from if runner is not None else "arrival"
    arrival_ms = request_arrival_ms(flow_ctx.flow_run if flow_ctx else None, slo_from)
    call = StageCall(
        call_id=f"{task_run_id}:{attempt}",
        stage=spec.name,
        stage_path=spec.import_path,
        workflow=decl,
        request_id=opts.request_id or run_id,
        run_id=run_id,
        item=item,
        upstream=tuple(upstream),
        arrival_ms=arrival_ms,
        input_size=opts.input_size or spec.size(item),
        task_run_id=task_run_id,
        deployment_id=str(getattr(flow_ctx.flow_run, "deployment_id", None) or "") if flow_ctx else "",
        profile_stage=spec.profile_name if spec.profile_name != spec.name else "",
        run_name=_run_name(flow_ctx),
    )
    return call


def _run_name(flow_ctx: Any) -> str:
    """The flow run's name in its context ("" outside a flow run, or where it has none), a long one cut to
    :data:`~esg_prefect.control.calls.MAX_RUN_NAME` characters ending in ``…``, so the cut shows."""
    name = getattr(flow_ctx.flow_run, "name", None) if flow_ctx is not None and flow_ctx.flow_run else None
    return shortened_run_name(name) if isinstance(name, str) else ""


def replay_lines(result: StageResult, logger: Any) -> None:
    """What the call's batch printed or logged, replayed on this task run (``runtime.batch_output``).

    A print is printed here, so Prefect's ``log_prints`` (the task's, the
    flow's or the setting) decides whether it becomes a log line, as for any
    task; what the batch wrote to stderr is written to stderr, never logged, as
    a plain task's warnings and progress bars are not; a log record goes to the
    task run's logger at its level. Each line names the batch, which may have
    served other runs too.
    """
    tag = f"[batch {result.batch_id}]"
    for level, name, text in result.lines:
        if name:
            logger.log(level, "%s %s: %s", tag, name, text)
        elif level >= STDERR_LEVEL:  # written, not printed: Prefect's log_prints logs print(file=sys.stderr) too,
            sys.stderr.write(f"{tag} {text}\n")  # and a plain task's stderr (warnings, progress bars) stays there
        else:
            print(f"{tag} {text}")


def _wait(pool: StagePool, call: StageCall, timeout_s: float | None) -> StageResult:
    """The call's result; with a task timeout, waited for in slices so that Prefect's timeout can stop the wait.

    Prefect stops a timed-out task in a worker thread by raising in it, which a
    blocking wait does not see until it returns. On the way out (a timeout or
    any other interruption) a call still queued is withdrawn from the pool.
    """
    fut = pool.submit(call)
    if timeout_s is None:
        return fut.result()
    try:
        while True:
            try:
                return fut.result(timeout=_WAIT_SLICE_S)
            except concurrent.futures.TimeoutError:
                continue
    except BaseException:
        if not fut.done():
            pool.cancel(call.call_id)
        raise
