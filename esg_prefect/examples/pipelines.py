"""The example pipelines as Prefect flows whose DNN stages are pooled by ESG.

Three workflows, the models of :mod:`esg_prefect.examples.catalog`:

* ``image``: preprocess -> detect -> classify -> caption, with the parallel
  branch preprocess -> scene joining at caption (a fork-join the dominator
  split turns into one segment);
* ``text``: tokenize -> encode -> classify_text -> summarize (a chain);
* ``video``: split_frames -> frame_model, once per frame (fan-out) -> aggregate.

The DNN stages are pooled (``Pipeline.stage``); the cheap tensor and string stages
(preprocess, tokenize, split_frames) are plain Prefect tasks that run in the flow's
process, and the workflow declared to the pool is the DAG of the DNN stages.

A flow takes a request *seed* and makes its input inside (as a real flow would
fetch an image or a text): flow parameters go to the Prefect API, tensors
should not. The flows carry no task runner; choose one per use::

    from esg_prefect import ESGTaskRunner
    image_flow.with_options(task_runner=ESGTaskRunner())(request_seed=7)
"""

from __future__ import annotations

import functools
import random
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from esg_prefect.examples import catalog, image, text, video
from esg_prefect.integration.stage import Pipeline

_HERE = __name__

SLO_MS = {"image": 2000.0, "text": 1500.0, "video": 2500.0}
"""End-to-end SLOs of the example *flows*, from the flow run's start to its last stage.

The catalog's SLOs (3x the batch-1 model time) are for the models alone. A request served
through Prefect also pays Prefect's own per-task-run overhead, measured on the 2-core
development machine at 100-250 ms per task run (a 5-task flow of trivial tasks took about
1.2 s there): image has 5 task runs per request, text 4, video 10 (8 frame calls).
"""


@functools.cache
def _local_model(workflow: str, stage: str) -> Any:
    """The model of a cheap stage, built once per process (the flow's own process)."""
    return catalog.get_pipeline(workflow).stage(stage).load("cpu")


def _local_task(workflow: str, st: catalog.StageSpec) -> Any:
    """A plain Prefect task for a cheap, non-DNN stage: it runs in the flow, never in the pool.

    Resizing an image, tokenizing a text or cutting a clip into frames costs 0.2-2 ms
    here (see the profile), far less than a round trip to a worker with a 1 MB image
    in and out; batching gains nothing on them. So they stay ordinary tasks, run as
    Prefect's thread pool would run them, under either task runner.
    """

    def run_one(item: Any) -> Any:
        return st.run(_local_model(workflow, st.name), [item])[0]

    run_one.__name__ = run_one.__qualname__ = st.name
    # No cache key: Prefect's default policy hashes the inputs (a 3.7 MB image, a clip of frames) on
    # every call, for a cache that nothing reads (results are not persisted).
    return task(name=st.name, cache_policy=NO_CACHE)(run_one)


def _dnn_edges(spec: catalog.PipelineSpec) -> tuple[tuple[str, str], ...]:
    """The pipeline's edges between DNN stages: cheap stages contracted (their inputs feed their outputs)."""
    dnn = {st.name for st in spec.stages if st.is_dnn}
    edges = set(spec.edges)
    for st in spec.stages:
        if st.name in dnn:
            continue
        preds = {a for a, b in edges if b == st.name}
        succs = {b for a, b in edges if a == st.name}
        edges = {(a, b) for a, b in edges if st.name not in (a, b)} | {(a, b) for a in preds for b in succs}
    return tuple(sorted(edges))


def _pipeline(name: str) -> tuple[Pipeline, dict[str, Any]]:
    spec = catalog.get_pipeline(name)
    pipe = Pipeline(name, slo_ms=SLO_MS[name], edges=_dnn_edges(spec))
    tasks = {
        st.name: pipe.stage(load=st.load, name=st.name, profile_name=st.profile_name, import_path=f"{_HERE}:{st.name}")(
            st.run
        )
        if st.is_dnn
        else _local_task(name, st)
        for st in spec.stages
    }
    return pipe, tasks


IMAGE, _image = _pipeline("image")
TEXT, _text = _pipeline("text")
VIDEO, _video = _pipeline("video")

preprocess, detect, classify, scene, caption = (
    _image[s] for s in ("preprocess", "detect", "classify", "scene", "caption")
)
tokenize, encode, classify_text, summarize = (_text[s] for s in ("tokenize", "encode", "classify_text", "summarize"))
split_frames, frame_model, aggregate = (_video[s] for s in ("split_frames", "frame_model", "aggregate"))


@flow(name="image-pipeline")
def image_flow(request_seed: int) -> dict[str, Any]:
    """Detect, classify and caption one image; a scene embedding joins at the caption."""
    img = image.make_input(random.Random(request_seed))
    pre = preprocess.submit(img)
    scene_vec = scene.submit(pre)
    classes = classify.submit(detect.submit(pre))
    out: dict[str, Any] = caption(image.caption_input(classes.result(), scene_vec.result()))
    return {"tokens": out["tokens"] if isinstance(out, dict) and "tokens" in out else out}


@flow(name="text-pipeline")
def text_flow(request_seed: int) -> dict[str, Any]:
    """Encode a text, classify its topic and summarise it."""
    doc = text.make_input(random.Random(request_seed))
    out: dict[str, Any] = summarize(classify_text(encode(tokenize(doc))))
    return out


@flow(name="text-pipeline-async")
async def async_text_flow(request_seed: int) -> dict[str, Any]:
    """:func:`text_flow` as an async flow: each model stage awaited through its ``.aio`` twin.

    Many runs on one event loop (a web handler's, ``asyncio.gather``) then wait
    at once, and their calls share batches; a sync stage would block the loop.
    """
    doc = text.make_input(random.Random(request_seed))
    tokens = tokenize(doc)  # a plain task on this machine's CPU: quick, run inline
    out: dict[str, Any] = await summarize.aio(await classify_text.aio(await encode.aio(tokens)))
    return out


@flow(name="video-pipeline")
def video_flow(request_seed: int) -> dict[str, Any]:
    """Split a clip into frames, run the frame model once per frame, aggregate."""
    clip = video.make_input(random.Random(request_seed))
    frames = split_frames(clip)
    per_frame = frame_model.map(frames).result()
    out: dict[str, Any] = aggregate(video.aggregate_input(per_frame))
    return out


FLOWS = {"image": image_flow, "text": text_flow, "video": video_flow}
"""The example flows by workflow name."""
