"""bench/whole_bill.py on a tiny cell: the bill's split adds up, and the RESULT line parses."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    return load_script("whole_bill_bench", "bench/whole_bill.py")


wb = _bench()
CELL = wb.Cell("tiny", "azure_functions_2019", 80.0, 0)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    sweep = wb.lifecycle_sweep((3.0,))
    jobs = wb.grid_jobs([CELL], ("esg", "fast-gshare", "triton"), sweep, duration_s=4.0, warmup_s=1.0)
    return wb.run_jobs(jobs, processes=1)


def _whole_from_records(run, case) -> float:
    """The report window's bill, straight from the batch and idle records (rate x duration)."""
    w0 = case.warmup_s * 1000.0
    p = case.prices
    total = 0.0
    for b in run.batches:
        if b.start_ms >= w0:
            total += p.rate_per_s(b.config.vcpus, b.config.gpu_share, b.hardware) * (b.end_ms - b.start_ms)
    for i in run.idles:  # the GPU share all along, the vCPUs during a pre-warm load
        start = max(i.start_ms, w0)
        if i.end_ms > start:
            load = max(0.0, i.start_ms + i.loading_ms - start)
            total += i.gpu_share * p.gpu_price_s(i.hardware) * (i.end_ms - start) + i.vcpus * p.price_per_vcpu_s * load
    return total / 1000.0


@pytest.mark.parametrize(("scheduler", "warmup_s"), [("esg", 0.0), ("esg", 1.0), ("triton", 1.0)])
def test_split_sums_to_the_whole_bill(scheduler: str, warmup_s: float) -> None:
    job = wb.Job(CELL, scheduler, (), 4.0, warmup_s)
    case = wb.job_case(job)
    run = wb.simulate(case)
    bill = wb.bill_split(run, case)
    prewarms = [i for i in run.idles if i.loading_ms > 0]
    whole = _whole_from_records(run, case)
    assert whole > 0
    assert min(bill.busy, bill.idle, bill.cold) >= 0
    assert math.isclose(bill.busy + bill.idle + bill.cold, whole, rel_tol=1e-9)
    assert math.isclose(whole, run.report.busy_cost + run.report.idle_cost, rel_tol=1e-9)
    if warmup_s == 0:
        assert bill.cold > 0  # the cluster starts with no worker
    # the cold part: every cold batch's start, at its worker's price, plus pre-warm loads (idle records)
    cold_batches = {s.batch_id: s.cold_start_ms for s in run.stages if s.cold_start_ms > 0}
    from_batches = sum(
        case.prices.rate_per_s(b.config.vcpus, b.config.gpu_share, b.hardware) * cold_batches[b.batch_id] / 1000.0
        for b in run.batches
        if b.batch_id in cold_batches and b.start_ms >= case.warmup_s * 1000.0
    )
    assert bill.cold >= from_batches - 1e-15
    if not prewarms:
        assert math.isclose(bill.cold, from_batches, rel_tol=1e-9)
    elif warmup_s == 0:  # every pre-warm start's load is in the window, billed as cold
        assert bill.cold > from_batches


@pytest.mark.parametrize("scheduler", ["esg", "fast-gshare"])
def test_the_idle_bill_splits_into_gaps_between_batches_and_the_lifecycle(scheduler: str) -> None:
    job = wb.Job(CELL, scheduler, (), 4.0, 1.0)
    case = wb.job_case(job)
    run = wb.simulate(case)
    bill = wb.bill_split(run, case)
    w0, p = case.warmup_s * 1000.0, case.prices
    spans: dict[str, list[float]] = {}
    for b in run.batches:
        spans.setdefault(b.worker_id, []).append(b.start_ms)
        spans[b.worker_id].append(b.end_ms)
    gaps = ends = 0.0
    for i in run.idles:
        start = max(i.start_ms, w0)
        if i.end_ms <= start:
            continue
        load = max(0.0, i.start_ms + i.loading_ms - start)
        dollars = i.gpu_share * p.gpu_price_s(i.hardware) * (i.end_ms - start - load) / 1000.0
        mine = spans.get(i.worker_id, [])
        if mine and min(mine) <= i.start_ms and i.end_ms <= max(mine):
            gaps += dollars
        else:
            ends += dollars
    assert gaps > 0 and ends > 0
    assert math.isclose(bill.idle_gaps, gaps, rel_tol=1e-9)
    assert math.isclose(bill.idle - bill.idle_gaps, ends, rel_tol=1e-9)
    # share-seconds: busy ones are the batches' time past their cold starts, held ones every record's time
    held = sum(b.config.gpu_share * (b.end_ms - b.start_ms) for b in run.batches if b.start_ms >= w0)
    held += sum(i.gpu_share * (i.end_ms - max(i.start_ms, w0)) for i in run.idles if i.end_ms > max(i.start_ms, w0))
    assert math.isclose(bill.share_held, held / 1000.0, rel_tol=1e-9)
    assert 0.0 < bill.share_busy < bill.share_held
    assert 0.0 < bill.share_utilisation < 1.0


