"""Keep-alive from measured idle gaps: the hybrid-histogram policy, per stage.

A fixed keep-alive bills every worker that stops being needed for the whole
window. Shahrad et al. ("Serverless in the Wild", ATC '20) instead keep a
function warm for a high percentile of its measured idle times, and fall back
to the fixed window while the histogram holds too few of them. Here the idle
times are the gaps between a stage's batches on a warm worker (a gap ends when
the worker is reused), kept per stage in a histogram with logarithmic bins
(one decade in :data:`BINS_PER_DECADE` bins) whose counts halve when they pass
a cap, so that it follows a changing load. A worker that goes idle is kept for
the gaps' percentile times ``1 + margin``, at least ``floor_cold_starts`` of
its stage's cold starts (ski rental: idling that long costs about what a
restart does, counting the SLO slack a cold start on a request's path takes)
and 1 s, and at most the platform's fixed keep-alive for its hardware.

A stage's last worker keeps the fixed window (the fleet sees to it): a burst
after a lull finds it warm.

With the placement's most-recently-idle-first reuse, load gathers on few
workers: their gaps are short and they stay, while a worker only a burst
needed sees no reuse and expires after the percentile instead of the window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from esg_prefect.exceptions import ConfigError
from esg_prefect.scheduling.settings import PlatformSettings
from esg_prefect.scheduling.waves import LULL_MS, Waves

BINS_PER_DECADE = 8
_LOW_MS = 1.0  # gaps below 1 ms fall in the first bin
_DECADES = 7  # up to 10^7 ms (about 2.8 hours); longer gaps fall in the last bin
_BINS = BINS_PER_DECADE * _DECADES
LULL_RESTARTS = 2.0
"""A wavy stage's surplus worker idles at least this many of its cold starts before it goes: ski rental's
break-even (idling one cold start costs what a restart does) with a margin for the restart's wait."""
SCALE_DOWN_WINDOW_MS = 5000.0
"""Time constant of the busy-worker average that scale-down sizes a stage by."""


@dataclass(frozen=True, slots=True)
class GapPolicy:
    """The knobs of :class:`AdaptiveKeepAlive`.

    Attributes:
        percentile: which percentile of the measured gaps to keep a worker for (0-100).
        percentile_waves: the percentile instead while the worker's stage's calls come in waves
            (:class:`~esg_prefect.scheduling.waves.Waves`).
        margin: extra fraction on top of that percentile.
        floor_cold_starts: the least keep-alive, in cold starts of the worker's stage on its hardware.
        min_ms: the least keep-alive whatever the cold start (a profile without cold starts reads 0).
        min_samples: gaps a stage needs before its histogram is used (the fixed window until then).
        worker_samples: gaps a worker needs before its own histogram counts too.
        cap: count at which a stage's histogram halves (how much history it weighs).
    """

    percentile: float = 99.0
    percentile_waves: float = 99.0
    margin: float = 0.1
    floor_cold_starts: float = 20.0
    min_ms: float = 1000.0
    min_samples: int = 20
    worker_samples: int = 5
    cap: int = 1000

    def __post_init__(self) -> None:
        if not (0.0 < self.percentile <= 100.0):
            raise ConfigError(f"keep-alive percentile must be in (0, 100], got {self.percentile!r}")
        if not (0.0 < self.percentile_waves <= 100.0):
            raise ConfigError(f"keep-alive percentile in waves must be in (0, 100], got {self.percentile_waves!r}")
        if not (math.isfinite(self.margin) and self.margin >= 0.0):
            raise ConfigError(f"keep-alive margin must be a finite number >= 0, got {self.margin!r}")
        if not (math.isfinite(self.floor_cold_starts) and self.floor_cold_starts >= 0.0):
            raise ConfigError(f"keep-alive floor must be a finite number >= 0, got {self.floor_cold_starts!r}")
        if self.min_samples < 1 or self.worker_samples < 1 or self.cap < 2 * self.min_samples:
            raise ConfigError(
                f"keep-alive histogram needs min_samples >= 1, worker_samples >= 1 and cap >= 2 * min_samples, "
                f"got {self.min_samples!r}, {self.worker_samples!r}, {self.cap!r}"
            )


def _bin(gap_ms: float) -> int:
    if gap_ms <= _LOW_MS:
        return 0
    return min(_BINS - 1, int(math.log10(gap_ms / _LOW_MS) * BINS_PER_DECADE))


def _upper_edge(i: int) -> float:
    return float(_LOW_MS * 10.0 ** ((i + 1) / BINS_PER_DECADE))


class GapHistogram:
    """Idle gaps in logarithmic bins, halved at a cap; percentiles read as a bin's upper edge."""

    __slots__ = ("cap", "counts", "total")

    def __init__(self, cap: int) -> None:
        self.counts = [0.0] * _BINS
        self.total = 0.0
        self.cap = cap

    def add(self, gap_ms: float) -> None:
        """Count one gap; halve every count once the total reaches the cap."""
        self.counts[_bin(gap_ms)] += 1.0
        self.total += 1.0
        if self.total >= self.cap:
            self.counts = [c / 2.0 for c in self.counts]
            self.total /= 2.0

    def percentile(self, p: float) -> float:
        """The upper edge of the bin holding the ``p``-th percentile (ms); 0 when empty."""
        if self.total <= 0.0:
            return 0.0
        want = self.total * p / 100.0
        seen = 0.0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= want - 1e-9:
                return _upper_edge(i)
        return _upper_edge(_BINS - 1)


