"""Which workers a steady stage may start, and how many, from its measured rate (``stage_plan``).

ESG sizes each batch for the queue of the moment and starts a worker wherever the search finds one
cheaper; on the whole bill that leaves a stage with workers of several shares, each partly idle.
This planner holds a stage's *starts* to one kind and a count, as the rate-based baselines do, while
ESG keeps choosing batches and placements (docs/decisions/whole-bill.md, section 10):

* **the kind**: per stage, the (hardware, vCPUs, share, batch) of least price per second (shares
  for their life, vCPUs while busy) whose batch fills at the stage's rate and runs within the
  stage's part of its workflows' SLOs (split in proportion to the stages' fastest latencies) at
  utilisation ``stage_plan_utilization``; chosen from the stage's calls counted over 30 s, and
  chosen again only when that rate has moved by a quarter;
* **the count**: the workers of that kind the same counted 30 s rate needs at that utilisation,
  each round (not the queues' EWMAs: a snapshot lists only queues with calls waiting, so their sum
  swings between nothing and the clumps in which a batch's results reach the next stage);
* **the hold**: any warm worker may still serve; a new worker must be of the plan's kind and the
  stage below its count, or of any kind when the plan's kind has no room left;
* **the drain** (``stage_plan_drain``, off by default): a stage at a count of that many workers or
  more sends its batches only to idle workers of the plan's kind, waiting for one when all are
  busy, so that the warm workers of other kinds (its warm-up's, a former plan's) idle out instead of
  taking a part of its load, each partly idle. Off because once such a stage's queue backs up, ESG
  runs it in ever smaller batches, below the throughput its count was sized for, and it does not
  catch up (measured in docs/decisions/whole-bill.md, section 10);
* **the retirement** (``stage_plan_retire``, off by default): a held stage whose plan's kind holds its
  count, one of those workers idle, stops its other idle workers once they have idled ``RETIRE_IDLE_MS``,
  while the count's workers carry the stage's highest 1 s rate of the last 30 s at that utilisation or
  less. Make before break: only a stage whose plan's workers are warm, with one idle to take the next
  batch, loses the warm-up's workers of other kinds and those past its count, which otherwise keep
  taking a part of its load and never idle long enough to expire. ``stage_plan_retire_spares`` keeps that many
  of those workers, the cheapest idle ones, as spares for a clump of calls the count alone would queue;
  ``stage_plan_retire_cheap_spare`` keeps one spare of the stage's cheapest kind instead (least idle price among
  the kinds that run a call within that fraction of its budget), started as the dearer ones go: until it is
  warm, the cheapest of them stays;
* **the gate**: only while the stage looks steady (its highest 1 s count of calls over the last
  30 s at most ``stage_plan_gate`` times its 30 s mean, once it has 10 s of history). A bursty
  stage is left to ESG as it is: a fleet sized to the rate meets the next wave too small.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from esg_prefect.exceptions import MissingProfileError
from esg_prefect.model.attribution import idle_rates
from esg_prefect.model.cluster import Worker
from esg_prefect.model.config import Config
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import Snapshot
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.first_stage import Resource
from esg_prefect.scheduling.tables import CandidateTables

__all__ = ["NewCalls", "SpareKind", "StagePlan", "StagePlanner", "StartSpare", "plan_stage", "stage_budgets"]

HISTORY_MS = 30_000.0
"""How long a stage's calls are counted for its kind and its steadiness."""
PEAK_WINDOW_MS = 1_000.0
"""The window of the counts whose highest value the gate compares with the mean."""
SETTLE_MS = 10_000.0
"""History a stage needs before its plan may hold."""
REPLAN = 0.25
"""Relative change of the 30 s rate that makes the kind be chosen again."""
RETIRE_IDLE_MS = 50.0
"""How long a held stage's surplus worker idles before ``stage_plan_retire`` stops it."""
CLUMP_WINDOW_MS = 100.0
"""The window of the counts whose highest value ``stage_plan_retire_clump`` calls the stage's clump."""


@dataclass(frozen=True, slots=True)
class StagePlan:
    """A stage's planned kind, for the rate it was chosen at."""

    hardware: str
    vcpus: int
    gpu_share: float
    batch: int
    latency_ms: float
    price_per_s: float
    rate_per_s: float

    def workers(self, rate_per_s: float, rho: float) -> int:
        """Workers of this kind that carry ``rate_per_s`` at utilisation ``rho`` (at least one)."""
        return max(1, math.ceil(rate_per_s * self.latency_ms / 1000.0 / self.batch / rho))


