"""The profiler: profile CSV and store, Stash breakdown, co-run table, validation, CLI and flow.

The stages here are tiny toys (worker processes import them from this module as
``tests.test_profiler:toy_targets``): ``sleepy`` sleeps 2 ms per item, so its
latency grows with the batch whatever the machine's load (the one ordering the
tests may assert); ``sized`` costs with the total length of its inputs. One
module-scoped session measures them once (1 repetition, batches 1, 2, 4) with the
breakdown and the validation; the tests read its results. No timing is asserted
beyond what the sleeps guarantee.
"""

from __future__ import annotations

import csv
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from esg_prefect.exceptions import InvalidInputError, MissingProfileError, ProfileError, UnknownStageError
from esg_prefect.model import Config, LatencyProfile, ProfilePoint
from esg_prefect.profiler import (
    COMPONENTS,
    BreakdownOptions,
    CoRunRow,
    InterferenceTable,
    MeasureSettings,
    ProfileRequest,
    ProfileTarget,
    SessionOptions,
    SessionResult,
    ValidationReport,
    ValidationRow,
    input_size,
    read_profile_csv,
    read_samples_csv,
    run_session,
)
from esg_prefect.profiler.breakdown import read_breakdown_csv
from esg_prefect.profiler.machine import reset_peak_rss
from esg_prefect.profiler.results import EXTRA_FIELDS, PROFILE_FIELDS
from esg_prefect.profiler.targets import resolve_targets
from esg_prefect.profiler.validate import read_validation_csv, repredict
from esg_prefect.store.migrations import Migration
from esg_prefect.store.profile_store import PROFILE_MIGRATIONS, ProfileStore, migrate_profiles

TOYS = "tests.test_profiler:toy_targets"
SLEEP_PER_ITEM_S = 0.01  # 30 ms between batches of 1 and 4: more than a loaded machine's hiccups
BLOB_BYTES = 4 << 20

pytestmark = pytest.mark.xdist_group("profiler")


# ---- toy stages (imported by the worker processes) ---------------------------------------------


def load_sleepy(device: str) -> dict[str, Any]:
    return {"device": device}


def run_sleepy(model: dict[str, Any], items: list[float]) -> list[float]:
    blobs = [b"x" * BLOB_BYTES for _ in items]  # resident while the call runs: the peak grows with the batch
    time.sleep(SLEEP_PER_ITEM_S * len(items))
    return [x + 1 + 0 * len(blobs) for x in items]


def samples_sleepy(rng: random.Random, n: int) -> list[float]:
    return [rng.random() for _ in range(n)]


def load_sized(device: str) -> int:
    return 3


def run_sized(model: int, items: list[str]) -> list[int]:
    acc = 0
    for text in items:
        for _ in range(200 * len(text.split())):
            acc += model
    return [len(t) for t in items]


def samples_sized(rng: random.Random, n: int) -> list[str]:
    return [" ".join("w" for _ in range(rng.randint(2, 40))) for _ in range(n)]


def toy_targets() -> list[ProfileTarget]:
    return [
        ProfileTarget("sleepy", load_sleepy, run_sleepy, samples_sleepy, pipeline="toy"),
        ProfileTarget("sized", load_sized, run_sized, samples_sized, pipeline="toy"),
    ]


def run_broken(model: int, items: list[float]) -> list[float]:
    if len(items) > 1:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")
    return items


def broken_targets() -> list[ProfileTarget]:
    return [ProfileTarget("broken", load_sleepy, run_broken, samples_sleepy, pipeline="toy")]


# ---- one measured session ------------------------------------------------------------------------


@pytest.fixture(scope="session")  # the group keeps its tests on one worker: one profiling session there
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[SessionResult, Path, str]:
    out = tmp_path_factory.mktemp("profile")
    url = f"sqlite:///{out / 'profiles.db'}"
    settings = MeasureSettings((1, 2, 4), pool=6, warmup=1, min_reps=1, max_reps=1, max_attempts=1)
    opts = SessionOptions(
        request=ProfileRequest((TOYS,), vcpus=(1,), settings=settings, wait_quiet_s=0.0, worker_start_launches=1),
        out_dir=out,
        name="toy",
        breakdown=BreakdownOptions(batch=2, slot_s=0.2, requests=8),
        validate=True,
        validation_batches=(1, 3),
        store_url=url,
    )
    seen: list[tuple[int, int]] = []
    res = run_session(opts, lambda done, total, label: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] == 2 * 3  # 2 stages x 3 batch sizes x 1 configuration
    return res, out, url


