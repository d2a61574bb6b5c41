"""Which stages' calls come in waves: bursts apart by lulls, as on the Azure LLM code trace.

Three policies read it. ESG's lookahead starts the next stages' workers as a wave's batch goes out
(:class:`~esg_prefect.scheduling.esg_round.Lookahead`); the platform's keep-alive then lets a wavy
stage's idle workers go at a lower percentile of its gaps (``keep_alive_percentile_waves``,
:mod:`~esg_prefect.control.keepalive`), and those its load no longer needs once idle for a lull
(``scale_down_waves``, :class:`~esg_prefect.control.fleet.Fleet`). A steady stage keeps all three as
they were: its calls never pause for ``LULL_MS``. ESG and the platform feed it the same calls (their
ready times, in order), so they agree.
"""

from __future__ import annotations

from collections import deque

__all__ = ["LULL_MS", "WAVE_HISTORY_MS", "WAVE_SETTLE_MS", "WAVE_SHARE", "Waves"]

LULL_MS = 400.0
"""A silence of a stage's calls at least this long is a lull (within a wave of the code trace the gaps stay
under it; between waves they are 0.5-4 s; the steady traces' stages never pause that long)."""
WAVE_SHARE = 0.1
"""A stage's calls come in waves when its lulls fill at least this share of its recent history."""
WAVE_HISTORY_MS = 30_000.0
"""How far back, from its latest call, a stage's lulls are counted."""
WAVE_SETTLE_MS = 2_000.0
"""History a stage needs before its calls can be said to come in waves."""


class Waves:
    """Per stage, its first and latest call and the lulls of its last ``WAVE_HISTORY_MS`` (module docstring)."""

    __slots__ = ("_first", "_latest", "_lulls")

    def __init__(self) -> None:
        self._first: dict[str, float] = {}
        self._latest: dict[str, float] = {}
        self._lulls: dict[str, deque[tuple[float, float]]] = {}  # (end, length), oldest first

    def observe(self, stage: str, ready_ms: float) -> None:
        """A call of ``stage`` became ready at ``ready_ms`` (calls of a stage in time order; an earlier one is
        counted as arriving with the latest)."""
        latest = self._latest.get(stage)
        if latest is None:
            self._first[stage] = self._latest[stage] = ready_ms
            return
        if ready_ms - latest >= LULL_MS:
            lulls = self._lulls.get(stage)
            if lulls is None:
                lulls = self._lulls[stage] = deque()
            lulls.append((ready_ms, ready_ms - latest))
            while lulls[0][0] < ready_ms - WAVE_HISTORY_MS:
                lulls.popleft()
        if ready_ms > latest:
            self._latest[stage] = ready_ms

    def in_waves(self, stage: str) -> bool:
        """Whether ``stage``'s lulls fill ``WAVE_SHARE`` of the ``WAVE_HISTORY_MS`` before its latest call (False
        before ``WAVE_SETTLE_MS`` of history)."""
        lulls = self._lulls.get(stage)
        if not lulls:
            return False
        latest = self._latest[stage]
        span = min(WAVE_HISTORY_MS, latest - self._first[stage])
        if span < WAVE_SETTLE_MS:
            return False
        start = latest - WAVE_HISTORY_MS
        return sum(g for end, g in lulls if end >= start) >= WAVE_SHARE * span
