"""Reading a CSV's rows into objects, with errors that name the file and the line.

The profiler's tables (profiles, per-call samples, validation, co-run rows) are
CSV files that users edit and ship. A malformed row should fail with the file
and line in the message, whichever table it is; this module is that loop, once.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from esg_prefect.exceptions import ProfileError, close_match

__all__ = ["check_row_width", "config_columns", "decimal", "integer", "misnamed_columns", "read_rows"]

T = TypeVar("T")


def read_rows(
    path: str | Path,
    parse: Callable[[dict[str, str]], T],
    error: type[Exception] = ProfileError,
    required: Iterable[str] = (),
    kind: str = "",
) -> list[T]:
    """``parse`` applied to every row of the CSV at ``path`` (a dict by column name).

    Args:
        path: the CSV file (with a header line).
        parse: builds one object from a row; a missing column or a bad value raises
            ``KeyError``, ``TypeError`` or ``ValueError``.
        error: the exception raised instead, with the file and line.
        required: columns that must be in the header (checked before any row).
        kind: what file it should be (``"a samples CSV"``), said when columns are missing: most often
            another of the profiler's tables was given.

    Raises:
        error: naming the file, and the line of a malformed row or the missing columns.

    Example:
        >>> import tempfile, os
        >>> with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as fh:
        ...     _ = fh.write("a,b\\n1,2\\n3,x\\n")
        >>> try:
        ...     read_rows(fh.name, lambda r: int(r["a"]) + int(r["b"]))
        ... except ProfileError as exc:
        ...     print(str(exc).split(" ", 1)[1].split(":")[0])
        line 3
        >>> os.unlink(fh.name)
    """
    out: list[T] = []
    with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's "CSV UTF-8" starts with a BOM
        reader = csv.DictReader(fh)
        missing = set(required) - set(reader.fieldnames or ())
        if missing:
            raise error(
                f"{path}: missing columns {sorted(missing)}"
                + (f"; give {kind}" if kind else "")
                + f"; its header: {list(reader.fieldnames or ())}"  # shows a wrong delimiter or a stray space
            )
        for lineno, row in enumerate(reader, start=2):
            try:
                out.append(parse(row))
            except KeyError as exc:  # a column the header lacks, asked for by name
                raise error(f"{path} line {lineno}: no column {exc}") from exc
            except (TypeError, ValueError) as exc:
                raise error(f"{path} line {lineno}: {exc}") from exc
    return out


def config_columns(row: dict[str, str]) -> tuple[str, str, int, int, float]:
    """``(stage, hardware, batch, vcpus, gpu_share)`` of a row: the columns every profiler table starts with.

    Raises:
        KeyError, ValueError: on a missing column, or a bad number naming its column and value
            (``batch must be an integer, got '2.5'``; :func:`read_rows` adds the file and line).
    """
    return row["stage"], row["hardware"], integer(row, "batch"), integer(row, "vcpus"), decimal(row, "gpu_share")


def misnamed_columns(header: Iterable[str], read: Collection[str], known: Collection[str] = ()) -> list[str]:
    """Messages for the header's columns that look like misspelt names of columns it lacks.

    A CSV may carry columns its reader skips, so an unknown column is no error in
    itself; but one that resembles a column the reader would read and does not find
    (``p95`` for ``p95_ms``) is almost always a typo, and reading on would silently
    drop what it holds. ``known`` lists the skipped columns that are expected
    (another writer's extras), which are never taken for typos.
    """
    columns = list(header)
    absent = [c for c in read if c not in columns]
    out = []
    for col in columns:
        if col in known or col in read:
            continue
        guess = close_match(col, absent)
        if guess:
            out.append(f"column {col!r} is not one this table reads: did you mean {guess!r}?")
    return out


def check_row_width(row: Mapping[str | None, object], width: int) -> None:
    """Refuse a row of ``csv.DictReader`` with more or fewer values than the header has columns.

    Raises:
        ValueError: saying how many values the row has (:func:`read_rows` names the line).
    """
    extra = row.get(None)
    if isinstance(extra, list) and extra:
        raise ValueError(f"{width + len(extra)} values, but the header has {width} columns")
    missing = sum(1 for k, v in row.items() if k is not None and v is None)
    if missing:
        raise ValueError(f"{width - missing} values, but the header has {width} columns")


def integer(row: Mapping[str, str], column: str) -> int:
    """``row[column]`` as an int; a bad value names the column (``batch must be an integer, got '2.5'``)."""
    text = row[column]
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{column} must be an integer, got {text!r}") from None


def decimal(row: Mapping[str, str], column: str) -> float:
    """``row[column]`` as a float; a bad value names the column (``mean_ms must be a number, got 'abc'``)."""
    text = row[column]
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{column} must be a number, got {text!r}") from None
