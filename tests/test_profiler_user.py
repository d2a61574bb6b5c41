"""The profiler on a user's own stages: where their module is found, and what a bad run or bad samples say.

No profiling run here: the commands are stopped before any worker starts, the
summary's warnings and the memory figures are checked on synthetic measurements,
and the worker's body runs in this process.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from esg_prefect.exceptions import ProfileError, UnknownStageError
from esg_prefect.profiler import MeasureSettings, ProfileRequest, ProfileTarget, SessionResult
from esg_prefect.profiler.report import falls, noise_warnings, quiet_line
from esg_prefect.profiler.results import ProfiledPoint
from esg_prefect.profiler.run import Configuration, ProfileRun
from esg_prefect.profiler.targets import PreparedStage, prepare, resolve_targets

REPO = Path(__file__).resolve().parents[1]
USER_MODULE = "esg_user_stages_beside"  # a name no installed package has
USER_SOURCE = """
from esg_prefect.profiler import ProfileTarget

def targets():
    return [ProfileTarget("beside", lambda d: 1, lambda m, xs: list(xs), lambda rng, n: [1.0] * n)]
"""


@pytest.fixture
def beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's module in a folder that is the working directory but not on the import path."""
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != str(tmp_path)])
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    yield tmp_path
    sys.modules.pop(USER_MODULE, None)


