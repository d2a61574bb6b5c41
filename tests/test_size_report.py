"""The profiler's report of `--fit-sizes` (profiler.sizes.size_report) and its default wait for quiet."""

from __future__ import annotations

from esg_prefect.model.size_model import SizeSample
from esg_prefect.profiler.sizes import FIT_MIN_SAMPLES, size_report


def _sample(i: int) -> SizeSample:
    return SizeSample("detect", "cpu", 1 + i % 2, 1, 0.0, float(1 + i), 2.0 + 0.5 * (1 + i))


def test_too_few_samples_say_why_the_table_is_empty() -> None:
    text = size_report([_sample(i) for i in range(FIT_MIN_SAMPLES - 1)])
    assert "detect" not in text  # no row: one configuration, too few calls
    assert f"no stage fitted: {FIT_MIN_SAMPLES - 1} sample(s), and a fit needs {FIT_MIN_SAMPLES} or more" in text


def test_enough_samples_give_a_row_and_no_excuse() -> None:
    text = size_report([_sample(i) for i in range(12)])
    assert any(line.startswith("detect") for line in text.splitlines())
    assert "no stage fitted" not in text


def test_the_profilers_entry_points_wait_as_long_for_quiet_by_default() -> None:
    """The flow (``profile --flow``), the CLI and a ProfileRequest: one default, ``DEFAULT_WAIT_QUIET_S``."""
    import inspect

    import typer

    from esg_prefect.cli import app
    from esg_prefect.profiler.flow import profile_flow
    from esg_prefect.profiler.run import DEFAULT_WAIT_QUIET_S, ProfileRequest

    flow_default = inspect.signature(profile_flow.fn).parameters["wait_quiet_s"].default
    profile = typer.main.get_command(app).commands["profile"]  # type: ignore[attr-defined]  # a group's commands
    option = next(p for p in profile.params if p.name == "wait_quiet_s")
    assert flow_default == ProfileRequest(specs=("examples",)).wait_quiet_s == option.default == DEFAULT_WAIT_QUIET_S
