"""A batch function's prints and log records reach the task runs it served, from every kind of worker."""

from __future__ import annotations

import logging
import re
import sys
import threading
import warnings

import pytest
from prefect import flow

from esg_prefect import ESGTaskRunner
from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.exceptions import StageFailedError
from esg_prefect.model import PriceSheet
from esg_prefect.runtime import batch_output
from esg_prefect.runtime.batch_output import MAX_LINES, capture, checked_lines, run_caught, with_output
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend, LocalProcessBackend
from esg_prefect.scheduling import ESGSettings
from esg_prefect.service.wire import parse_result, result_body
from tests.toy_stages import POISON, RUN_LOGGER, chatty, loud, settle, toy_profile

TALK = WorkflowDecl("talk", 5_000, ())
PRICES = PriceSheet(1e-5, {})


def call(i: int) -> StageCall:
    return StageCall(f"chatty-{i}", "chatty", "tests.toy_stages:chatty", TALK, f"run{i}", f"run{i}", i)


# ---- the capture itself ------------------------------------------------------------------------


def test_a_capture_takes_its_own_threads_prints_and_records_and_no_other_threads() -> None:
    log = logging.getLogger("tests.capture")
    log.setLevel(logging.INFO)
    other_started, other_done = threading.Event(), threading.Event()

    def other() -> None:
        other_started.wait(5)
        print("from another thread")
        log.warning("another thread's record")
        other_done.set()

    t = threading.Thread(target=other)
    t.start()
    with capture() as caught:
        print("one", "two")
        print("partial", end="")
        print(" line")
        sys.stderr.write("to stderr\nunfinished")
        log.info("info %d", 5)
        log.debug("below the logger's level: not kept")
        other_started.set()
        assert other_done.wait(5)
    t.join()
    lines = caught.result()
    assert lines == (
        (logging.INFO, "", "one two"),
        (logging.INFO, "", "partial line"),
        (logging.WARNING, "", "to stderr"),
        (logging.INFO, "tests.capture", "info 5"),
        (logging.WARNING, "", "unfinished"),
    )
    assert isinstance(sys.stdout, batch_output._Routed)  # still routed, passing other threads' writes through