def test_idle_rows_name_both_schedulers_per_cell(rows: list[dict]) -> None:
    v = wb.judge(CELL.name, rows)
    table = wb.idle_rows([v])
    assert len(table) == 2 + 2
    for line, r in zip(table[2:], (v.esg, v.best), strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:2] == [CELL.name, r["scheduler"]]
        idle, gaps, ends, util = (float(c) for c in cells[2:6])
        assert math.isclose(idle, gaps + ends, rel_tol=0.02)  # three digits shown
        assert 0.0 < util <= 1.0
        if r is v.esg:  # the best baseline's bill over ESG's without its ends: at least the ratio itself
            bound = float(cells[6])
            assert bound == pytest.approx(v.best["whole"] / (r["whole"] - (r["idle"] - r["idle_gaps"])), abs=0.005)
            assert bound >= round(v.ratio, 2)
        else:
            assert cells[6] == ""


def test_rows_carry_the_split_per_request(rows: list[dict]) -> None:
    assert {r["scheduler"] for r in rows} == {"esg", "fast-gshare", "triton"}
    assert len(rows) == 5  # ESG once, each baseline at its defaults and a fixed 3 s keep-alive
    for r in rows:
        assert r["requests"] > 0
        assert math.isclose(r["busy"] + r["idle"] + r["cold"], r["whole"], rel_tol=1e-9)
        assert r["report_agrees"]
        assert set(r["p99"]) == {"image-classify", "image-tag", "voice-reply"}


def test_verdict_and_result_line(rows: list[dict]) -> None:
    v = wb.judge(CELL.name, rows)
    assert v.best["scheduler"] in ("fast-gshare", "triton")
    assert math.isclose(v.ratio, v.best["whole"] / v.esg["whole"])
    assert v.won == (not v.misses)
    line = wb.result_line([v], 1.0)
    m = re.fullmatch(
        r"RESULT worst_cell=(\S+) whole_bill_ratio_worst=(\d+\.\d{3}) cells_won=(\d+)/(\d+) "
        r"whole_bill_ratio_median=(\d+\.\d{3}) esg_slo_min=(\d\.\d{4}) p99_misses=(\d+) wall_s=(\d+)",
        line,
    )
    assert m, line
    assert m.group(1) == "tiny" and m.group(4) == "1"
    assert int(m.group(3)) == int(v.won)
    assert "\n" not in line
    table = wb.table_rows([v])
    assert len(table) == 2 + 1 + 2  # header, rule, ESG and the two baselines at their chosen settings
    assert all(t.startswith("|") and t.endswith("|") for t in table)


def test_pick_setting_prefers_the_cheaper_within_half_a_point() -> None:
    rows = [
        {"slo_hit_rate": 0.999, "whole": 3.0, "setting": ()},
        {"slo_hit_rate": 0.996, "whole": 2.0, "setting": (("keep_alive_s", 15.0),)},
        {"slo_hit_rate": 0.990, "whole": 1.0, "setting": (("keep_alive_s", 3.0),)},
    ]
    assert wb.pick_setting(rows)["setting"] == (("keep_alive_s", 15.0),)
    assert wb.setting_label(()) == "defaults"
    assert wb.setting_label((("keep_alive_policy", "fixed"), ("keep_alive_s", 3.0))) == "fixed 3 s"


def test_the_sweep_starts_at_the_defaults_and_runs_no_setting_twice() -> None:
    sweep = wb.lifecycle_sweep((3.0, 60.0))
    assert sweep[0] == ()
    assert all(dict(s)["keep_alive_s"] in (3.0, 60.0) for s in sweep[1:])
    base = wb.standard_case().settings
    built = [wb.replace(base, **dict(s)) for s in sweep]
    assert len(built) == len({repr(b) for b in built})


