"""Latency profiles: point validation, interpolation by hand, no extrapolation, CSV."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from esg_prefect.exceptions import ConfigError, MissingProfileError, ProfileError
from esg_prefect.model.config import Config
from esg_prefect.model.profile import LatencyProfile, ProfilePoint

HEADER = "stage,hardware,batch,vcpus,gpu_share,mean_ms,p95_ms,cold_start_ms\n"


def pt(batch: int, vcpus: int, share: float, mean: float, p95: float | None = None, stage: str = "enc") -> ProfilePoint:
    """A point on the CPU when ``share`` is 0, else on a T4."""
    return ProfilePoint(stage, "cpu" if share == 0 else "T4", batch, vcpus, share, mean, p95)


def cpu_profile() -> LatencyProfile:
    """CPU grid: vcpus {1, 4} x batch {1, 4}."""
    return LatencyProfile([pt(1, 1, 0, 10.0), pt(4, 1, 0, 22.0), pt(1, 4, 0, 4.0), pt(4, 4, 0, 10.0)])


def gpu_profile() -> LatencyProfile:
    """T4 grid: vcpus {1, 4} x share {0.5, 1.0} at batch 1, plus batch 4 at vcpus 1."""
    return LatencyProfile(
        [
            pt(1, 1, 0.5, 40.0),
            pt(1, 1, 1.0, 24.0),
            pt(1, 4, 0.5, 30.0),
            pt(1, 4, 1.0, 18.0),
            pt(4, 1, 0.5, 52.0),
            pt(4, 1, 1.0, 30.0),
        ]
    )


# ---- ProfilePoint -------------------------------------------------------------


@pytest.mark.parametrize(("hardware", "share"), [("cpu", 0.5), ("T4", 0.0)])
def test_hardware_and_share_must_agree(hardware: str, share: float) -> None:
    with pytest.raises(ProfileError, match=re.escape(f"hardware {hardware!r} does not fit gpu_share {share}")):
        ProfilePoint("enc", hardware, 1, 1, share, 10.0)


@pytest.mark.parametrize("mean", [0.0, -3.0, float("nan"), float("inf")])
def test_mean_must_be_finite_and_positive(mean: float) -> None:
    with pytest.raises(ProfileError, match=re.escape(f"mean_ms must be a finite number > 0, got {mean!r}")):
        pt(1, 1, 0, mean)


@pytest.mark.parametrize("p95", [0.0, -1.0, float("nan")])
def test_p95_must_be_finite_and_positive(p95: float) -> None:
    with pytest.raises(ProfileError, match=re.escape(f"p95_ms must be a finite number > 0 or empty, got {p95!r}")):
        pt(1, 1, 0, 10.0, p95)


@pytest.mark.parametrize(("batch", "vcpus", "match"), [(0, 1, "batch .* got 0"), (1, 0, "vcpus .* got 0")])
def test_bad_batch_or_vcpus_raise_config_error(batch: int, vcpus: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ProfilePoint("enc", "cpu", batch, vcpus, 0.0, 10.0)


@pytest.mark.parametrize(("stage", "hardware", "bad"), [("", "cpu", "stage"), ("enc", "", "hardware")])
def test_empty_names_are_rejected(stage: str, hardware: str, bad: str) -> None:
    with pytest.raises(ProfileError, match=f"{bad} must be a non-empty name, got ''"):
        ProfilePoint(stage, hardware, 1, 1, 0.0, 10.0)


def test_share_is_normalised_to_the_grid() -> None:
    assert pt(1, 1, 0.1 + 0.2, 5.0).gpu_share == 0.3


# ---- interpolation ------------------------------------------------------------


def test_measured_points_are_returned_as_measured() -> None:
    prof = cpu_profile()
    assert prof.latency_ms("enc", Config(4, 4, 0.0), "cpu") == 10.0
    assert prof.latency_ms("enc", Config(1, 1, 0.0), "cpu") == 10.0


@pytest.mark.parametrize(("batch", "expected"), [(2, 14.0), (3, 18.0)])
def test_piecewise_linear_in_batch(batch: int, expected: float) -> None:
    # vcpus 1: 10 at batch 1, 22 at batch 4 -> 10 + 12 * (batch - 1) / 3
    assert cpu_profile().latency_ms("enc", Config(batch, 1, 0.0), "cpu") == expected


def test_linear_in_inverse_vcpus() -> None:
    # batch 1, vcpus 2 between 1 (10 ms) and 4 (4 ms): t = (1/2 - 1) / (1/4 - 1) = 2/3 -> 10 - 6 * 2/3 = 6
    # (linear in vcpus would give t = 1/3 and 8 ms)
    assert cpu_profile().latency_ms("enc", Config(1, 2, 0.0), "cpu") == pytest.approx(6.0, rel=1e-12)


def test_batch_and_vcpus_together() -> None:
    # batch 2: vcpus 1 row 10 + 12/3 = 14; vcpus 4 row 4 + 6/3 = 6; vcpus 2: t = 2/3 -> 14 - 8 * 2/3 = 26/3
    assert cpu_profile().latency_ms("enc", Config(2, 2, 0.0), "cpu") == pytest.approx(26 / 3, rel=1e-12)


def test_linear_in_inverse_share() -> None:
    # vcpus 1, batch 1: share 0.5 -> 40, 1.0 -> 24; share 0.75: t = (4/3 - 2) / (1 - 2) = 2/3 -> 40 - 16 * 2/3
    # = 88/3 (linear in share would give 32)
    assert gpu_profile().latency_ms("enc", Config(1, 1, 0.75), "T4") == pytest.approx(88 / 3, rel=1e-12)


def test_bilinear_in_inverse_vcpus_and_share() -> None:
    # share 0.75 at vcpus 1: 88/3 (above); at vcpus 4: 30 - 12 * 2/3 = 22;
    # vcpus 2: t = 2/3 -> 88/3 + (22 - 88/3) * 2/3 = 264/9 - 44/9 = 220/9
    assert gpu_profile().latency_ms("enc", Config(1, 2, 0.75), "T4") == pytest.approx(220 / 9, rel=1e-12)


def test_batch_and_share_together() -> None:
    # batch 2 at vcpus 1: share 0.5 row 40 + 12/3 = 44; share 1.0 row 24 + 6/3 = 26;
    # share 0.75: 44 - 18 * 2/3 = 32
    assert gpu_profile().latency_ms("enc", Config(2, 1, 0.75), "T4") == pytest.approx(32.0, rel=1e-12)


@pytest.mark.parametrize(
    ("config", "hardware"),
    [
        (Config(8, 1, 0.0), "cpu"),  # batch above the largest measured (4)
        (Config(1, 8, 0.0), "cpu"),  # vcpus above the largest measured (4)
        (Config(1, 1, 0.25), "T4"),  # share below the smallest measured (0.5)
        (Config(2, 4, 0.5), "T4"),  # corner (vcpus 4, share 0.5) has no batch above 1 to interpolate to
        (Config(1, 1, 0.5), "cpu"),  # a GPU share on the CPU
        (Config(1, 1, 0.0), "T4"),  # a CPU config on a GPU
        (Config(1, 1, 0.5), "A100"),  # hardware never measured
    ],
)
def test_no_extrapolation(config: Config, hardware: str) -> None:
    prof = LatencyProfile([*cpu_profile().points, *gpu_profile().points])
    assert prof.try_latency_ms("enc", config, hardware) is None
    with pytest.raises(MissingProfileError, match=re.escape(f"no profile covers stage 'enc' on {hardware!r}")):
        prof.latency_ms("enc", config, hardware)


def test_unknown_stage_is_named_in_missing_profile_error() -> None:
    with pytest.raises(MissingProfileError, match=r"stage 'dec' on 'cpu'.*measured hardware for it: none"):
        cpu_profile().latency_ms("dec", Config(1, 1, 0.0), "cpu")


def test_missing_profile_error_lists_measured_hardware() -> None:
    with pytest.raises(MissingProfileError, match=re.escape("measured hardware for it: ['T4']")):
        gpu_profile().latency_ms("enc", Config(1, 1, 0.0), "cpu")


def test_p95_is_used_where_measured_else_mean() -> None:
    prof = LatencyProfile([pt(1, 1, 0, 10.0, 12.0), pt(4, 1, 0, 22.0)])
    assert prof.latency_ms("enc", Config(1, 1, 0.0), "cpu") == 12.0  # default p95
    assert prof.latency_ms("enc", Config(1, 1, 0.0), "cpu", "mean") == 10.0
    assert prof.latency_ms("enc", Config(4, 1, 0.0), "cpu", "p95") == 22.0  # no p95: mean
    # batch 2 with p95: 12 + (22 - 12) / 3 = 46/3; with mean: 10 + 12 / 3 = 14
    assert prof.latency_ms("enc", Config(2, 1, 0.0), "cpu") == pytest.approx(46 / 3, rel=1e-12)
    assert prof.latency_ms("enc", Config(2, 1, 0.0), "cpu", "mean") == 14.0


def test_unknown_percentile_is_named() -> None:
    with pytest.raises(ProfileError, match="got 'p99'"):
        cpu_profile().latency_ms("enc", Config(1, 1, 0.0), "cpu", "p99")  # type: ignore[arg-type]


def test_duplicate_points_are_rejected() -> None:
    # 0.1 + 0.2 normalises to 0.3, so these are the same point
    msg = re.escape("duplicate profile point for stage 'enc' on 'T4': batch=2 vcpus=1 gpu_share=0.3")
    with pytest.raises(ProfileError, match=msg):
        LatencyProfile([pt(2, 1, 0.3, 5.0), pt(2, 1, 0.1 + 0.2, 6.0)])


def test_queries_about_the_table() -> None:
    prof = LatencyProfile([*cpu_profile().points, pt(1, 1, 0, 3.0, stage="dec")])
    assert prof.stages() == frozenset({"enc", "dec"})
    assert prof.hardware_types("enc") == frozenset({"cpu"})
    assert prof.measured_configs("enc", "cpu") == [Config(1, 1), Config(1, 4), Config(4, 1), Config(4, 4)]  # sorted
    assert prof.measured_configs("enc", "T4") == []


# ---- cold start ---------------------------------------------------------------


def test_cold_start_defaults_to_zero_and_is_looked_up() -> None:
    prof = LatencyProfile(cpu_profile().points, {("enc", "cpu"): 800})
    assert prof.cold_start_ms("enc", "cpu") == 800.0
    assert prof.cold_start_ms("enc", "T4") == 0.0


@pytest.mark.parametrize("ms", [-1.0, float("nan")])
def test_bad_cold_start_is_named(ms: float) -> None:
    with pytest.raises(ProfileError, match=re.escape(f"cold_start_ms for ('enc', 'cpu') must be >= 0, got {ms!r}")):
        LatencyProfile(cpu_profile().points, {("enc", "cpu"): ms})


# ---- CSV ----------------------------------------------------------------------


def test_csv_round_trip(tmp_path: Path) -> None:
    points = [*gpu_profile().points, pt(1, 1, 0, 41.5, 44.0), pt(2, 1, 0, 0.1 + 0.2, stage="dec")]
    prof = LatencyProfile(points, {("enc", "T4"): 2400.0, ("enc", "cpu"): 820.5})
    path = tmp_path / "profile.csv"
    prof.to_csv(path)
    back = LatencyProfile.from_csv(path)
    assert back.points == prof.points  # floats survive exactly, p95 None stays None
    assert back.cold_start_ms("enc", "T4") == 2400.0
    assert back.cold_start_ms("enc", "cpu") == 820.5
    assert back.cold_start_ms("dec", "cpu") == 0.0
    cfg = Config(1, 2, 0.75)
    assert back.latency_ms("enc", cfg, "T4") == prof.latency_ms("enc", cfg, "T4")


def test_csv_from_stream_with_extra_columns_and_empty_p95() -> None:
    text = "note," + HEADER.replace("\n", "") + "\nx,enc,cpu,1,1,0,10,,5\nx,enc,cpu,2,1,0,12,13,7\n"
    prof = LatencyProfile.from_csv(io.StringIO(text))
    assert prof.points == (pt(1, 1, 0, 10.0), pt(2, 1, 0, 12.0, 13.0))
    assert prof.cold_start_ms("enc", "cpu") == 7.0  # the largest cold start given for the pair


@pytest.mark.parametrize(
    ("row3", "match"),
    [
        ("enc,cpu,x,1,0,10,,", r"<stream> line 3: batch must be an integer, got 'x'"),
        ("enc,cpu,2.5,1,0,10,,", r"<stream> line 3: batch must be an integer, got '2.5'"),
        ("enc,cpu,2,1,0,ten,,", r"<stream> line 3: mean_ms must be a number, got 'ten'"),
        ("enc,cpu,2,1,0,-4,,", r"<stream> line 3: mean_ms must be a finite number > 0, got -4.0"),
        ("enc,T4,2,1,0,4,,", r"<stream> line 3: hardware 'T4' does not fit gpu_share 0.0"),
        ("enc,cpu,2,1,0,4,,-5", r"<stream> line 3: cold_start_ms must be a finite number >= 0, got -5.0"),
        ("enc,cpu,2,1,0,4,,nan", r"<stream> line 3: cold_start_ms must be a finite number >= 0, got nan"),
        ("enc,cpu", r"<stream> line 3: 2 values, but the header has 8 columns"),
        ("enc,cpu,2,1,0,4,,,", r"<stream> line 3: 9 values, but the header has 8 columns"),
    ],
)
def test_csv_errors_name_the_line(row3: str, match: str) -> None:
    text = HEADER + "enc,cpu,1,1,0,10,,\n" + row3 + "\n"
    with pytest.raises(ProfileError, match=match):
        LatencyProfile.from_csv(io.StringIO(text))


def test_csv_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "enc,cpu,1,1,0,zero,,\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=re.escape(f"{path} line 2: ") + ".*'zero'"):
        LatencyProfile.from_csv(path)


def test_csv_a_spreadsheets_byte_order_mark_is_not_a_column(tmp_path: Path) -> None:
    """It was read into the first column's name: "missing columns ['stage']" for a profile written by hand."""
    path = tmp_path / "mine.csv"
    path.write_text("\ufeff" + HEADER + "enc,cpu,1,1,0,10,,\n", encoding="utf-8")
    assert LatencyProfile.from_csv(path).stages() == {"enc"}


