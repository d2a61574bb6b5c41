"""docs/settings.md, generated from :class:`ESGSettings`: each knob's default and what it decides.

The descriptions are the dataclass docstring's ``Attributes`` entries and the
defaults are the dataclass's own, so the page cannot drift from the code
(``esg-prefect schedulers --markdown`` prints it; a test compares it with the file).
Knobs are grouped by who reads them.
"""

from __future__ import annotations

import re
from dataclasses import fields

from esg_prefect.model.config import ConfigSpace
from esg_prefect.scheduling.settings import SETTINGS_GROUPS, ESGSettings, search_knobs


def knob_groups() -> dict[str, tuple[str, ...]]:
    """The knobs by who reads them: the search's first, then each group of :data:`SETTINGS_GROUPS`."""
    groups = {"Search (ESG's A* and its dispatch rules)": search_knobs()}
    for title, group in SETTINGS_GROUPS.items():
        groups[title] = tuple(f.name for f in fields(group))
    return groups


def knob_descriptions() -> dict[str, str]:
    """Each knob's description, from the ``Attributes`` section of :class:`ESGSettings`' docstring."""
    doc = ESGSettings.__doc__ or ""
    section = doc.split("Attributes:", 1)[1]
    out: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        head = re.match(r"^ {8}(\w+): (.*)$", line)
        if head:
            name = head.group(1)
            out[name] = head.group(2).strip()
        elif line.startswith(" " * 12) and name:
            out[name] += " " + line.strip()
    return out


def _default(value: object) -> str:
    if isinstance(value, dict):  # the configuration space
        return "; ".join(f"{k} {list(v)}" for k, v in value.items())  # type: ignore[call-overload]
    return repr(value)


def _rst_to_md(text: str) -> str:
    """Sphinx roles and literals as Markdown code."""
    text = re.sub(r":(?:class|meth|mod|func):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def settings_markdown() -> str:
    """The whole of docs/settings.md."""
    defaults = ESGSettings().to_dict()
    described = knob_descriptions()
    space = [f"`{f.name}`" for f in fields(ConfigSpace)]  # the block's fields for config_space
    lines = [
        "# Settings",
        "",
        "Every knob of `ESGSettings` (`esg_prefect.scheduling.settings`), with its default. The same",
        "knobs are fields of the `ESGSchedulerSettings` Prefect block, except `config_space`: there it is",
        f"{len(space)} fields, {', '.join(space[:-1])} and {space[-1]}. `--set KEY=VALUE` (repeatable)",
        "overrides the knobs for `esg-prefect simulate` and `compare` runs and for a pool service",
        "(`esg-prefect pool serve`). A value is read as JSON (`true`, `0.25`, `{...}`), else as a Python",
        "literal (`True`, `'frontier'`, as the defaults below are written), else as a string.",
        "This page is generated from the code (`esg-prefect schedulers --markdown > docs/settings.md`);",
        "figures behind the defaults are in [results.md](results.md).",
        "",
    ]
    for group, names in knob_groups().items():
        lines += [f"## {group}", "", "| knob | default | what it decides |", "|---|---|---|"]
        for name in names:
            desc = _rst_to_md(described[name]).replace("|", "\\|")
            lines.append(f"| `{name}` | `{_default(defaults[name])}` | {desc} |")
        lines.append("")
    return "\n".join(lines)
