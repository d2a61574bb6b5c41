"""``esg-prefect profile --flow``: each option is a parameter of the flow or refused, none ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esg_prefect.profiler import SessionOptions, SessionResult


def test_flow_refuses_fit_sizes_which_runs_no_flow(tmp_path: Path) -> None:
    """``--flow --fit-sizes S`` printed the size report and ran no flow: --flow was ignored."""
    from esg_prefect.cli import app

    (tmp_path / "s.csv").write_text("stage\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["profile", "--flow", "--fit-sizes", str(tmp_path / "s.csv")])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("\u2502", " ").split())  # rich's error box, unwrapped
    assert "--flow measures a new profile and takes none of --fit-sizes;" in said


def test_flow_takes_the_measuring_options_the_cli_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--flow`` passed none of ``--max-attempts``, ``--breakdown-batch``, ``--co-runners``, ``--trace``,
    ``--utilisation``, ``--validation-batches``, ``--no-store``: the flow ran on its defaults (and stored)."""
    from esg_prefect.cli import app
    from esg_prefect.integration import api_check
    from esg_prefect.profiler import flow

    called: dict[str, Any] = {}
    monkeypatch.setattr(api_check, "check_prefect_api", lambda url: None)
    monkeypatch.setattr(flow, "profile_flow", lambda **kw: called.update(kw) or {"files": {}})
    argv = ["profile", "--flow", "--breakdown", "--validate", "--max-attempts", "2", "--breakdown-batch", "8"]
    argv += ["--co-runners", "3", "--trace", "poisson", "--utilisation", "0.5", "--validation-batches", "2,4"]
    result = CliRunner().invoke(app, [*argv, "--no-store"])
    assert result.exit_code == 0, result.output
    taken = {k: called.get(k) for k in ("max_attempts", "breakdown_batch", "co_runners", "trace", "utilisation")}
    assert taken == {"max_attempts": 2, "breakdown_batch": 8, "co_runners": 3, "trace": "poisson", "utilisation": 0.5}
    assert called["validation_batches"] == [2, 4] and called["store"] is False


def test_the_flow_runs_its_session_with_those_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from esg_prefect.profiler import flow

    seen: list[SessionOptions] = []

    def session(opts: SessionOptions) -> SessionResult:
        seen.append(opts)
        return SessionResult(files={})

    monkeypatch.setattr(flow, "_session", session)
    monkeypatch.setattr(flow, "create_markdown_artifact", lambda *a, **kw: None)
    params = {"breakdown_batch": 8, "co_runners": 3, "trace": "poisson", "utilisation": 0.5}
    flow.profile_flow.fn(
        breakdown=True, validation=True, max_attempts=2, validation_batches=[2, 4], store=False, **params
    )
    (opts,) = seen
    assert opts.request is not None and opts.request.settings.max_attempts == 2
    assert opts.breakdown is not None and (opts.breakdown.batch, opts.breakdown.co_runners) == (8, 3)
    assert (opts.breakdown.trace, opts.breakdown.utilisation) == ("poisson", 0.5)
    assert opts.validation_batches == (2, 4) and opts.store_url is False


@pytest.fixture
def flow_sessions(monkeypatch: pytest.MonkeyPatch) -> list[SessionOptions]:
    """The sessions the flow's body would run, recorded instead of run (``profile_flow.fn``: no flow run)."""
    from esg_prefect.profiler import flow

    seen: list[SessionOptions] = []
    monkeypatch.setattr(flow, "_session", lambda opts: seen.append(opts) or SessionResult(files={}))
    monkeypatch.setattr(flow, "create_markdown_artifact", lambda *a, **kw: None)
    return seen


