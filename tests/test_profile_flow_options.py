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
    flow.profile_flow.fn(breakdown=True, max_attempts=2, validation_batches=[2, 4], store=False, **params)
    (opts,) = seen
    assert opts.request is not None and opts.request.settings.max_attempts == 2
    assert opts.breakdown is not None and (opts.breakdown.batch, opts.breakdown.co_runners) == (8, 3)
    assert (opts.breakdown.trace, opts.breakdown.utilisation) == ("poisson", 0.5)
    assert opts.validation_batches == (2, 4) and opts.store_url is False


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
