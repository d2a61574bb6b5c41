"""The simulated cluster: the control core's fleet, plus service times and GPU interference.

Worker bookkeeping, capacity, keep-alive and billing are the fleet's
(:class:`~esg_prefect.control.fleet.Fleet`, the same code the runtime pool
runs); this module adds only what a real platform would measure instead: how
long a batch takes. Service time of a batch (ESG-SPEC section 2, plus what the
profile leaves out)::

    cold start (if a new worker)  +  input transfer (if any input is on another node)
      +  L(stage, config, hardware) * (1 + interference * other busy workers on the GPU)

where ``L`` is drawn per :class:`~esg_prefect.simulator.case.SimSpec`
``service_time`` (log-normal with the profile's mean and p95 by default).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from esg_prefect.control.fleet import Fleet
from esg_prefect.control.worker import FleetWorker
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.model.config import Config
from esg_prefect.model.interference import CoRunModel
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.unchecked import unchecked
from esg_prefect.simulator.case import ClusterSpec, SimSpec

_Z95 = 1.6448536269514722  # standard normal 95th percentile


def lognormal_params(mean_ms: float, p95_ms: float | None) -> tuple[float, float] | None:
    """``(mu, sigma)`` of a log-normal with this mean and 95th percentile; None for a fixed value.

    ``mean = exp(mu + sigma^2 / 2)`` and ``p95 = exp(mu + z95 * sigma)`` give
    ``sigma^2 / 2 - z95 * sigma + ln(p95 / mean) = 0``; the smaller root is
    taken. A p95 at or below the mean (or none) means no spread.

    Examples:
        >>> mu, sigma = lognormal_params(10.0, 12.0)
        >>> round(math.exp(mu + sigma * sigma / 2), 9), round(math.exp(mu + 1.6448536269514722 * sigma), 9)
        (10.0, 12.0)
    """
    if p95_ms is None or p95_ms <= mean_ms:
        return None
    d = math.log(p95_ms / mean_ms)
    disc = _Z95 * _Z95 - 2.0 * d
    sigma = _Z95 - math.sqrt(disc) if disc > 0 else _Z95
    return math.log(mean_ms) - sigma * sigma / 2.0, sigma


SimWorker = FleetWorker  # the simulator's name for the fleet's worker


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """How long a dispatched batch takes, in parts."""

    cold_start_ms: float
    transfer_ms: float
    exec_ms: float

    @property
    def total_ms(self) -> float:
        """Dispatch to end."""
        return self.cold_start_ms + self.transfer_ms + self.exec_ms


_batch_timing = unchecked(BatchTiming)


class SimCluster(Fleet):
    """The fleet of a simulated cluster, with service times and GPU interference.

    Args:
        spec: the cluster.
        profile: the latency model (service times and cold starts).
        sim: platform behaviour (noise, interference, network).
        keep_alive_ms: how long an idle worker is kept.
        rng: the run's service-time random source.
        keep_alive_scales: per hardware type, the fraction of ``keep_alive_ms`` its
            idle workers get (``ESGSettings.keep_alive_by_price``); None: all of it.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        profile: LatencyProfile,
        sim: SimSpec,
        keep_alive_ms: float,
        rng: random.Random,
        keep_alive_scales: Mapping[str, float] | None = None,
    ) -> None:
        base = spec.snapshot()
        super().__init__(base.nodes, base.devices, keep_alive_ms, keep_alive_scales)
        self.profile = profile
        self.sim = sim
        self.rng = rng
        self._busy_on_device: dict[str, int] = {d: 0 for d in self.devices}
        self._lat: dict[tuple[str, str, int, int, float], tuple[float, tuple[float, float] | None]] = {}
        # PALDIA's co-run model, only where the case uses one (SimSpec.corun): otherwise the linear
        # interference_per_corunner, so that runs without it are unchanged.
        self._corun = CoRunModel.load(sim.corun) if sim.corun is not None else None

    def timing(
        self,
        w: SimWorker,
        stage: str,
        config: Config,
        cold: bool,
        remote_inputs: int,
        item_sizes: Sequence[float] | None = None,
    ) -> BatchTiming:
        """Service time of a batch about to start on ``w`` (draws from the run's RNG).

        ``item_sizes`` (the jobs' input sizes) rescale the profile's time by its
        size model (:meth:`LatencyProfile.size_factor`) where it has one: the
        simulated platform's truth for inputs of varied size, whether or not
        the scheduler plans with it.

        Raises:
            InvalidInputError: when the profile does not cover the configuration.
        """
        key = (stage, w.hardware, config.batch, config.vcpus, config.gpu_share)
        entry = self._lat.get(key)
        if entry is None:
            mean = self.profile.try_latency_ms(stage, config, w.hardware, "mean")
            if mean is None:
                raise InvalidInputError(f"dispatch of {stage} with {config} on {w.hardware}: no profile covers it")
            p95 = self.profile.try_latency_ms(stage, config, w.hardware, "p95")
            entry = (mean, lognormal_params(mean, p95))
            if self.sim.service_time == "p95":
                entry = (p95 if p95 is not None else mean, None)
            elif self.sim.service_time == "mean":
                entry = (mean, None)
            self._lat[key] = entry
        value, params = entry
        if params is not None:
            value = math.exp(params[0] + params[1] * self.rng.gauss(0.0, 1.0))
        if item_sizes:
            value *= self.profile.size_factor(stage, config, w.hardware, item_sizes)
        if w.device_id is not None:
            others = self._busy_on_device[w.device_id]
            if self._corun is not None:
                value *= self._corun.slowdown(stage, w.hardware, others)
            else:
                value *= 1.0 + self.sim.interference_per_corunner * others
        cold_ms = self.profile.cold_start_ms(stage, w.hardware) if cold else 0.0
        transfer = 0.0
        if remote_inputs:
            kbits = remote_inputs * self.sim.payload_kb * 8.192  # 1 KB = 8.192 kbit
            transfer = self.sim.network_latency_ms + kbits / (self.sim.network_gbps * 1000.0)
        return _batch_timing(cold_ms, transfer, value)

    def begin(self, w: SimWorker) -> None:
        """Count ``w`` as busy on its GPU (for interference)."""
        if w.device_id is not None:
            self._busy_on_device[w.device_id] += 1

    def end(self, w: SimWorker) -> None:
        """``w``'s batch ended: it no longer slows its GPU's other workers."""
        if w.device_id is not None:
            self._busy_on_device[w.device_id] -= 1
