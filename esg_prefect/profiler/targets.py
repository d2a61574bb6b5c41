"""What the profiler measures: stages, how to build their models, and real inputs for them.

A :class:`ProfileTarget` is a stage as the profiler sees it: a loader (the cold
start), a batch function, a generator of realistic inputs and, for stages whose
cost depends on their input (Cypress), a size function. Targets are named by
*spec strings*, so that a fresh worker process can rebuild them:

``examples``, ``examples:<pipeline>``
    the stages of the example pipelines, or of one, from the target provider
    registered under that name (entry point group ``esg_prefect.profile_targets``;
    :mod:`esg_prefect.examples.profiling`): each stage is fed the real outputs of
    its upstream stages;
``module:attr``
    a :class:`ProfileTarget`, a sequence of them, or a zero-argument callable
    returning them;
``module:stage@module:samples``
    a registered stage (a :class:`~esg_prefect.runtime.stages.StageSpec`, or the
    Prefect task made by ``Pipeline.stage``) and ``samples(rng, n) -> items``.

:func:`prepare` builds the models in the calling process and times each cold
start (build plus the first call on one real input), as a worker pays it.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from esg_prefect.exceptions import InvalidInputError, ProfileError, UnknownStageError
from esg_prefect.runtime.stages import SizeFn, StageSpec, import_object, resolve_stage
from esg_prefect.runtime.stages import input_size as input_size  # re-exported: the profiler's size unit

LoadFn = Callable[[str], Any]
RunFn = Callable[[Any, list[Any]], Sequence[Any]]
SamplesFn = Callable[[random.Random, int], list[Any]]


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    """One stage to profile.

    Args:
        name: the stage's name in the latency profile.
        load: ``load(device) -> model``; the cold start.
        run: ``run(model, items) -> outputs``, the batch function.
        samples: ``samples(rng, n) -> items``: ``n`` realistic inputs.
        pipeline: the pipeline it belongs to (groups the report and plots).
        size_of: ``size_of(item) -> float`` for the size model; :func:`input_size` by default.

    Example:
        >>> t = ProfileTarget("double", lambda d: 2, lambda m, xs: [m * x for x in xs],
        ...                   lambda rng, n: [rng.random() for _ in range(n)])
        >>> t.run(2, [1, 2])
        [2, 4]
    """

    name: str
    load: LoadFn
    run: RunFn
    samples: SamplesFn
    pipeline: str = ""
    size_of: SizeFn | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError(f"a profile target needs a non-empty name, got {self.name!r}")
        for what in ("load", "run", "samples"):
            if not callable(getattr(self, what)):
                raise InvalidInputError(f"profile target {self.name!r}: {what} must be callable")

    def size(self, item: Any) -> float:
        """The input size of one item."""
        return float((self.size_of or input_size)(item))


@dataclass(slots=True)
class PreparedStage:
    """A target with its model built in this process, real inputs, and its measured cold start."""

    target: ProfileTarget
    model: Any
    jobs: list[Any]
    load_ms: float
    cold_start_ms: float
    model_mem_mb: float = 0.0
    cursor: int = field(default=0)

    @property
    def name(self) -> str:
        """The stage's profile name."""
        return self.target.name

    def next_batch(self, batch: int) -> list[Any]:
        """The next ``batch`` jobs, round robin, so successive calls see different inputs."""
        items = [self.jobs[(self.cursor + k) % len(self.jobs)] for k in range(batch)]
        self.cursor = (self.cursor + batch) % len(self.jobs)
        return items


def samples_name(target: ProfileTarget) -> str:
    """The target's samples function as a user names it: ``'module:function'``."""
    fn = target.samples
    return f"'{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}'"