def test_a_captured_record_opts_out_of_prefects_api_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replayed on the task runs instead; from a worker Prefect would only warn that no run is active."""
    from prefect.logging.handlers import APILogHandler

    sent: list[logging.LogRecord] = []
    monkeypatch.setattr("prefect.logging.handlers.emit_api_log", lambda log: sent.append(log))
    log = logging.getLogger("tests.extra_logger")
    handler = APILogHandler()
    log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as warned, capture() as caught:
            warnings.simplefilter("always")
            log.warning("from a batch")
        assert caught.result() == ((logging.WARNING, "tests.extra_logger", "from a batch"),)
        assert [str(w.message) for w in warned] == []
        with pytest.warns(UserWarning, match="without a flow run id"):
            log.warning("outside a batch")  # Prefect's handler, as before: no run, a warning
    finally:
        log.removeHandler(handler)
    assert sent == []


def test_a_capture_is_bounded_and_says_what_it_dropped() -> None:
    with capture() as caught:
        for i in range(MAX_LINES + 50):
            print(f"line {i}")
        print("x" * 10_000)
    lines = caught.result()
    assert len(lines) == MAX_LINES + 1
    assert lines[MAX_LINES - 1] == (logging.INFO, "", f"line {MAX_LINES - 1}")
    assert lines[-1] == (logging.WARNING, batch_output.__name__, "51 more line(s) of this batch's output not kept")

    with capture() as caught:
        print("y" * 10_000)
    (only,) = caught.result()
    assert len(only[2]) < 2_100 and only[2].endswith("(8000 characters cut)")


def test_lines_from_elsewhere_are_checked_to_plain_tuples() -> None:
    good = [[20, "", "printed"], [30, "mod", "logged"]]
    assert checked_lines(good) == ((20, "", "printed"), (30, "mod", "logged"))
    bad = [[True, "", "a bool level"], [20, 5, "a non-string name"], [20, ""], "text", {"x": 1}, [20, "", "kept"]]
    assert checked_lines(bad) == ((20, "", "kept"),)
    assert checked_lines(None) == () and checked_lines("20,,x") == ()
    assert len(checked_lines([[20, "", "x"]] * 5_000)) == MAX_LINES + 1


def test_a_failed_batchs_traceback_carries_what_it_printed() -> None:
    text = with_output("Traceback ...\nValueError: poison\n", [(20, "", "about to fail"), (30, "mod", "careful")])
    assert text.endswith("Output of the batch before it failed:\n  about to fail\n  mod: careful\n")
    assert with_output("tb", ()) == "tb"


def test_run_caught_keeps_the_error_and_gives_it_as_a_worker_sends_it() -> None:
    def boom(x: int) -> int:
        print("before")
        raise KeyError(x)

    got = run_caught(boom, 3)
    assert isinstance(got.error, KeyError) and got.value is None and got.lines == ((logging.INFO, "", "before"),)
    assert got.failed is not None
    kind, message, trace = got.failed  # made from the error: type, message, and its traceback
    assert (kind, message) == ("KeyError", "3")
    assert trace.startswith("Traceback (most recent call last):") and ", in boom\n" in trace
    assert trace.endswith("KeyError: 3\n")
    ok = run_caught(lambda: 5)
    assert (ok.value, ok.error, ok.failed, ok.lines) == (5, None, None, ())


def test_lines_survive_the_pool_services_json() -> None:
    res = StageResult("c1", 6, "b1", 1, "w1", "cpu", 1, 0.0, 1.0, 2.0, 2.0, False, False, lines=((20, "", "hi"),))
    assert parse_result(result_body(res)).lines == ((20, "", "hi"),)
    body = result_body(res)
    del body["result"]["lines"]  # a service that does not send them
    assert parse_result(body).lines == ()


# ---- from the workers ---------------------------------------------------------------------------


def _check_pool(pool: Pool) -> None:
    futs = [pool.submit(call(i)) for i in (1, 2, POISON, RUN_LOGGER)]
    ok1, ok2, bad, no_context = settle(futs, timeout=120)
    assert isinstance(no_context, StageFailedError)
    assert "raised MissingContextError" in str(no_context) and "log with logging.getLogger(...) or print" in str(
        no_context
    )
    assert isinstance(ok1, StageResult) and isinstance(ok2, StageResult), (ok1, ok2)
    for r in (ok1, ok2):  # each result has its own run's lines (a batch with the poison ran again in halves)
        assert any(re.fullmatch(r"chatty got [12] item\(s\)", text) for lv, _, text in r.lines if lv == 20), r.lines
        # ...and its batch size is that run's, as the function saw it, not the batch's before the halving
        assert (20, "", f"chatty got {r.batch_size} item(s)") in r.lines and r.co_batched_runs == r.batch_size
        assert (30, "", "chatty to stderr") in r.lines
        assert any(level == 30 and name == "tests.chatty" and "chatty saw" in text for level, name, text in r.lines)
    assert isinstance(bad, StageFailedError)  # bisected down to the poison alone
    assert "Output of the batch before it failed:" in bad.remote_traceback
    assert "about to fail on the poison" in bad.remote_traceback


def _check_load_output(pool: Pool) -> None:
    def loud_call(i: int) -> StageCall:
        return StageCall(f"loud-{i}", "loud", "tests.toy_stages:loud", TALK, f"run{i}", f"run{i}", i)

    first = pool.submit(loud_call(1)).result(120)
    assert first.cold_start and first.output == 2
    assert first.lines == (
        (20, "", "(loading the model) loading the loud model"),
        (30, "tests.chatty", "(loading the model) loud: 2 weights were not found"),
    )
    again = pool.submit(loud_call(2)).result(120)  # on the warm worker: the load is not repeated
    assert not again.cold_start and again.lines == ()


def test_an_inline_workers_batch_output_comes_back_with_each_result() -> None:
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend(vcpus=2))
    try:
        _check_pool(pool)
        _check_load_output(pool)
    finally:
        pool.close()


@pytest.mark.service
def test_a_process_workers_batch_output_comes_back_with_each_result() -> None:
    settings = ESGSettings(wait_for_batch=False)
    pool = Pool(toy_profile(), PRICES, settings=settings, backend=LocalProcessBackend(vcpus=2, spares=0, preload=()))
    try:
        _check_pool(pool)
        _check_load_output(pool)
    finally:
        pool.close()


# ---- on the task runs ---------------------------------------------------------------------------


def _talk(log_prints: bool, caplog: pytest.LogCaptureFixture) -> None:
    """One flow run of the chatty stage on an inline pool, its logs caught at INFO."""
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend(vcpus=2))
    try:

        @flow(task_runner=ESGTaskRunner(pool=pool), log_prints=log_prints)
        def talking(x: int) -> int:
            return chatty(x)

        with caplog.at_level(logging.INFO):
            assert talking(4) == 5
    finally:
        pool.close()


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("log_prints", [True, False])
def test_a_task_run_replays_its_batchs_output_as_prefect_would(
    log_prints: bool, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    _talk(log_prints, caplog)
    out = capsys.readouterr()
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "prefect.task_runs"]
    assert any(lv == logging.WARNING and "] tests.chatty: chatty saw [4]" in m for lv, m in messages), messages
    printed = [m for _, m in messages if m.endswith("chatty got 1 item(s)")]
    if log_prints:  # Prefect's log_prints: the task run's log, as for a print in any task
        assert printed == [printed[0]] and printed[0].startswith("[batch b") and "prefect" not in printed[0]
        # The inline worker's thread carries no task run's context: the print was not logged there directly.
        assert "chatty got 1 item(s)" not in [m for _, m in messages]
        assert "chatty got" not in out.out
    else:  # printed where the flow runs
        assert not printed
        assert "] chatty got 1 item(s)" in out.out and "] chatty to stderr" in out.err


@pytest.mark.usefixtures("prefect_harness")
def test_a_failed_task_run_shows_the_output_of_the_model_load_it_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    """The load's output goes with the cold batch's calls whether they succeed or fail: a failure is where it helps."""
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend(vcpus=2))
    try:

        @flow(task_runner=ESGTaskRunner(pool=pool))
        def failing(x: int) -> int:
            return loud(x)

        with caplog.at_level(logging.INFO):
            state = failing(POISON, return_state=True)
    finally:
        pool.close()
    assert state.is_failed()
    err = state.result(raise_on_failure=False)
    assert isinstance(err, StageFailedError) and isinstance(err, ValueError)
    assert err.remote_traceback.endswith(
        "Output of the batch before it failed:\n"
        "  (loading the model) loading the loud model\n"
        "  tests.chatty: (loading the model) loud: 2 weights were not found\n"
    )
    failed = [r for r in caplog.records if r.name == "prefect.task_runs" and r.levelno >= logging.ERROR]
    shown = "\n".join(logging.Formatter().format(r) for r in failed)  # as the task run's log shows it
    assert "(loading the model) loading the loud model" in shown, shown


@pytest.mark.usefixtures("prefect_harness")
def test_under_log_prints_a_batchs_stderr_stays_on_stderr_as_in_a_plain_task(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # log_prints turns print() into log lines; what a task writes to stderr (warnings, progress
    # bars, a library's stream handler) stays there. Prefect's print_as_log also takes
    # print(..., file=sys.stderr), so the replay must not print stderr lines.
    _talk(True, caplog)
    messages = [r.getMessage() for r in caplog.records if r.name == "prefect.task_runs"]
    assert any(m.endswith("] chatty got 1 item(s)") for m in messages), messages  # the print: logged
    assert not [m for m in messages if "chatty to stderr" in m], messages
    assert "] chatty to stderr" in capsys.readouterr().err


# ---- the error a task run sees ----------------------------------------------------------------


def test_a_stages_builtin_error_is_that_type_too_and_pickles_by_name() -> None:
    import pickle
    import subprocess

    from esg_prefect import exceptions

    err = StageFailedError.raised("stage 's' raised KeyError: 'k'", "KeyError", "Traceback ...")
    assert isinstance(err, KeyError) and isinstance(err, StageFailedError)
    assert str(err) == "stage 's' raised KeyError: 'k'" and err.error_type == "KeyError"  # not KeyError's quotes
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and back.remote_traceback == "Traceback ..." and str(back) == str(err)
    # A fresh process finds the class by its name (the module makes it on demand).
    code = "import pickle,sys; e = pickle.loads(sys.stdin.buffer.read()); print(isinstance(e, KeyError), e.error_type)"
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(err), capture_output=True, check=True)
    assert out.stdout.decode().split() == ["True", "KeyError"]
    for name in ("MyOwnError", "UnicodeDecodeError", "StopIteration", "KeyboardInterrupt", ""):
        plain = StageFailedError.raised("m", name)
        assert type(plain) is StageFailedError, name
    with pytest.raises(AttributeError):
        exceptions.StageFailedError_NoSuchError  # noqa: B018


def test_a_stages_builtin_error_reaches_the_caller_through_the_service_as_that_type() -> None:
    from esg_prefect.service.wire import error_body

    err = StageFailedError.raised("stage 's' raised ZeroDivisionError: division by zero", "ZeroDivisionError", "tb")
    body = error_body(err)
    assert body["error"]["type"] == "StageFailedError" and body["error"]["error_type"] == "ZeroDivisionError"
    with pytest.raises(ZeroDivisionError, match="division by zero") as got:
        parse_result(body)
    assert isinstance(got.value, StageFailedError) and got.value.remote_traceback == "tb"


@pytest.mark.usefixtures("prefect_harness")
def test_a_flow_catches_a_stages_error_by_its_own_type_and_retries_see_it() -> None:
    pool = Pool(toy_profile(), PRICES, backend=InlineBackend(vcpus=2))
    seen: list[type] = []

    def only_value_errors(task: object, run: object, state: object) -> bool:
        exc = state.result(raise_on_failure=False)  # type: ignore[attr-defined]
        seen.append(type(exc))
        return isinstance(exc, ValueError)

    retried = chatty.with_options(retries=1, retry_condition_fn=only_value_errors)
    try:

        @flow(task_runner=ESGTaskRunner(pool=pool))
        def catching(x: int) -> str:
            try:
                retried(x)
            except ValueError as exc:  # what the batch function raised, as for a plain task
                return f"caught {type(exc).__mro__[1].__name__}"
            return "not raised"

        assert catching(POISON) == "caught StageFailedError"
        attempts = [c for c in pool.snapshot().calls if c.stage == "chatty"]
    finally:
        pool.close()
    assert len(seen) == 1 and issubclass(seen[0], ValueError)  # the condition saw a ValueError...
    assert len(attempts) == 2 and not any(c.ok for c in attempts)  # ...so the call ran again