def test_profile_csv_loads_as_a_latency_profile(session: tuple[SessionResult, Path, str]) -> None:
    res, out, _ = session
    path = out / "toy.csv"
    with open(path, newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh))
    assert tuple(header) == (*PROFILE_FIELDS, *EXTRA_FIELDS)
    profile = LatencyProfile.from_csv(path)
    assert profile.stages() == {"sleepy", "sized"}
    assert {c.batch for c in profile.measured_configs("sleepy", "cpu")} == {1, 2, 4}
    # the sleeps make the order certain: 10 ms per item at least
    lat = [profile.latency_ms("sleepy", Config(b, 1), "cpu", "mean") for b in (1, 2, 4)]
    assert lat[0] < lat[2] and lat[0] >= 1000 * SLEEP_PER_ITEM_S and lat[2] >= 4000 * SLEEP_PER_ITEM_S
    points = read_profile_csv(path)
    assert len(points) == 6
    for p in points:
        assert p.p50_ms <= p.p95_ms or math.isclose(p.p50_ms, p.p95_ms)
        assert p.peak_mem_mb >= p.model_mem_mb >= 0
        assert p.cold_start_ms >= p.load_ms >= 0  # cold start = load + first call
        assert p.worker_start_ms > 0
        assert profile.cold_start_ms(p.stage, "cpu") == pytest.approx(p.total_cold_start_ms, abs=0.1)
        assert p.reps == 1 and p.pipeline == "toy"
    if reset_peak_rss():  # Linux: the peak is per point, so it follows the batch's allocations
        mem = {p.batch: p.peak_mem_mb for p in points if p.stage == "sleepy"}
        assert mem[4] >= 3 * BLOB_BYTES / (1 << 20) and mem[4] > mem[1]
    # scheduler-facing profile equals the file's
    assert res.profile is not None and res.profile.stages() == profile.stages()


def test_samples_record_input_sizes(session: tuple[SessionResult, Path, str]) -> None:
    _, out, _ = session
    samples = read_samples_csv(out / "toy_samples.csv")
    assert {(s.stage, s.batch) for s in samples} == {(st, b) for st in ("sleepy", "sized") for b in (1, 2, 4)}
    sized = [s for s in samples if s.stage == "sized"]
    assert all(2 * s.batch <= s.total_size <= 40 * s.batch for s in sized)  # words per text: 2..40