def test_csv_missing_columns_are_named() -> None:
    with pytest.raises(ProfileError, match=re.escape("missing columns ['mean_ms', 'vcpus']; its header: ['stage',")):
        LatencyProfile.from_csv(io.StringIO("stage,hardware,batch,gpu_share\nenc,cpu,1,0\n"))


@pytest.mark.parametrize(("typo", "meant"), [("p95", "p95_ms"), ("p95ms", "p95_ms"), ("cold_start", "cold_start_ms")])
def test_csv_a_misspelt_column_is_refused_not_skipped(typo: str, meant: str) -> None:
    """A misspelt p95_ms was skipped: the profile planned with the means, and nothing said so.

    (A misspelt required column is a missing one, named as such.)
    """
    header = HEADER.replace(meant, typo, 1)
    with pytest.raises(
        ProfileError, match=re.escape(f"column {typo!r} is not one this table reads: did you mean {meant!r}?")
    ):
        LatencyProfile.from_csv(io.StringIO(header + "enc,cpu,1,1,0,10,11,5\n"))


def test_csv_the_profilers_own_columns_are_no_typos() -> None:
    """p50_ms resembles p95_ms; a profiler CSV without p95 values still reads (its columns are known)."""
    text = "stage,hardware,batch,vcpus,gpu_share,mean_ms,p50_ms,peak_mem_mb\nenc,cpu,1,1,0,10,9,3\n"
    assert LatencyProfile.from_csv(io.StringIO(text)).points == (pt(1, 1, 0, 10.0),)


def test_csv_duplicate_rows_are_rejected() -> None:
    with pytest.raises(ProfileError, match="duplicate profile point for stage 'enc' on 'cpu'"):
        LatencyProfile.from_csv(io.StringIO(HEADER + "enc,cpu,1,1,0,10,,\nenc,cpu,1,1,0.0,11,,\n"))


def test_an_alias_takes_the_named_stages_points_in_place_of_its_own() -> None:
    prof = LatencyProfile(
        [ProfilePoint("a", "cpu", 1, 1, 0.0, 10.0), ProfilePoint("b", "cpu", 1, 1, 0.0, 30.0)],
        {("a", "cpu"): 100.0, ("b", "cpu"): 300.0},
    )
    got = prof.aliased({"a": "b"})
    assert got.latency_ms("a", Config(1, 1, 0.0), "cpu") == 30.0 and got.cold_start_ms("a", "cpu") == 300.0
    assert got.latency_ms("b", Config(1, 1, 0.0), "cpu") == 30.0
    assert prof.aliased({"a": "a"}).latency_ms("a", Config(1, 1, 0.0), "cpu") == 10.0  # itself: unchanged
