"""Arrival times per workflow from a real trace, scaled to a target rate, seeded.

``arrivals(trace, workflows, rate_per_s, duration_s, seed)`` returns
``[(arrival_ms, workflow), ...]`` in time order: the requests a run (simulated
or live) receives. What each trace contributes, and how it is scaled:

``azure_functions_2019``
    The most-invoked http-triggered functions of the Azure Functions 2019
    sample, one per workflow (the first workflow gets the most-invoked
    function). Each keeps its own per-minute shape; its counts are scaled so
    that its mean rate over the 8-hour sample is the workflow's share of
    ``rate_per_s`` (equal shares unless ``weights`` say otherwise). Within a
    minute, arrivals are uniform at random (a Poisson process modulated per
    minute). ``minute_s`` sets how many simulated seconds one trace minute
    lasts (60: real time; less compresses the day's shape into a short run).

``azure_llm_code`` / ``azure_llm_conv``
    Every request of the Azure LLM 2023 code (very bursty, inter-arrival CV
    about 13) or conversation (steady, CV about 1.1) trace. Time is compressed
    by one factor, the trace's mean rate over ``rate_per_s``, so bursts stay
    bursts; the trace repeats when the run is longer than it. Each request
    goes to a workflow at random, by ``weights``.

``alibaba_genai_2026``
    The Alibaba GenAI 2026 requests (only where the file is present, see
    :mod:`esg_prefect.workload.traces`), time-compressed like the LLM traces;
    the request kind (text-to-image, image-to-image, inpainting, most frequent
    first) picks the workflow, so each workflow keeps its kind's shape. Times
    have 1-second resolution; each gets a uniform random offset within its second.

``poisson``
    A homogeneous Poisson process at ``rate_per_s``, workflows by ``weights``:
    the control for the real traces.

``csv:<path>``
    Your own trace: a CSV file with a column ``arrival_s`` (seconds, any
    origin) and optionally ``workflow``. Time-compressed to ``rate_per_s`` like
    the LLM traces; rows name their workflow (names not in ``workflows`` are an
    error), or, without the column or with an empty cell, workflows are drawn
    by ``weights`` (a trace may name only the requests it knows). This is how
    to ask what ESG would save on a workload of your own.

The trace's starting point is ``start_s`` seconds into it (for the functions
trace, rounded down to a minute); with ``start_s=None`` the seed picks it, so
different seeds see different windows of the trace. Every random choice comes
from one :class:`random.Random` seeded by ``(trace, seed)``: a list of arrivals
is a function of its arguments.

Example:
    >>> a = arrivals("azure_llm_conv", ["chat"], rate_per_s=50.0, duration_s=2.0, seed=0, start_s=0.0)
    >>> len(a) > 0 and all(0.0 <= t < 2000.0 and wf == "chat" for t, wf in a)
    True
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.csv_rows import read_rows
from esg_prefect.workload import traces

Arrival = tuple[float, str]
"""``(arrival_ms, workflow)``."""


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """What a trace name stands for."""

    name: str
    description: str
    shipped: bool


TRACES: dict[str, TraceInfo] = {
    t.name: t
    for t in (
        TraceInfo(
            "azure_functions_2019",
            "Azure Functions 2019 sample: most-invoked http functions, one per workflow, per-minute shape",
            True,
        ),
        TraceInfo("azure_llm_code", "Azure LLM inference 2023, code service: bursty arrivals (CV ~13)", True),
        TraceInfo("azure_llm_conv", "Azure LLM inference 2023, conversation service: steady arrivals (CV ~1.1)", True),
        TraceInfo(
            "alibaba_genai_2026",
            "Alibaba GenAI 2026 (diffusion serving): request kind -> workflow; read from the shared folder only",
            False,
        ),
        TraceInfo("poisson", "synthetic Poisson arrivals (the control)", True),
    )
}


def trace_names() -> list[str]:
    """Every trace name :func:`arrivals` accepts."""
    return sorted(TRACES)


def trace_available(name: str) -> bool:
    """Whether ``name`` can be read here (the Alibaba trace needs the shared folder)."""
    if name not in TRACES:
        return False
    return name != "alibaba_genai_2026" or traces.alibaba_available()


def _check(
    trace: str, workflows: Sequence[str], rate_per_s: float, duration_s: float, weights: Sequence[float] | None
) -> list[float]:
    if trace not in TRACES and not trace.startswith("csv:"):
        raise InvalidInputError(f"unknown trace {trace!r}; known: {trace_names()}")
    if not workflows:
        raise InvalidInputError("arrivals need at least one workflow")
    if len(set(workflows)) != len(workflows):
        raise InvalidInputError(f"workflow names must be unique, got {list(workflows)}")
    for name, v in (("rate_per_s", rate_per_s), ("duration_s", duration_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InvalidInputError(f"{name} must be a finite number > 0, got {v!r}")
    w = [1.0] * len(workflows) if weights is None else [float(x) for x in weights]
    if len(w) != len(workflows):
        raise InvalidInputError(f"weights has {len(w)} values for {len(workflows)} workflows")
    if any(not (math.isfinite(x) and x >= 0) for x in w) or sum(w) <= 0:
        raise InvalidInputError(f"weights must be >= 0 with a positive sum, got {w}")
    return w


def arrivals(
    trace: str,
    workflows: Sequence[str],
    rate_per_s: float,
    duration_s: float,
    seed: int,
    *,
    start_s: float | None = None,
    minute_s: float = 60.0,
    weights: Sequence[float] | None = None,
) -> list[Arrival]:
    """Requests of ``workflows`` from ``trace`` over ``duration_s``, at ``rate_per_s`` on average.

    Args:
        trace: one of :func:`trace_names`.
        workflows: workflow names, in the order traces map to them.
        rate_per_s: target mean arrival rate of all workflows together.
        duration_s: length of the arrival window.
        seed: seed of every random choice.
        start_s: where in the trace to start (trace seconds); None lets the seed pick.
        minute_s: simulated seconds per trace minute (``azure_functions_2019`` only).
        weights: relative share of each workflow (equal by default; ignored by
            ``alibaba_genai_2026``, where the request kind decides).

    Returns:
        ``(arrival_ms, workflow)`` pairs sorted by time (ties by workflow order).

    Raises:
        InvalidInputError: on an unknown trace or a bad value, named.
        TraceUnavailableError: when the Alibaba trace is not in the shared folder.
    """
    w = _check(trace, workflows, rate_per_s, duration_s, weights)
    if not (math.isfinite(minute_s) and minute_s > 0):
        raise InvalidInputError(f"minute_s must be > 0, got {minute_s!r}")
    if start_s is not None and not (math.isfinite(start_s) and start_s >= 0):
        raise InvalidInputError(f"start_s must be >= 0 or None, got {start_s!r}")
    rng = random.Random(f"{trace}:{seed}")
    duration_ms = duration_s * 1000.0
    wf = list(workflows)
    out: list[tuple[float, int]]
    if trace == "poisson":
        out = []
        t = rng.expovariate(rate_per_s) * 1000.0
        while t < duration_ms:
            out.append((t, rng.choices(range(len(wf)), w)[0]))
            t += rng.expovariate(rate_per_s) * 1000.0
    elif trace in ("azure_llm_code", "azure_llm_conv"):
        times = traces.llm_arrivals_s(trace.rsplit("_", 1)[1])
        picks = _compressed(times, rate_per_s, duration_ms, start_s, rng, jitter_s=0.0)
        out = [(t, rng.choices(range(len(wf)), w)[0]) for t, _ in picks]
    elif trace.startswith("csv:"):
        times, names = _user_csv(trace[4:])
        index = {w: i for i, w in enumerate(wf)}
        unknown = sorted({n for n in names if n is not None and n not in index})
        if unknown:
            raise InvalidInputError(f"{trace}: rows name workflows {unknown[:5]} not among {wf}")
        picks = _compressed(times, rate_per_s, duration_ms, start_s, rng, jitter_s=0.0)
        out = []
        for t, i in picks:
            name = names[i]
            out.append((t, index[name] if name is not None else rng.choices(range(len(wf)), w)[0]))
    elif trace == "alibaba_genai_2026":
        reqs = traces.alibaba_genai_requests()
        kinds = [k for k, _ in Counter(r.predict_type for r in reqs).most_common()]
        index = {k: i % len(wf) for i, k in enumerate(kinds)}
        picks = _compressed(tuple(r.time_s for r in reqs), rate_per_s, duration_ms, start_s, rng, jitter_s=1.0)
        out = [(t, index[reqs[i].predict_type]) for t, i in picks]
    else:  # azure_functions_2019
        out = _functions(len(wf), w, rate_per_s, duration_ms, start_s, minute_s, rng)
    out.sort()
    return [(t, wf[i]) for t, i in out]


def _user_csv(path: str) -> tuple[tuple[float, ...], tuple[str | None, ...]]:
    """Arrival times (s from the first, sorted) and workflow names (None where not given) of a user's CSV.

    Raises:
        InvalidInputError: naming the file, when it cannot be read, has a bad row, fewer than two
            arrivals, or all of them at one time (a span of 0 s has no rate to replay it at).
    """

    def row(r: dict[str, str]) -> tuple[float, str | None]:
        try:
            t = float(r["arrival_s"])
        except ValueError:
            raise ValueError(f"arrival_s {r['arrival_s']!r} is not a number") from None
        if not math.isfinite(t):
            raise ValueError(f"arrival_s must be finite, got {t}")
        return t, r.get("workflow") or None

    try:
        rows = read_rows(path, row, InvalidInputError, required=("arrival_s",))
    except OSError as exc:
        raise InvalidInputError(f"cannot read the trace file {path!r}: {exc}") from exc
    if len(rows) < 2:
        raise InvalidInputError(f"{path}: needs at least two arrivals, has {len(rows)}")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    if rows[-1][0] == t0:  # no span: no rate to replay it at (a zero division further on)
        raise InvalidInputError(
            f"{path}: all {len(rows)} arrivals are at {t0:g} s; a trace needs arrivals at two or more times"
        )
    return tuple(t - t0 for t, _ in rows), tuple(n for _, n in rows)


def csv_trace_rate(path: str) -> tuple[int, float]:
    """A user's CSV trace's rows and its own mean rate (requests/s): ``rate_per_s`` that replays it in real time.

    The rate is the rows over the trace's span plus one mean gap (the cycle the
    replay repeats). With ``start_s=0`` and this rate, arrivals fall at the
    file's own times, from its first row.
    """
    times, _ = _user_csv(path)
    n = len(times)
    return n, n / (times[-1] + times[-1] / (n - 1))


def _compressed(
    times_s: Sequence[float],
    rate_per_s: float,
    duration_ms: float,
    start_s: float | None,
    rng: random.Random,
    jitter_s: float,
) -> list[tuple[float, int]]:
    """Trace times compressed to ``rate_per_s``, from ``start_s`` on, repeating the trace as needed.

    Returns ``(arrival_ms, index into times_s)`` pairs (not sorted when jittered).
    """
    n = len(times_s)
    # One cycle lasts the trace's span plus one mean gap, so a repeat neither overlaps nor leaves a hole.
    span = times_s[-1] + (times_s[-1] / (n - 1) if n > 1 else 1.0)
    factor = rate_per_s / (n / span)  # trace seconds per run second
    start = rng.uniform(0.0, span) if start_s is None else start_s % span
    i = next((k for k, t in enumerate(times_s) if t >= start), n)
    cycle = 0
    out: list[tuple[float, int]] = []
    limit_s = duration_ms / 1000.0 * factor  # trace seconds the run covers
    while True:
        if i == n:
            i, cycle = 0, cycle + 1
        base = times_s[i] + cycle * span - start
        if base >= limit_s:
            return out
        t_ms = (base + (rng.random() * jitter_s if jitter_s else 0.0)) / factor * 1000.0
        if t_ms < duration_ms:
            out.append((t_ms, i))
        i += 1


def _functions(
    n_wf: int,
    weights: list[float],
    rate_per_s: float,
    duration_ms: float,
    start_s: float | None,
    minute_s: float,
    rng: random.Random,
) -> list[tuple[float, int]]:
    """Per-minute Azure Functions shapes, one function per workflow, scaled to each workflow's rate."""
    funcs = traces.http_functions()[:n_wf]
    if len(funcs) < n_wf:
        raise InvalidInputError(f"the Azure Functions sample has {len(funcs)} http functions, {n_wf} workflows asked")
    minutes = len(funcs[0].counts)
    m0 = rng.randrange(minutes) if start_s is None else int(start_s // 60) % minutes
    minute_ms = minute_s * 1000.0
    total_w = sum(weights)
    out: list[tuple[float, int]] = []
    for k, f in enumerate(funcs):
        mean_per_s = f.total / (minutes * 60.0)
        scale = rate_per_s * weights[k] / total_w / mean_per_s
        m = 0
        while m * minute_ms < duration_ms:
            t0 = m * minute_ms
            length = min(minute_ms, duration_ms - t0)
            expected = f.counts[(m0 + m) % minutes] / 60.0 * scale * (length / 1000.0)
            count = int(expected) + (1 if rng.random() < expected - int(expected) else 0)
            out.extend((t0 + rng.random() * length, k) for _ in range(count))
            m += 1
    return out