def test_simulator_bench_result_line() -> None:
    """bench/simulator.py ends with its RESULT line, whole bill and p99 ratios included."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "simulator.py"), "--duration", "3", "--rate", "60", "--processes", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    num = r"(\d+\.\d{3}|inf)"
    assert re.fullmatch(
        rf"RESULT slo_gain_vs_best_baseline={num} cost_ratio_best_baseline_over_esg={num} "
        rf"whole_bill_ratio_best_baseline_over_esg={num} p99_ratio_esg_over_best_baseline={num} "
        r"sim_requests_per_s=\d+",
        last,
    ), last


def test_trace_cells_at_more_seeds_keep_seed_zero_names() -> None:
    names = [(c.name, c.seed) for c in wb.grid_cells(trace_seeds=(0, 2))]
    assert names[:3] == [("standard-s0", 0), ("standard-s1", 1), ("standard-s2", 2)]
    assert ("code-low", 0) in names and ("code-low-s2", 2) in names and ("conv-near-s2", 2) in names
    assert len(names) == 3 + 6 * 2
    assert [c.name for c in wb.grid_cells(quick=True, trace_seeds=(0, 1))] == ["standard-s0", "conv-mid"]


def test_each_cell_runs_long_enough_for_its_requests() -> None:
    lengths = {c.name: wb.cell_duration(c) for c in wb.grid_cells()}
    assert lengths["standard-s0"] == wb.WARMUP_S + wb.MIN_WINDOW_S == 30.0  # 300/s: the shortest window is plenty
    assert lengths["code-low"] == 10.0 + 160.0  # 12.5/s: 2,000 requests take 160 s
    assert lengths["conv-low"] == 10.0 + 27.0  # 75/s: 26.7 s, rounded up
    for c in wb.grid_cells():
        window = lengths[c.name] - wb.WARMUP_S
        assert window >= wb.MIN_WINDOW_S and window * c.rate_per_s >= wb.MIN_WINDOW_REQUESTS
    assert wb.cell_duration(wb.grid_cells()[3], warmup_s=20.0) == 180.0
    jobs = wb.grid_jobs(wb.grid_cells()[3:5], ("esg",))
    assert {j.cell.name: j.duration_s for j in jobs} == {"code-low": 170.0, "code-mid": 90.0}
    assert {j.duration_s for j in wb.grid_jobs(wb.grid_cells()[3:5], ("esg",), duration_s=12.0)} == {12.0}


def test_bad_trace_seeds_and_unknown_cells_get_one_line() -> None:
    for args, words in ((["--trace-seeds", "one"], "--trace-seeds must be comma-separated integers, got 'one'"),
                        (["--only", "nope"], "--only names unknown cells ['nope']")):  # fmt: skip
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "whole_bill.py"), *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


def test_a_verdict_never_reads_as_the_goal_it_missed() -> None:
    esg = {"requests": 100, "slo_hit_rate": 0.99, "whole": 1.0, "p99": {}}
    near = wb.Verdict("c", esg, {}, esg, 1.2494, -0.5004, ())
    assert near.misses == [
        "cost: whole-bill ratio 1.249 < 1.25",
        "SLO: -0.5004 points vs best baseline",
    ]
    far = wb.Verdict("c", esg, {}, esg, 1.17, -0.56, ())
    assert far.misses == ["cost: whole-bill ratio 1.17 < 1.25", "SLO: -0.56 points vs best baseline"]
    assert wb.Verdict("c", esg, {}, esg, 1.25, -0.5, ()).won
    base = {**esg, "p99": {"a": (136.0, 80.0), "b": (60.0, 170.0)}}
    both = wb.Verdict("c", esg, {}, base, 1.5, 0.1, ("a 112>80 ms",))
    assert both.misses == ["p99 over SLO: a 112>80 ms (the best baseline's too: a 136>80 ms)"] and not both.won
    alone = wb.Verdict("c", esg, {}, {**esg, "p99": {"a": (70.0, 80.0)}}, 1.5, 0.1, ("a 112>80 ms",))
    assert alone.misses == ["p99 over SLO: a 112>80 ms"]


def test_cell_types_gather_a_cells_seeds() -> None:
    assert [wb.cell_type(n) for n in ("code-low", "code-low-s3", "standard-s0", "conv-mid-s12", "a-sx")] == [
        "code-low", "code-low", "standard", "conv-mid", "a-sx"
    ]  # fmt: skip

    def verdict(cell: str, ratio: float, esg_slo: float, base_slo: float, over: tuple[str, ...] = ()) -> object:
        esg = {"requests": 100, "slo_hit_rate": esg_slo, "whole": 1.0, "p99": {}}
        base = {**esg, "slo_hit_rate": base_slo}
        return wb.Verdict(cell, esg, {}, base, ratio, (esg_slo - base_slo) * 100, over)

    one_seed = [verdict("code-low", 1.5, 0.999, 0.998), verdict("conv-low", 1.0, 1.0, 1.0)]
    assert wb.type_rows(one_seed) == []  # nothing to gather
    rows = wb.type_rows(
        [
            verdict("code-near", 1.57, 0.9887, 0.9976, ("image-classify 87>80 ms",)),
            verdict("code-near-s1", 1.51, 0.9849, 0.9824, ("image-classify 112>80 ms",)),
            verdict("code-near-s2", 1.49, 0.9856, 0.9856, ("image-classify 96>80 ms",)),
            verdict("conv-mid", 1.30, 1.0, 0.9996),
        ]
    )
    assert rows[2] == "| code-near | 3 | 0 | 1.51 (1.49-1.57) | -0.21 (-0.89) | 0.9864 | 0.9885 | 3 |"
    assert rows[3] == "| conv-mid | 1 | 1 | 1.30 (1.30-1.30) | +0.04 (+0.04) | 1.0000 | 0.9996 | 0 |"
    empty = {"requests": 0, "slo_hit_rate": 0.0, "whole": 0.0, "p99": {}}
    quiet = wb.Verdict("code-low", empty, {}, empty, math.nan, 0.0, ())  # a window with no request
    rows = wb.type_rows([quiet, verdict("code-low-s1", 1.4, 0.999, 0.998)])
    assert rows[2] == "| code-low | 2 | 1 | 1.40 (1.40-1.40) | +0.10 (+0.10) | 0.9990 | 0.9980 | 0 |"
    assert wb.type_rows([quiet, wb.Verdict("code-low-s1", empty, {}, empty, math.nan, 0.0, ())])[2] == (
        "| code-low | 2 | 0 | - | - | - | - | 0 |"
    )
