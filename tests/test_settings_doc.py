"""docs/settings.md is generated from ESGSettings and kept in step with it; the block takes its defaults."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

from esg_prefect.integration.blocks import ESGSchedulerSettings
from esg_prefect.model.config import ConfigSpace
from esg_prefect.scheduling import ESGSettings
from esg_prefect.scheduling.settings import PaldiaSettings, PlatformSettings
from esg_prefect.scheduling.settings_doc import knob_descriptions, knob_groups, settings_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_every_knob_is_described_and_in_exactly_one_group() -> None:
    names = [f.name for f in fields(ESGSettings)]
    grouped = [n for group in knob_groups().values() for n in group]
    assert sorted(grouped) == sorted(names)  # each once, none unknown
    described = knob_descriptions()
    assert set(described) == set(names) and all(len(described[n]) > 10 for n in names)


def test_docs_settings_md_is_what_the_code_generates() -> None:
    on_disk = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert on_disk == settings_markdown(), "run: esg-prefect schedulers --markdown > docs/settings.md"


def test_the_block_takes_every_default_from_the_dataclass() -> None:
    block = ESGSchedulerSettings()
    assert block.to_settings() == ESGSettings()
    source = (ROOT / "esg_prefect" / "integration" / "blocks.py").read_text(encoding="utf-8")
    knobs = source[source.index("class ESGSchedulerSettings") : source.index("def to_settings")]
    assert "default=_knob(" in knobs and "default=True" not in knobs and "default=False" not in knobs
    # docs/settings.md says config_space is the ConfigSpace's fields there, one list each.
    space = {f.name for f in fields(ConfigSpace)}
    assert space <= set(ESGSchedulerSettings.model_fields) and "config_space" not in ESGSchedulerSettings.model_fields
    assert all(f"`{name}`" in settings_markdown().split("## ")[0] for name in space)


def test_the_groups_carry_the_settings_values() -> None:
    s = ESGSettings(tick_ms=2.0, keep_alive_s=9.0, hybrid_sharing=True, size_aware=False)
    assert s.platform.tick_ms == 2.0 and s.platform.keep_alive_s == 9.0
    assert s.paldia.hybrid_sharing and not s.cypress.size_aware
    # The groups have no defaults of their own: a default is written once, in ESGSettings.
    assert all(f.default is MISSING for g in (PlatformSettings, PaldiaSettings) for f in fields(g))