@pytest.mark.parametrize(
    ("params", "named"),
    [
        (
            {"quick": True, "max_attempts": 3},
            "quick=True is the smoke test (batches 1,2, one attempt, no wait for quiet, validation at 1,3) and "
            "takes none of max_attempts=3; drop it or quick=True",
        ),
        ({"quick": True, "wait_quiet_s": 5.0, "validation_batches": [2]}, "of wait_quiet_s=5.0, validation_batches"),
        ({"trace": "poisson"}, "trace='poisson' is for breakdown=True and does nothing without it; add breakdown=True"),
        ({"breakdown_batch": 8, "validation": True}, "breakdown_batch=8 is for breakdown=True"),
        ({"co_runners": 2}, "co_runners=2 is for breakdown=True"),
        ({"utilisation": 0.5}, "utilisation=0.5 is for breakdown=True"),
        ({"validation_batches": [2, 4], "breakdown": True}, "validation_batches=[2, 4] is for validation=True"),
        ({"store": False, "store_url": "sqlite:///x.db"}, "store=False skips the profile store and takes none of"),
    ],
)
def test_the_flow_refuses_a_parameter_its_run_would_ignore(
    flow_sessions: list[SessionOptions], params: dict[str, Any], named: str
) -> None:
    """Each of these ran and dropped the parameter without a word (one attempt and no wait with quick,
    no breakdown to take the trace, ...), called directly or from a deployment's parameters."""
    from esg_prefect.exceptions import InvalidInputError
    from esg_prefect.profiler import flow

    with pytest.raises(InvalidInputError) as err:
        flow.profile_flow.fn(**params)
    assert named in str(err.value)
    assert flow_sessions == []  # refused before anything ran


@pytest.mark.parametrize(
    "params",
    [
        {"quick": True, "max_attempts": 4, "wait_quiet_s": 120.0, "validation_batches": None},  # the defaults, set
        {"quick": True, "batches": [1, 2, 4]},  # the flow's quick takes its batch sizes
        {"breakdown": True, "trace": "poisson", "co_runners": 2, "validation": True, "validation_batches": [2]},
        {"store": False},
    ],
)
def test_the_flow_takes_the_parameters_its_run_takes(
    flow_sessions: list[SessionOptions], params: dict[str, Any]
) -> None:
    from esg_prefect.profiler import flow

    flow.profile_flow.fn(**params)
    (opts,) = flow_sessions
    assert opts.request is not None
    if params.get("batches"):
        assert opts.request.settings.batches == (1, 2, 4) and opts.request.settings.max_attempts == 1


@pytest.mark.parametrize("argv", [[], ["--quick"], ["--validate"], ["--breakdown", "--trace", "poisson"]])
def test_the_cli_s_flow_passes_the_flow_s_own_check(
    monkeypatch: pytest.MonkeyPatch, flow_sessions: list[SessionOptions], argv: list[str]
) -> None:
    """``--flow`` passes every parameter: one at a value other than the flow's default, such as the
    validation's batch sizes without ``--validate``, would be refused by the flow."""
    from esg_prefect.cli import app
    from esg_prefect.integration import api_check
    from esg_prefect.profiler import flow

    monkeypatch.setattr(api_check, "check_prefect_api", lambda url: None)
    real = flow.profile_flow.fn
    monkeypatch.setattr(flow, "profile_flow", lambda **kw: real(**kw))
    result = CliRunner().invoke(app, ["profile", "--flow", *argv])
    assert result.exit_code == 0, result.output
    assert len(flow_sessions) == 1


def test_the_flow_s_parameter_names_are_its_parameters() -> None:
    import inspect

    from esg_prefect.profiler.flow import profile_flow
    from esg_prefect.profiler.option_modes import FLOW_PARAMETERS

    params = set(inspect.signature(profile_flow.fn).parameters)
    assert set(FLOW_PARAMETERS.values()) <= params
    assert params - set(FLOW_PARAMETERS.values()) == {"batches", "out_dir", "name"}


def test_the_flow_s_new_parameters_default_as_the_cli_s_options() -> None:
    import inspect

    import typer

    from esg_prefect.cli import app
    from esg_prefect.profiler.flow import profile_flow
    from esg_prefect.profiler.validate import VALIDATION_BATCHES

    flow_defaults = {k: p.default for k, p in inspect.signature(profile_flow.fn).parameters.items()}
    profile = typer.main.get_command(app).commands["profile"]  # type: ignore[attr-defined]  # a group's commands
    cli_defaults = {p.name: p.default for p in profile.params}
    for name in ("max_attempts", "breakdown_batch", "co_runners", "trace", "utilisation"):
        assert flow_defaults[name] == cli_defaults[name], name
    assert flow_defaults["validation_batches"] is None and cli_defaults["validation_batches"] == ",".join(
        map(str, VALIDATION_BATCHES)
    )
    assert flow_defaults["store"] is True and cli_defaults["no_store"] is False
