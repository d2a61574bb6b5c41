"""The registry of example pipelines, and the direct loop that runs them without Prefect.

Each :class:`PipelineSpec` names its stages (a :class:`StageSpec` each: how to
load the model, the batch function, whether it is a DNN, its name in the latency
profile), its edges, a suggested SLO and its request generator. The integration
layer wires the same stage functions into Prefect flows; the simulator and the
scheduler read the names, edges and SLO through :meth:`PipelineSpec.workflow`.

:func:`run_pipeline_direct` is the "ideal direct loop" the benchmarks compare
against: warm models, stage after stage, every stage's jobs in full batches, no
queues and no Prefect.

How a stage's input is made from its upstream outputs (one request):

- an entry stage receives the request;
- a stage with a *join* function receives ``join({upstream name: upstream output})``
  (the image ``caption`` and the video ``aggregate``);
- any other stage receives the output of its single upstream stage;
- a *fan-out* stage (``calls_per_request > 1``, the video ``frame_model``) receives a
  list and is called once per element; its per-request output is the list of results.

Example:
    >>> import random
    >>> spec = get_pipeline("text")
    >>> spec.stage_names
    ('tokenize', 'encode', 'classify_text', 'summarize')
    >>> out = run_pipeline_direct("text", [spec.make_input(random.Random(0))])
    >>> sorted(out[0])
    ['text', 'tokens']
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from esg_prefect.examples import image, text, video
from esg_prefect.exceptions import InvalidInputError, WorkflowError
from esg_prefect.model import CPU, Config, LatencyProfile, Workflow

LoadFn = Callable[[str], Any]
RunFn = Callable[[Any, list[Any]], list[Any]]
JoinFn = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One stage of an example pipeline.

    Args:
        name: stage name, unique across the catalog.
        load: ``load(device) -> model``: builds the model with seeded weights (the cold start).
        run: ``run(model, inputs) -> outputs``: the batch function, one output per input, in order.
        is_dnn: False for the cheap tensor or string stages (preprocess, tokenize, split).
        profile_name: the stage's name in the latency profile CSV.
        calls_per_request: typical calls per request; above 1 marks a fan-out stage
            (its input is a list, one call per element).
    """

    name: str
    load: LoadFn
    run: RunFn
    is_dnn: bool
    profile_name: str
    calls_per_request: int = 1

    def __post_init__(self) -> None:
        if not self.name or not self.profile_name:
            raise InvalidInputError(
                f"stage and profile names must be non-empty, got {self.name!r}, {self.profile_name!r}"
            )
        if self.calls_per_request < 1:
            raise InvalidInputError(f"calls_per_request must be >= 1, got {self.calls_per_request}")

    @property
    def fan_out(self) -> bool:
        """Whether the stage is called once per element of its input list."""
        return self.calls_per_request > 1

    @property
    def load_path(self) -> str:
        """``module:function`` import path of :attr:`load` (stage code travels by import path)."""
        return f"{self.load.__module__}:{self.load.__qualname__}"

    @property
    def run_path(self) -> str:
        """``module:function`` import path of :attr:`run`."""
        return f"{self.run.__module__}:{self.run.__qualname__}"


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """One example pipeline.

    Args:
        name: pipeline (workflow) name.
        stages: the stages in a topological order.
        edges: ``(upstream, downstream)`` stage-name pairs.
        slo_ms: suggested end-to-end SLO, from the measured CPU profile (see :func:`suggest_slo_ms`).
        make_input: ``make_input(rng) -> request``: one realistic request for the entry stage.
        joins: ``(stage, join)`` pairs: ``join({upstream name: output}) -> input`` for stages whose
            input is not simply their single upstream's output.

    Raises:
        WorkflowError: on unknown stage names in edges or joins, a cycle, a stage order that is not
            topological, or a pipeline without exactly one entry and one exit.
    """

    name: str
    stages: tuple[StageSpec, ...]
    edges: tuple[tuple[str, str], ...]
    slo_ms: float
    make_input: Callable[[random.Random], Any]
    joins: tuple[tuple[str, JoinFn], ...] = ()

    def __post_init__(self) -> None:
        wf = self.workflow()  # validates names, edges, DAG and the SLO
        names = self.stage_names
        order = {s: i for i, s in enumerate(names)}
        for u, v in self.edges:
            if order[u] > order[v]:
                raise WorkflowError(f"pipeline {self.name!r}: stages are not in topological order ({u!r} -> {v!r})")
        if len(wf.entries) != 1 or len(wf.exits) != 1:
            raise WorkflowError(f"pipeline {self.name!r} needs one entry and one exit, got {wf.entries} and {wf.exits}")
        for stage, _ in self.joins:
            if stage not in order:
                raise WorkflowError(f"pipeline {self.name!r}: join for unknown stage {stage!r}")
        for st in self.stages:
            if len(wf.predecessors(st.name)) > 1 and st.name not in dict(self.joins):
                raise WorkflowError(f"pipeline {self.name!r}: stage {st.name!r} has several upstreams and no join")

    @property
    def stage_names(self) -> tuple[str, ...]:
        """Stage names in topological order."""
        return tuple(s.name for s in self.stages)

    def stage(self, name: str) -> StageSpec:
        """The stage called ``name``."""
        for s in self.stages:
            if s.name == name:
                return s
        raise InvalidInputError(f"pipeline {self.name!r} has no stage {name!r}; stages: {self.stage_names}")

    def workflow(self, slo_ms: float | None = None) -> Workflow:
        """The pipeline as a :class:`~esg_prefect.model.Workflow` (stage names as in the profile's)."""
        return Workflow(self.name, self.stage_names, self.edges, self.slo_ms if slo_ms is None else slo_ms)

    def input_for(self, stage: str, upstream: Mapping[str, Any]) -> Any:
        """The input of ``stage`` for one request, from its upstream stages' outputs (by name)."""
        join = dict(self.joins).get(stage)
        if join is not None:
            return join(upstream)
        if len(upstream) != 1:
            raise WorkflowError(f"stage {stage!r} expects one upstream output, got {sorted(upstream)}")
        return next(iter(upstream.values()))


