"""Workloads: shipped trace files, arrival generation per trace, the rate estimator, the GPU profiles."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import itertools
import math
import re
import statistics
from pathlib import Path

import pytest

from esg_prefect.exceptions import ConfigError, InvalidInputError, ProfileError
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.profile_source import PROFILE_DIR
from esg_prefect.workload import ArrivalRateEWMA, arrivals, trace_available, trace_names, traces
from esg_prefect.workload import gpu_profiles as gp
from esg_prefect.workload.traces import parse_timestamp_s, shared_traces_dir

# sha256 of the decompressed shipped files: the unchanged source files (LLM) and the http rows of the sample.
SHIPPED_SHA256 = {
    "azure_llm_2023_code.csv.gz": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "azure_llm_2023_conv.csv.gz": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    "azure_functions_2019_http_invocations.csv.gz": "c4a86dacebfb44398eb1a32196f78e43eaec02b1da8cb7ed2e49c55dedf1d0ed",
}


# ---- shipped files -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHIPPED_SHA256))
def test_shipped_trace_files_are_the_documented_bytes(name: str) -> None:
    data = gzip.decompress((traces.DATA_DIR / name).read_bytes())
    assert hashlib.sha256(data).hexdigest() == SHIPPED_SHA256[name]
    assert name in (traces.DATA_DIR / "README.md").read_text(encoding="utf-8")


def test_shipped_data_is_small_and_attributed() -> None:
    files = list(traces.iter_shipped_files())
    assert sum(f.stat().st_size for f in files) < 400_000
    readme = (traces.DATA_DIR / "README.md").read_text(encoding="utf-8")
    for needle in (
        "CC-BY-4.0",
        "MIT",
        "Splitwise",
        "Serverless in the Wild",
        "790921015d50dd6aae7f7e47f39ba0e235ad6b08",
    ):
        assert needle in readme
    assert not list(traces.DATA_DIR.glob("*alibaba*")) and not list(traces.DATA_DIR.glob("*infless*"))


def test_readers() -> None:
    code, conv = traces.llm_arrivals_s("code"), traces.llm_arrivals_s("conv")
    assert (len(code), len(conv)) == (8819, 19366)
    assert code[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(code))
    funcs = traces.http_functions()
    assert len(funcs) == 139 and funcs[0].total == 12418 and len(funcs[0].counts) == 480
    assert funcs[0].first_minute == 480
    with pytest.raises(InvalidInputError, match="'chat'"):
        traces.llm_arrivals_s("chat")


def test_parse_timestamp() -> None:
    assert parse_timestamp_s("1970-01-01 00:00:00") == 0.0
    assert parse_timestamp_s("2023-11-16 18:17:03.9799600") - parse_timestamp_s(
        "2023-11-16 18:17:03.0"
    ) == pytest.approx(0.97996)
    assert parse_timestamp_s("2024-03-01 00:00:00") - parse_timestamp_s("2024-02-28 00:00:00") == 2 * 86400.0
    with pytest.raises(InvalidInputError, match="bad timestamp"):
        parse_timestamp_s("yesterday")


# ---- arrivals ------------------------------------------------------------------------------


@pytest.mark.parametrize("trace", ["poisson", "azure_functions_2019", "azure_llm_code", "azure_llm_conv"])
def test_arrivals_are_seeded_sorted_and_in_window(trace: str) -> None:
    a = arrivals(trace, ["a", "b"], rate_per_s=80.0, duration_s=20.0, seed=4)
    assert a == arrivals(trace, ["a", "b"], rate_per_s=80.0, duration_s=20.0, seed=4)
    assert a != arrivals(trace, ["a", "b"], rate_per_s=80.0, duration_s=20.0, seed=5)
    assert a == sorted(a)
    assert all(0.0 <= t < 20_000.0 and wf in ("a", "b") for t, wf in a)
    assert {wf for _, wf in a} == {"a", "b"}


def test_poisson_rate() -> None:
    a = arrivals("poisson", ["w"], rate_per_s=200.0, duration_s=50.0, seed=1)
    assert abs(len(a) - 10_000) < 4 * math.sqrt(10_000)


def test_llm_compression_keeps_the_trace_order_and_rate() -> None:
    # From the start of the conv trace at 2x its mean rate: the first arrivals are the trace's, twice as fast.
    times = traces.llm_arrivals_s("conv")
    mean_rate = len(times) / (times[-1] + times[-1] / (len(times) - 1))
    a = arrivals("azure_llm_conv", ["w"], rate_per_s=2 * mean_rate, duration_s=5.0, seed=0, start_s=0.0)
    assert [t for t, _ in a[:5]] == pytest.approx([1000.0 * t / 2 for t in times[:5]])
    # Over whole cycles of the trace the mean rate is the target.
    long = arrivals("azure_llm_conv", ["w"], rate_per_s=100.0, duration_s=3 * 19366 / 100.0, seed=0, start_s=0.0)
    assert abs(len(long) - 3 * 19366) <= 3


def test_bursty_and_steady_traces_keep_their_burstiness() -> None:
    def cv(trace: str) -> float:
        ts = [t for t, _ in arrivals(trace, ["w"], rate_per_s=100.0, duration_s=60.0, seed=0, start_s=0.0)]
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert cv("azure_llm_code") > 5.0 > 1.5 > cv("azure_llm_conv") > 0.8


def test_weights_split_the_requests() -> None:
    a = arrivals("azure_llm_conv", ["a", "b"], rate_per_s=100.0, duration_s=60.0, seed=0, weights=(3.0, 1.0))
    share = sum(1 for _, wf in a if wf == "a") / len(a)
    assert 0.72 < share < 0.78


def test_functions_trace_keeps_each_functions_minute_shape() -> None:
    # One trace minute per simulated second, from 08:00: minute m of the top function gets
    # counts[m] / 60 * scale arrivals in second m, rounded up or down.
    top = traces.http_functions()[0]
    rate = 50.0
    scale = rate / (top.total / (len(top.counts) * 60.0))
    a = arrivals("azure_functions_2019", ["w"], rate_per_s=rate, duration_s=10.0, seed=2, start_s=0.0, minute_s=1.0)
    for m in range(10):
        expected = top.counts[m] / 60.0 * scale
        got = sum(1 for t, _ in a if m * 1000.0 <= t < (m + 1) * 1000.0)
        assert math.floor(expected) <= got <= math.ceil(expected), (m, got, expected)


def test_functions_trace_maps_the_most_invoked_functions_in_order() -> None:
    a = arrivals("azure_functions_2019", ["w0", "w1"], rate_per_s=40.0, duration_s=600.0, seed=1, start_s=0.0)
    counts = {w: sum(1 for _, x in a if x == w) for w in ("w0", "w1")}
    # each gets its equal share of the rate on average over the whole sample; here 10 minutes of it
    # minute m brings counts[m] * scale, scale = 20/s over the sample's mean rate (total / 28,800 s)
    for w, f in zip(("w0", "w1"), traces.http_functions()[:2], strict=True):
        expected = sum(f.counts[:10]) * 20.0 * 28_800.0 / f.total
        assert abs(counts[w] - expected) <= 10, (w, counts[w], expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"trace": "nope"}, "unknown trace 'nope'"),
        ({"rate_per_s": 0.0}, "rate_per_s must be"),
        ({"duration_s": -1.0}, "duration_s must be"),
        ({"workflows": []}, "at least one workflow"),
        ({"workflows": ["a", "a"]}, "unique"),
        ({"weights": (1.0,)}, "weights has 1 values for 2"),
        ({"start_s": -5.0}, "start_s must be"),
    ],
)
def test_arrivals_name_bad_input(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "trace": "poisson",
        "workflows": ["a", "b"],
        "rate_per_s": 10.0,
        "duration_s": 1.0,
        "seed": 0,
    }
    with pytest.raises(InvalidInputError, match=match):
        arrivals(**{**base, **kwargs})  # type: ignore[arg-type]


def test_alibaba_trace_from_the_shared_folder_or_a_clear_error() -> None:
    assert "alibaba_genai_2026" in trace_names()
    if not trace_available("alibaba_genai_2026"):
        with pytest.raises(traces.TraceUnavailableError, match="research/study use only"):
            arrivals("alibaba_genai_2026", ["t2i"], 10.0, 5.0, 0)
        return
    a = arrivals("alibaba_genai_2026", ["t2i", "i2i", "inpaint"], rate_per_s=100.0, duration_s=30.0, seed=0)
    counts = {w: sum(1 for _, x in a if x == w) for w in ("t2i", "i2i", "inpaint")}
    assert counts["t2i"] > counts["i2i"] > counts["inpaint"]  # the kinds' frequencies in the trace


# ---- the rate estimator ---------------------------------------------------------------------------


def test_rate_ewma_worked_example() -> None:
    est = ArrivalRateEWMA(alpha=0.5)
    assert est.rate_per_s(0.0) == 0.0
    est.observe(0.0)
    assert est.rate_per_s(0.0) == 0.0  # one event: no gap yet
    est.observe(100.0)
    assert est.rate_per_s(100.0) == 10.0
    est.observe(150.0, n=2)  # two gaps of 25 ms: 0.25 * 100 + 0.75 * 25 = 43.75 ms
    assert est.rate_per_s(150.0) == pytest.approx(1000.0 / 43.75)
    est.observe(150.0)  # same instant: redo as three gaps of 50/3 ms: 0.125 * 100 + 0.875 * 50/3
    assert est.rate_per_s(150.0) == pytest.approx(1000.0 / (12.5 + 0.875 * 50.0 / 3.0))
    # no arrival for 1 s: at most one arrival per second since the last one
    assert est.rate_per_s(1150.0) == pytest.approx(1.0)


def test_rate_ewma_bad_input() -> None:
    with pytest.raises(ConfigError, match="alpha"):
        ArrivalRateEWMA(0.0)
    est = ArrivalRateEWMA(0.2)
    est.observe(10.0)
    with pytest.raises(InvalidInputError, match="time order"):
        est.observe(5.0)
    with pytest.raises(InvalidInputError, match="n must be >= 1"):
        est.observe(20.0, n=0)


# ---- GPU profiles -----------------------------------------------------------------------------------


def test_share_slowdown() -> None:
    assert gp.share_slowdown(1.0, 1.0) == 1.0
    assert gp.share_slowdown(0.9, 0.3) == pytest.approx(3.0)
    assert gp.share_slowdown(0.5, 0.6) == 1.0
    assert gp.share_slowdown(0.1, 0.1) == pytest.approx(2.5)  # the 0.25 floor
    with pytest.raises(ProfileError, match="share"):
        gp.share_slowdown(0.5, 0.0)


def _table(rows: list[tuple[int, float, float, float]], licence: str = "MIT") -> list[dict[str, str]]:
    out = []
    for b, thr, avg, p95 in rows:
        out.append(
            {
                "framework": "F", "model_dir": "m", "submodel": "", "serving": "triton_offline", "gpu": "T4",
                "precision": "FP16", "backend": "", "variant": "", "seq_len": "", "batch_size": str(b),
                "throughput_per_s": str(thr), "lat_avg_ms": str(avg), "lat_p50_ms": "", "lat_p90_ms": "",
                "lat_p95_ms": str(p95), "source_path": "m/README.md", "source_section": "s", "license": licence,
            }
        )  # fmt: skip
    return out


def test_derive_worked_example() -> None:
    # batch 1: 100/s (u = 100/400 = 0.25), batch 4: 400/s (u = 1.0).
    table = _table([(1, 100.0, 10.0, 12.0), (4, 400.0, 10.0, 11.0)])
    sel = gp.TableSelector("T4", "F", "m", "", "T4", "FP16", "triton_offline")
    stage = gp.StageSource("st", "title", 200.0, (sel,))
    rows, sources = gp.derive(table, gp.ColdStartModel("c", 50.0, 0.5), [stage])
    got = {(r.batch, r.gpu_share): (r.mean_ms, r.p95_ms, r.cold_start_ms) for r in rows}
    assert got[(1, 1.0)] == (10.0, 12.0, 150.0)
    assert got[(1, 0.5)] == (10.0, 12.0, 150.0)  # needs 0.25: no slowdown
    assert got[(1, 0.1)] == (25.0, 30.0, 150.0)  # 0.25 / 0.1 = 2.5x
    assert got[(4, 0.5)] == (20.0, 22.0, 150.0)  # 1.0 / 0.5 = 2x
    assert len(rows) == 2 * len(gp.SHARES)
    assert sources[0]["license"] == "MIT" and sources[0]["batches"] == "1 4"


def test_derive_refuses_other_licences_and_ambiguous_tables() -> None:
    sel = gp.TableSelector("T4", "F", "m", "", "T4", "FP16", "triton_offline")
    stage = gp.StageSource("st", "title", 1.0, (sel,))
    with pytest.raises(ProfileError, match=r"GPL-3\.0"):
        gp.derive(_table([(1, 1.0, 1.0, 1.0)], "GPL-3.0"), stages=[stage])
    with pytest.raises(ProfileError, match="repeated batch sizes"):
        gp.derive(_table([(1, 1.0, 1.0, 1.0), (1, 2.0, 1.0, 1.0)]), stages=[stage])
    with pytest.raises(ProfileError, match="no published table"):
        gp.derive([], stages=[stage])


def test_shipped_profiles_load_and_cover_the_standard_models() -> None:
    for name, _ in gp.COLD_STARTS:
        prof = LatencyProfile.from_csv(PROFILE_DIR / name)
        assert prof.stages() == frozenset(s.stage for s in gp.STAGES)
        for s in gp.STAGES:
            assert prof.hardware_types(s.stage) == frozenset({"T4", "V100", "A100"})
    swap = LatencyProfile.from_csv(PROFILE_DIR / "nvidia_gpu.csv")
    container = LatencyProfile.from_csv(PROFILE_DIR / "nvidia_gpu_container.csv")
    assert swap.cold_start_ms("resnet50", "T4") == pytest.approx(50.0 + 98.0 / 12.0, abs=0.05)
    assert container.cold_start_ms("resnet50", "T4") == 1598.0


SOURCE = (shared_traces_dir() or Path("/nonexistent")) / "profiles" / "nvidia_dle_inference_latency.csv"


@pytest.mark.skipif(not SOURCE.exists(), reason="the shared trace folder with NVIDIA's tables is not here")
def test_shipped_profiles_are_reproducible_from_the_published_tables() -> None:
    with open(SOURCE, encoding="utf-8", newline="") as fh:
        table = list(csv.DictReader(fh))
    for name, cold in gp.COLD_STARTS:
        rows, sources = gp.derive(table, cold)
        assert gp.profile_csv(rows) == (PROFILE_DIR / name).read_text(encoding="utf-8")
    assert gp.sources_csv(sources) == gp.SOURCES_FILE.read_text(encoding="utf-8")
    assert {r["license"] for r in csv.DictReader(io.StringIO(gp.sources_csv(sources)))} <= set(gp.PERMISSIVE)


def test_a_users_trace_saved_by_a_spreadsheet_is_read_and_a_wrong_header_is_shown(tmp_path: Path) -> None:
    """A spreadsheet's "CSV UTF-8" starts with a byte-order mark: it was read as part of the first column's
    name, and the file refused for "missing columns ['arrival_s']" with nothing to show why."""
    path = tmp_path / "mine.csv"
    path.write_text("\ufeffarrival_s,workflow\n0,a\n1,a\n", encoding="utf-8")
    assert [w for _, w in arrivals(f"csv:{path}", ["a"], 2.0, 1.0, 0, start_s=0.0)] == ["a", "a"]
    path.write_text("arrival_s;workflow\n0;a\n1;a\n")
    with pytest.raises(InvalidInputError, match=re.escape("its header: ['arrival_s;workflow']")):
        arrivals(f"csv:{path}", ["a"], 2.0, 1.0, 0)


def test_a_users_own_trace(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("arrival_s,workflow\n10.0,b\n10.5,a\n11.0,a\n12.0,b\n")
    # span 2 s + one mean gap (2/3 s) holds 4 requests: 1.5/s; at 3/s time runs twice as fast
    a = arrivals(f"csv:{path}", ["a", "b"], rate_per_s=3.0, duration_s=1.2, seed=0, start_s=0.0)
    assert a == [(0.0, "b"), (250.0, "a"), (500.0, "a"), (1000.0, "b")]
    path.write_text("arrival_s\n0\n1\n")
    assert {w for _, w in arrivals(f"csv:{path}", ["a"], 2.0, 3.0, 0)} == {"a"}
    path.write_text("arrival_s,workflow\n0,zz\n1,a\n")
    with pytest.raises(InvalidInputError, match="workflows \\['zz'\\]"):
        arrivals(f"csv:{path}", ["a"], 2.0, 3.0, 0)
    path.write_text("time\n0\n")
    with pytest.raises(InvalidInputError, match=r"missing columns \['arrival_s'\]"):
        arrivals(f"csv:{path}", ["a"], 2.0, 3.0, 0)
    path.write_text("arrival_s\n0\nsoon\n")
    with pytest.raises(InvalidInputError, match="line 3: arrival_s 'soon' is not a number"):
        arrivals(f"csv:{path}", ["a"], 2.0, 3.0, 0)
    path.write_text("arrival_s\n0\ninf\n")
    with pytest.raises(InvalidInputError, match="line 3: arrival_s must be finite"):
        arrivals(f"csv:{path}", ["a"], 2.0, 3.0, 0)
    with pytest.raises(InvalidInputError, match="cannot read the trace file"):
        arrivals(f"csv:{tmp_path / 'missing.csv'}", ["a"], 2.0, 3.0, 0)
    path.write_text("arrival_s\n4\n4\n")  # a span of 0 s, once a division by zero
    with pytest.raises(InvalidInputError, match=r"mine.csv: all 2 arrivals are at 4 s; .* two or more times"):
        arrivals(f"csv:{path}", ["a"], 2.0, 3.0, 0)


def test_a_users_trace_row_with_an_empty_workflow_cell_is_drawn_by_weights(tmp_path: Path) -> None:
    """As documented (docs/simulator.md, "Your own trace"): a trace may name only the requests it knows."""
    path = tmp_path / "mine.csv"
    path.write_text("arrival_s,workflow\n0,a\n1,\n2,a\n3,\n")
    got = arrivals(f"csv:{path}", ["a", "b"], 1.0, 4.0, 0, start_s=0.0, weights=(0.0, 1.0))
    assert [w for _, w in got] == ["a", "b", "a", "b"]


def test_a_users_trace_at_its_own_rate_is_replayed_as_recorded(tmp_path: Path) -> None:
    from esg_prefect.workload.arrivals import csv_trace_rate

    path = tmp_path / "mine.csv"
    path.write_text("arrival_s\n5.0\n5.1\n5.15\n7.0\n8.0\n")
    rows, own = csv_trace_rate(str(path))
    assert rows == 5 and own == pytest.approx(5 / (3.0 + 3.0 / 4))  # span 3 s plus one mean gap
    got = arrivals(f"csv:{path}", ["a"], rate_per_s=own, duration_s=3.5, seed=1, start_s=0.0)
    assert [t for t, _ in got] == pytest.approx([0.0, 100.0, 150.0, 2000.0, 3000.0])


def test_simulate_says_how_a_users_trace_is_replayed(tmp_path: Path) -> None:
    from rich.console import Console

    from esg_prefect.cli.case_file import note_csv_replay
    from esg_prefect.simulator import standard_case

    path = tmp_path / "mine.csv"
    path.write_text("arrival_s\n0\n1\n2\n3\n")  # 4 rows over 4 s: 1 request/s
    console = Console(record=True, width=400)
    case = standard_case(trace=f"csv:{path}", rate_per_s=30.0, duration_s=2.0)
    note_csv_replay(case, console)
    text = console.export_text()
    assert "4 rows, 1 requests/s" in text and "30x faster" in text and "from a point the seed picks" in text
    assert "workload.rate_per_s 1 and workload.start_s 0 replay it" in text  # a case file's keys
    console = Console(record=True, width=400)
    note_csv_replay(case, console, from_file=False)  # the standard case's options
    assert "--rate 1 and start_s 0 (in a case file) replay it" in console.export_text()


def test_the_replay_note_says_slower_by_a_factor_above_1(tmp_path: Path) -> None:
    from rich.console import Console

    from esg_prefect.cli.case_file import note_csv_replay
    from esg_prefect.simulator import standard_case

    path = tmp_path / "mine.csv"
    path.write_text("arrival_s\n" + "\n".join(f"{i / 10.7:.6f}" for i in range(107)) + "\n")  # 10.7 requests/s
    for rate, pace in ((10.0, "1.07x slower"), (21.4, "2x faster"), (10.7, "in real time")):
        console = Console(record=True, width=400)
        note_csv_replay(standard_case(trace=f"csv:{path}", rate_per_s=rate, duration_s=2.0), console)
        assert f"10.7 requests/s) is replayed at {rate:g} requests/s, {pace}," in console.export_text()


def test_rate_estimate_restarts_after_an_idle_spell() -> None:
    from esg_prefect.workload.rate import ArrivalRateEWMA

    est = ArrivalRateEWMA(alpha=0.2)
    est.observe(0.0)
    est.observe(100.0)  # a stream 100 ms apart
    est.observe(40_100.0)  # then 40 s of nothing: an idle spell, not a gap of the stream
    assert est.rate_per_s(40_100.0) == 0.0  # no estimate until the stream shows its pace again
    est.observe(40_150.0)
    assert est.rate_per_s(40_150.0) == pytest.approx(20.0)  # 50 ms apart, at once
    steady = ArrivalRateEWMA(alpha=0.2)
    for t in (0.0, 600.0, 1200.0, 1800.0):
        steady.observe(t)
    steady.observe(3000.0)  # 2x the gap, and 8x of a 100 ms estimate would be only 800 ms: still a gap
    assert steady.rate_per_s(3000.0) == pytest.approx(1000.0 / (0.8 * 600.0 + 0.2 * 1200.0))
