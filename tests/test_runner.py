"""ESGTaskRunner with real Prefect flow runs: contract, pooling across runs, failures, async."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import pickle
import threading
from collections.abc import Iterator

import pytest
from prefect import flow
from prefect.states import State

from esg_prefect import ESGTaskRunner
from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.scheduling import ESGSettings
from tests.toy_calls import toy_pool
from tests.toy_stages import POISON, double, first, flaky, inc, second, slow, tally, third, toy_profile

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    """One toy pool on 2 vCPUs for all the module's tests (conftest's ``pool`` is one a test)."""
    with toy_pool(vcpus=2) as p:
        yield p


def test_runner_contract() -> None:
    a, b = ESGTaskRunner(), ESGTaskRunner()
    assert a == b and a.duplicate() == a
    assert ESGTaskRunner(scheduler="esg-unpruned") != a
    settings = ESGSettings(tick_ms=2.0)
    assert ESGTaskRunner(settings=settings).duplicate() == ESGTaskRunner(settings=settings)
    p = Pool(toy_profile(), backend=InlineBackend())
    try:
        r = ESGTaskRunner(pool=p)
        assert r.duplicate().pool_client() is p
        clone = pickle.loads(pickle.dumps(r))  # the live pool is dropped, the settings kept
        assert clone._pool is None and clone._config == r._config
    finally:
        p.close()
    with pytest.raises(InvalidInputError, match="'gpu'"):
        ESGTaskRunner(backend="gpu")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="not both"):
        ESGTaskRunner(pool=Pool(toy_profile(), backend=InlineBackend()), settings=settings)
    with pytest.raises(InvalidInputError, match=r"settings, prices configure an embedded pool; the pool service at"):
        ESGTaskRunner(address="http://127.0.0.1:4270", settings="default", prices="default")
    with pytest.raises(InvalidInputError, match=r"^scheduler configures an embedded pool"):
        ESGTaskRunner(address="http://127.0.0.1:4270", scheduler="fast-gshare")


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"scheduler": "nope"}, "unknown scheduler 'nope'; known: esg, "),
        ({"settings": {"tick_ms": -1}}, "tick_ms must be a finite number > 0, got -1"),
        ({"settings": {"tick": 3}}, "unknown ESG settings ['tick']"),
        ({"settings": 5}, "settings must be ESGSettings, a dict of them, .* got int"),
        ({"prices": 3.0}, "prices must be a PriceSheet, .* got float"),
        ({"profile": "/no/such/profile.csv"}, "no profile file '/no/such/profile.csv'"),
        ({"profile": 123}, "profile must be a CSV path .str or Path., got 123"),
        ({"max_workers": "4"}, "max_workers must be an int >= 1 .or None., got '4'"),
        ({"max_workers": 0}, "max_workers must be an int >= 1 .or None., got 0"),
        ({"switch_interval_s": "x"}, "switch_interval_s must be a number of seconds in .0, 1., or None, got 'x'"),
        ({"switch_interval_s": -1}, "switch_interval_s must be a number of seconds in .0, 1., or None, got -1"),
        ({"token": 123}, "token must be a string, got int"),
        (
            {"token": "s3cret"},
            "^token is the bearer token of a pool service; the embedded pool .no address. takes none",
        ),
    ],
)
def test_an_embedded_pools_bad_options_are_refused_when_the_runner_is_made(
    kwargs: dict[str, object], named: str
) -> None:
    """Not at the first stage call of a flow run: the runner is made where the flow is defined."""
    from esg_prefect.exceptions import ConfigError

    with pytest.raises((InvalidInputError, ConfigError), match=named.replace("[", r"\[").replace("]", r"\]")):
        ESGTaskRunner(**kwargs)  # type: ignore[arg-type]


def test_settings_given_as_a_dict_are_the_same_runner_as_esg_settings() -> None:
    runner = ESGTaskRunner(settings={"share_batches": True, "tick_ms": 2.0})
    assert runner == ESGTaskRunner(settings=ESGSettings(share_batches=True, tick_ms=2.0))
    assert runner.duplicate()._config["settings"] == ESGSettings(share_batches=True, tick_ms=2.0)


def test_concurrent_flow_runs_share_batches(pool: Pool) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    def toy_flow(x: int) -> int:
        return inc(double(x))

    xs = [x for x in range(17) if x != POISON]  # more runs than threads: some start as others end
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        out = list(ex.map(toy_flow, xs))
    assert out == [2 * x + 1 for x in xs]


def test_calls_of_concurrent_flow_runs_are_batched_together() -> None:
    # One vCPU and a 200 ms stage: while a batch runs, the other flow runs' calls queue and
    # leave together in the next batch. On a loaded 2-core machine the flow runs' calls reach the
    # pool up to a second apart; with no bound on batch waits ESG holds them within the 5 s SLO
    # for a fuller batch, so they meet whatever the machine's load.
    one_cpu = Pool(
        toy_profile(),
        PriceSheet(1e-5, {}),
        settings=ESGSettings(max_batch_wait_ms=0.0),
        backend=InlineBackend(vcpus=1),
    )
    try:

        @flow(task_runner=ESGTaskRunner(pool=one_cpu))
        def burst_flow(x: int) -> int:
            return slow(x)

        with concurrent.futures.ThreadPoolExecutor(12) as ex:
            out = list(ex.map(burst_flow, range(12)))
        assert out == [x + 1 for x in range(12)]
        batches = one_cpu.snapshot().batches
        runs_per_batch = [len({i.run_id for i in b.items}) for b in batches]
        assert sum(len(b.items) for b in batches) == 12
        assert max(runs_per_batch) > 1, runs_per_batch  # calls of different flow runs in one batch
    finally:
        one_cpu.close()


def test_a_stage_is_planned_with_the_profile_its_decorator_names(pool: Pool) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    def renamed_flow(x: int) -> int:
        return tally(x)  # stage "tally", profiled as "inc": the profile has no "tally"

    assert [renamed_flow(x) for x in (1, 2)] == [101, 102]
    assert {w.stage for w in pool.snapshot().workers} >= {"tally"}  # its own workers, not inc's code


def test_edges_naming_a_stage_the_pipeline_lacks_are_refused_at_its_first_call(pool: Pool) -> None:
    from esg_prefect.exceptions import WorkflowError
    from esg_prefect.integration.stage import Pipeline
    from tests.toy_stages import load_inc

    edgy = Pipeline("edgy", 800, edges=[("a", "enc")])

    @edgy.stage(load=load_inc, import_path="tests.toy_stages:inc")
    def enc(model: dict[str, int], items: list[int]) -> list[int]:
        return items

    @flow(task_runner=ESGTaskRunner(pool=pool))
    def edgy_flow(x: int) -> int:
        return enc(x)

    with pytest.raises(
        WorkflowError, match=r"pipeline 'edgy': its edges name stages it does not have: 'a' \(its stages: 'enc'\)"
    ):
        edgy_flow(1)
    from tests.toy_stages import toy

    toy.check_edges()  # double -> inc: both are its stages


def test_a_batch_function_workers_could_not_call_or_find_is_refused_when_decorated() -> None:
    from esg_prefect.integration.stage import Pipeline
    from tests.toy_stages import load_inc

    pipe = Pipeline("checked", 800)
    with pytest.raises(
        InvalidInputError,
        match=r"stage 'one_arg': its batch function must take \(model, items\), got one_arg\(items: 'list\[int\]'\)",
    ):

        @pipe.stage(load=load_inc, import_path="tests.toy_stages:inc")
        def one_arg(items: list[int]) -> list[int]:
            return items

    with pytest.raises(InvalidInputError, match=r"stage 'inner' is defined inside a function .*import_path="):

        @pipe.stage(load=load_inc)
        def inner(model: object, items: list[int]) -> list[int]:
            return items

    with pytest.raises(InvalidInputError, match=r"stage 'later': the batch function 'later' is async; .* plain def"):

        @pipe.stage(load=load_inc, import_path="tests.toy_stages:inc")
        async def later(model: object, items: list[int]) -> list[int]:
            return items

    assert not {"inner", "one_arg", "later"} & set(pipe.stages)  # nothing half-registered


def test_a_stage_given_a_cache_key_fn_keeps_it_as_its_cache_policy() -> None:
    # Before, NO_CACHE was set beside the user's key function and Prefect warned, once per worker process.
    from prefect.cache_policies import NO_CACHE

    from esg_prefect.integration.stage import Pipeline
    from tests.toy_stages import load_inc

    pipe = Pipeline("keyed", 800)

    def key(context: object, parameters: dict[str, object]) -> str:
        return "k"

    def run(model: object, items: list[int]) -> list[int]:
        return items

    keyed = pipe.stage(load=load_inc, import_path="tests.toy_stages:inc", name="keyed", cache_key_fn=key)(run)
    plain = pipe.stage(load=load_inc, import_path="tests.toy_stages:double", name="plain")(run)
    assert keyed.cache_key_fn is key and keyed.cache_policy is not NO_CACHE
    assert plain.cache_policy is NO_CACHE


def test_submit_map_states_and_upstream_failure(pool: Pool) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    def mapped(xs: list[int]) -> tuple[list[int], State, State]:
        doubled = double.map(xs)
        bad = inc.submit(POISON * 2)  # inc(26) is the poison: this task run fails, nothing else does
        after_bad = double.submit(1, wait_for=[bad])
        good = [inc.submit(d) for d in doubled]
        return [g.result() for g in good], bad.wait() or bad.state, after_bad.wait() or after_bad.state

    values, bad_state, after_state = mapped([1, 2, 3, 4])
    assert values == [3, 5, 7, 9]
    assert bad_state.is_failed() and "poison input 26" in str(bad_state.message)
    assert after_state.name == "NotReady"  # an upstream failure, as under any Prefect runner


def test_retries_are_prefect_retries(pool: Pool) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    def retried(x: int) -> int:
        return flaky(x)

    assert retried(7) == 107  # failed once in the pool, retried by Prefect, then pooled again


def test_async_flows_are_pooled(pool: Pool) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    async def async_flow(x: int) -> int:
        return inc.submit(double.submit(x)).result()

    async def many() -> list[int]:
        return await asyncio.gather(*(async_flow(x) for x in range(40, 48)))

    assert asyncio.run(many()) == [2 * x + 1 for x in range(40, 48)]


def test_async_flows_awaiting_a_stages_aio_share_batches_on_one_event_loop() -> None:
    """``await stage.aio(x)`` leaves the loop free: concurrent async runs' calls meet in one batch.

    The pool is paused until every run's call is queued, so the test does not
    depend on how fast the runs start; with a blocking wait the first run would
    hold the loop and the others would never submit.
    """
    paused = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend(vcpus=2))
    paused.pause()

    @flow(task_runner=ESGTaskRunner(pool=paused))
    async def aio_flow(x: int) -> int:
        return await inc.aio(x)

    async def many() -> list[int]:
        runs = [asyncio.ensure_future(aio_flow(x)) for x in range(6)]
        while sum(paused.snapshot().queue_depths.values()) < 6:  # every run waits at once, the loop free
            await asyncio.sleep(0.02)
        paused.resume()
        return await asyncio.gather(*runs)

    try:
        assert asyncio.run(many()) == [x + 1 for x in range(6)]
        batches = paused.snapshot().batches
        assert sum(len(b.items) for b in batches) == 6
        assert max(len({i.run_id for i in b.items}) for b in batches) > 1
    finally:
        paused.close()


def test_a_stages_aio_runs_locally_without_the_esg_runner_and_withdraws_a_cancelled_call() -> None:
    @flow
    async def plain(x: int) -> int:
        return await inc.aio(x)

    assert asyncio.run(plain(3)) == 4
    assert inc.aio.esg_stage is inc.esg_stage and inc.aio.name == inc.name

    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    pool.pause()
    hurried = inc.aio.with_options(timeout_seconds=0.5)

    @flow(task_runner=ESGTaskRunner(pool=pool))
    async def hurried_flow(x: int) -> int:
        return await hurried(x)

    try:
        state = asyncio.run(hurried_flow(1, return_state=True))
        assert state.is_failed()
        for _ in range(200):  # withdrawn on the pool's loop: wait for it, not for a time
            if not any(pool.snapshot().queue_depths.values()):
                break
            threading.Event().wait(0.05)
        failed = [c for c in pool.snapshot().calls if not c.ok]
        assert len(failed) == 1 and "cancelled" in failed[0].error
    finally:
        pool.close()


def test_a_stage_with_options_is_a_stage_whose_async_twin_has_the_same_options(pool: Pool) -> None:
    retried = inc.with_options(name="inc-retried", retries=2, tags={"retried"})
    twin = retried.aio
    assert (retried.name, retried.retries, retried.tags) == ("inc-retried", 2, {"retried"})
    assert (twin.name, twin.retries, twin.tags) == ("inc-retried", 2, {"retried"})
    assert inspect.iscoroutinefunction(twin.fn) and not inspect.iscoroutinefunction(retried.fn)
    assert retried.esg_stage is twin.esg_stage is inc.esg_stage
    assert retried.esg_pipeline is twin.esg_pipeline is inc.esg_pipeline
    assert (inc.retries, inc.aio.retries, inc.aio.name) == (0, 0, "inc")  # the stage itself unchanged
    hurried = twin.with_options(timeout_seconds=30)  # the twin's own with_options keeps it a stage's twin
    assert (hurried.timeout_seconds, hurried.retries, hurried.esg_stage) == (30, 2, inc.esg_stage)
    assert inspect.iscoroutinefunction(hurried.fn)

    @flow(task_runner=ESGTaskRunner(pool=pool))
    async def retried_flow(x: int) -> int:
        return await hurried(x) + await retried.aio(x)

    assert asyncio.run(retried_flow(5)) == 12


def test_dag_is_learned_from_runs(pool: Pool) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    def learned_flow(x: int) -> int:
        # Futures carry the lineage (Prefect cannot link plain ints returned by direct calls).
        a = first.submit(x)
        return third.submit(second.submit(a)).result()

    assert learned_flow(3) == 33
    wf = pool._registry.current()["learned"]
    assert wf.edges == (("first", "second"), ("second", "third"))


def test_stage_logs_name_the_batch(pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    @flow(task_runner=ESGTaskRunner(pool=pool))
    def logged(x: int) -> int:
        return double(x)

    with caplog.at_level(logging.INFO):
        assert logged(5) == 10
    lines = [r.getMessage() for r in caplog.records if "double:" in r.getMessage()]
    assert lines and "batch b" in lines[0] and "queue wait" in lines[0] and "predicted" in lines[0]


def test_without_the_esg_runner_stages_run_locally() -> None:
    @flow
    def plain(x: int) -> int:
        return inc(double(x))

    assert plain(4) == 9


def test_equal_runners_hash_alike_and_the_embedded_pool_asks_for_the_switch_interval() -> None:
    a, b = ESGTaskRunner(backend="inline"), ESGTaskRunner(backend="inline")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.duplicate() == a and hash(a.duplicate()) == hash(a)
    assert ESGTaskRunner(backend="inline", scheduler="esg-fastest") != a
    assert a._config["switch_interval_s"] == 0.001
    assert ESGTaskRunner(backend="inline", switch_interval_s=None)._config["switch_interval_s"] is None


def test_a_pool_leaves_the_switch_interval_alone_unless_asked() -> None:
    import sys

    before = sys.getswitchinterval()
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    try:
        sys.setswitchinterval(0.004)
        decl = WorkflowDecl("toy", 800, (("double", "inc"),))
        call = StageCall("sw-1", "inc", "tests.toy_stages:inc", decl, "sw", "sw", 3)
        assert pool.submit(call).result(30).output == 4
        assert sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        pool.close()
        sys.setswitchinterval(before)


def test_a_stage_tasks_timeout_stops_its_wait_and_withdraws_the_call() -> None:
    # The pool is paused, so the call never runs: before, the task waited on it for ever (Prefect's
    # timeout cannot interrupt a blocking wait) and the call stayed queued after its task had failed.
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend())
    pool.pause()
    hurried = inc.with_options(timeout_seconds=0.5)

    @flow(task_runner=ESGTaskRunner(pool=pool))
    def hurried_flow(x: int) -> int:
        return hurried(x)

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            state = ex.submit(hurried_flow, 1, return_state=True).result(timeout=120)
        assert state.is_failed()
        assert "timed out" in str(state.message).lower() or state.name == "TimedOut", state
        for _ in range(200):  # withdrawn on the pool's loop: wait for it, not for a time
            if not any(pool.snapshot().queue_depths.values()):
                break
            threading.Event().wait(0.05)
        assert not any(pool.snapshot().queue_depths.values())
        failed = [c for c in pool.snapshot().calls if not c.ok]
        assert len(failed) == 1 and "cancelled" in failed[0].error
    finally:
        pool.close()


def test_the_async_example_pipeline_answers_as_the_sync_one() -> None:
    """flows/async_requests.py's flow: its stages awaited through .aio, pooled, give the sync flow's answers."""
    from esg_prefect.examples.pipelines import async_text_flow, text_flow
    from esg_prefect.integration.runner import close_shared_pools

    runner = ESGTaskRunner(backend="inline", artifacts=False, store=False)
    pooled = async_text_flow.with_options(task_runner=runner)

    async def both() -> list[dict[str, object]]:
        return await asyncio.gather(*(pooled(request_seed=s) for s in (1, 2)))

    try:
        assert asyncio.run(both()) == [text_flow(request_seed=s) for s in (1, 2)]
    finally:
        close_shared_pools()
