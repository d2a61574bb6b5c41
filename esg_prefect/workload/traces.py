"""Readers of the real traces: raw timestamps and per-minute counts, nothing scaled yet.

Shipped with the package (``esg_prefect/data/traces``, CC-BY-4.0 / MIT, see the
README there): the two Azure LLM inference traces of 2023 (complete files,
gzip-compressed, unchanged) and the http-triggered rows of the Azure Functions
2019 500-function sample (rows unchanged). Read from the shared trace folder
only, never shipped: the Alibaba GenAI 2026 trace, whose licence allows
research and study use only. :func:`shared_traces_dir` finds that folder
(``$ESG_PREFECT_TRACES`` or ``../shared/traces`` next to the checkout).

Everything read is cached per process; the readers return tuples so the cache
cannot be changed by a caller.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from esg_prefect.exceptions import InvalidInputError

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
"""Where the shipped trace files live."""

LLM_FILES = {
    "code": "azure_llm_2023_code.csv.gz",
    "conv": "azure_llm_2023_conv.csv.gz",
}
FUNCTIONS_FILE = "azure_functions_2019_http_invocations.csv.gz"
ALIBABA_GENAI_PATH = Path("alibaba_genai_2026") / "lora_request_trace.csv"


class TraceUnavailableError(InvalidInputError):
    """A trace that is not shipped and was not found in the shared trace folder."""


def shared_traces_dir() -> Path | None:
    """The shared trace folder: ``$ESG_PREFECT_TRACES``, else ``../shared/traces`` beside the checkout."""
    env = os.environ.get("ESG_PREFECT_TRACES")
    if env:
        p = Path(env)
        return p if p.is_dir() else None
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "traces"
        if (parent / "pyproject.toml").exists() and candidate.is_dir():
            return candidate
    return None


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # closed by the caller's with


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_timestamp_s(text: str) -> float:
    """Seconds since 1970 of ``YYYY-MM-DD hh:mm:ss[.fffffff]`` (any number of fraction digits).

    The LLM traces carry seven fraction digits, more than :mod:`datetime` parses.

    Examples:
        >>> parse_timestamp_s("1970-01-02 00:00:01.5")
        86401.5
    """
    try:
        date, clock = text.strip().split(" ")
        y, mo, d = (int(x) for x in date.split("-"))
        hh, mm, ss = clock.split(":")
        return _days_from_civil(y, mo, d) * 86400.0 + int(hh) * 3600.0 + int(mm) * 60.0 + float(ss)
    except ValueError as exc:
        raise InvalidInputError(f"bad timestamp {text!r}: expected 'YYYY-MM-DD hh:mm:ss[.f]'") from exc


def _llm_path(service: str) -> Path:
    """The shipped Azure LLM 2023 trace file of ``service``.

    Raises:
        InvalidInputError: on an unknown service.
    """
    name = LLM_FILES.get(service)
    if name is None:
        raise InvalidInputError(f"Azure LLM service must be one of {sorted(LLM_FILES)}, got {service!r}")
    return DATA_DIR / name


@lru_cache(maxsize=4)
def llm_arrivals_s(service: str) -> tuple[float, ...]:
    """Arrival times (s from the first request) of the Azure LLM 2023 trace of ``service``.

    Args:
        service: ``"code"`` (bursty) or ``"conv"`` (steady).

    Raises:
        InvalidInputError: on an unknown service.
    """
    with _open_text(_llm_path(service)) as fh:
        times = [parse_timestamp_s(row["TIMESTAMP"]) for row in csv.DictReader(fh)]
    times.sort()
    t0 = times[0]
    return tuple(t - t0 for t in times)


@lru_cache(maxsize=4)
def llm_context_tokens(service: str) -> tuple[int, ...]:
    """Prompt lengths (``ContextTokens``) of every request of the Azure LLM 2023 trace of ``service``.

    Raises:
        InvalidInputError: on an unknown service.
    """
    with _open_text(_llm_path(service)) as fh:
        return tuple(int(row["ContextTokens"]) for row in csv.DictReader(fh))


@dataclass(frozen=True, slots=True)
class FunctionSeries:
    """Per-minute invocation counts of one function of the Azure Functions 2019 sample.

    Attributes:
        function: the function's hashed id (``HashFunction``).
        app: the hashed app id.
        first_minute: minute of the day of ``counts[0]`` (480 = 08:00).
        counts: invocations in each minute.
    """

    function: str
    app: str
    first_minute: int
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        """Invocations over the whole series."""
        return sum(self.counts)


@lru_cache(maxsize=1)
def http_functions() -> tuple[FunctionSeries, ...]:
    """The http-triggered functions of the sample, most invoked first (ties by function id)."""
    out: list[FunctionSeries] = []
    with _open_text(DATA_DIR / FUNCTIONS_FILE) as fh:
        reader = csv.reader(fh)
        header = next(reader)
        minutes = [int(h) for h in header[4:]]
        for row in reader:
            if row[3] != "http":
                continue
            out.append(FunctionSeries(row[2], row[1], minutes[0], tuple(int(x) for x in row[4:])))
    out.sort(key=lambda f: (-f.total, f.function))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class GenAIRequest:
    """One request of the Alibaba GenAI 2026 trace: when, and which kind of job."""

    time_s: float
    predict_type: str


def _alibaba_path() -> Path:
    base = shared_traces_dir()
    path = None if base is None else base / ALIBABA_GENAI_PATH
    if path is None or not path.exists():
        raise TraceUnavailableError(
            "the Alibaba GenAI 2026 trace is not shipped (its licence allows research/study use only); "
            f"put it at <traces>/{ALIBABA_GENAI_PATH.as_posix()} and point $ESG_PREFECT_TRACES at <traces>"
        )
    return path


def alibaba_available() -> bool:
    """Whether the Alibaba GenAI 2026 trace can be read here."""
    try:
        _alibaba_path()
    except TraceUnavailableError:
        return False
    return True


@lru_cache(maxsize=1)
def alibaba_genai_requests() -> tuple[GenAIRequest, ...]:
    """Requests of the Alibaba GenAI 2026 trace (s from the first), in time order.

    Raises:
        TraceUnavailableError: when the file is not in the shared trace folder.
    """
    with _open_text(_alibaba_path()) as fh:
        rows = [(parse_timestamp_s(r["gmt_create"]), r["predict_type"]) for r in csv.DictReader(fh)]
    rows.sort()
    t0 = rows[0][0]
    return tuple(GenAIRequest(t - t0, kind) for t, kind in rows)


def iter_shipped_files() -> Iterator[Path]:
    """The trace files shipped with the package."""
    yield from sorted(DATA_DIR.glob("*.csv.gz"))
