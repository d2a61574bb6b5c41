"""Blocks: Prefect's standard block suite, conversion to the model's objects, saving and loading."""

from __future__ import annotations

import functools
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite

from esg_prefect.integration.blocks import ESGPool, ESGPriceSheet, ESGSchedulerSettings
from esg_prefect.model import PriceSheet
from esg_prefect.model.interference import DEFAULT_CORUN_TABLE
from esg_prefect.scheduling import ESGSettings

DATA = Path(__file__).resolve().parent.parent / "esg_prefect" / "data"


@pytest.fixture(scope="module")
def local_logo_url() -> Iterator[str]:
    """The shipped logo served on 127.0.0.1: the standard suite opens the logo URL, and CI has no internet."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(DATA))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/logo.png"
    server.shutdown()


class _Suite(BlockStandardTestSuite):
    @pytest.fixture(autouse=True)
    def _serve_logo(self, block: type[Block], local_logo_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        assert block._logo_url.endswith("/esg_prefect/data/logo.png")  # the published copy of the same file
        monkeypatch.setattr(block, "_logo_url", local_logo_url)


class TestESGPool(_Suite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ESGPool


class TestESGPriceSheet(_Suite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ESGPriceSheet


class TestESGSchedulerSettings(_Suite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ESGSchedulerSettings


def test_defaults_match_the_model() -> None:
    assert ESGSchedulerSettings().to_settings() == ESGSettings()
    assert ESGPriceSheet().to_price_sheet() == PriceSheet.default()
    per_s = ESGPriceSheet(unit="per_second", vcpu=1e-5, gpu={"T4": 1e-4}).to_price_sheet()
    assert per_s == PriceSheet(1e-5, {"T4": 1e-4})


def test_the_block_mirrors_every_knob() -> None:
    knobs = set(ESGSettings.__dataclass_fields__) - {"config_space"}
    assert knobs <= set(ESGSchedulerSettings.model_fields), knobs - set(ESGSchedulerSettings.model_fields)
    assert ESGSchedulerSettings(best_effort_tolerance=0.25).to_settings().best_effort_tolerance == 0.25


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"batches": [0], "gpu_shares": [5.0]}, "batches must hold ints >= 1, got 0"),
        ({"gpu_shares": [0.5, 5.0]}, "gpu_share must be in [0, 1], got 5.0"),
        ({"vcpus": []}, "vcpus must not be empty"),
        ({"shed_after_slo": 0.5}, "shed_after_slo must be 0 (off) or a finite number >= 1"),
        (
            {"corun_table": "/nope.csv", "hybrid_sharing": True},
            "corun_table '/nope.csv': co-run table '/nope.csv' not found",
        ),
    ],
)
def test_a_bad_knob_is_refused_when_the_settings_block_is_made(fields: dict[str, object], named: str) -> None:
    """Each saved fine and failed only at a flow run's first stage call; now refused by ESGSettings' own rules."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        ESGSchedulerSettings(**fields)  # type: ignore[arg-type]
    assert named in str(exc.value), exc.value


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"gpu": {"T4": -3.0, "A100": 1.0}}, "gpu_per_hour['T4'] must be a finite price >= 0, got -3.0"),
        ({"unit": "per_second", "gpu": {"T4": float("inf")}}, "got inf"),
        ({"vcpu": float("inf")}, "vcpu_per_hour must be a finite price >= 0, got inf"),
    ],
)
def test_a_bad_price_is_refused_when_the_price_block_is_made(fields: dict[str, object], named: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        ESGPriceSheet(**fields)  # type: ignore[arg-type]
    assert named in str(exc.value), exc.value


def test_a_bad_value_set_on_a_made_block_is_refused_too() -> None:
    from pydantic import ValidationError

    prices, settings = ESGPriceSheet(), ESGSchedulerSettings()
    with pytest.raises(ValidationError, match=r"gpu_per_hour\['T4'\] must be a finite price >= 0, got -1.0"):
        prices.gpu = {"T4": -1.0}
    with pytest.raises(ValidationError, match="shed_after_slo must be 0"):
        settings.shed_after_slo = 0.5
    # the refused values are not left on the blocks (pydantic keeps a value its model validator refuses)
    assert prices.gpu == ESGPriceSheet().gpu
    assert settings.shed_after_slo == ESGSchedulerSettings().shed_after_slo
    settings.corun_table = "/nope.csv"  # read only with hybrid sharing on
    with pytest.raises(ValidationError, match=r"co-run table '/nope\.csv' not found"):
        settings.hybrid_sharing = True
    assert settings.hybrid_sharing is False
    settings.tick_ms = 7.0  # a good value after a refused one is taken
    assert settings.tick_ms == 7.0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {"address": "127.0.0.1:4270"},
            "address: not an http(s) URL with a host; give the pool service's address, "
            "e.g. http://127.0.0.1:4270, got '127.0.0.1:4270'",
        ),
        ({"address": "htp://127.0.0.1:4270"}, "got 'htp://127.0.0.1:4270'"),
        (
            {"address": "http://127.0.0.1:4270", "scheduler": "fast-gshare"},
            "scheduler configures an embedded pool; the pool service at http://127.0.0.1:4270 has its own",
        ),
        ({"address": "http://127.0.0.1:4270", "profile_path": "p.csv", "backend": "inline"}, "profile_path, backend"),
    ],
)
def test_a_pool_block_the_runner_would_refuse_is_refused_when_made(fields: dict[str, object], named: str) -> None:
    """Saved fine and refused only as each deployment run imported its flow (``ESGTaskRunner(pool=...)``)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        ESGPool(**fields)  # type: ignore[arg-type]
    assert named in str(exc.value), exc.value
    made = ESGPool(address="http://127.0.0.1:4270")
    with pytest.raises(ValidationError, match=re.escape("got 'localhost:4270'")):
        made.address = "localhost:4270"
    assert made.address == "http://127.0.0.1:4270"  # the refused value is not left on the block
    saved = made.model_dump(exclude={"block_type_slug"}) | {"address": "127.0.0.1:4270"}  # saved in the UI
    with pytest.raises(ValidationError, match="not an http"):
        ESGPool.model_validate(saved)
    assert ESGPool(address="").address == ""  # the UI's empty field: the embedded pool


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"scheduler": ""}, "unknown scheduler ''; known: "),
        ({"scheduler": "esgg", "backend": "inline"}, "unknown scheduler 'esgg'"),
        ({"profile_path": "/nope/profile.csv"}, "no profile file '/nope/profile.csv'"),
    ],
)
def test_an_embedded_pool_block_the_runner_would_refuse_is_refused_when_made(
    fields: dict[str, object], named: str
) -> None:
    """Without an address the block checked nothing: ``scheduler=""`` (the UI's empty field) saved fine and
    ``ESGTaskRunner(pool=...)`` refused it as each run imported its flow. Now refused when made, set or loaded."""
    from pydantic import ValidationError

    from esg_prefect import ESGTaskRunner
    from esg_prefect.exceptions import InvalidInputError

    with pytest.raises(InvalidInputError, match=re.escape(named)):  # the runner's own rule, for the record
        ESGTaskRunner(**{"profile" if k == "profile_path" else k: v for k, v in fields.items()})  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as exc:
        ESGPool(**fields)  # type: ignore[arg-type]
    assert named in str(exc.value), exc.value
    made = ESGPool(backend="inline")
    name, value = next(iter(fields.items()))
    with pytest.raises(ValidationError, match=re.escape(named)):
        setattr(made, name, value)
    assert made == ESGPool(backend="inline")  # the refused value is not left on the block
    with pytest.raises(ValidationError, match=re.escape(named)):  # as saved in the UI, then loaded
        ESGPool.model_validate(made.model_dump(exclude={"block_type_slug"}) | fields)
    profile = str(DATA / "profiles" / "examples_cpu.csv")
    assert ESGPool(scheduler="fast-gshare", profile_path=profile).profile_path == profile
    assert ESGPool(profile_path="").profile_path == ""  # the UI's empty field: the shipped profiles


def test_a_pool_block_with_a_token_and_no_address_is_refused() -> None:
    """The embedded pool takes no token: ``ESGPool(token=...)`` without an address saved fine and the runner
    dropped the token without a word (a service address left out, say). Refused when made, set or loaded,
    without echoing the secret; the UI's empty token is no token."""
    from pydantic import SecretStr, ValidationError

    named = "token is the bearer token of a pool service; the embedded pool (no address) takes none"
    for address in (None, ""):  # "": the UI's empty field
        with pytest.raises(ValidationError, match=re.escape(named)) as exc:
            ESGPool(address=address, token=SecretStr("s3cret-token"), backend="inline")
        assert "s3cret-token" not in str(exc.value)
    made = ESGPool(address="http://127.0.0.1:4270", token=SecretStr("s3cret-token"))
    with pytest.raises(ValidationError, match=re.escape(named)):
        made.address = None
    assert made.address == "http://127.0.0.1:4270"  # the refused value is not left on the block
    with pytest.raises(ValidationError, match=re.escape(named)):  # as saved in the UI, then loaded
        ESGPool.model_validate({"backend": "inline", "token": "s3cret-token"})
    assert ESGPool(backend="inline", token=SecretStr("")).token is not None  # the UI's empty field: taken


def test_a_pool_block_with_an_empty_profile_path_beside_an_address_is_taken() -> None:
    """The UI's empty profile field: the runner reads "" as no profile (``block.profile_path or None``), but the
    block refused it beside an address ("profile_path configures an embedded pool")."""
    from esg_prefect import ESGTaskRunner

    block = ESGPool(address="http://127.0.0.1:4270", profile_path="")
    runner = ESGTaskRunner(pool=block)
    assert runner._address == "http://127.0.0.1:4270" and runner._config["profile"] is None


@pytest.mark.parametrize(
    ("block", "name", "says"),
    [
        (ESGSchedulerSettings, "keep_alive", "did you mean 'keep_alive_s'?"),
        (ESGPriceSheet, "gpus", "did you mean 'gpu'?"),
        (ESGPool, "adress", "did you mean 'address'?"),
        (ESGPool, "zzz", "its fields: address, backend, profile_path, scheduler, token"),
    ],
)
def test_a_name_that_is_no_field_is_refused_with_the_one_meant(block: type[Block], name: str, says: str) -> None:
    """Prefect's blocks keep unknown keywords: ``ESGSchedulerSettings(keep_alive=10)`` made a block still at 60 s."""
    from pydantic import ValidationError

    line = f"{block.__name__} has no field {name!r}{':' if 'did' in says else ';'} {says}"
    with pytest.raises(ValidationError, match=re.escape(line)):
        block(**{name: 10})
    made = block()
    with pytest.raises(ValueError, match=re.escape(line)):
        setattr(made, name, 10)
    assert name not in made.model_dump()
    type(made).model_validate(made.model_dump())  # a saved block's own keys still load


def test_a_co_run_table_is_read_only_where_hybrid_sharing_would_read_it() -> None:
    """A block is validated again wherever it is loaded: a path saved elsewhere stops only a pool that reads it."""
    saved = ESGSchedulerSettings().model_dump(exclude={"block_type_slug"}) | {"corun_table": "profiles/corun.csv"}
    assert ESGSchedulerSettings.model_validate(saved).corun_table == "profiles/corun.csv"  # hybrid sharing off


@pytest.mark.usefixtures("prefect_harness")
def test_a_saved_block_not_valid_where_it_is_loaded_is_one_line(tmp_path: Path) -> None:
    from esg_prefect import ESGTaskRunner
    from esg_prefect.exceptions import InvalidInputError

    table = tmp_path / "corun.csv"
    table.write_text(DEFAULT_CORUN_TABLE.read_text())
    ESGSchedulerSettings(hybrid_sharing=True, corun_table=str(table)).save("test-moved-table", overwrite=True)
    table.unlink()  # saved on one machine, loaded on another that lacks the file
    runner = ESGTaskRunner(settings="test-moved-table", backend="inline")
    with pytest.raises(InvalidInputError) as exc:
        runner.pool_client()
    assert str(exc.value) == (
        f"the ESG Scheduler Settings block 'test-moved-table' is not valid here: "
        f"corun_table '{table}': co-run table '{table}' not found (give a CSV path or 'default')"
    )


def test_good_values_still_make_blocks() -> None:
    assert ESGSchedulerSettings(shed_after_slo=0.0).to_settings().shed_after_slo == 0.0
    assert ESGSchedulerSettings(shed_after_slo=2.0, corun_table="default", hybrid_sharing=True).shed_after_slo == 2.0
    table = str(DEFAULT_CORUN_TABLE)  # a co-run CSV given by its path, as a user would
    assert ESGSchedulerSettings(corun_table=table, hybrid_sharing=True).to_settings().corun_table == table
    assert ESGPriceSheet(gpu={"T4": 0.0}).to_price_sheet().gpu_price_s("T4") == 0.0


@pytest.mark.usefixtures("prefect_harness")
def test_save_load_and_runner_accepts_block_names() -> None:
    from esg_prefect import ESGTaskRunner

    ESGSchedulerSettings(tick_ms=2.0, search_horizon="workflow").save("test-settings", overwrite=True)
    ESGPriceSheet(vcpu=0.05).save("test-prices", overwrite=True)
    runner = ESGTaskRunner(settings="test-settings", prices="test-prices", backend="inline")
    pool = runner.pool_client()
    try:
        assert pool.settings.tick_ms == 2.0 and pool.settings.search_horizon == "workflow"
        assert pool.prices.price_per_vcpu_s == pytest.approx(0.05 / 3600)
    finally:
        from esg_prefect.integration.runner import close_shared_pools

        close_shared_pools()


def test_a_block_name_with_no_saved_block_is_named_at_first_use() -> None:
    from esg_prefect import ESGTaskRunner
    from esg_prefect.exceptions import InvalidInputError

    runner = ESGTaskRunner(settings="no-such-settings", backend="inline")  # names resolve at first use
    with pytest.raises(InvalidInputError, match=r"no ESG Scheduler Settings block named 'no-such-settings'"):
        runner.pool_client()


def test_a_block_name_with_the_prefect_api_down_is_one_line_naming_both() -> None:
    """It was httpx's traceback, ending in ``ConnectError: [Errno 111] Connection refused``: no block, no URL."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from esg_prefect import ESGTaskRunner
    from esg_prefect.exceptions import InvalidInputError

    url = "http://127.0.0.1:9/api"  # the discard port: nothing listens there
    with temporary_settings({PREFECT_API_URL: url}):
        with pytest.raises(InvalidInputError) as exc:
            ESGTaskRunner(pool="svc")  # an ESGPool name resolves at once
        runner = ESGTaskRunner(prices="team-prices", backend="inline")
        with pytest.raises(InvalidInputError) as later:
            runner.pool_client()
    assert str(exc.value) == (
        f"cannot load the ESG Pool block 'svc': the Prefect API at {url} does not answer (ConnectError); "
        "start it with `prefect server start`, or point PREFECT_API_URL at the server that holds the block"
    )
    assert str(later.value).startswith("cannot load the ESG Price Sheet block 'team-prices': the Prefect API at")


def test_a_pool_block_stands_for_the_runner_options_it_holds() -> None:
    from pydantic import SecretStr

    from esg_prefect import ESGTaskRunner
    from esg_prefect.exceptions import InvalidInputError

    token = "t" * 20
    remote = ESGTaskRunner(pool=ESGPool(address="http://10.0.0.5:4270", token=SecretStr(token)))
    assert remote._address == "http://10.0.0.5:4270" and remote._token == token and remote._pool is None
    embedded = ESGTaskRunner(pool=ESGPool(backend="inline", scheduler="fast-gshare"))
    assert embedded._address is None and embedded._config["backend"] == "inline"
    assert embedded == ESGTaskRunner(backend="inline", scheduler="fast-gshare")  # the same runner as given here
    with pytest.raises(InvalidInputError, match="the ESGPool block already sets address, scheduler"):
        ESGTaskRunner(pool=ESGPool(), address="http://127.0.0.1:4270", scheduler="fast-gshare")
    with pytest.raises(InvalidInputError, match="settings configures an embedded pool"):
        ESGTaskRunner(pool=ESGPool(address="http://127.0.0.1:4270"), settings={"tick_ms": 2.0})


def test_create_defaults_saves_once_and_keeps_what_is_saved_when_run_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import runpy

    script = str(Path(__file__).resolve().parents[1] / "blocks" / "create_defaults.py")
    name = "test-defaults-twice"
    for argv in ([script, "--name", name, "--overwrite"], [script, "--name", name]):
        monkeypatch.setattr("sys.argv", argv)
        runpy.run_path(script, run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [f"saved {k} {name!r}" for k in ("ESGPool", "ESGPriceSheet", "ESGSchedulerSettings")]
    assert all(line.startswith("kept ") and "--overwrite" in line for line in out[3:]) and len(out) == 6


def test_create_defaults_answers_help_a_bad_name_and_an_api_that_is_down_in_one_line(tmp_path: Path) -> None:
    """--help had no description, a name Prefect refuses and an API that is down each ended in a traceback."""
    import os
    import subprocess
    import sys

    script = str(Path(__file__).resolve().parents[1] / "blocks" / "create_defaults.py")

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, script, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "PREFECT_HOME": str(tmp_path), **env},
        )

    helped = run("--help")
    assert helped.returncode == 0 and "Save the default esg-prefect block documents" in helped.stdout
    bad = run("--name", "My Default")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "lowercase letters, digits and dashes only, got 'My Default'" in bad.stderr
    down = run(PREFECT_API_URL="http://127.0.0.1:9/api")
    assert down.returncode == 2 and "Traceback" not in down.stderr
    assert "PREFECT_API_URL=http://127.0.0.1:9/api does not answer" in down.stderr