class NewCalls:
    """Per stage, the calls that became ready since the previous round: one scan of the queues a round, which the
    stage planner and the lookahead's wave detector both read.

    A call is counted in the first round it is in a queue, the round after the instant it became ready; a
    stage's calls are merged across its workflows' queues.
    """

    def __init__(self) -> None:
        self._last_ms = -math.inf

    def take(self, snapshot: Snapshot, now_ms: float) -> dict[str, list[float]]:
        """The ready times (sorted) per stage of the waiting calls that became ready after the previous round,
        up to ``now_ms``; the next round counts from ``now_ms``."""
        last, self._last_ms = self._last_ms, now_ms
        new: dict[str, list[float]] = {}
        for q in snapshot.queues:
            new.setdefault(q.key.stage, []).extend(j.ready_ms for j in q.jobs if last < j.ready_ms <= now_ms)
        for times in new.values():
            times.sort()
        return new


def stage_budgets(
    workflows: tuple[Workflow, ...], tables: CandidateTables, hardware: frozenset[str]
) -> dict[str, float]:
    """Each stage's part of its workflows' SLOs, in proportion to the fastest latencies on the critical path
    (the least over the workflows that use it). A workflow with a stage the profile lacks is left out: its
    calls are refused by ESG_1Q, naming the stage."""
    out: dict[str, float] = {}
    for wf in workflows:
        order = wf.topological_order()
        try:
            fastest = {s: tables.min_latency_ms(s, hardware) for s in order}
        except MissingProfileError:
            continue
        path: dict[str, float] = {}
        for s in order:
            path[s] = fastest[s] + max((path[p] for p in wf.predecessors(s)), default=0.0)
        critical = max(path.values())
        for s in order:
            out[s] = min(out.get(s, math.inf), wf.slo_ms * fastest[s] / critical)
    return out


def plan_stage(
    tables: CandidateTables, stage: str, rate_per_s: float, budget_ms: float, hardware: frozenset[str], rho: float
) -> StagePlan | None:
    """The least-price kind that carries ``rate_per_s`` within ``budget_ms`` at utilisation ``rho``; None if none.

    A batch of ``b`` fits when its latency plus the time ``b`` calls take to arrive is within the
    budget; ``n`` workers carry the rate when ``rate x latency / b / n <= rho``. The price is the
    ``n`` workers' shares for their life and their vCPUs while busy.
    """
    if rate_per_s <= 0:
        return None
    prices = tables.prices
    best: tuple[float, float, StagePlan] | None = None
    for hw in sorted(hardware & tables.profile.hardware_types(stage)):
        for vcpus, share in tables.resources(hw):
            for b in tables.settings.config_space.batches:
                lat = tables.latency_ms(stage, b, vcpus, share, hw)
                if lat is None or lat + (b - 1) / rate_per_s * 1000.0 > budget_ms:
                    continue
                load = rate_per_s * lat / 1000.0 / b  # busy workers needed
                n = max(1, math.ceil(load / rho))
                price = n * share * prices.gpu_price_s(hw) + vcpus * prices.price_per_vcpu_s * load
                if best is None or (price, lat) < best[:2]:
                    best = (price, lat, StagePlan(hw, vcpus, share, b, lat, price, rate_per_s))
    return None if best is None else best[2]


class SpareKind(NamedTuple):
    """A stage's cheapest kind for a spare (``stage_plan_retire_cheap_spare``) and its price per second idle."""

    hardware: str
    vcpus: int
    gpu_share: float
    batch: int
    idle_per_s: float


StartSpare = Callable[[str, Config, str, str], None]
"""Starts a worker of (stage, config, hardware) with a reason, where it has room without stopping anyone (the
scheduler's round builds the start: :class:`~esg_prefect.scheduling.base.Start`). Nothing comes back: the planner
decides the same whether it started (its cheapest surplus stays until a start is warm, for good if none is)."""


class _Stage:
    """What the planner keeps per stage: recent calls, its plan, its count."""

    __slots__ = ("budget", "burst", "calls", "clumps", "count", "peaks", "plan", "recent", "steady")

    def __init__(self) -> None:
        self.calls: deque[float] = deque()  # ready times over the last HISTORY_MS
        self.recent: deque[float] = deque()  # ready times over the last PEAK_WINDOW_MS
        self.peaks: deque[tuple[float, int]] = deque()  # (when, 1 s count), decreasing: the window's maximum first
        self.plan: StagePlan | None = None
        self.count = 1
        self.steady = False
        self.budget = math.inf  # the stage's part of its workflows' SLOs
        self.burst: deque[float] = deque()  # ready times over the last CLUMP_WINDOW_MS (stage_plan_retire_clump)
        self.clumps: deque[tuple[float, int]] = deque()  # (when, 100 ms count), decreasing, as peaks