def adaptive_keep_alive(
    settings: PlatformSettings, cold_start_ms: Callable[[str, str], float]
) -> AdaptiveKeepAlive | None:
    """The policy the platform settings ask for, with the stages' cold starts; None for the fixed window."""
    if settings.keep_alive_policy == "fixed":
        return None
    policy = GapPolicy(
        percentile=settings.keep_alive_percentile,
        percentile_waves=settings.keep_alive_percentile_waves,
        floor_cold_starts=settings.keep_alive_cold_starts,
    )
    return AdaptiveKeepAlive(policy, cold_start_ms)


class AdaptiveKeepAlive:
    """Per-stage and per-worker gap histograms, and the keep-alive they give a worker going idle.

    A worker is kept for the larger of its stage's percentile and, once it has
    gaps enough of its own, its own: a worker that bursts need every few
    seconds keeps its place, one they needed once expires at the stage's pace.
    """

    def __init__(
        self, policy: GapPolicy | None = None, cold_start_ms: Callable[[str, str], float] | None = None
    ) -> None:
        self.policy = policy or GapPolicy()
        self.cold_start_ms = cold_start_ms
        self._stages: dict[str, GapHistogram] = {}
        self._workers: dict[str, GapHistogram] = {}
        self.waves = Waves()  # fed the stages' calls by the control core

    def observe(self, stage: str, gap_ms: float, worker_id: str | None = None) -> bool:
        """A warm worker of ``stage`` was reused after ``gap_ms`` idle; True when that made its histogram usable."""
        p = self.policy
        h = self._stages.get(stage)
        if h is None:
            h = self._stages[stage] = GapHistogram(p.cap)
        before = h.total
        gap = max(0.0, gap_ms)
        h.add(gap)
        if worker_id is not None:
            mine = self._workers.get(worker_id)
            if mine is None:
                mine = self._workers[worker_id] = GapHistogram(2 * p.min_samples)
            mine.add(gap)
        return before < p.min_samples <= h.total

    def forget(self, worker_id: str) -> None:
        """A worker is gone: drop its histogram."""
        self._workers.pop(worker_id, None)

    def keep_alive_ms(self, stage: str, fixed_ms: float, worker_id: str | None = None, hardware: str = "cpu") -> float:
        """How long a worker of ``stage`` going idle now is kept; ``fixed_ms`` while its stage's gaps are few."""
        h = self._stages.get(stage)
        p = self.policy
        if h is None or h.total < p.min_samples:
            return fixed_ms
        pct = p.percentile_waves if self.waves.in_waves(stage) else p.percentile
        gap = h.percentile(pct)
        mine = self._workers.get(worker_id) if worker_id is not None else None
        if mine is not None and mine.total >= p.worker_samples:
            gap = max(gap, mine.percentile(pct))
        return min(fixed_ms, max(self.floor_ms(stage, hardware), gap * (1.0 + p.margin)))

    def lull_ms(self, stage: str, hardware: str) -> float:
        """How long a wavy stage's surplus worker idles before it goes (``scale_down_waves``): a lull and the margin,
        and never less than :data:`LULL_RESTARTS` of its cold starts (stopping sooner costs more than it saves)."""
        restart = 0.0 if self.cold_start_ms is None else LULL_RESTARTS * self.cold_start_ms(stage, hardware)
        return max(LULL_MS * (1.0 + self.policy.margin), restart)

    def floor_ms(self, stage: str, hardware: str) -> float:
        """The least keep-alive of a worker of ``stage`` on ``hardware``."""
        p = self.policy
        if self.cold_start_ms is None:
            return p.min_ms
        return max(p.min_ms, p.floor_cold_starts * self.cold_start_ms(stage, hardware))


class BusyAverage:
    """Per stage, the number of its busy workers averaged over time (an exponential window of ``window_ms``).

    The load a stage's workers carry, measured rather than predicted: the
    platform keeps as many workers as it needs at a target utilisation and
    lets the rest expire (``Fleet``'s scale-down), as Knative's autoscaler
    sizes a revision by its observed concurrency.
    """

    __slots__ = ("_busy", "_last", "_value", "window_ms")

    def __init__(self, window_ms: float) -> None:
        self.window_ms = window_ms
        self._busy: dict[str, int] = {}
        self._value: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def _advance(self, stage: str, now_ms: float) -> float:
        last = self._last.get(stage)
        busy = self._busy.get(stage, 0)
        v = self._value.get(stage, 0.0)
        if last is not None and now_ms > last:
            v = busy + (v - busy) * math.exp(-(now_ms - last) / self.window_ms)
            self._value[stage] = v
            self._last[stage] = now_ms
        elif last is None:
            self._last[stage] = now_ms
        return v

    def change(self, stage: str, now_ms: float, delta: int) -> None:
        """``delta`` workers of ``stage`` went busy (+) or idle (-) at ``now_ms`` (earlier times count as the last)."""
        self._advance(stage, now_ms)
        self._busy[stage] = max(0, self._busy.get(stage, 0) + delta)

    def value(self, stage: str, now_ms: float) -> float:
        """The average up to ``now_ms``."""
        return self._advance(stage, now_ms)

    def last_ms(self, stage: str) -> float:
        """When the stage last changed (0 if never)."""
        return self._last.get(stage, 0.0)
