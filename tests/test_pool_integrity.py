"""The pool never answers a call with another call's work, and answers every call it takes.

Each test here failed on the code before the fix it guards (issue: wrong results
across workflows, calls never answered): workers matched by stage name across
workflows, calls that raised while queued, a workflow broken by one call, a
worker killed while loading, outputs kept for ever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.exceptions import (
    CallConflictError,
    InvalidInputError,
    StageRejectedError,
    WorkerCrashedError,
)
from esg_prefect.model.cluster import Device, Node
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.stages import input_size, resolve_stage
from esg_prefect.runtime.workers import (
    InlineBackend,
    LocalProcessBackend,
    WorkerDiedError,
    WorkerHandle,
    WorkerSpec,
)
from esg_prefect.scheduling import ESGSettings
from tests.toy_calls import PRICES, TOY, toy_call, toy_pool
from tests.toy_stages import FRAGILE_DEATHS, settle, toy_profile

VISION = WorkflowDecl("vision", 800)
SPEECH = WorkflowDecl("speech", 800)


def mk(
    i: int,
    stage: str = "inc",
    path: str | None = None,
    wf: WorkflowDecl = TOY,
    call_id: str | None = None,
    item: Any = None,
) -> StageCall:
    return toy_call(i, stage, call_id=call_id or f"{wf.name}-{stage}-{i}", wf=wf, path=path, item=item)


@pytest.fixture
def pool() -> Iterator[Pool]:
    """A toy pool on 2 vCPUs."""
    with toy_pool(vcpus=2) as p:
        yield p


# ---- 1. workers are keyed by the code they run ---------------------------------------------


def test_two_workflows_with_a_stage_of_one_name_run_their_own_code(pool: Pool) -> None:
    futs = []
    for i in range(12):  # interleaved, so that warm workers of either are there for the other
        futs.append((1000 + i, pool.submit(mk(i, "classify", "tests.toy_stages:classify_vision", VISION))))
        futs.append((2000 + i, pool.submit(mk(i, "classify", "tests.toy_stages:classify_speech", SPEECH))))
    for want, fut in futs:
        assert fut.result(60).output == want
    snap = pool.snapshot()
    by_worker: dict[str, set[str]] = {}
    for c in snap.calls:
        assert c.result is not None
        by_worker.setdefault(c.result.worker_id, set()).add(c.workflow)
    assert all(len(wfs) == 1 for wfs in by_worker.values()), by_worker  # no worker served both codes
    assert {w.stage for w in snap.workers} <= {"classify", "classify@speech", "classify@vision"}
    assert len({w.stage for w in snap.workers}) == 2


def test_workflows_sharing_one_stage_code_share_its_workers(pool: Pool) -> None:
    other = WorkflowDecl("toy2", 800, (("double", "inc"),))
    for i in range(6):
        assert pool.submit(mk(i, "inc", wf=TOY)).result(60).output == i + 1
        assert pool.submit(mk(i, "inc", wf=other)).result(60).output == i + 1
    assert {w.stage for w in pool.snapshot().workers} == {"inc"}  # consolidated, one name


def test_a_stage_name_bound_to_other_code_in_its_workflow_is_refused(pool: Pool) -> None:
    assert pool.submit(mk(1, "inc")).result(60).output == 2
    with pytest.raises(CallConflictError, match=r"stage 'inc' of workflow 'toy' runs 'tests.toy_stages:inc'"):
        pool.submit(mk(2, "inc", "tests.toy_stages:double")).result(60)
    assert pool.submit(mk(3, "inc")).result(60).output == 4  # the workflow still works


def test_a_call_names_the_stage_of_the_profile_it_is_planned_with(pool: Pool) -> None:
    renamed = WorkflowDecl("renamed", 800)
    bare = mk(1, "tally", wf=renamed)
    with pytest.raises(StageRejectedError, match="no latency profile covers stage 'tally'"):
        pool.submit(bare).result(60)
    other = WorkflowDecl("renamed2", 800)
    call = StageCall("t2", "tally", "tests.toy_stages:tally", other, "r2", "r2", 2, profile_stage="inc")
    assert pool.submit(call).result(60).output == 102
    with pytest.raises(InvalidInputError, match="profile_stage"):
        StageCall("t3", "tally", "tests.toy_stages:tally", other, "r3", "r3", 3, profile_stage=5)  # type: ignore[arg-type]


def test_a_stage_with_its_own_profile_rows_may_name_another_stages_profile(pool: Pool) -> None:
    # "double" has rows of its own in the toy profile; a call of it planned as "inc" replaces them.
    call = StageCall(
        "d1", "double", "tests.toy_stages:double", WorkflowDecl("own", 800), "r", "r", 4, profile_stage="inc"
    )
    assert pool.submit(call).result(60).output == 8


def test_a_reused_call_id_for_another_call_is_refused(pool: Pool) -> None:
    assert pool.submit(mk(1, "inc", call_id="same")).result(60).output == 2
    assert pool.submit(mk(1, "inc", call_id="same")).result(60).output == 2  # a true retry joins
    with pytest.raises(CallConflictError, match="'same' was used for another call"):
        pool.submit(mk(7, "inc", call_id="same")).result(60)  # another request under that id


# ---- 2. every call is answered, and holds no place after --------------------------------------


def test_a_fault_while_queueing_answers_the_call_and_frees_its_place(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("slo table exploded")

    assert pool.submit(mk(0, "inc")).result(60).output == 1
    monkeypatch.setattr(pool.core, "arrive", broken)  # admission into the control core fails
    with pytest.raises(StageRejectedError, match="slo table exploded"):
        pool.submit(mk(1, "inc")).result(60)
    monkeypatch.undo()
    assert pool.submit(mk(2, "inc")).result(60).output == 3
    assert pool._ids.inflight == {}  # nothing left holding a place


@pytest.mark.parametrize("field", ["call_id", "stage", "request_id", "run_id", "stage_path"])
def test_empty_identifiers_are_refused_when_the_call_is_made(field: str) -> None:
    kwargs = {
        "call_id": "c",
        "stage": "inc",
        "stage_path": "tests.toy_stages:inc",
        "workflow": TOY,
        "request_id": "r",
        "run_id": "r",
        "item": 1,
        field: "",
    }
    with pytest.raises(InvalidInputError, match=field):
        StageCall(**kwargs)  # type: ignore[arg-type]


def test_inputs_without_a_length_still_have_a_size() -> None:
    assert input_size({"boxes": 5}) == 1.0
    assert input_size({"hidden": 3.0}) == 1.0
    assert input_size({"boxes": [1, 2, 3]}) == 3.0


# ---- 3. one call cannot break or retune a workflow -----------------------------------------


def test_a_cyclic_or_empty_declaration_is_refused_before_anything_changes() -> None:
    with pytest.raises(InvalidInputError, match="cycle a -> b -> a"):
        WorkflowDecl("w", 100, (("a", "b"), ("b", "a")))
    with pytest.raises(InvalidInputError, match="non-empty strings"):
        WorkflowDecl("w", 100, (("a", ""),))


def test_a_workflows_slo_and_graph_are_fixed_by_its_first_call(pool: Pool) -> None:
    assert pool.submit(mk(1, "inc")).result(60).output == 2
    with pytest.raises(CallConflictError, match=r"slo_ms=800; this call declares 50"):
        pool.submit(mk(2, "inc", wf=WorkflowDecl("toy", 50, TOY.edges))).result(60)
    with pytest.raises(CallConflictError, match="was declared with edges"):
        pool.submit(mk(3, "inc", wf=WorkflowDecl("toy", 800, (("inc", "double"),)))).result(60)
    assert pool.submit(mk(4, "inc")).result(60).output == 5
    assert pool.snapshot().requests["r4"].slo_ms == 800


# ---- 4. a worker killed while loading is a crash, not the stage's failure --------------------


class _DiesLoadingOnce:
    """A backend whose first worker start dies while loading (as a SIGKILL would), then starts inline."""

    def __init__(self, deaths: int) -> None:
        self.inner = InlineBackend(vcpus=2)
        self.deaths = deaths
        self.starts = 0

    def nodes(self) -> tuple[Node, ...]:
        return self.inner.nodes()

    def devices(self) -> tuple[Device, ...]:
        return self.inner.devices()

    async def start(self, spec: WorkerSpec) -> WorkerHandle:
        self.starts += 1
        if self.starts <= self.deaths:
            await asyncio.sleep(0)
            raise WorkerDiedError(f"worker {spec.worker_id} died while loading {spec.stage_path!r}")
        return await self.inner.start(spec)

    async def close(self) -> None:
        await self.inner.close()


def test_calls_of_a_worker_that_died_loading_run_on_the_next_one() -> None:
    backend = _DiesLoadingOnce(deaths=1)
    with Pool(toy_profile(), PRICES, backend=backend) as p:
        futs = [p.submit(mk(i, "inc")) for i in range(5)]
        assert [f.result(60).output for f in futs] == [i + 1 for i in range(5)]
    assert backend.starts >= 2


def test_a_stage_whose_workers_always_die_loading_fails_as_a_crash() -> None:
    with (
        Pool(toy_profile(), PRICES, backend=_DiesLoadingOnce(deaths=10_000)) as p,
        pytest.raises(WorkerCrashedError, match="3 times while loading"),
    ):
        p.submit(mk(1, "inc")).result(60)


@pytest.mark.service
def test_a_worker_process_killed_while_loading_is_replaced() -> None:
    FRAGILE_DEATHS.write_text("0:1")
    try:
        settings = ESGSettings(wait_for_batch=False)
        backend = LocalProcessBackend(vcpus=2, spares=0, preload=())
        fragile = WorkflowDecl("fragile", 10_000)
        with Pool(toy_profile(), PRICES, settings=settings, backend=backend) as p:
            futs = [p.submit(mk(i, "fragile", wf=fragile)) for i in range(4)]
            results = settle(futs, timeout=120)
        assert [r.output if isinstance(r, StageResult) else r for r in results] == [1, 2, 3, 4]
        assert FRAGILE_DEATHS.read_text() == "1:1"  # one worker died loading; the next one served
    finally:
        FRAGILE_DEATHS.unlink(missing_ok=True)


# ---- 5. memory: records keep no outputs, finished calls are forgotten -----------------------


def test_records_keep_no_outputs_and_finished_calls_are_bounded(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool._ids, "memory", 5)
    for i in range(12):
        assert pool.submit(mk(i, "inc")).result(60).output == i + 1
    snap = pool.snapshot()
    assert len(snap.calls) == 12 and all(c.result is not None and c.result.output is None for c in snap.calls)
    assert len(pool._ids.done) == 5 and len(pool._ids.identity) == 5


def test_the_stage_paths_used_here_resolve() -> None:
    assert resolve_stage("tests.toy_stages:classify_vision").name == "classify"
    assert resolve_stage("tests.toy_stages:classify_speech").name == "classify"


def test_log_lines_count_items_and_runs_in_plain_english() -> None:
    one = StageResult("c", 1, "b1", 1, "w1", "cpu", 1, 0.0, 0.0, 1.0, 1.0, False, False, "", 1)
    many = StageResult("c", 1, "b2", 4, "w1", "cpu", 1, 0.0, 0.0, 1.0, 1.0, False, False, "", 3)
    assert "(1 item from 1 run)" in one.describe() and "(4 items from 3 runs)" in many.describe()


def test_a_log_line_says_why_on_one_short_line() -> None:
    why = "no plan meets the slack: fastest option, best effort (cold start, best fit)"
    risky = StageResult("c", 1, "b14", 6, "w3", "cpu", 1, 0.0, 2.0, 16.3, 73.2, False, True, why, 6)
    assert risky.describe().endswith(f"predicted 16.3 ms, actual 73.2 ms; AT RISK of missing the SLO: {why}")
    planned = replace(risky, at_risk=False, reason="cheapest plan within the slack over 2 stage(s) (warm worker)")
    assert planned.describe().endswith("actual 73.2 ms; cheapest plan within the slack over 2 stage(s) (warm worker)")
    assert replace(risky, reason="").describe().endswith("actual 73.2 ms; AT RISK of missing the SLO")
    long = replace(risky, reason="line one\n  line two " * 40).describe()
    assert "\n" not in long and long.endswith("...") and len(long.split("SLO: ", 1)[1]) <= 120


def test_finished_outputs_kept_for_retries_are_bounded_in_bytes() -> None:
    # Before, the last 2,000 finished calls kept their outputs: 10 MB outputs held 20 GB.
    import numpy as np

    from esg_prefect.runtime.call_ids import CallIds

    ids = CallIds(memory=2_000, max_bytes=1_000)
    decl = WorkflowDecl("w", 100)
    for i in range(3):
        call = StageCall(f"c{i}", "s", "m:s", decl, "r", "r", i)
        fut: concurrent.futures.Future[StageResult] = concurrent.futures.Future()
        ids.start(call, fut)
        out = np.zeros(75)  # 600 bytes
        fut.set_result(StageResult(call.call_id, out, "b", 1, "w", "cpu", 1, 0.0, 0.0, 1.0, 1.0, False, False))
        ids.finish(call.call_id, fut)
    assert list(ids.done) == ["c2"] and ids.held_bytes == 600  # two 600-byte outputs do not fit in 1,000
    again: concurrent.futures.Future[StageResult] = concurrent.futures.Future()
    assert not ids.join(StageCall("c0", "s", "m:s", decl, "r", "r", 0), again)  # forgotten: it would run again
    assert ids.join(StageCall("c2", "s", "m:s", decl, "r", "r", 2), again) and again.result(1).output.nbytes == 600


@pytest.mark.parametrize(
    "returned",
    [{"scores": [0.5]}, "ok", b"ok", {0.5}, 0.5, None],
    ids=["dict", "str", "bytes", "set", "float", "None"],
)
def test_a_batch_function_returning_no_sequence_is_refused_even_at_batch_one(returned: object) -> None:
    """A dict of one key, a one-character string: iterated, they pass the count at batch 1 and hand back garbage."""
    from esg_prefect.runtime.stages import StageSpec, run_checked

    spec = StageSpec("rank", lambda device: None, lambda model, items: returned, "tests.toy_stages:inc")
    with pytest.raises(InvalidInputError, match=rf"stage 'rank': batch function returned a {type(returned).__name__},"):
        run_checked(spec, None, [1])


def test_a_batch_function_may_return_any_ordered_sequence_of_outputs() -> None:
    import torch

    from esg_prefect.runtime.stages import StageSpec, run_checked

    def spec(run: Any) -> StageSpec:
        return StageSpec("rank", lambda device: None, run, "tests.toy_stages:inc")

    assert run_checked(spec(lambda m, items: [i * 2 for i in items]), None, [1, 2]) == [2, 4]
    assert run_checked(spec(lambda m, items: tuple(items)), None, [1, 2]) == [1, 2]
    assert run_checked(spec(lambda m, items: (i for i in items)), None, [1, 2]) == [1, 2]
    rows = run_checked(spec(lambda m, items: torch.ones(len(items), 3)), None, [1, 2])
    assert len(rows) == 2 and rows[0].shape == (3,)
    with pytest.raises(InvalidInputError, match="returned a Tensor, not a sequence"):
        run_checked(spec(lambda m, items: torch.tensor(0.5)), None, [1])  # a 0-d tensor: one value, not a batch
