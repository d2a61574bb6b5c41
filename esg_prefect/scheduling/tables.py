"""Precomputed candidate tables: what each stage's configurations cost and take.

The latency model and the price sheet change rarely; the scheduler asks the
same questions every few milliseconds. This module answers them from caches
keyed by (stage, hardware types present): Pareto-pruned options per stage,
minimum latencies, SLO distributions, search horizons and suffix frontiers.
It is shared by ESG and the baselines, and by the runtime and the simulator to
compute the deadlines jobs carry, so that all agree. The first stage's
building blocks (resources, gap classes, wait groups) are in
:mod:`~esg_prefect.scheduling.first_stage`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from esg_prefect.exceptions import MissingProfileError
from esg_prefect.model.config import CPU, Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile
from esg_prefect.model.slo import SLODistribution, critical_path
from esg_prefect.model.unchecked import unchecked
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.first_stage import GAP_UNIT_MS as GAP_UNIT_MS
from esg_prefect.scheduling.first_stage import FirstPick as FirstPick
from esg_prefect.scheduling.first_stage import Resource as Resource
from esg_prefect.scheduling.first_stage import _Entry, _FirstParts, _prune_entries, _wait_groups
from esg_prefect.scheduling.first_stage import _pick as _pick
from esg_prefect.scheduling.first_stage import gap_class as gap_class
from esg_prefect.scheduling.first_stage import gap_ms as gap_ms
from esg_prefect.scheduling.frontier import Option, SuffixFrontiers, pareto_prune
from esg_prefect.scheduling.settings import ESGSettings


def to_us(ms: float) -> int:
    """Milliseconds to integer microseconds, the search's exact unit."""
    return round(ms * 1000.0)


_CACHE_LIMIT = 4096
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Choice:
    """The payload of a search option: what running it means.

    Attributes:
        stage: stage name.
        config: resources and batch size (the real size for a first stage).
        hardware: ``"cpu"`` or GPU type.
        latency_ms: predicted batch latency (cold start included if ``cold``).
        wait_ms: time to wait for the batch to fill (first stage only).
        cold: a new worker must start.
    """

    stage: str
    config: Config
    hardware: str
    latency_ms: float
    wait_ms: float = 0.0
    cold: bool = False


# Options made on every decision that waits for a batch: without the frozen __init__'s cost
# (esg_prefect.model.unchecked; neither class has checks).
_option = unchecked(Option)
_choice = unchecked(Choice)


def _waiting(o: Option, latency_us: int, cost: float, wait_ms: float) -> Option:
    """A dispatch-now option turned into one that first waits ``wait_ms`` for its batch to fill."""
    c = o.payload
    assert isinstance(c, Choice)
    return _option(latency_us, cost, _choice(c.stage, c.config, c.hardware, c.latency_ms, wait_ms, c.cold))


