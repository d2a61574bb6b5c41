"""A profile given by name or by path follows one rule everywhere: a shipped name wins, else a CSV path.

The rule (:mod:`esg_prefect.model.profile_source`) is checked where it is stated
and at each place that takes such a value: :func:`resolve_profile` (a case,
``simulate --profile``), a case file (:func:`load_case`, :func:`case_dict_in`)
and ``pool serve --profile``. The case that tells the rules apart is a file in
the working directory whose name is a shipped profile's.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from esg_prefect.cli import main
from esg_prefect.cli.case_file import case_dict_in, load_case
from esg_prefect.exceptions import ConfigError
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.profile_source import (
    PROFILE_DIR,
    is_shipped_name,
    load_profile,
    profile_path,
    shipped_profiles,
    shipped_size_model,
)
from esg_prefect.model.workflow import Workflow
from esg_prefect.runtime.profiles import load_default_profile
from esg_prefect.simulator.case import Case, ClusterSpec, NodeSpec, WorkloadSpec, resolve_profile

MINE = "stage,hardware,batch,vcpus,gpu_share,mean_ms,p95_ms,cold_start_ms\nmine,cpu,1,1,0,5,6,100\n"
"""A user's own profile: one stage no shipped profile has."""

SHIPPED = "examples_cpu, nvidia_gpu, nvidia_gpu_container, profiler_examples_cpu"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory: ``tmp_path``, holding a file named as a shipped profile, ``nvidia_gpu``."""
    (tmp_path / "nvidia_gpu").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _case(profile: str) -> Case:
    return Case(
        name="mine",
        workflows=(Workflow.chain("w", ["mine"], slo_ms=50.0),),
        profile=profile,
        prices=PriceSheet(0.001, {}),
        cluster=ClusterSpec((NodeSpec("n0", 4),)),
        workload=WorkloadSpec("poisson", 1.0),
        duration_s=1.0,
    )


# ---- the rule -------------------------------------------------------------------------------------


def test_the_shipped_names_are_the_profiles_not_the_profilers_side_tables() -> None:
    assert ", ".join(shipped_profiles()) == SHIPPED
    assert is_shipped_name("nvidia_gpu")
    for value in ("nvidia_gpu.csv", "./nvidia_gpu", "nvidia_gpu_sources", "profiler_examples_cpu_samples", ""):
        assert not is_shipped_name(value), value


def test_a_shipped_name_wins_over_a_file_of_that_name_and_a_path_reaches_the_file(in_tmp: Path) -> None:
    assert profile_path("nvidia_gpu") == PROFILE_DIR / "nvidia_gpu.csv"
    assert profile_path("./nvidia_gpu") == Path("nvidia_gpu")
    assert profile_path(str(in_tmp / "nvidia_gpu")) == in_tmp / "nvidia_gpu"


def test_a_folder_named_as_a_shipped_profile_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nvidia_gpu").mkdir()  # e.g. what `simulate --out nvidia_gpu` leaves
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert profile_path("nvidia_gpu") == PROFILE_DIR / "nvidia_gpu.csv"
    with pytest.raises(ConfigError, match="nor a file"):
        profile_path("mine")  # a folder is not a profile file


def test_neither_a_name_nor_a_file_is_one_line_naming_the_value_and_the_names(in_tmp: Path) -> None:
    with pytest.raises(ConfigError) as err:
        profile_path("nvidia")
    assert str(err.value) == (
        f"profile 'nvidia' is neither a shipped profile's name ({SHIPPED}) nor a file; "
        "give a latency profile CSV (esg-prefect profile writes one) or one of those names"
    )


# ---- each place that takes a profile by name or path ----------------------------------------------


def test_resolve_profile_follows_the_rule(in_tmp: Path) -> None:
    assert "mine" not in resolve_profile("nvidia_gpu").stages()
    assert resolve_profile("./nvidia_gpu").stages() == {"mine"}
    assert _case("./nvidia_gpu").load_profile().stages() == {"mine"}
    with pytest.raises(ConfigError, match=f"'nope' is neither a shipped profile's name \\({SHIPPED}\\)"):
        resolve_profile("nope")


def _same(a: LatencyProfile, b: LatencyProfile) -> None:
    assert a.points == b.points
    assert {(p.stage, p.hardware): a.cold_start_ms(p.stage, p.hardware) for p in a.points} == {
        (p.stage, p.hardware): b.cold_start_ms(p.stage, p.hardware) for p in b.points
    }
    assert a.sizes is not None and b.sizes is not None
    assert a.sizes.fits == b.sizes.fits


@pytest.mark.parametrize("name", shipped_profiles())
def test_a_shipped_name_is_one_profile_in_the_simulator_and_the_pool(name: str) -> None:
    # The simulator (a case, simulate --profile), pool serve --profile and the default pool's
    # loader all give the same table with the same size model: the simulator predicts what runs.
    simulated = resolve_profile(name)
    _same(simulated, load_profile(name))  # what pool serve --profile reads
    _same(simulated, load_default_profile((f"{name}.csv",)))
    _same(simulated, resolve_profile(str(PROFILE_DIR / f"{name}.csv")))  # the shipped file by its path
    model = shipped_size_model()
    assert model is not None and simulated.sizes is not None
    assert simulated.sizes.fits == model.fits


def test_a_file_of_ones_own_keeps_its_own_size_model_or_none(in_tmp: Path) -> None:
    # No samples beside ./nvidia_gpu: count-only, not the shipped samples' model.
    assert load_profile("./nvidia_gpu").sizes is None
    assert resolve_profile("./nvidia_gpu").sizes is None


def test_a_case_file_keeps_a_shipped_name_and_reads_a_path_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "mycase"
    folder.mkdir()
    (folder / "nvidia_gpu").write_text(MINE)  # beside the case file, named as a shipped profile
    monkeypatch.chdir(tmp_path)
    for value, expected in (("nvidia_gpu", "nvidia_gpu"), ("./nvidia_gpu", str(Path("mycase") / "nvidia_gpu"))):
        (folder / "case.json").write_text(json.dumps(_case(value).to_dict()))
        assert load_case(Path("mycase/case.json")).profile == expected, value
    monkeypatch.chdir(folder)  # the case file in the working directory: the path must not become the bare name
    assert load_case(Path("case.json")).profile == "./nvidia_gpu"
    assert load_case(Path("case.json")).load_profile().stages() == {"mine"}


def test_a_case_file_written_beside_a_file_named_as_a_shipped_profile_keeps_it_a_path(in_tmp: Path) -> None:
    assert case_dict_in(_case("./nvidia_gpu"), in_tmp)["profile"] == "./nvidia_gpu"  # not "nvidia_gpu"
    assert case_dict_in(_case("nvidia_gpu"), in_tmp)["profile"] == "nvidia_gpu"


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pool_serve_profile_follows_the_rule(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    serve = ["pool", "serve", "--allow", "x", "--port", str(_closed_port()), "--profile"]
    # Past the profile, the next check fails: a results file in a folder that does not exist.
    bad_db = ["--results-db", str(in_tmp / "no" / "such" / "results.db")]
    (in_tmp / "nvidia_gpu").write_text("not a profile\n")  # were it read, --profile would be refused
    assert main([*serve, "nvidia_gpu", *bad_db]) == 2
    assert "--results-db" in _one_line(capsys.readouterr().err)  # the shipped profile was taken
    assert main([*serve, "./nvidia_gpu", *bad_db]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--profile" in line and "cannot read './nvidia_gpu'" in line  # the file was read
    assert main([*serve, "nvidia"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--profile" in line and f"profile 'nvidia' is neither a shipped profile's name ({SHIPPED})" in line


def test_simulate_profile_follows_the_rule_and_names_the_option(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "nvidia_gpu").write_text("not a profile\n")  # were it read, --profile would be refused
    assert main(["simulate", "--profile", "./nvidia_gpu", "--duration", "1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--profile" in line and "cannot read './nvidia_gpu'" in line  # the file was read
    assert main(["simulate", "--profile", "nvidia", "--duration", "1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--profile" in line and f"profile 'nvidia' is neither a shipped profile's name ({SHIPPED})" in line
