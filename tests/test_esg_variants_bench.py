"""bench/esg_variants.py: ESG's settings variants over extra seeds, on tiny runs."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from tests.scripts import load_script


def _bench() -> ModuleType:
    return load_script("esg_variants_bench", "bench/esg_variants.py")


ev = _bench()


def test_a_variant_against_the_defaults_prints_each_cell_and_a_result(capsys: pytest.CaptureFixture[str]) -> None:
    ev.main(["--only", "conv-mid", "--seeds", "10,11", "--variant", "consolidate_slack=0", "--duration", "3",
             "--warmup", "1", "--processes", "1"])  # fmt: skip
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| conv-mid |")]
    assert [r.split("|")[2].strip() for r in rows] == ["defaults", "consolidate_slack=0"]
    assert [r.split("|")[3].strip() for r in rows] == ["2", "2"]  # seeds counted
    assert rows[0].split("|")[5].strip() == "+0.0%"  # the reference against itself
    found = re.search(r"RESULT variant=consolidate_slack=0 cells_cheaper=(\d)/1 whole_change_median=([-+]\d\.\d+) "
                      r"slo_points_min=([-+]\d+\.\d+) slo_points_worst_seed=([-+]\d+\.\d+)$", out.strip())  # fmt: skip
    assert found, out
    change = float(rows[1].split("|")[5].strip().rstrip("%")) / 100
    assert float(found.group(2)) == pytest.approx(change, abs=6e-4)
    assert found.group(1) == ("1" if change < 0 else "0")
    assert rows[0].split("|")[11:13] == [" 0/2 ", " +0.00 "]  # the reference against itself, seed by seed
    assert float(found.group(4)) <= min(0.0, float(found.group(3))) + 1e-9  # one seed falls at least the mean's fall


def test_the_paired_comparison_counts_seeds_and_finds_the_worst_one() -> None:
    def run(whole: float, slo: float, requests: int = 10) -> dict[str, object]:
        return {"requests": requests, "whole": whole, "slo_hit_rate": slo}

    ref = [run(2e-6, 0.999), run(3e-6, 0.998), run(4e-6, 0.990), run(0.0, 0.0, requests=0)]
    var = [run(1e-6, 0.990), run(2e-6, 0.999), run(5e-6, 0.990), run(1e-6, 1.0)]
    got = ev.paired(ref, var)
    assert got == {"cheaper": 2.0, "worst_points": pytest.approx(-0.9), "seeds": 3.0}
    assert ev.paired(ref[:1], [run(3e-6, 1.0)]) == {"cheaper": 0.0, "worst_points": 0.0, "seeds": 1.0}


def test_a_seed_with_no_request_is_left_out_of_the_means() -> None:
    row = {"requests": 10, "whole": 2e-6, "slo_hit_rate": 0.99, "p99": {"a": (90.0, 100.0)}, "workers": 8}
    empty = {**row, "requests": 0, "whole": 0.0, "slo_hit_rate": 0.0, "workers": 3}
    other = {**row, "whole": 8e-6, "slo_hit_rate": 0.97, "p99": {"a": (120.0, 100.0)}}
    got = ev.summarise([row, empty, other])
    assert got["whole"] == pytest.approx(4e-6) and got["slo"] == pytest.approx(0.98)
    assert (got["slo_min"], got["p99_misses"], got["workers"], got["seeds"]) == (0.97, 1.0, 8.0, 2.0)


def test_the_cells_run_at_the_extra_seeds_only() -> None:
    grid = ev.cells(["conv-low", "standard"], [10, 12])
    assert sorted((ev.short(c), c.seed) for c in grid) == [("conv-low", 10), ("conv-low", 12), ("standard", 10),
                                                           ("standard", 12)]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--variant", "no_such_knob=1"], "'no_such_knob'"),
        (["--variant", "consolidate_slack=-1"], "consolidate_slack"),
        (["--variant", "keep_alive_s"], "'keep_alive_s'"),
        (["--only", "conv-high"], "'conv-high'"),
        (["--seeds", "a,b"], "'a,b'"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_value(argv: list[str], named: str) -> None:
    with pytest.raises(SystemExit) as exc:
        ev.main(argv)
    message = str(exc.value)
    assert message.startswith("esg_variants:") and named in message and "\n" not in message