def test_profile_imports_a_module_from_the_working_directory(beside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import esg_prefect.cli.profile as profile_cli
    from esg_prefect.cli import app

    seen: list[str] = []

    def run_cli(*, target: tuple[str, ...], **_: object) -> None:  # instead of the run: resolve its targets here
        seen.extend(t.name for t in resolve_targets(target[0]))

    monkeypatch.setattr(profile_cli, "_run_cli", run_cli)
    result = CliRunner().invoke(app, ["profile", "-t", f"{USER_MODULE}:targets", "--vcpus", "1"])
    assert result.exit_code == 0, result.output
    assert seen == ["beside"]
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(beside), str(REPO)]  # for the worker processes
    child = subprocess.run(
        [sys.executable, "-P", "-c", f"import {USER_MODULE}"], cwd="/", capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr  # a child interpreter finds it too, from anywhere


def test_pool_serve_imports_stages_from_the_working_directory(beside: Path) -> None:
    from esg_prefect.cli import main

    assert main(["pool", "serve", "--allow", USER_MODULE, "--port", "-1"]) == 2  # refused before any pool starts
    assert sys.path[0] == str(beside) and os.environ["PYTHONPATH"].startswith(str(beside))


def test_a_console_script_finds_the_module_beside_it(beside: Path) -> None:
    # -P: no working directory on sys.path, as for the esg-prefect console script
    argv = ["profile", "-t", f"{USER_MODULE}:no_such_attribute", "--vcpus", "1", "--no-store"]
    code = "import sys; from esg_prefect.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code, *argv], cwd=beside, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert f"module {USER_MODULE!r} has no attribute 'no_such_attribute'" in proc.stderr, proc.stderr


def test_a_module_not_found_says_where_to_run_from(beside: Path) -> None:
    (beside / "needs_a_dependency_xyz.py").write_text("import no_such_dependency_xyz\n")
    sys.path.insert(0, str(beside))
    with pytest.raises(UnknownStageError) as info:
        resolve_targets("not_here_xyz:embed@not_here_xyz:images")
    assert "No module named 'not_here_xyz'; run esg-prefect from the folder that holds not_here_xyz.py" in str(
        info.value
    )
    assert "or add that folder to PYTHONPATH" in str(info.value)
    with pytest.raises(UnknownStageError, match="'not_here_xyz'; run esg-prefect from the folder"):
        resolve_targets("not_here_xyz.sub:targets")
    with pytest.raises(UnknownStageError) as info:  # the module is there; what it imports is not: no hint
        resolve_targets("needs_a_dependency_xyz:targets")
    assert "No module named 'no_such_dependency_xyz'" in str(info.value) and "run esg-prefect" not in str(info.value)
    sys.modules.pop("needs_a_dependency_xyz", None)


# ---- a disturbed run: counted and warned of -------------------------------------------------------


def _point(stage: str, batch: int, mean_ms: float, vcpus: int = 1, quiet: bool = True) -> ProfiledPoint:
    return ProfiledPoint(stage, "cpu", batch, vcpus, 0.0, mean_ms, mean_ms, mean_ms, 2.0, 1.0, 0.0, quiet=quiet)


def _run(points: list[ProfiledPoint]) -> ProfileRun:
    configs = [Configuration("cpu", "cpu", v) for v in dict.fromkeys(p.vcpus for p in points)]
    other: dict[str, float | None] = {c.label: 1.7 for c in configs}
    return ProfileRun(ProfileRequest(), points, [], configs, [], other, {}, 0.0, 1.0, {})


def test_a_disturbed_run_counts_its_points_and_warns_per_stage() -> None:
    embed = [(1, 0.5), (2, 0.86), (4, 0.68), (8, 1.87), (16, 7.48), (32, 3.15)]  # as a loaded machine timed them
    rank2 = [(1, 0.040), (2, 15.4), (4, 0.034), (8, 0.038)]
    points = [_point("embed", b, ms, quiet=b not in (2, 16)) for b, ms in embed]
    points += [_point("rank", b, ms, vcpus=2, quiet=b != 2) for b, ms in rank2]
    points += [_point("steady", b, 1.0 + b * (0.2 if b != 4 else 0.15)) for b in (1, 2, 4, 8)]  # a 12 % dip: noise
    text = SessionResult(run=_run(points)).text()
    assert "other processes' CPU during profiling (cores): cpu/1vcpu 1.70, cpu/2vcpu 1.70" in text
    assert (
        "points not quiet (other processes on their cores after every attempt): cpu/1vcpu 2/10, cpu/2vcpu 1/4" in text
    )
    assert "3/14 in all" in text
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, text  # embed and rank; steady is neither disturbed nor falling
    assert warnings[0].startswith("warning: embed: 2 of 6 points not quiet (cpu/1vcpu b2, b16); time falls as the ")
    assert "(cpu/1vcpu b16 7.48 ms -> b32 3.15 ms)" in warnings[0]
    assert "b2 0.86 ms -> b4 0.68 ms" not in warnings[0]  # 21 % faster: within noise
    assert "cpu/2vcpu b2 15.4 ms -> b4 0.034 ms" in warnings[1]
    assert all("profile again on a quieter machine" in w for w in warnings)


def test_a_quiet_monotonic_run_has_no_warning() -> None:
    points = [_point("s", b, 0.03 + 0.01 * b) for b in (1, 2, 4, 8)]
    points.append(_point("tiny", 1, 0.06))
    points.append(_point("tiny", 2, 0.03))  # half the time, but 30 us: the timer's jitter
    assert falls(points) == [] and noise_warnings(points) == []
    assert quiet_line(points).endswith("cpu/1vcpu 0/6; 0/6 in all")


# ---- peak memory: the batch's own, never the process's ------------------------------------------


def _tiny_stage(model_mem_mb: float = 0.0) -> PreparedStage:
    target = ProfileTarget("tiny", lambda d: 1, lambda m, xs: list(xs), lambda rng, n: [1.0] * n)
    return PreparedStage(target, 1, [1.0, 2.0], load_ms=1.0, cold_start_ms=2.0, model_mem_mb=model_mem_mb)


class _Rss:
    """A process of 313 MiB resident (torch, other models) whose calls allocate ``per_item`` MiB each."""

    def __init__(self, per_item: float, can_reset: bool = True) -> None:
        self.per_item, self.can_reset, self.peak, self.batch = per_item, can_reset, 313.0, 0

    def reset(self) -> bool:
        if self.can_reset:
            self.peak = 313.0
        return self.can_reset

    def run(self, model: object, items: list[float]) -> list[float]:
        self.peak = max(self.peak, 313.0 + self.per_item * len(items))
        return list(items)


@pytest.mark.parametrize("can_reset", [True, False])
@pytest.mark.parametrize(("per_item", "model_mb"), [(0.0, 0.0), (0.0, 1.5), (2.0, 0.0)])
def test_peak_memory_is_the_model_plus_the_batch_own_peak(
    monkeypatch: pytest.MonkeyPatch, per_item: float, model_mb: float, can_reset: bool
) -> None:
    from dataclasses import replace

    from esg_prefect.profiler import measure

    rss = _Rss(per_item, can_reset)
    monkeypatch.setattr(measure, "reset_peak_rss", rss.reset)
    monkeypatch.setattr(measure, "current_rss_mb", lambda: 313.0 if can_reset else None)
    monkeypatch.setattr(measure, "peak_rss_mb", lambda: rss.peak)
    stage = _tiny_stage(model_mb)
    stage.target = replace(stage.target, run=rss.run)
    peaks = {}
    for batch in (1, 2, 4, 8):
        point, _ = measure.measure_point(stage, batch, vcpus=1, settings=MeasureSettings.quick((batch,)))
        peaks[batch] = point.peak_mem_mb
    own = {b: model_mb + per_item * b for b in (1, 2, 4, 8)}
    if can_reset:  # Linux: the peak is reset before each point
        assert peaks == own  # never the process's 313 MiB
    else:  # elsewhere: the rise of the process's high-water mark, a lower bound (the growth since the last point)
        assert all(model_mb <= peaks[b] <= own[b] for b in own) and (per_item == 0) == (peaks[8] == model_mb)


# ---- samples that do not fit the stage ------------------------------------------------------------


def text_samples(rng: random.Random, n: int) -> list[str]:
    return ["a few words"] * n  # tests.toy_stages:inc adds 1 to numbers


def broken_samples(rng: random.Random, n: int) -> list[int]:
    raise KeyError("no such split")


def test_samples_that_do_not_fit_name_the_stage_and_the_samples() -> None:
    with pytest.raises(ProfileError) as info:
        prepare(["tests.toy_stages:inc@tests.test_profiler_user:text_samples"], pool=2)
    assert str(info.value) == (
        "stage 'inc' failed on its first input from samples 'tests.test_profiler_user:text_samples' (they may "
        'not fit the stage: check what it takes): TypeError: can only concatenate str (not "int") to str'
    )
    with pytest.raises(ProfileError, match=r"^samples 'tests.test_profiler_user:broken_samples' of stage 'inc' "):
        prepare(["tests.toy_stages:inc@tests.test_profiler_user:broken_samples"], pool=2)


def test_the_worker_reports_the_stage_and_samples_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from esg_prefect.profiler import worker
    from esg_prefect.profiler.worker import FAILED, _main

    monkeypatch.setattr(worker, "_apply", lambda job: "cpu")  # the worker's body in this process: threads untouched
    job = {"task": "profile", "specs": ["tests.toy_stages:inc@tests.test_profiler_user:text_samples"], "vcpus": 1}
    (tmp_path / "job.json").write_text(json.dumps({**job, "out": str(tmp_path / "out.json")}))
    assert _main([str(tmp_path / "job.json")]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"{FAILED}stage 'inc' failed on its first input from samples 'tests.test_profiler_user:")
