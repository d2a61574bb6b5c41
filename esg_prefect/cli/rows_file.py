"""``compare``'s ``rows.jsonl``: the finished runs kept in ``--out``, reused only by the code that wrote them.

A row is reused when both its key and its code stamp match. The key
(``compare.spec_key``) names the run: experiment, scheduler, seed, labels
and a digest of the whole case, its settings included, and of the contents
of the user's files it reads (:func:`case_files`, :func:`file_digests`): a
trace or profile CSV edited in place is a new run, not its old rows. The stamp
(:func:`code_stamp`) names the code that computed it: the package version
plus a digest of the package's Python sources and data files (profiles,
traces), as a checkout changes schedulers and the simulator without a new
version. Reading every such file of the package takes a few milliseconds
and is sound: no change that could move a row goes unseen, and at worst an
unrelated edit runs the rows again. Rows written by other code, or before
rows carried a stamp, are dropped from the file, and the user is told in one line.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

__all__ = ["CODE_FIELD", "case_files", "code_stamp", "file_digests", "package_digest", "reusable_rows"]

CODE_FIELD = "code"
"""The field of a kept row that holds the :func:`code_stamp` of the code that computed it."""

_DIGESTED = frozenset({".py", ".csv", ".gz", ".json"})
"""The files of the package whose content can change a row: its code and its data (profiles, traces)."""


def package_digest(root: Path) -> str:
    """A digest of the Python sources and data files under ``root`` (paths and contents; caches left out)."""
    h = hashlib.sha1()
    files = (p for p in root.rglob("*") if p.suffix in _DIGESTED and "__pycache__" not in p.parts and p.is_file())
    for path in sorted(files):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:10]


@functools.cache
def code_stamp() -> str:
    """This package's version and a digest of its code and data: ``0.1.0+1a2b3c4d5e`` (once per process)."""
    import esg_prefect

    return f"{esg_prefect.__version__}+{package_digest(Path(esg_prefect.__file__).parent)}"


def case_files(case: Any) -> list[str]:
    """The user's files ``case`` reads, as it names them: a ``csv:`` trace's, and its profile unless a shipped one.

    A shipped profile is data of the package, which :func:`code_stamp` covers.
    """
    from esg_prefect.model.profile_source import is_shipped_name

    files = []
    if case.workload.trace.startswith("csv:"):
        files.append(case.workload.trace[4:])
    if isinstance(case.profile, str) and not is_shipped_name(case.profile):
        files.append(case.profile)
    return files


def file_digests(paths: Iterable[str]) -> dict[str, str]:
    """A digest of each file's bytes, by path, each file read once.

    A file that cannot be read gets ``"unreadable"``: its run fails, and says
    why, as it would have without the digest.
    """
    out: dict[str, str] = {}
    for path in paths:
        if path not in out:
            try:
                out[path] = hashlib.sha1(Path(path).read_bytes()).hexdigest()
            except OSError:
                out[path] = "unreadable"
    return out


def reusable_rows(
    sink: Path, stamp: str, wanted: Collection[str], needed: Iterable[str], say: Callable[[str], Any]
) -> dict[str, dict[str, Any]]:
    """The rows of ``sink`` that code stamped ``stamp`` may reuse, by key.

    A row is kept when it carries ``stamp`` and every field in ``needed``. The
    others are dropped from the file, as no run of this code can reuse them;
    when some of them are runs of ``wanted`` (the keys asked for now), ``say``
    gets one line naming how many and which code wrote them.
    """
    if not sink.exists():
        return {}
    fields = tuple(needed)
    kept: dict[str, dict[str, Any]] = {}
    lines: list[str] = []
    stale: list[dict[str, Any]] = []
    for line in sink.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get(CODE_FIELD) == stamp and all(k in row for k in fields):
            kept[row["key"]] = row
            lines.append(line)
        else:
            stale.append(row)
    if not stale:
        return kept
    sink.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    asked = [r for r in stale if r.get("key") in wanted]
    if asked:
        by = sorted({str(r.get(CODE_FIELD) or "an esg-prefect that did not stamp its rows") for r in asked})
        say(
            f"not reusing {len(asked)} run(s) in {sink}: computed by {', '.join(by)}, not by this code "
            f"(esg-prefect {stamp}); running them again"
        )
    return kept