def _why(exc: BaseException) -> str:
    """An exception on one line: its type and message (a torch message spans lines)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def timed_cold(target: ProfileTarget, device: str, first: Any, inputs: str = "") -> tuple[Any, float, float, float]:
    """Build the model and make the first call: ``(model, load ms, cold start ms, resident MiB the model added)``.

    ``inputs`` names where ``first`` came from (``samples 'module:function'``): a first call that
    fails then says so, as inputs of the wrong kind are the likely cause.

    Raises:
        ProfileError: naming the stage, when its model fails to build or its first call fails.
    """
    from esg_prefect.profiler.machine import current_rss_mb

    gc.collect()
    rss0 = current_rss_mb()
    t0 = time.perf_counter()
    try:
        model = target.load(device)
    except Exception as exc:
        raise ProfileError(f"stage {target.name!r} failed to build its model: {_why(exc)}") from exc
    t1 = time.perf_counter()
    rss1 = current_rss_mb()
    try:
        target.run(model, [first])
    except Exception as exc:
        where = f" from {inputs} (they may not fit the stage: check what it takes)" if inputs else ""
        raise ProfileError(f"stage {target.name!r} failed on its first input{where}: {_why(exc)}") from exc
    _sync(device)
    t2 = time.perf_counter()
    mem = 0.0 if rss0 is None or rss1 is None else max(rss1 - rss0, 0.0)
    return model, (t1 - t0) * 1000.0, (t2 - t0) * 1000.0, mem


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


PROVIDERS = "esg_prefect.profile_targets"
"""Entry-point group of target providers: a spec ``<name>`` or ``<name>:<pipeline>`` goes to the provider ``<name>``."""


class TargetProvider(Protocol):
    """Targets the profiler gets by name from a package (the example pipelines are one such)."""

    def pipelines(self, name: str | None) -> list[str]:
        """The pipelines a spec names: all (``name`` None) or one."""
        ...

    def targets(self, pipelines: Sequence[str]) -> list[ProfileTarget]:
        """Their stages, without building any model."""
        ...

    def prepare(self, pipeline: str, device: str, pool: int, seed: int) -> list[PreparedStage]:
        """Their stages built, with ``pool`` real inputs each and timed cold starts."""
        ...


def provider_of(spec: str) -> tuple[TargetProvider, list[str]] | None:
    """The provider a spec names, and the pipelines it asks for; None for other specs."""
    from importlib.metadata import entry_points

    name, sep, pipeline = spec.partition(":")
    found = entry_points(group=PROVIDERS, name=name)
    if not found or (sep and ("@" in pipeline or "." in pipeline)):
        return None
    provider: TargetProvider = next(iter(found)).load()
    return provider, provider.pipelines(pipeline if sep else None)


def targets_of(spec: str) -> list[ProfileTarget]:
    """Every target a spec names, without building any model."""
    found = provider_of(spec)
    return found[0].targets(found[1]) if found else resolve_targets(spec)


def where_hint(module_name: str, exc: BaseException | None) -> str:
    """Where to run from when ``exc`` says ``module_name`` itself was not found ("" for any other failure).

    A module missing from the import path is most often a script beside the user that the
    command was run away from; a module that fails inside (a missing dependency) needs no hint.
    """
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or not (module_name == missing or module_name.startswith(missing + ".")):
        return ""
    top = module_name.split(".")[0]
    return (
        f"; run esg-prefect from the folder that holds {top}.py (or {top}/), as the working directory is "
        "on the import path, or add that folder to PYTHONPATH"
    )


def _import(path: str) -> Any:
    """The object a target's ``module:attribute`` names, with where to run from when its module is not found."""
    return import_object(path, "target", hint=where_hint)


def resolve_targets(spec: str) -> list[ProfileTarget]:
    """The targets a spec string names (not for ``examples`` specs, which :func:`prepare` handles).

    Raises:
        UnknownStageError: naming the spec when it cannot be imported or is not a target (a stage
            without its ``@module:samples`` included).
    """
    if "@" in spec:
        stage_path, samples_path = spec.split("@", 1)
        try:
            stage = resolve_stage(stage_path)
        except UnknownStageError as exc:  # its module not found: say where to run from
            hint = where_hint(stage_path.partition(":")[0], exc.__cause__)
            if not hint:
                raise
            raise UnknownStageError(f"{exc}{hint}") from exc.__cause__
        samples = _import(samples_path)
        if not callable(samples):
            raise UnknownStageError(f"samples {samples_path!r} of target {spec!r} is not callable")
        pipeline = getattr(getattr(_import(stage_path), "esg_pipeline", None), "name", "")  # Pipeline.stage's task
        return [ProfileTarget(stage.profile_name, stage.load, stage.run, samples, pipeline=str(pipeline))]
    obj = _import(spec)
    if isinstance(obj, ProfileTarget):
        return [obj]
    if isinstance(obj, StageSpec) or isinstance(getattr(obj, "esg_stage", None), StageSpec):
        # A stage (the task Pipeline.stage makes is callable too): calling it would run its task.
        raise UnknownStageError(
            f"{spec!r} is a stage; give its samples: 'module:stage@module:samples' ('{spec}@<module>:<samples>', "
            "samples(rng, n) returning n inputs)"
        )
    if callable(obj) and not isinstance(obj, (list, tuple)):
        obj = obj()
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(t, ProfileTarget) for t in obj):
        return list(obj)
    raise UnknownStageError(
        f"{spec!r} is not a ProfileTarget, a list of them, or a callable returning them; "
        "for a registered stage use 'module:stage@module:samples'"
    )


def prepare(specs: Sequence[str], *, device: str = "cpu", pool: int = 32, seed: int = 0) -> list[PreparedStage]:
    """Build every target's model in this process, make ``pool`` real inputs each, time the cold starts.

    Raises:
        InvalidInputError: on a ``pool`` below 1.
        UnknownStageError: on a spec that names no target.
        ProfileError: naming the stage and its samples when they fail, or the stage fails on them.
    """
    if pool < 1:
        raise InvalidInputError(f"pool must be >= 1, got {pool}")
    out: list[PreparedStage] = []
    for spec in specs:
        found = provider_of(spec)
        if found:
            provider, pipelines = found
            for name in pipelines:
                out += provider.prepare(name, device, pool, seed)
            continue
        for target in resolve_targets(spec):
            where = f"samples {samples_name(target)}"
            try:
                jobs = list(target.samples(random.Random(f"{seed}-{target.name}"), pool))
            except Exception as exc:
                raise ProfileError(f"{where} of stage {target.name!r} failed: {_why(exc)}") from exc
            if not jobs:
                raise InvalidInputError(f"target {target.name!r}: {where} returned no inputs")
            model, load_ms, cold_ms, mem = timed_cold(target, device, jobs[0], where)
            out.append(PreparedStage(target, model, jobs, load_ms, cold_ms, mem))
    names = [p.name for p in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidInputError(f"stage names must be unique across the targets profiled together, repeated: {dup}")
    return out
