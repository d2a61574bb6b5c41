"""The arrival rate of an AFW queue, as an EWMA of inter-arrival gaps.

Both the live runtime and the simulator keep one estimator per queue and pass
``rate_per_s(now_ms)`` to the scheduler as ``QueueState.arrival_rate_per_s``
(ESG-SPEC section 3: waiting for a fuller batch uses "arrival rate from an EWMA
per queue"). They must use the same estimator, or the same case would batch
differently in the two; that is why it lives here and not in either of them.

Two details matter for pipelines:

* Downstream queues receive jobs in bursts: a batch of 8 that finishes puts 8
  jobs in the next queue at once. Such an event of ``n`` jobs after a gap
  ``g`` counts as ``n`` arrivals ``g / n`` apart, so the estimate follows the
  long-run rate instead of jumping to infinity. Observations at the same
  instant are merged into one event.
* When arrivals stop, an estimate frozen at the last event would promise jobs
  that never come; the rate reported at ``now_ms`` is therefore at most one
  arrival per time since the last one.
* When they start again after an idle spell (a gap of at least ``IDLE_MIN_MS``
  and more than ``IDLE_FACTOR`` times the estimate), that gap is not part of the
  stream: averaged in, a 40 s pause would keep the estimate at seconds for tens
  of arrivals 50 ms apart, and the burst would never be batched (seen live: two
  client processes, each starting a burst of flow runs after its warm-up call,
  had no batch in common). The estimate restarts from the next gap instead.
  (A first gap is always taken: refusing first gaps of a second or more made
  deployment runs, each a process starting a second or more after the last,
  never batch together.)
  Steady streams never see such a gap (Poisson arrivals exceed 8x their mean
  gap with probability e^-8 = 0.03 %, and only gaps of a second or more count).

Example:
    >>> est = ArrivalRateEWMA(alpha=0.5)
    >>> est.observe(0.0); est.observe(100.0)
    >>> est.rate_per_s(100.0)
    10.0
    >>> est.observe(150.0, n=2)   # two jobs 50 ms later: two gaps of 25 ms
    >>> round(est.rate_per_s(150.0), 3)   # gap estimate 0.25 * 100 + 0.75 * 25 = 43.75 ms
    22.857
"""

from __future__ import annotations

import math

from esg_prefect.exceptions import ConfigError, InvalidInputError

IDLE_FACTOR = 8.0
"""A gap this many times the estimate (and at least IDLE_MIN_MS) is an idle spell, not part of the stream."""
IDLE_MIN_MS = 1000.0


class ArrivalRateEWMA:
    """EWMA of the gaps between arrivals to one queue.

    Args:
        alpha: weight of the newest gap, in (0, 1] (``ESGSettings.rate_ewma_alpha``).

    Raises:
        ConfigError: when ``alpha`` is out of range.
    """

    __slots__ = ("_before_last", "_gap_ms", "_last_ms", "_last_n", "_prev_ms", "alpha")

    def __init__(self, alpha: float) -> None:
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
            raise ConfigError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._last_ms: float | None = None  # time of the latest event
        self._prev_ms: float | None = None  # time of the event before it
        self._last_n = 0  # jobs in the latest event
        self._gap_ms: float | None = None  # the estimate
        self._before_last: float | None = None  # the estimate before the latest event

    def observe(self, t_ms: float, n: int = 1) -> None:
        """Record ``n`` jobs arriving at ``t_ms`` (not before the previous observation).

        Raises:
            InvalidInputError: on ``n < 1`` or time going backwards.
        """
        if n < 1:
            raise InvalidInputError(f"n must be >= 1, got {n}")
        if not math.isfinite(t_ms):
            raise InvalidInputError(f"t_ms must be finite, got {t_ms!r}")
        last = self._last_ms
        if last is not None and t_ms < last:
            raise InvalidInputError(f"arrivals must be observed in time order: {t_ms} after {last}")
        if last is not None and t_ms == last:
            # Same instant: redo the latest update with the merged count.
            self._last_n += n
            self._gap_ms = self._before_last
            if self._prev_ms is not None:
                self._update(last - self._prev_ms, self._last_n)
            return
        self._prev_ms = last
        self._last_ms = t_ms
        self._last_n = n
        self._before_last = self._gap_ms
        if last is not None:
            self._update(t_ms - last, n)

    def _update(self, gap_ms: float, n: int) -> None:
        if self._gap_ms is not None and gap_ms >= IDLE_MIN_MS and gap_ms > IDLE_FACTOR * self._gap_ms:
            self._gap_ms = None  # an idle spell ended: the stream restarts with the next gap
            return
        # n arrivals g/n apart, each an EWMA step: closed form of n steps.
        keep = (1.0 - self.alpha) ** n
        sample = gap_ms / n
        self._gap_ms = sample if self._gap_ms is None else keep * self._gap_ms + (1.0 - keep) * sample

    def rate_per_s(self, now_ms: float) -> float:
        """Estimated arrivals per second at ``now_ms``; 0 until two events were seen."""
        if self._gap_ms is None or self._last_ms is None:
            return 0.0
        gap = max(self._gap_ms, now_ms - self._last_ms)
        return 1000.0 / gap if gap > 0 else 0.0