def test_breakdown_rows_for_every_stage(session: tuple[SessionResult, Path, str]) -> None:
    res, out, _ = session
    assert res.breakdown is not None
    rows = {r.stage: r for r in res.breakdown.rows}
    assert set(rows) == {"sleepy", "sized"}
    for r in rows.values():
        assert r.batch == 2 and r.h2d_ms is None and r.component_ms("h2d") == 0.0  # CPU: not applicable
        assert r.compute_ms > 0 and r.transfer_ms > 0 and r.transfer_bytes > 0
        assert r.queueing_ms >= 0 and r.queue_p95_ms >= 0 and r.queue_trace == "azure_llm_conv"
        assert r.slowdown > 0 and r.interference_ms >= 0 and r.co_runners == 1
        assert r.cold_start_ms > 0
        assert r.warm_total_ms == pytest.approx(sum(r.component_ms(c) for c in COMPONENTS[:-1]))
    assert rows["sleepy"].compute_ms >= 2000 * SLEEP_PER_ITEM_S
    back = {r.stage: r for r in read_breakdown_csv(out / "toy_stalls.csv")}
    assert back["sleepy"].h2d_ms is None
    assert back["sleepy"].compute_ms == pytest.approx(rows["sleepy"].compute_ms, rel=1e-3)
    assert (out / "profiler_toy_toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_corun_table_round_trips(session: tuple[SessionResult, Path, str]) -> None:
    res, out, _ = session
    table = InterferenceTable.from_csv(out / "toy_corun.csv")
    assert table.stages() == {"sleepy", "sized"}
    assert res.breakdown is not None
    for r in res.breakdown.corun.rows:
        assert table.slowdown(r.stage, "cpu", 1) == pytest.approx(r.slowdown, rel=1e-3)
        assert table.slowdown(r.stage, "cpu", 0) == 1.0


def test_validation_numbers(session: tuple[SessionResult, Path, str]) -> None:
    res, out, _ = session
    v = res.validation
    assert v is not None
    assert {(r.stage, r.batch, r.interpolated) for r in v.rows} == {
        (s, b, b == 3) for s in ("sleepy", "sized") for b in (1, 3)
    }
    for r in v.rows:
        assert r.measured_ms > 0 and r.predicted_ms > 0 and math.isfinite(r.ape)
    per = v.per_stage()
    assert set(per) == {"sleepy", "sized"} and all(e >= 0 for e in per.values())
    assert "sleepy" in v.table()
    with open(out / "toy_validation.csv", newline="", encoding="utf-8") as fh:
        assert len(list(csv.DictReader(fh))) == 4
    # the same measurements predicted by another profile: every prediction doubled, measurements kept
    back = read_validation_csv(out / "toy_validation.csv")
    assert [(r.stage, r.batch) for r in back.rows] == [(r.stage, r.batch) for r in v.rows]
    assert res.profile is not None
    doubled = LatencyProfile(
        [
            ProfilePoint(p.stage, p.hardware, p.batch, p.vcpus, p.gpu_share, 2 * p.mean_ms, 2 * (p.p95_ms or p.mean_ms))
            for p in res.profile.points
        ]
    )
    again = repredict(back, doubled)
    for old, new in zip(v.rows, again.rows, strict=True):
        assert new.measured_ms == pytest.approx(old.measured_ms, rel=1e-3, abs=1e-3)  # the CSV keeps 3 decimals
        assert new.predicted_ms == pytest.approx(2 * old.predicted_ms, rel=1e-3)
    assert (out / "profiler_toy_validation.png").exists()


def test_run_is_in_the_store(session: tuple[SessionResult, Path, str]) -> None:
    res, out, url = session
    with ProfileStore(url) as store:
        runs = store.runs()
        assert [r.run_id for r in runs] == [res.run_id]
        stored = store.load_profile()
        from_csv = LatencyProfile.from_csv(out / "toy.csv")
        assert stored.stages() == from_csv.stages()
        cfg = Config(2, 1)
        assert stored.latency_ms("sleepy", cfg, "cpu") == pytest.approx(from_csv.latency_ms("sleepy", cfg, "cpu"), 1e-3)
        stalls = store.stalls(res.run_id or "")
        assert {(s.stage, s.component) for s in stalls} == {(st, c) for st in ("sleepy", "sized") for c in COMPONENTS}
        assert next(s for s in stalls if s.component == "h2d").ms is None


# ---- pure parts ------------------------------------------------------------------------------------


def test_interference_table_interpolates_and_names_missing_stages() -> None:
    t = InterferenceTable(
        [CoRunRow("a", "cpu", 4, 1, 0.0, 1, 10.0, 12.0), CoRunRow("a", "cpu", 4, 1, 0.0, 3, 10.0, 20.0)]
    )
    assert t.slowdown("a", "cpu", 1) == pytest.approx(1.2)
    assert t.slowdown("a", "cpu", 2) == pytest.approx(1.6)  # between 1.2 and 2.0
    assert t.slowdown("a", "cpu", 5) == pytest.approx(2.8)  # the last two points' line
    with pytest.raises(ProfileError, match="no co-run measured for stage 'b'"):
        t.slowdown("b", "cpu", 1)
    with pytest.raises(ProfileError, match="co_runners must be >= 0, got -1"):
        t.slowdown("a", "cpu", -1)
    with pytest.raises(ProfileError, match="alone_ms must be a finite number > 0"):
        CoRunRow("a", "cpu", 4, 1, 0.0, 1, 0.0, 1.0)


def test_validation_report_medians() -> None:
    rows = tuple(
        ValidationRow("s", "cpu", b, 1, 0.0, b == 3, pred, 10.0, True) for b, pred in ((1, 11.0), (3, 13.0), (8, 10.5))
    )
    rep = ValidationReport(rows, {})
    assert rep.median_ape("s") == pytest.approx(0.10)
    assert rep.median_ape("s", interpolated=True) == pytest.approx(0.30)
    assert rep.passed()
    assert not ValidationReport(rows, {}, target=0.05).passed()
    with pytest.raises(InvalidInputError, match="no validation rows for stage 'x'"):
        rep.median_ape("x")


def test_input_size_units() -> None:
    import torch

    assert input_size("three short words") == 3
    assert input_size(torch.zeros(17, dtype=torch.int64)) == 17
    assert input_size({"hidden": torch.zeros(9, 256)}) == 9
    assert input_size({"boxes": torch.zeros(5, 4), "image": torch.zeros(3, 8, 8)}) == 5
    assert input_size(["a b", "c"]) == 3


def test_a_registered_stage_with_samples_keeps_its_pipeline() -> None:
    (target,) = resolve_targets("tests.toy_stages:inc@tests.test_profiler:samples_sleepy")
    assert (target.name, target.pipeline) == ("inc", "toy")  # the pipeline column was left empty


def test_bad_targets_are_named() -> None:
    with pytest.raises(UnknownStageError, match="'nope'"):
        resolve_targets("tests.test_profiler:nope")
    with pytest.raises(UnknownStageError, match="is not a ProfileTarget"):
        resolve_targets("tests.test_profiler:SLEEP_PER_ITEM_S")
    assert [t.name for t in resolve_targets(TOYS)] == ["sleepy", "sized"]
    with pytest.raises(UnknownStageError, match=r"'tests.toy_stages:inc' is a stage; give its samples"):
        resolve_targets("tests.toy_stages:inc")  # the task Pipeline.stage made, callable, is not called


def test_profile_store_versions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with ProfileStore(url) as store:
        assert migrate_profiles(store.engine) == ()  # already at the newest version
        with pytest.raises(MissingProfileError, match="holds no profile run"):
            store.load_profile()
    v2 = Migration(2, "noop", lambda conn: None)
    with ProfileStore(url) as store:
        assert migrate_profiles(store.engine, (*PROFILE_MIGRATIONS, v2)) == (2,)
    from esg_prefect.exceptions import ConfigError

    with pytest.raises(ConfigError, match="schema version 2, newer than this esg-prefect knows \\(1\\)"):
        ProfileStore(url)


# ---- the command ----------------------------------------------------------------------------------


@pytest.mark.service
def test_cli_quick_profile(tmp_path: Path) -> None:
    from esg_prefect.cli import app

    result = CliRunner().invoke(
        app,
        ["profile", "--quick", "-t", TOYS, "--vcpus", "1", "--no-store", "--out-dir", str(tmp_path), "--name", "q"],
    )
    assert result.exit_code == 0, result.output
    assert "sleepy" in result.output and "wrote profile" in result.output
    assert LatencyProfile.from_csv(tmp_path / "q.csv").stages() == {"sleepy", "sized"}
    bad = CliRunner().invoke(app, ["profile", "--vcpus", "0"])
    assert bad.exit_code != 0 and "--vcpus must be integers >= 1" in bad.output


@pytest.mark.service
def test_an_existing_profile_is_validated_on_the_targets_given(tmp_path: Path) -> None:
    """``--profile X --validate -t T`` measures T's stages, not the example stages (``-t`` was
    ignored with ``--profile``: an example stage of the same name was validated in its place), and
    names the profile's stages that no target validated."""
    from esg_prefect.cli import app

    points = [ProfilePoint(s, "cpu", b, 1, 0.0, 5.0 * b, 6.0 * b) for s in ("sleepy", "ghost") for b in (1, 2)]
    LatencyProfile(points).to_csv(tmp_path / "mine.csv")
    argv = ["profile", "--quick", "-t", TOYS, "--profile", str(tmp_path / "mine.csv"), "--validate"]
    result = CliRunner().invoke(app, [*argv, "--no-store", "--out-dir", str(tmp_path), "--name", "v"])
    assert result.exit_code == 0, result.output
    assert {r.stage for r in read_validation_csv(tmp_path / "v_validation.csv").rows} == {"sleepy"}
    assert f"not validated: ghost: in the profile but not among the targets ({TOYS})" in result.output


def test_flow_refuses_the_options_it_would_ignore(tmp_path: Path) -> None:
    """``--flow`` measured a new profile whatever ``--profile`` said: refused in one line now."""
    from esg_prefect.cli import app

    (tmp_path / "mine.csv").write_text("stage\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["profile", "--flow", "--profile", str(tmp_path / "mine.csv"), "--validate"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("\u2502", " ").split())  # rich's error box, unwrapped
    assert "--flow measures a new profile and takes none of --profile;" in said


def test_a_stage_that_fails_is_named_with_its_point_in_one_line(tmp_path: Path) -> None:
    argv = ["profile", "--quick", "-t", "tests.test_profiler:broken_targets", "--vcpus", "1", "--no-store"]
    proc = subprocess.run(
        [sys.executable, "-m", "esg_prefect.cli", *argv, "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "stage 'broken' failed at batch 2, 1 vCPU(s)" in last and "mat1 and mat2" in last, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.service
@pytest.mark.usefixtures("prefect_harness")
def test_flow_reports_progress_and_writes_the_profile(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from esg_prefect.profiler.flow import profile_flow

    out = profile_flow(
        targets=[TOYS], vcpus=[1], quick=True, out_dir=str(tmp_path), name="f", store_url=f"{tmp_path / 'p.db'}"
    )
    assert LatencyProfile.from_csv(tmp_path / "f.csv").stages() == {"sleepy", "sized"}
    assert out["run_id"] and out["files"]["profile"] == str(tmp_path / "f.csv")

    async def artifacts(key: str) -> list[Any]:
        async with get_client() as client:
            flt = ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
            return list(await client.read_artifacts(artifact_filter=flt))

    import asyncio

    progress = asyncio.run(artifacts("esg-profile-progress"))
    assert progress and progress[0].data == 100.0
    report = asyncio.run(artifacts("esg-profile-report"))
    assert report and "sleepy" in str(report[0].data)


def test_a_malformed_stall_row_is_named_by_file_and_line(tmp_path: Path) -> None:
    from esg_prefect.profiler.breakdown import write_breakdown_csv

    path = tmp_path / "stalls.csv"
    write_breakdown_csv([_stall_row("a"), _stall_row("b")], path)
    assert [r.stage for r in read_breakdown_csv(path)] == ["a", "b"]
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace(",2,", ",two,", 1)  # batch of the second row
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match=r"stalls\.csv line 3: .*'two'"):
        read_breakdown_csv(path)


def _stall_row(stage: str) -> Any:
    from dataclasses import fields

    from esg_prefect.profiler.breakdown import StallRow

    values: dict[str, Any] = {}
    for f in fields(StallRow):
        if f.name in ("stage", "pipeline", "hardware", "queue_trace"):
            values[f.name] = stage if f.name == "stage" else "x"
        elif f.name == "batch":
            values[f.name] = 2
        elif f.type in ("int", int):
            values[f.name] = 1
        elif f.type in ("bool", bool):
            values[f.name] = True
        else:
            values[f.name] = 1.5
    return StallRow(**values)


def test_example_targets_come_from_their_entry_point_with_real_upstream_inputs() -> None:
    from esg_prefect.examples.profiling import EXAMPLES
    from esg_prefect.profiler.targets import prepare, provider_of, targets_of

    found = provider_of("examples:text")
    assert found is not None and found[0] is EXAMPLES and found[1] == ["text"]
    assert provider_of("tests.toy_stages:inc@tests.toy_stages:samples") is None
    assert [t.name for t in targets_of("examples:text")] == ["tokenize", "encode", "classify_text", "summarize"]
    stages = prepare(["examples:text"], pool=2)
    assert [p.name for p in stages] == ["tokenize", "encode", "classify_text", "summarize"]
    assert all(len(p.jobs) == 2 and p.cold_start_ms > 0 for p in stages)
    assert isinstance(stages[1].jobs[0], type(stages[0].target.run(stages[0].model, [stages[0].jobs[0]])[0]))


def test_the_profile_flow_s_parameters_validate_without_a_warning() -> None:
    """Its ``validate`` parameter shadowed pydantic's model attribute: a UserWarning at each run of
    ``esg-prefect profile --flow``, and an error where warnings are errors."""
    import warnings

    from esg_prefect.profiler.flow import profile_flow

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params = profile_flow.validate_parameters({"quick": True, "validation": True})
    assert params["validation"] is True and params["quick"] is True


@pytest.mark.parametrize("share", [0.0, -0.25, 1.5, math.nan])
def test_the_request_and_the_cli_refuse_the_same_gpu_shares(share: float) -> None:
    """One bound (``is_gpu_share``) for both; each error as it was, the CLI's naming its option."""
    import typer

    from esg_prefect.cli.profile import _shares

    with pytest.raises(InvalidInputError, match=re.escape(f"gpu_shares must be in (0, 1], got [0.5, {share}]")):
        ProfileRequest(gpu_shares=(0.5, share))
    with pytest.raises(typer.BadParameter, match=re.escape(f"must be GPU fractions in (0, 1], got '0.5,{share}'")):
        _shares(f"0.5,{share}")
    assert ProfileRequest(gpu_shares=(0.25, 1.0)).gpu_shares == _shares("0.25,1") == (0.25, 1.0)