def _caption_join(up: Mapping[str, Any]) -> Any:
    return image.caption_input(up["classify"], up["scene"])


def _aggregate_join(up: Mapping[str, Any]) -> Any:
    return video.aggregate_input(up["frame_model"])


PIPELINES: dict[str, PipelineSpec] = {
    "image": PipelineSpec(
        name="image",
        stages=(
            StageSpec("preprocess", image.load_preprocess, image.run_preprocess, False, "preprocess"),
            StageSpec("detect", image.load_detect, image.run_detect, True, "detect"),
            StageSpec("classify", image.load_classify, image.run_classify, True, "classify"),
            StageSpec("scene", image.load_scene, image.run_scene, True, "scene"),
            StageSpec("caption", image.load_caption, image.run_caption, True, "caption"),
        ),
        edges=(
            ("preprocess", "detect"),
            ("detect", "classify"),
            ("classify", "caption"),
            ("preprocess", "scene"),
            ("scene", "caption"),
        ),
        slo_ms=380.0,
        make_input=image.make_input,
        joins=(("caption", _caption_join),),
    ),
    "text": PipelineSpec(
        name="text",
        stages=(
            StageSpec("tokenize", text.load_tokenize, text.run_tokenize, False, "tokenize"),
            StageSpec("encode", text.load_encode, text.run_encode, True, "encode"),
            StageSpec("classify_text", text.load_classify_text, text.run_classify_text, True, "classify_text"),
            StageSpec("summarize", text.load_summarize, text.run_summarize, True, "summarize"),
        ),
        edges=(("tokenize", "encode"), ("encode", "classify_text"), ("classify_text", "summarize")),
        slo_ms=990.0,
        make_input=text.make_input,
    ),
    "video": PipelineSpec(
        name="video",
        stages=(
            StageSpec("split_frames", video.load_split_frames, video.run_split_frames, False, "split_frames"),
            StageSpec("frame_model", video.load_frame_model, video.run_frame_model, True, "frame_model", video.FRAMES),
            StageSpec("aggregate", video.load_aggregate, video.run_aggregate, True, "aggregate"),
        ),
        edges=(("split_frames", "frame_model"), ("frame_model", "aggregate")),
        slo_ms=140.0,
        make_input=video.make_input,
        joins=(("aggregate", _aggregate_join),),
    ),
}
"""The example pipelines by name. SLOs: see :func:`suggest_slo_ms`; values set from the shipped CPU profile."""


def get_pipeline(name: str) -> PipelineSpec:
    """The pipeline called ``name``.

    Raises:
        InvalidInputError: naming the known pipelines when ``name`` is not one.
    """
    try:
        return PIPELINES[name]
    except KeyError:
        raise InvalidInputError(f"unknown pipeline {name!r}; known: {sorted(PIPELINES)}") from None


def all_stages() -> list[StageSpec]:
    """Every stage of every pipeline, pipeline by pipeline in topological order."""
    return [s for p in PIPELINES.values() for s in p.stages]


def load_pipeline(name: str, device: str = "cpu") -> dict[str, Any]:
    """Load every stage's model of pipeline ``name`` on ``device``: stage name -> model."""
    return {s.name: s.load(device) for s in get_pipeline(name).stages}


