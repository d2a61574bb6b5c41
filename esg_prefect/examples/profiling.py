"""The example pipelines as profiler targets: ``esg-prefect profile --targets examples[:<pipeline>]``.

Registered with the profiler through the ``esg_prefect.profile_targets`` entry
point (the profiler imports no example code). Each stage is fed the real
outputs of its upstream stages: the pipeline runs once, stage by stage, so text
lengths, box counts and crop counts vary as they do in service, and each
stage's cold start is timed as it is built.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from esg_prefect.examples.catalog import PIPELINES, StageSpec, get_pipeline, trace_pipeline
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.profiler.targets import PreparedStage, ProfileTarget, timed_cold


def _no_samples(rng: random.Random, n: int) -> list[Any]:
    raise InvalidInputError("example stages get their inputs from the pipeline's upstream stages")


class ExampleTargets:
    """The profiler's target provider for the example pipelines."""

    def pipelines(self, name: str | None) -> list[str]:
        """Every example pipeline (``name`` None), or the one named (unknown names are named in the error)."""
        if name is None:
            return list(PIPELINES)
        get_pipeline(name)
        return [name]

    def targets(self, pipelines: Sequence[str]) -> list[ProfileTarget]:
        """The pipelines' stages as targets; their ``samples`` is unused (see :meth:`prepare`)."""
        out = []
        for name in pipelines:
            for st in get_pipeline(name).stages:
                out.append(ProfileTarget(st.profile_name, st.load, st.run, _no_samples, pipeline=name))
        return out

    def prepare(self, pipeline: str, device: str, pool: int, seed: int) -> list[PreparedStage]:
        """Build each stage of ``pipeline`` and ``pool`` real inputs for it, timing the cold starts."""
        spec = get_pipeline(pipeline)
        rng = random.Random(f"{seed}-{pipeline}")
        requests = [spec.make_input(rng) for _ in range(pool)]
        timed: dict[str, tuple[Any, float, float, float]] = {}

        def loader(stage: StageSpec, jobs: list[Any]) -> Any:
            t = ProfileTarget(stage.profile_name, stage.load, stage.run, _no_samples)
            timed[stage.name] = timed_cold(t, device, jobs[0])
            return timed[stage.name][0]

        jobs, _ = trace_pipeline(pipeline, requests, batch_size=8, loader=loader, device=device)
        out = []
        for st in spec.stages:
            model, load_ms, cold_ms, mem = timed[st.name]
            target = ProfileTarget(st.profile_name, st.load, st.run, _no_samples, pipeline=pipeline)
            out.append(PreparedStage(target, model, jobs[st.name], load_ms, cold_ms, mem))
        return out


EXAMPLES = ExampleTargets()