class CandidateTables:
    """Cached per-stage options and SLO structures for one (profile, prices, settings).

    Args:
        profile: the latency model.
        prices: the price sheet.
        settings: the ESG knobs (configuration space, percentile, horizon).
    """

    def __init__(self, profile: LatencyProfile, prices: PriceSheet, settings: ESGSettings) -> None:
        self.profile = profile
        self.prices = prices
        self.settings = settings
        self._lat_cache: dict[tuple[str, str, int, int, float], float | None] = {}
        self._configs: dict[tuple[int, int, float], Config] = {}
        self._options: dict[tuple[str, frozenset[str]], tuple[Option, ...]] = {}
        self._slo: dict[tuple[Workflow, frozenset[str]], SLODistribution] = {}
        self._suffix: dict[
            tuple[Workflow, str, frozenset[str]], tuple[tuple[str, ...], list[tuple[Option, ...]], SuffixFrontiers]
        ] = {}
        # First-stage option caches: static given (stage, batch, resources, warm flag).
        self._single: dict[tuple[str, str, int, float, int, int], Option | None] = {}
        # (stage, n, id(resources)) -> the static parts of a first stage's options (_FirstParts).
        self._parts: dict[tuple[str, int, int], _FirstParts] = {}
        # (stage, batch sizes, resource kinds) -> the cold options of those kinds, pruned (_pruned_over).
        self._cold: dict[tuple[str, tuple[int, ...], tuple[tuple[str, int, float], ...]], list[_Entry]] = {}

    # ---- latencies -------------------------------------------------------

    def latency_ms(self, stage: str, batch: int, vcpus: int, share: float, hardware: str) -> float | None:
        """Planned batch latency, or None where the profile has no cover (cached)."""
        key = (stage, hardware, batch, vcpus, share)
        got = self._lat_cache.get(key, _MISSING)
        if got is _MISSING:
            got = self._lat_cache[key] = self.profile.try_latency_ms(
                stage, self._config(batch, vcpus, share), hardware, self.settings.percentile
            )
        return got  # type: ignore[return-value]

    def sized_latency_ms(
        self, stage: str, batch: int, vcpus: int, share: float, hardware: str, size_factor: float
    ) -> float | None:
        """Planned latency of a batch whose items run ``size_factor`` times as long as typical ones.

        The factor scales the table's time only: a corrected profile's per-batch
        overhead is paid once whatever the items' size (:meth:`LatencyProfile.latency_ms`).
        """
        base = self.latency_ms(stage, batch, vcpus, share, hardware)  # cached: packing asks per batch size
        if base is None or size_factor == 1.0:
            return base
        overhead = self.profile.overhead_ms(stage, hardware)
        return (base - overhead) * size_factor + overhead

    def _config(self, batch: int, vcpus: int, share: float) -> Config:
        """``Config(batch, vcpus, share)``, one object per value (checked once; stages share them)."""
        key = (batch, vcpus, share)
        got = self._configs.get(key)
        if got is None:
            got = self._configs[key] = Config(batch, vcpus, share)
        return got

    def resources(self, hardware: str) -> Iterable[tuple[int, float]]:
        """(vcpus, share) pairs of the configuration space usable on ``hardware``."""
        space = self.settings.config_space
        for share in space.gpu_shares:
            if (share == 0.0) != (hardware == CPU):
                continue
            for v in space.vcpus:
                yield v, share

    def stage_options(self, stage: str, hardware: frozenset[str]) -> tuple[Option, ...]:
        """Pareto-pruned full-batch options of ``stage`` on the given hardware types.

        Raises:
            MissingProfileError: when no configuration of the space is covered.
        """
        key = (stage, hardware)
        cached = self._options.get(key)
        if cached is not None:
            return cached
        opts: list[Option] = []
        for hw in sorted(hardware & self.profile.hardware_types(stage)):
            for v, s in self.resources(hw):
                for b in self.settings.config_space.batches:
                    lat = self.latency_ms(stage, b, v, s, hw)
                    if lat is None:
                        continue
                    cfg = Config(b, v, s)
                    cost = self.prices.cost_per_request(cfg, hw, lat)
                    opts.append(Option(to_us(lat), cost, Choice(stage, cfg, hw, lat)))
        if not opts:
            covered = sorted(self.profile.hardware_types(stage))
            hint = (
                "measure it with `esg-prefect profile` and pass the CSV (ESGTaskRunner(profile=...), "
                "pool serve --profile)"
                if not covered
                else "widen the configuration space (docs/settings.md, config_space) or the hardware"
            )
            raise MissingProfileError(
                f"no latency profile covers stage {stage!r} on hardware {sorted(hardware)} within the "
                f"configuration space; profiled hardware for it: {covered or 'none'}; {hint}"
            )
        pruned = pareto_prune(opts)
        self._options[key] = pruned
        return pruned

    def min_latency_ms(self, stage: str, hardware: frozenset[str]) -> float:
        """Least batch latency of ``stage`` at any covered configuration."""
        return self.stage_options(stage, hardware)[0].latency_us / 1000.0

    # ---- SLO structures --------------------------------------------------

    def slo(self, workflow: Workflow, hardware: frozenset[str]) -> SLODistribution:
        """The workflow's dominator-based SLO distribution (cached)."""
        key = (workflow, hardware)
        dist = self._slo.get(key)
        if dist is None:
            mins = {s: self.min_latency_ms(s, hardware) for s in workflow.stages}
            dist = SLODistribution(workflow, mins, redistribute=self.settings.redistribute_slack)
            self._slo[key] = dist
        return dist

    def horizon(self, workflow: Workflow, stage: str, hardware: frozenset[str]) -> tuple[str, ...]:
        """Stages planned together with ``stage``: itself first, then the ones after it.

        With ``search_horizon="segment"`` these are the stages to the end of
        ``stage``'s SLO segment (in a fork-join region, the heaviest branch);
        with ``"workflow"``, the heaviest path on to the workflow's end, each
        later segment contributing its critical path.
        """
        dist = self.slo(workflow, hardware)
        seg = dist.segment_of(stage)
        path = critical_path(workflow, seg.stages, dist.min_latency_ms, start=stage)
        if self.settings.search_horizon == "segment":
            return path
        out = list(path)
        for later in dist.segments[seg.index + 1 :]:
            out.extend(critical_path(workflow, later.stages, dist.min_latency_ms))
        return tuple(out)

    def suffix(
        self, workflow: Workflow, stage: str, hardware: frozenset[str]
    ) -> tuple[tuple[str, ...], list[tuple[Option, ...]], SuffixFrontiers]:
        """Horizon after ``stage``, its stages' options and their suffix frontiers (cached)."""
        key = (workflow, stage, hardware)
        got = self._suffix.get(key)
        if got is None:
            rest = self.horizon(workflow, stage, hardware)[1:]
            opts = [self.stage_options(s, hardware) for s in rest]
            got = (rest, opts, SuffixFrontiers(opts))
            self._suffix[key] = got
        return got

    # ---- first-stage options -----------------------------------------------

    def single_option(self, stage: str, res: Resource, batch: int) -> Option | None:
        """Dispatch-now option of ``batch`` jobs on ``res`` (cold start added unless warm).

        With ``idle_aware``, a new worker's cost includes the keep-alive it idles
        through after its last batch, and a warm one's the idle gap this use
        closes (its gap class) past one cold start, at most its cold twin's extra: using a worker that
        would otherwise expire keeps it billed, while one in steady use costs its
        busy time. The idle time is priced at the worker's whole rate, though it
        is billed at its GPU share's: a weight on idle time that keeps cold
        starts off the requests' path (``docs/decisions/idle-vcpus.md``).
        """
        hw, v, share, warm = res
        key = (stage, hw, v, share, batch, warm)
        got = self._single.get(key, _MISSING)
        if got is not _MISSING:
            return got  # type: ignore[return-value]
        lat = self.latency_ms(stage, batch, v, share, hw)
        opt = None
        if lat is not None:
            cold_ms = 0.0 if warm else self.profile.cold_start_ms(stage, hw)
            busy = lat + cold_ms
            cfg = self._config(batch, v, share)
            extra = self._idle_after_ms(stage, hw)
            if warm and extra:  # the gap past one cold start (a pre-warmed worker's load is its start's cost)
                start_ms = self.profile.cold_start_ms(stage, hw)
                extra = min(max(0.0, gap_ms(warm) - start_ms), extra + start_ms)
            elif warm:
                extra = 0.0
            cost = self.prices.batch_cost(cfg, hw, busy + extra) / batch
            opt = _option(to_us(busy), cost, _choice(stage, cfg, hw, busy, 0.0, cold_ms > 0))
        self._single[key] = opt
        return opt

    def _idle_after_ms(self, stage: str, hardware: str) -> float:
        """The idle time a new worker is billed for at least once, after its last batch (``idle_aware``).

        Its keep-alive, as the platform gives it on ``hardware`` (scaled by
        price among the types the stage is profiled on, with ``keep_alive_by_price``).
        """
        s = self.settings
        if not s.idle_aware:
            return 0.0
        if s.keep_alive_policy == "histogram":  # the gaps' percentile, most often its floor once measured
            return s.keep_alive_cold_starts * self.profile.cold_start_ms(stage, hardware)
        keep = s.keep_alive_s * 1000.0
        if s.keep_alive_by_price:
            keep *= self.prices.keep_alive_scales(self.profile.hardware_types(stage)).get(hardware, 1.0)
        return keep

    def prepare(self, workflow: Workflow, hardware: frozenset[str]) -> None:
        """Build ahead the tables decisions on ``workflow`` read (e.g. when it is registered).

        Each stage's horizon tables and first-stage options at every queue
        length, every resource warm and cold; decisions build what they miss
        either way (the same values), so this only moves the one-time cost.

        Raises:
            MissingProfileError: when a stage has no profiled configuration on ``hardware``.
        """
        for stage in workflow.stages:
            self.suffix(workflow, stage, hardware)
            hws = sorted(hardware & self.profile.hardware_types(stage))
            warm = tuple((hw, v, s, True) for hw in hws for v, s in self.resources(hw))
            cold = tuple((hw, v, s, False) for hw, v, s, _ in warm)
            for n in range(1, self.settings.config_space.max_batch + 1):
                self._build_now(stage, n, cold)  # every cold option at sizes up to n, and their fronts
                for r in warm:
                    self.single_option(stage, r, n)

    def first_options(
        self, stage: str, n: int, resources: tuple[Resource, ...], rate_per_s: float
    ) -> tuple[Option, ...]:
        """Pareto-pruned first-stage options for a queue of ``n`` jobs.

        Dispatch-now options cover each batch size up to ``n`` and the whole
        queue when it is shorter than the largest batch; with
        ``wait_for_batch`` and a known arrival rate, each larger batch size is
        offered too, its latency lengthened by the projected fill time
        ``(batch - n) / rate``. Both parts come from caches, so a decision
        costs a merge of short lists.
        """
        space = self.settings.config_space
        n = min(n, space.max_batch)
        parts = self._first_parts(stage, n, resources)
        now = parts.now
        if not (self.settings.wait_for_batch and rate_per_s > 0 and n < space.max_batch):
            return now
        # A queue that keeps waiting is decided again every round with the same length, rate
        # and resources (only other queues changed): the merged list is then the same.
        merged = parts.merged
        got = merged.get(rate_per_s)
        if got is None:
            if len(merged) >= 16:
                merged.clear()  # bounded memory: a waiting queue's rate moves on, old rates do not recur
            got = merged[rate_per_s] = self._with_waits(stage, n, resources, rate_per_s, parts)
        return got

    def first_pick(
        self, stage: str, n: int, resources: tuple[Resource, ...], rate_per_s: float, slack_us: int
    ) -> FirstPick:
        """The one-stage search over :meth:`first_options`, in one pass and without building the list.

        Most queues are searched alone (the dominator split cuts chains into
        one-stage segments), and the queue's length or arrival rate has
        changed since its last decision more often than not, so the merged
        options would be built anew each time only to be scanned once. The
        answer is the same as :func:`~esg_prefect.scheduling.search.astar_plan`
        on ``[first_options(...)]``: the cheapest option within the slack (the
        last one that fits: costs fall strictly along the list), the list's
        length, how many of its options fit, and the latencies between which
        the slack can move without changing which options fit.
        """
        space = self.settings.config_space
        n = min(n, space.max_batch)
        parts = self._first_parts(stage, n, resources)
        if not (self.settings.wait_for_batch and rate_per_s > 0 and n < space.max_batch):
            return _pick(parts.now, slack_us)
        cands = self._candidates(stage, n, resources, rate_per_s, parts)
        best_cost = math.inf
        count = m = 0
        pick: tuple[int, float, int, Option, float] | None = None
        lo: float = -math.inf
        hi: float = math.inf
        for cand in cands:
            if cand[1] < best_cost:
                best_cost = cand[1]
                count += 1
                if cand[0] <= slack_us:
                    m += 1
                    pick = cand
                    lo = cand[0]
                elif hi == math.inf:
                    hi = cand[0]
        best = None
        if pick is not None:
            lat, cost, _, o, wait_ms = pick
            best = o if wait_ms == 0.0 else _waiting(o, lat, cost, wait_ms)
        return FirstPick(best, count, m, lo, hi)

    def _first_parts(self, stage: str, n: int, resources: tuple[Resource, ...]) -> _FirstParts:
        """The static parts of the first-stage options for ``n`` jobs on ``resources`` (cached).

        Keyed by the resources tuple's identity (the scheduler hands the same
        few tuples round after round; hashing one costs more than the rest of
        the lookup) and kept with the tuple itself, so a recycled ``id`` never matches.
        """
        key = (stage, n, id(resources))
        got = self._parts.get(key)
        if got is None or got.resources is not resources:
            if len(self._parts) >= _CACHE_LIMIT:
                self._parts.clear()  # bounded memory; entries are cheap to rebuild
            got = self._parts[key] = _FirstParts(resources, self._build_now(stage, n, resources))
        return got

    def _candidates(
        self, stage: str, n: int, resources: tuple[Resource, ...], rate_per_s: float, parts: _FirstParts
    ) -> list[tuple[int, float, int, Option, float]]:
        """Every first-stage candidate at ``rate_per_s`` as (latency, cost, position, option, wait), sorted.

        Everything but the waits is static given (stage, n, resources), so it
        is cached; pareto_prune's order (latency, cost, position) is the
        tuples' own, and positions are unique, so tuples never compare past them.
        """
        if parts.waits is None:
            batches = self.settings.config_space.batches
            parts.waits = _wait_groups(n, parts.now, batches, lambda b: self._pruned_over(stage, (b,), resources))
        head, groups = parts.waits
        cands = list(head)
        append = cands.append
        for more, group in groups:  # a few short groups: a plain loop beats a comprehension's set-up
            wait_ms = more / rate_per_s * 1000.0
            wait_us = round(wait_ms * 1000.0)  # to_us, inlined
            for lat, cost, idx, o in group:
                append((lat + wait_us, cost, idx, o, wait_ms))
        cands.sort()
        return cands

    def _with_waits(
        self, stage: str, n: int, resources: tuple[Resource, ...], rate_per_s: float, parts: _FirstParts
    ) -> tuple[Option, ...]:
        # The same result as pareto_prune(now + every wait option), built without making an
        # Option for the wait options that the pruning drops: only the survivors become Options.
        out: list[Option] = []
        best = math.inf
        for lat, cost, _, o, wait_ms in self._candidates(stage, n, resources, rate_per_s, parts):
            if cost < best:  # strictly cheaper than every faster-or-equal option (pareto_prune's rule)
                out.append(o if wait_ms == 0.0 else _waiting(o, lat, cost, wait_ms))
                best = cost
        return tuple(out)

    def _build_now(self, stage: str, n: int, resources: tuple[Resource, ...]) -> tuple[Option, ...]:
        sizes = tuple(sorted({b for b in self.settings.config_space.batches if b <= n} | {n}))
        return self._pruned_over(stage, sizes, resources)

    def _pruned_over(self, stage: str, sizes: tuple[int, ...], resources: tuple[Resource, ...]) -> tuple[Option, ...]:
        """``pareto_prune`` of the option of every resource at every size (resource-major): the same list.

        Resources change mostly in which few are warm. A warm option dominates
        its cold twin (no slower, no dearer, first on a tie), and pruning a
        union equals pruning one part's frontier with the other part; so the
        cold options of every kind present are pruned once per (stage, sizes,
        kinds) and each call adds the warm ones. Positions (resource, size,
        warm first) keep ``pareto_prune``'s tie-break.
        """
        kinds = tuple([r[:3] for r in resources])
        stride = self.settings.config_space.max_batch + 1  # sizes never exceed the largest batch
        if len(sizes) == 1:
            front = self._cold_front(stage, sizes[0], kinds, stride)
        else:
            key = (stage, sizes, kinds)
            got = self._cold.get(key)
            if got is None:  # the union of each size's frontier (positions do not depend on the other sizes)
                got = _prune_entries([e for b in sizes for e in self._cold_front(stage, b, kinds, stride)])
                self._keep_cold(key, got)
            front = got
        warm: list[_Entry] = []
        for i, r in enumerate(resources):
            if r[3]:
                for b in sizes:
                    o = self.single_option(stage, r, b)
                    if o is not None:
                        warm.append((o.latency_us, o.cost, 2 * (i * stride + b), o))
        if warm:
            front = _prune_entries(front + warm)
        return tuple([e[3] for e in front])

    def _cold_front(self, stage: str, b: int, kinds: tuple[tuple[str, int, float], ...], stride: int) -> list[_Entry]:
        """The pruned cold options of ``kinds`` at batch size ``b``, with their positions (cached)."""
        key = (stage, (b,), kinds)
        got = self._cold.get(key)
        if got is None:
            cold: list[_Entry] = []
            for i, (hw, v, s) in enumerate(kinds):
                o = self.single_option(stage, (hw, v, s, False), b)
                if o is not None:
                    cold.append((o.latency_us, o.cost, 2 * (i * stride + b) + 1, o))
            got = _prune_entries(cold)
            self._keep_cold(key, got)
        return got

    def _keep_cold(
        self, key: tuple[str, tuple[int, ...], tuple[tuple[str, int, float], ...]], front: list[_Entry]
    ) -> None:
        if len(self._cold) >= _CACHE_LIMIT:
            self._cold.clear()  # bounded memory; entries are cheap to rebuild
        self._cold[key] = front