def _run_batched(stage: StageSpec, model: Any, jobs: list[Any], batch_size: int) -> list[Any]:
    out: list[Any] = []
    for i in range(0, len(jobs), batch_size):
        chunk = jobs[i : i + batch_size]
        res = stage.run(model, chunk)
        if len(res) != len(chunk):
            raise WorkflowError(f"stage {stage.name!r} returned {len(res)} outputs for {len(chunk)} inputs")
        out += res
    return out


def trace_pipeline(
    name: str,
    inputs: Sequence[Any],
    *,
    batch_size: int = 8,
    models: Mapping[str, Any] | None = None,
    device: str = "cpu",
    loader: Callable[[StageSpec, list[Any]], Any] | None = None,
) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Run pipeline ``name`` stage by stage and return every stage's jobs and outputs.

    Args:
        name: pipeline name.
        inputs: requests.
        batch_size: jobs per call of each stage.
        models: warm models by stage name; a stage missing here is loaded when it is reached.
        device: where to load missing models.
        loader: ``loader(stage, jobs) -> model`` loads a missing model instead of
            ``stage.load(device)``; it sees the stage's jobs first (the profiler times
            the cold start, load plus first call, on a real job this way).

    Returns:
        ``(jobs, outputs)``: per stage name, the inputs of its calls (one per call: a fan-out
        stage has one per element) and the per-request outputs.
    """
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
    spec = get_pipeline(name)
    models = dict(models or {})
    wf = spec.workflow()
    jobs: dict[str, list[Any]] = {}
    outputs: dict[str, list[Any]] = {}
    for stage in spec.stages:
        preds = wf.predecessors(stage.name)
        if preds:
            per_request = [spec.input_for(stage.name, {p: outputs[p][i] for p in preds}) for i in range(len(inputs))]
        else:
            per_request = list(inputs)
        flat = [x for req in per_request for x in req] if stage.fan_out else per_request
        if stage.name not in models:
            models[stage.name] = loader(stage, flat) if loader is not None else stage.load(device)
        if stage.fan_out:
            results = _run_batched(stage, models[stage.name], flat, batch_size)
            grouped, start = [], 0
            for req in per_request:
                grouped.append(results[start : start + len(req)])
                start += len(req)
            jobs[stage.name], outputs[stage.name] = flat, grouped
        else:
            jobs[stage.name] = per_request
            outputs[stage.name] = _run_batched(stage, models[stage.name], per_request, batch_size)
    return jobs, outputs


def run_pipeline_direct(
    name: str,
    inputs: Sequence[Any],
    *,
    batch_size: int = 8,
    models: Mapping[str, Any] | None = None,
    device: str = "cpu",
) -> list[Any]:
    """Run pipeline ``name`` over ``inputs`` in batches, with no Prefect and no pool: the ideal direct loop.

    Args:
        name: pipeline name.
        inputs: requests, e.g. from the pipeline's ``make_input``.
        batch_size: jobs per call of each stage.
        models: warm models from :func:`load_pipeline`; loaded now (a cold start) when omitted.
        device: where to load models when ``models`` is omitted.

    Returns:
        The exit stage's output for each request, in order.
    """
    spec = get_pipeline(name)
    _, outputs = trace_pipeline(name, inputs, batch_size=batch_size, models=models, device=device)
    return outputs[spec.workflow().exits[0]]


def critical_path_ms(name: str, profile: LatencyProfile, vcpus: int = 1) -> float:
    """The longest path through pipeline ``name`` of unbatched mean latencies on the CPU.

    Each stage costs its mean batch latency with ``vcpus`` vCPUs at batch 1,
    except a fan-out stage, which costs one batch of its ``calls_per_request``
    calls (one request's frames run together).

    Raises:
        MissingProfileError: when the profile lacks a needed point.
    """
    spec = get_pipeline(name)
    cost = {
        s.name: profile.latency_ms(s.profile_name, Config(s.calls_per_request, vcpus), CPU, "mean") for s in spec.stages
    }
    wf = spec.workflow()
    finish: dict[str, float] = {}
    for s in wf.topological_order():
        finish[s] = cost[s] + max((finish[p] for p in wf.predecessors(s)), default=0.0)
    return max(finish.values())


def suggest_slo_ms(name: str, profile: LatencyProfile, factor: float = 3.0, vcpus: int = 1) -> float:
    """A suggested SLO: ``factor`` times :func:`critical_path_ms`, rounded up to 10 ms.

    Raises:
        MissingProfileError: when the profile lacks a needed point.
    """
    return float(math.ceil(factor * critical_path_ms(name, profile, vcpus) / 10.0) * 10)
