"""Layering: the domain model and the scheduler core stay free of runtime dependencies and clocks.

STYLE.md: dependencies point one way; ``esg_prefect.model`` and ``esg_prefect.scheduling``
import neither prefect, torch, asyncio nor an HTTP library, and read no clock (time is
injected). Two checks: a fresh interpreter's ``sys.modules`` after importing both
packages, and a static scan of every import statement in their source files.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE_PACKAGES = ("model", "scheduling", "control")
# Heavy or I/O dependencies that the pure layers must not load, even indirectly.
FORBIDDEN_LOADED = ("prefect", "torch", "asyncio", "httpx", "starlette", "uvicorn", "sqlmodel")
# The same, plus the clock, thread and process modules: the pure layers get time injected, never
# read it, and run on their caller's thread.
FORBIDDEN_IMPORTS = (*FORBIDDEN_LOADED, "time", "datetime", "threading", "socket", "subprocess")

PROBE = """
import json, sys
import esg_prefect.model, esg_prefect.scheduling, esg_prefect.control.calls, esg_prefect.control.records
import esg_prefect.control.core, esg_prefect.control.fleet, esg_prefect.control.events
print(json.dumps({"file": esg_prefect.__file__, "modules": sorted(sys.modules)}))
"""


def roots_in(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    """The modules that are one of ``roots`` or inside one of them."""
    return sorted(m for m in modules if m.split(".")[0] in roots)


def forbidden_imports(source: str, filename: str = "<src>") -> list[str]:
    """Every import statement (or literal dynamic import) in ``source`` that names a forbidden module."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
                isinstance(func, ast.Attribute) and func.attr == "import_module"
            )
            if dynamic and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        line = getattr(node, "lineno", 0)
        found += [f"{filename}:{line}: {n}" for n in names if n.split(".")[0] in FORBIDDEN_IMPORTS]
    return found


def pure_sources() -> list[Path]:
    return sorted(p for pkg in PURE_PACKAGES for p in (ROOT / "esg_prefect" / pkg).rglob("*.py"))


# ---- a fresh interpreter ------------------------------------------------------


def test_importing_model_and_scheduling_loads_no_runtime_dependency() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the probe must have imported this checkout, not some other installed copy
    assert Path(out["file"]).resolve() == ROOT / "esg_prefect" / "__init__.py"
    assert "esg_prefect.model.slo" in out["modules"]
    assert "esg_prefect.scheduling.search" in out["modules"]
    loaded = roots_in(out["modules"], FORBIDDEN_LOADED)
    assert loaded == [], f"the pure layers pulled in {loaded}; run `python -X importtime -c 'import ...'` to see why"


def test_roots_in_matches_packages_and_submodules_only() -> None:
    mods = ["asyncio", "asyncio.events", "asyncioextra", "torch.nn", "prefectx", "json"]
    assert roots_in(mods, FORBIDDEN_LOADED) == ["asyncio", "asyncio.events", "torch.nn"]


# ---- a static scan of the sources ---------------------------------------------


def test_the_scan_covers_both_packages() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in pure_sources()}
    for expected in ("esg_prefect/model/slo.py", "esg_prefect/model/profile.py", "esg_prefect/scheduling/search.py"):
        assert expected in files


@pytest.mark.parametrize("path", pure_sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_forbidden_import_statement(path: Path) -> None:
    assert forbidden_imports(path.read_text(encoding="utf-8"), path.name) == []


@pytest.mark.parametrize(
    "line",
    [
        "import time",
        "import time as t",
        "from time import monotonic",
        "import datetime",
        "from datetime import datetime",
        "import os, torch.nn",
        "from prefect.futures import PrefectFuture",
        "import asyncio",
        "from httpx import Client",
        "import starlette, uvicorn",
        "from sqlmodel import SQLModel",
        "if TYPE_CHECKING:\n    import prefect",
        "def f():\n    import time\n    return time.time()",
        "m = __import__('time')",
        "m = importlib.import_module('asyncio.events')",
    ],
)
def test_the_scan_catches_forbidden_imports(line: str) -> None:
    assert forbidden_imports(line) != []


@pytest.mark.parametrize(
    "line",
    [
        "import timeit",
        "from esg_prefect.model.config import Config",
        "from . import time",
        "from .datetime import x",
        "import math, heapq",
        "from typing import TYPE_CHECKING",
    ],
)
def test_the_scan_allows_other_imports(line: str) -> None:
    assert forbidden_imports(line) == []


# ---- the whole package order ------------------------------------------------------

# ARCHITECTURE.md's layers, bottom up: a package imports only packages of a lower rank (and
# itself). Packages of one rank are siblings and must not import each other.
RANKS = {
    "exceptions": 0,
    "model": 1,
    "scheduling": 2,
    "workload": 2,
    "control": 3,
    "runtime": 4,
    "simulator": 4,
    "service": 5,
    "store": 5,
    "integration": 6,
    "profiler": 6,
    "examples": 7,
    "cli": 8,
}
# Known upward imports still to be removed, each with its reason; a new one fails the test.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def package_imports() -> list[tuple[str, str, str]]:
    """Every ``esg_prefect.<pkg>`` import in the package, as (importing package, imported package, where)."""
    found = []
    for path in sorted((ROOT / "esg_prefect").rglob("*.py")):
        parts = path.relative_to(ROOT / "esg_prefect").parts
        if len(parts) == 1:
            continue  # the top-level __init__ (the public names, imported lazily) and exceptions.py
        src = parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                bits = name.split(".")
                if bits[0] == "esg_prefect" and len(bits) > 1 and bits[1] != src:
                    found.append((src, bits[1], f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


def test_every_package_has_a_rank() -> None:
    packages = {p.name for p in (ROOT / "esg_prefect").iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(RANKS), sorted(packages - set(RANKS))


def test_dependencies_point_down_the_layers() -> None:
    upward = [
        f"{where}: {src} -> {dst}"
        for src, dst, where in package_imports()
        if RANKS.get(dst, 0) >= RANKS[src] and (src, dst) not in KNOWN_UPWARD
    ]
    assert upward == [], "imports against the layer order (ARCHITECTURE.md):\n" + "\n".join(upward)


def test_the_known_upward_imports_still_exist() -> None:
    # Once one is removed, take it off KNOWN_UPWARD so that it cannot come back.
    seen = {(src, dst) for src, dst, _ in package_imports()}
    assert set(KNOWN_UPWARD) <= seen


# ---- the commands ------------------------------------------------------------------

CLI = ROOT / "esg_prefect" / "cli"


def command_modules() -> set[str]:
    """The ``esg_prefect.cli`` modules that add a command (they define ``register(app)``)."""
    found = set()
    for path in CLI.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body):
            found.add(path.stem)
    return found


def test_no_command_imports_another_command() -> None:
    # What two commands share lives in a shared module of the package (args, progress, case_file,
    # tables, bill_plot, ...), so that a command can change without reaching into the others.
    commands = command_modules()
    assert {"simulate", "compare", "pool", "profile"} <= commands
    crossing = []
    for name in sorted(commands):
        path = CLI / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from esg_prefect.cli import simulate`` names the command in the imported names
                pkg = node.module == "esg_prefect.cli"
                targets = [f"{node.module}.{a.name}" for a in node.names] if pkg else [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                bits = target.split(".")
                if bits[:2] == ["esg_prefect", "cli"] and len(bits) > 2 and bits[2] in commands - {name}:
                    crossing.append(f"esg_prefect/cli/{name}.py:{node.lineno}: {target}")
    assert crossing == [], "a command imports another command's module:\n" + "\n".join(crossing)
