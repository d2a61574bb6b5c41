"""What a bad ``module:attribute`` path says, for a stage (the workers) and a profile target (``profile -t``).

Both go through one import helper; each failure (a malformed path, a module not found, a module
whose own code refused something as it was imported, a missing attribute) keeps its exact line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from esg_prefect.exceptions import UnknownStageError
from esg_prefect.profiler.targets import resolve_targets
from esg_prefect.runtime.stages import resolve_stage

REFUSES = "esg_refuses_on_import_xyz"  # names no installed package has
MISSING = "esg_not_here_xyz"
HINT = (
    f"; run esg-prefect from the folder that holds {MISSING}.py (or {MISSING}/), as the working directory is "
    "on the import path, or add that folder to PYTHONPATH"
)


@pytest.fixture
def refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A module that raises an ESGError as it is imported."""
    (tmp_path / f"{REFUSES}.py").write_text(
        "from esg_prefect.exceptions import InvalidInputError\nraise InvalidInputError(\"no profile file 'p'\")\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop(REFUSES, None)


LINES = [
    (resolve_stage, "tests.toy_stages", "stage import path must look like 'module:attribute', got 'tests.toy_stages'"),
    (
        resolve_stage,
        f"{MISSING}:x",
        f"cannot import module {MISSING!r} of stage '{MISSING}:x': No module named {MISSING!r}",
    ),
    (resolve_stage, f"{REFUSES}:x", f"importing module {REFUSES!r} of stage '{REFUSES}:x' failed: no profile file 'p'"),
    (
        resolve_stage,
        "tests.toy_stages:inc.nope",
        "module 'tests.toy_stages' has no attribute 'inc.nope' (stage 'tests.toy_stages:inc.nope')",
    ),
    (
        resolve_stage,
        "tests.toy_stages:toy",
        "'tests.toy_stages:toy' is neither a StageSpec nor has an 'esg_stage' attribute",
    ),
    (resolve_targets, "tests.toy_stages", "a target must look like 'module:attribute', got 'tests.toy_stages'"),
    (
        resolve_targets,
        f"{MISSING}:x",
        f"cannot import module {MISSING!r} of target '{MISSING}:x': No module named {MISSING!r}{HINT}",
    ),
    (
        resolve_targets,
        f"{REFUSES}:x",
        f"importing module {REFUSES!r} of target '{REFUSES}:x' failed: no profile file 'p'",
    ),
    (
        resolve_targets,
        "tests.toy_stages:inc.nope",
        "module 'tests.toy_stages' has no attribute 'inc.nope' (target 'tests.toy_stages:inc.nope')",
    ),
    # a stage with samples: the stage's own line, with the hint where its module is not found
    (
        resolve_targets,
        f"{MISSING}:x@tests.toy_stages:inc",
        f"cannot import module {MISSING!r} of stage '{MISSING}:x': No module named {MISSING!r}{HINT}",
    ),
    (
        resolve_targets,
        "tests.toy_stages:inc@tests.toy_stages:nope",
        "module 'tests.toy_stages' has no attribute 'nope' (target 'tests.toy_stages:nope')",
    ),
]


@pytest.mark.usefixtures("refuses")
@pytest.mark.parametrize(("resolve", "path", "line"), LINES, ids=[f"{r.__name__}-{p}" for r, p, _ in LINES])
def test_a_bad_paths_failure_keeps_its_line(resolve: Callable[[str], object], path: str, line: str) -> None:
    with pytest.raises(UnknownStageError) as info:
        resolve(path)
    assert str(info.value) == line


def test_an_attribute_path_walks_into_objects() -> None:
    assert resolve_stage("tests.toy_stages:inc").name == "inc"
    (target,) = resolve_targets("tests.toy_stages:inc@tests.test_import_paths:samples")
    assert target.name == "inc" and target.samples is samples


def samples(rng: object, n: int) -> list[float]:
    """Inputs for ``tests.toy_stages:inc``."""
    return [1.0] * n