class StagePlanner:
    """Per-stage plans, counts and gates, updated once a round from the snapshot (module docstring)."""

    def __init__(self, tables: CandidateTables) -> None:
        self.tables = tables
        self.rho = tables.settings.stage_plan_utilization
        self.gate = tables.settings.stage_plan_gate
        self.drain = tables.settings.stage_plan_drain
        self.retire = tables.settings.stage_plan_retire
        self.spares = tables.settings.stage_plan_retire_spares
        self.clump = tables.settings.stage_plan_retire_clump
        self.cheap_spare = tables.settings.stage_plan_retire_cheap_spare
        self._spare_kinds: dict[tuple[str, float, frozenset[str]], SpareKind | None] = {}
        self._stages: dict[str, _Stage] = {}
        self._budgets: dict[tuple[tuple[Workflow, ...], frozenset[str]], dict[str, float]] = {}
        self._held: dict[tuple[tuple[Resource, ...], tuple[str, int, float], bool, bool], tuple[Resource, ...]] = {}

    def stage(self, name: str) -> _Stage | None:
        """The planner's state of stage ``name`` (None before its first call)."""
        return self._stages.get(name)

    def observe(
        self, new: Mapping[str, Sequence[float]], snapshot: Snapshot, now_ms: float, hardware: frozenset[str]
    ) -> None:
        """Count ``new``, the calls that became ready since the last round (:class:`NewCalls`); update each stage's
        plan, count and gate."""
        for name, times in new.items():
            st = self._stages.get(name)
            if st is None:
                st = self._stages[name] = _Stage()
            st.calls.extend(times)
            st.recent.extend(times)
            if self.clump:
                st.burst.extend(times)
        workflows = tuple(snapshot.workflows.values())  # the core's dict: the same order every round
        budgets = self._budgets.get((workflows, hardware))
        if budgets is None:
            budgets = self._budgets[(workflows, hardware)] = stage_budgets(workflows, self.tables, hardware)
        for name, st in self._stages.items():
            self._update(name, st, now_ms, budgets, hardware)

    def _update(
        self, name: str, st: _Stage, now_ms: float, budgets: dict[str, float], hardware: frozenset[str]
    ) -> None:
        calls, peaks = st.calls, st.peaks
        while calls and calls[0] < now_ms - HISTORY_MS:
            calls.popleft()
        _window_max(st.recent, peaks, now_ms, PEAK_WINDOW_MS)
        if self.clump:
            _window_max(st.burst, st.clumps, now_ms, CLUMP_WINDOW_MS)
        span_ms = now_ms - calls[0] if calls else 0.0
        mean = len(calls) / span_ms * 1000.0 if span_ms > 0 else 0.0
        peak = peaks[0][1] / PEAK_WINDOW_MS * 1000.0
        st.steady = span_ms >= SETTLE_MS and peak <= self.gate * mean
        if not st.steady or name not in budgets:
            return
        st.budget = budgets[name]
        if st.plan is None or abs(mean - st.plan.rate_per_s) > REPLAN * st.plan.rate_per_s:
            st.plan = plan_stage(self.tables, name, mean, budgets[name], hardware, self.rho) or st.plan
        if st.plan is not None:
            st.count = st.plan.workers(mean, self.rho)

    def restrict(self, stage: str, resources: tuple[Resource, ...], view: ClusterView) -> tuple[Resource, ...]:
        """``resources`` with the stage's hold applied: any warm one; a cold one only of the plan's kind below the
        count, or of any kind when the plan's kind has no room (all of them when the stage is not held); at a count
        of ``stage_plan_drain`` or more, only the plan's kind's warm ones (none: the queue waits)."""
        st = self._stages.get(stage)
        if st is None or not st.steady or st.plan is None:
            return resources
        p = st.plan
        kind = (p.hardware, p.vcpus, p.gpu_share)
        full = view.workers_of_kind(stage, *kind) >= st.count
        drain = full and 0 < self.drain <= st.count
        # The same answer object for the same inputs: ESG_1Q keeps a queue's answer while its
        # resources are the same object (scheduling.kept), and the same few recur round after round.
        key = (resources, kind, full, drain)
        got = self._held.get(key)
        if got is None:
            if len(self._held) > 4096:
                self._held.clear()
            if drain:
                got = tuple(r for r in resources if r[3] and r[:3] == kind)
            elif full:
                got = tuple(r for r in resources if r[3])
            elif any(not r[3] and r[:3] == kind for r in resources):
                got = tuple(r for r in resources if r[3] or r[:3] == kind)
            else:
                got = resources  # the plan's kind has no room: any kind, as ESG chooses
            self._held[key] = got
        return got

    def surplus(self, view: ClusterView, now_ms: float, start: StartSpare | None = None) -> tuple[str, ...]:
        """The idle workers ``stage_plan_retire`` stops this round (module docstring); () when it is off.

        Per held stage: its workers of the plan's kind, busy ones first and then idle ones most recently idle
        first (the placement reuses those), make its count; when they number the count and one of them is
        idle, and the count carries the stage's peak 1 s rate at the setting's utilisation, the stage's other
        idle workers that have idled ``RETIRE_IDLE_MS`` or more go. ``view``: after the round's commits.
        ``start(stage, config, hardware, reason)``: starts a worker (``stage_plan_retire_cheap_spare``) where
        there is room.
        """
        if self.retire <= 0:
            return ()
        out: list[str] = []
        for name, st in self._stages.items():
            p = st.plan
            if not st.steady or p is None or not st.peaks:
                continue
            peak = st.peaks[0][1] / PEAK_WINDOW_MS * 1000.0
            if peak * p.latency_ms / 1000.0 / p.batch > self.retire * st.count:
                continue
            kind = (p.hardware, p.vcpus, p.gpu_share)
            busy = sum(1 for w in view.busy_by_stage.get(name, ()) if not w.starting and _kind(w) == kind)
            busy += sum(1 for w in view.taken(name) if _kind(w) == kind)
            idle = view.idle_of_stage(name)
            mine = sorted(
                (w for w in idle if _kind(w) == kind and not w.starting),
                key=_recent_first,
            )
            keep = st.count - busy
            if keep < 1 or len(mine) < keep:
                continue  # the count is not warm, or none of it is idle: nothing goes
            kept = {w.worker_id for w in mine[:keep]}
            n = self.spares
            if self.cheap_spare:
                n += self._cheap_spare(name, st, view, idle, kept, now_ms, start)
            spares = self.spare_workers(idle, kept, n) if n else []
            if self.clump:
                kinds = Counter(_kind(w) for w in spares)
                kinds[kind] += st.count
                if not self._absorbs(name, st, kinds):
                    continue  # the count and the spares would not serve the stage's clump within its budget
            kept.update(w.worker_id for w in spares)
            for w in idle:
                since = w.idle_since_ms
                if w.worker_id in kept or w.starting or w.fresh or since is None or now_ms - since < RETIRE_IDLE_MS:
                    continue
                out.append(w.worker_id)
        return tuple(out)

    def spare_kind(self, stage: str, within_ms: float, hardware: frozenset[str]) -> SpareKind | None:
        """The stage's cheapest kind for a spare: of its (hardware, vCPUs, share) that run a batch of the space's
        smallest size within ``within_ms``, the least price per second idle (``idle_rates``), then per second busy,
        then the fastest, on the round's ``hardware``; None if none. Kept per (stage, bound, hardware)."""
        key = (stage, within_ms, hardware)
        if key in self._spare_kinds:
            return self._spare_kinds[key]
        tables, held = self.tables, self.tables.settings.idle_vcpus
        b = min(tables.settings.config_space.batches)
        best: tuple[float, float, float, SpareKind] | None = None
        for hw in sorted(hardware & tables.profile.hardware_types(stage)):
            for vcpus, share in tables.resources(hw):
                lat = tables.latency_ms(stage, b, vcpus, share, hw)
                if lat is None or lat > within_ms:
                    continue
                idle_s = idle_rates(tables.prices, vcpus, share, hw, held)[1]
                rank = (idle_s, tables.prices.rate_per_s(vcpus, share, hw), lat)
                if best is None or rank < best[:3]:
                    best = (*rank, SpareKind(hw, vcpus, share, b, idle_s))
        got = self._spare_kinds[key] = None if best is None else best[3]
        return got

    def _cheap_spare(
        self,
        name: str,
        st: _Stage,
        view: ClusterView,
        idle: Sequence[Worker],
        kept: set[str],
        now_ms: float,
        start: StartSpare | None,
    ) -> int:
        """``stage_plan_retire_cheap_spare`` for one stage whose count ``kept`` holds: 0 when it holds a spare of
        its cheapest kind (an idle one no dearer idle and fast enough, added to ``kept``, or a busy one outside the
        count), 1 when one of those is starting or is asked for now (make before break: the cheapest of the others
        stays until it is warm, and for good where no start has room), 0 when nothing would go or no kind fits."""
        within = self.cheap_spare * st.budget
        kind = self.spare_kind(name, within, view.hardware)
        if kind is None:
            return 0
        tables, held = self.tables, self.tables.settings.idle_vcpus

        def cheap(w: Worker) -> bool:
            """No dearer idle than the cheapest kind, and as fast as a spare must be (a cheaper, slower one is not)."""
            if idle_rates(tables.prices, w.vcpus, w.gpu_share, w.hardware, held)[1] > kind.idle_per_s * (1 + 1e-9):
                return False
            lat = tables.latency_ms(name, kind.batch, w.vcpus, w.gpu_share, w.hardware)
            return lat is not None and lat <= within

        others = [w for w in idle if w.worker_id not in kept and not w.starting]
        found = sorted(
            (w for w in others if cheap(w)),
            key=_recent_first,
        )
        if found:
            kept.add(found[0].worker_id)
            return 0
        plan = st.plan
        count_kind = None if plan is None else (plan.hardware, plan.vcpus, plan.gpu_share)
        working = [*view.busy_by_stage.get(name, ()), *view.taken(name)]
        if any(not w.starting and _kind(w) != count_kind and cheap(w) for w in working):
            return 0  # a spare of the cheap kind outside the count is running a batch
        if any(w.starting for w in working):
            return 1  # one start of a stage at a time; the cheapest surplus stays meanwhile
        due = [w for w in others if not w.fresh and now_ms - (w.idle_since_ms or now_ms) >= RETIRE_IDLE_MS]
        if not due:
            return 0
        if start is not None:
            cfg = Config(kind.batch, kind.vcpus, kind.gpu_share)
            start(name, cfg, kind.hardware, f"cheap spare: {kind.hardware} share {kind.gpu_share} as the surplus goes")
        return 1

    def spare_workers(self, idle: Sequence[Worker], kept: set[str], n: int) -> list[Worker]:
        """Of a stage's ``idle`` workers outside its count (``kept``), the ``n`` spares the retirement keeps: least
        price per second idle first (``idle_rates``, the one rule of idle prices), then the most recently idle (the
        warmer, which the placement reuses first), then by id. Workers still starting or fresh are not among them
        (never stopped)."""
        prices, held = self.tables.prices, self.tables.settings.idle_vcpus
        others = [w for w in idle if w.worker_id not in kept and not w.starting and not w.fresh]
        others.sort(
            key=lambda w: (
                idle_rates(prices, w.vcpus, w.gpu_share, w.hardware, held)[1],
                prices.rate_per_s(w.vcpus, w.gpu_share, w.hardware),
                -(w.idle_since_ms or 0.0),
                w.worker_id,
            )
        )
        return others[:n]

    def _absorbs(self, stage: str, st: _Stage, kinds: Mapping[tuple[str, int, float], int]) -> bool:
        """Whether workers of ``kinds`` (kind -> how many) serve the stage's largest 100 ms clump of the last 30 s
        within its budget, each running back-to-back batches of one size (the size that serves the most calls in
        the budget). Each distinct kind's best size is found once, however many workers share it."""
        if not st.clumps:
            return True
        room = 0
        for (hw, vcpus, share), n in kinds.items():
            best = 0
            for b in self.tables.settings.config_space.batches:
                lat = self.tables.latency_ms(stage, b, vcpus, share, hw)
                if lat is not None and 0 < lat <= st.budget:
                    best = max(best, int(st.budget // lat) * b)
            room += n * best
        return room >= st.clumps[0][1]


def _recent_first(w: Worker) -> tuple[float, str]:
    """Sort key: fresh workers first, then the most recently idle (the warmer, which the placement reuses first)."""
    return (-(math.inf if w.fresh else (w.idle_since_ms or 0.0)), w.worker_id)


def _kind(w: Worker) -> tuple[str, int, float]:
    return (w.hardware, w.vcpus, w.gpu_share)


def _window_max(times: deque[float], maxima: deque[tuple[float, int]], now_ms: float, window_ms: float) -> None:
    """Drop ``times`` older than ``window_ms`` and record their count in ``maxima``, a decreasing deque of the
    counts of the last HISTORY_MS whose first entry is their highest."""
    while times and times[0] < now_ms - window_ms:
        times.popleft()
    while maxima and maxima[-1][1] <= len(times):
        maxima.pop()
    maxima.append((now_ms, len(times)))
    while maxima[0][0] < now_ms - HISTORY_MS:
        maxima.popleft()
