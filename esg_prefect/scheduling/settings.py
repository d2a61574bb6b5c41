"""ESG's knobs: every choice ESG-SPEC leaves to the project, with its default.

docs/settings.md lists them, grouped by who reads them (generated from this
module by :mod:`esg_prefect.scheduling.settings_doc`). The scheduler block
(Prefect integration) mirrors this dataclass field by field and takes its
defaults from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from esg_prefect.exceptions import ConfigError, close_match
from esg_prefect.model.attribution import COST_SPLITS, IDLE_BILLINGS, CostSplit, IdleBilling
from esg_prefect.model.config import ConfigSpace

Heuristic = Literal["frontier", "min_cost"]
Horizon = Literal["segment", "workflow"]
InfeasiblePolicy = Literal["best_effort", "reject"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "heuristic": ("frontier", "min_cost"),
    "search_horizon": ("segment", "workflow"),
    "infeasible_policy": ("best_effort", "reject"),
    "percentile": ("p95", "mean"),
    "cost_split": COST_SPLITS,
    "idle_billing": IDLE_BILLINGS,
    "keep_alive_policy": ("histogram", "fixed"),
}


def _number(name: str, value: object, ok: Callable[[float], bool], rule: str) -> None:
    """Refuse ``value`` for setting ``name`` unless it is a real number (not a bool) for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(f"{name} must be {rule}, got {value!r}")


def _count(name: str, value: object, least: int, rule: str) -> None:
    """Refuse ``value`` for setting ``name`` unless it is an int (not a bool) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} must be {rule}, got {value!r}")


CONFIG_SPACE_JSON = 'an object of lists such as {"batches": [1, 2, 4], "vcpus": [1, 2], "gpu_shares": [0.5, 1]}'


@dataclass(frozen=True, slots=True)
class ESGSettings:
    """The knobs of the ESG scheduler, each with ESG-SPEC's default.

    Attributes:
        config_space: candidate (batch, vcpus, gpu_share) values; in JSON (``--set``, a case file), an object
            of lists, e.g. ``{"batches": [1, 2, 4], "vcpus": [1, 2], "gpu_shares": [0.5, 1]}`` (a list left
            out keeps its default).
        tick_ms: period of the controller's timer round.
        max_expansions: A* node expansion budget per decision.
        time_budget_ms: A* wall-time budget per decision (needs an injected clock).
        latency_blade: prune children that cannot finish within the slack.
        cost_blade: prune children that cannot beat the best complete plan.
        heuristic: ``"frontier"`` (slack-aware, exact: cheapest suffix-frontier point within the remaining
            slack) or ``"min_cost"`` (sum of per-stage cheapest costs, blind to the slack).
        search_horizon: plan to the end of the job's SLO segment (``"segment"``, the paper's dominator split)
            or to the end of the workflow.
        percentile: statistic of the profile to plan with.
        wait_for_batch: allow holding a queue for a fuller batch while the plan stays feasible.
        max_batch_wait_ms: the longest a queue's oldest job is held for a fuller batch (Triton's
            ``max_queue_delay``, Ray Serve's ``batch_wait_timeout_s``): a wait is offered only while the
            oldest job's time in the queue plus one projected gap between arrivals stays within it; 0: no
            bound, the paper's rule (waits bounded by the slack only).
        rate_ewma_alpha: weight of the newest inter-arrival gap in the arrival rate estimate kept per queue by
            the runtime and the simulator.
        infeasible_policy: ``"best_effort"`` dispatches an infeasible batch on the fastest resources (or the
            cheapest near them, ``best_effort_tolerance``) and marks it at risk; ``"reject"`` fails jobs that
            no configuration can serve in time.
        best_effort_tolerance: how much slower than the fastest option a best-effort dispatch may be, as a
            fraction of the fastest's latency: the cheapest option within it goes (0 is the spec's "fastest",
            kept as the ``esg-fastest`` ablation; not in the paper). A best-effort batch is already late, and
            the fastest option is often a cold start on the dearest GPU that stays warm, and billed idle, for
            the keep-alive; past capacity such starts stop idle workers and feed a cold-start storm. At tight
            SLOs on a workload that never runs past capacity, 0 is cheaper (docs/results.md, "Best effort").
        keep_alive_s: how long an idle warm worker is kept. A worker whose idle time costs nothing (a CPU
            worker while ``idle_vcpus`` is off) keeps all of it: the keep-alive policy, price, best-effort and
            scale-down rules that stop idle workers sooner save nothing on it.
        keep_alive_by_price: the platform's keep-alive depends on the GPU type: an idle worker on the cheapest
            type present keeps its keep-alive (``keep_alive_s``, or the histogram policy's value), one on a
            dearer type that times the cheapest type's price over its own
            (:meth:`~esg_prefect.model.pricing.PriceSheet.keep_alive_scales`). A type priced 0 keeps the whole
            keep-alive and is not the cheapest: the scale is to the cheapest type with a price above 0, so a
            free type does not stop every other type's idle workers at once. Applied by the simulator and
            the runtime pool to every scheduler (not in the paper, which bills no idle time; docs/results.md,
            "Idle cost"); a cluster of one GPU type is unaffected. Off keeps every idle worker
            ``keep_alive_s`` whatever it costs.
        keep_alive_policy: ``"histogram"`` keeps an idle worker for a percentile of its stage's measured idle
            gaps (the hybrid-histogram policy of Shahrad et al., ATC '20;
            :mod:`esg_prefect.control.keepalive`), within ``keep_alive_cold_starts`` and the fixed window
            above, which it uses until the stage has enough gaps and for a stage's last worker; ``"fixed"``
            always keeps the fixed window. Applied to every scheduler (docs/decisions/whole-bill.md).
        keep_alive_percentile: that percentile of the gaps (a 10 % margin is added).
        keep_alive_percentile_waves: the percentile instead for a stage whose calls come in waves
            (:mod:`esg_prefect.scheduling.waves`): its idle workers go sooner in a lull, and the next wave's
            are started ahead (``lookahead_starts``; docs/decisions/whole-bill.md, section 11).
        keep_alive_cold_starts: the least keep-alive of the histogram policy, in cold starts of the worker's
            stage on its hardware (ski rental: a restart costs its load and, on a request's path, SLO slack).
        best_effort_keep_alive: a worker started for a best-effort dispatch (no plan met the slack), while no
            planned dispatch has used it and it is not its stage's last worker, is kept this many of its cold
            starts once idle, not the policy's window: a burst's dear workers go when the burst does, and one
            reused within the plan keeps the usual keep-alive. 0 turns it off (docs/decisions/whole-bill.md).
        scale_down_utilization: with the histogram policy, a stage keeps the workers its measured load needs
            at this utilisation (its busy workers averaged over 5 s, over this, at least one); the surplus
            that idled longest expire after the floor above instead of the gaps' percentile, so the workers a
            burst needed go once it has gone (as Knative sizes by observed concurrency). In [0, 1]; 0 (the
            default) turns it off: on the bursty Azure code trace it cut ESG's bill by up to a fifth but lost
            SLO hits (docs/decisions/whole-bill.md). Applied to every scheduler.
        scale_down_waves: a stage whose calls come in waves (:mod:`~esg_prefect.scheduling.waves`) keeps the
            workers its measured load needs at this utilisation, as ``scale_down_utilization`` sizes them; the
            surplus that idled longest go once idle for a lull (400 ms and the policy's margin, or two of
            their cold starts if longer), not the floor, so the workers a wave used and its load no longer
            needs go early in the lull and the next wave's are started ahead (``lookahead_starts``). A
            pre-warmed worker with no batch yet keeps the usual rule. In [0, 1]; 0 turns it off. Applied to
            every scheduler; it trades some SLO hits at a bursty trace's high rates for a smaller bill
            (docs/decisions/whole-bill.md, section 12).
        shed_after_slo: a request whose calls still wait in a queue this many times its workflow's SLO after
            it arrived fails (its calls get ``StageRejectedError`` saying so) before the next round: past
            capacity the queues stay bounded and so does a round's work, as Triton's queue timeouts and Ray
            Serve's ``max_queued_requests`` do. 0 (the default) or >= 1; 0 keeps every call until it is
            served. Applied to every scheduler (docs/decisions/load-shedding.md).
        redistribute_slack: recompute later segments' deadlines from real finish times.
        cost_split: split a batch's cost among its jobs equally or by input size.
        idle_billing: attribute warm idle time to the runs served before it (a pre-warmed worker's first idle
            time to its first batch's runs), or show it on a separate idle line.
        idle_vcpus: bill an idle worker's vCPUs as well as its GPU share, for a platform that holds them for a
            worker's whole life. Off: an idle worker is a sleeping process that holds its share only
            (docs/decisions/idle-vcpus.md). The pool turns it on for a backend that reserves vCPUs per worker
            (Ray's ``cpu_reservation="lifetime"``).
        allow_eviction: stop idle workers of other stages to make room for a cold start when no free capacity
            is left.
        reserve_overhead: the runtime measures the caller's time between pooled stages of a request (under
            Prefect: ending one task run, starting the next) and plans each job to finish early enough to
            leave that much per remaining stage, plus one for the end of the flow run (not in the paper, whose
            stages are invoked by the platform itself).
        correction_alpha: the runtime compares each batch's measured time with the profile's prediction and
            corrects the stage's profile: a factor for the model's own time, and a per-batch overhead for a
            worker in another process (:mod:`esg_prefect.model.correction`); this is the weight of the newest
            batch in those estimates, 0 turns the correction off.
        wait_for_busy_warm: when no plan meets a queue's slack and the fastest option is a cold start that
            would stop idle workers, keep the jobs for a busy worker warm for the stage if it would finish
            them sooner (not in the paper; without it an overloaded cluster falls into a cold-start storm, see
            :mod:`esg_prefect.scheduling.esg`).
        idle_aware: price the idle time an option causes as well as its busy time (the whole bill: a worker
            holding a share is paid for while it idles): a new worker's options carry the keep-alive it will
            idle through after its last batch, a warm worker's the idle gap the use closes; so the search
            starts a worker only where warm ones cannot serve the queue within its slack, keeps load on the
            workers in use and lets the others expire. With ``wait_for_busy_warm``, late jobs of a stage with
            a busy worker wait for it rather than evict another stage's idle worker. Not in the paper, whose
            cost model bills busy time only (docs/decisions/whole-bill.md).
        wait_for_taken: with ``idle_aware``, a planned cold start waits instead for a worker of the stage
            that an earlier dispatch of the same round took, when that one runs the batch after its own within
            the slack the plan leaves and within this fraction of the cold option's latency (0: off; best
            effort waits so within a hundredth with ``wait_for_busy_warm``). A queue split into small batches
            over its warm workers otherwise starts a worker for its last batch, paying a cold start that a
            moment's wait would save (docs/decisions/whole-bill.md, section 15).
        consolidate_slack: with ``idle_aware``, a dispatch planned onto an idle warm worker that has idled
            ``consolidate_idle_ms`` or more waits instead for a busy worker of the stage that runs the batch
            at no more cost per job and ends within this fraction of the slack the plan leaves: the stage's
            load gathers on the workers in use and the surplus one expires
            (:mod:`~esg_prefect.scheduling.busy_warm`). In [0, 1]; 0 turns it off. The half left over is the
            margin for the busy worker's predicted end and the stages after.
        consolidate_idle_ms: how long the idle worker must have idled for the consolidation to hold a queue
            back from it (ms, >= 0): one idle a shorter time is in steady use, and waiting would only delay.
        share_batches: a batch of one workflow's stage takes on waiting calls of the same stage from other
            workflows' queues (the same model) while each one's deadline and the dispatching plan's slack
            allow the larger batch (:mod:`esg_prefect.scheduling.sharing`), in the stages packing does not
            re-size (``size_aware`` off or no reliable size fit of the stage); queues stay per (workflow,
            stage) for the SLO split. Off by default: on the whole-bill grid it cut the bill in some cells and
            lost SLO hits in others (not in the paper, whose queues never mix; docs/decisions/whole-bill.md).
        prewarm: after a dispatch onto a warm worker, start a worker off the requests' path
            (:class:`~esg_prefect.scheduling.base.Start`) when resources the queue could use warm within the
            same slack cost at least ``prewarm_saving`` less per job, none of that kind is idle for the stage
            and no start for the stage is under way (not in the paper, whose ESG starts workers only with jobs
            on them, so a queue kept being served by the dear workers of its warm-up; docs/results.md,
            "Pre-warming").
        prewarm_saving: the least relative saving per job that justifies a start, in (0, 1).
        stage_plan: hold a steady stage's worker starts to one kind and a count sized to its measured rate
            (any warm worker still serves; :mod:`~esg_prefect.scheduling.stage_plan`; not in the paper,
            docs/decisions/whole-bill.md, section 10).
        stage_plan_utilization: the utilisation a stage's planned workers are sized for, in (0, 1].
        stage_plan_gate: a stage is held only while its highest 1 s count of calls over the last 30 s is at
            most this multiple of its 30 s mean (> 1).
        stage_plan_drain: a held stage at its count, when that count is at least this many workers, sends its
            batches only to idle workers of the plan's kind (they wait for one), so that its other warm
            workers idle out; 0 (the default): never. Off because a drained stage whose queue backs up runs
            ever smaller batches and cannot catch up (docs/decisions/whole-bill.md, section 10); 2 is the
            setting measured.
        stage_plan_retire: a held stage whose plan's kind holds its count, one of them idle, stops its other
            idle workers (of other kinds, or of the plan's kind past the count) once they have idled 50 ms,
            while the count's workers carry the stage's highest 1 s rate of the last 30 s at this utilisation
            or less (make before break: the plan's workers are warm before the others go); 0 (the default):
            never. In [0, 1]; docs/decisions/whole-bill.md, "Probed 2026-11-28: retiring a held stage's
            surplus".
        stage_plan_retire_spares: of a held stage's workers that ``stage_plan_retire`` would stop, keep this many
            as spares, the cheapest idle ones (least price per second idle), to absorb a clump of calls that the
            count alone would queue; 0 (the default): keep none. An int >= 0; docs/decisions/whole-bill.md,
            "Probed 2026-11-28: retiring a held stage's surplus".
        stage_plan_retire_clump: ``stage_plan_retire`` stops a stage's surplus only while its count and its
            spares (``stage_plan_retire_spares``) would serve the stage's largest 100 ms clump of calls of the
            last 30 s within its part of the SLO; False (the default): no such test.
        stage_plan_retire_cheap_spare: ``stage_plan_retire`` keeps one spare of the stage's cheapest kind: least
            price per second idle among the kinds that run a call (a batch of the space's smallest size) within
            this fraction of the stage's part of the SLO; an idle worker outside the count no dearer idle, or one
            started as the dearer ones go (make before break: the cheapest of them stays until it is warm); 0
            (the default): no such spare. In [0, 1]; docs/decisions/whole-bill.md, "Probed 2026-11-28: retiring a
            held stage's surplus".
        lookahead_starts: after a round's dispatches of a stage, start a worker for each next stage of the
            workflow whose calls come in waves (:mod:`esg_prefect.scheduling.waves`) and that has no idle warm
            worker and none starting: the cheapest kind that runs the batch within the next stage's part of
            the SLO once warm, paid off the requests' path while the batch runs, so that a wave meets warm
            workers downstream (not in the paper; :class:`~esg_prefect.scheduling.esg_round.Lookahead`;
            docs/decisions/whole-bill.md, section 11).
        size_aware: pack each batch by its items' predicted time (the profile's input-size model; Cypress,
            :mod:`esg_prefect.scheduling.packing`) instead of their count; no effect on a stage the size model
            has no fit for (the published GPU tables' stages have none).
        hardware_selection: PALDIA's per-stage hardware selection (:mod:`esg_prefect.scheduling.hardware`):
            each stage may use only the cheapest hardware type whose pool can carry its queue's arrival rate
            (EWMA) within its deadline, and the types faster than it; off (the default) is the paper's ESG,
            which may pick any type.
        hardware_utilization: the fraction of a hardware pool's throughput the selector plans to use (headroom
            for bursts and queueing), in (0, 1].
        hybrid_sharing: PALDIA's hybrid spatio-temporal sharing (:mod:`esg_prefect.scheduling.hybrid`): before
            a batch co-runs beside busy tenants of a device, weigh it (latency x co-run slowdown) against
            waiting for tenants to finish; off (the default) is the paper's ESG.
        corun_table: the co-run table the hybrid sharing reads: ``"default"`` (the shipped CPU table, and the
            documented GPU model of :mod:`esg_prefect.model.interference` where no row is measured) or a CSV
            path written by ``esg-prefect profile --breakdown``.
    """

    config_space: ConfigSpace = field(default_factory=ConfigSpace)
    tick_ms: float = 5.0
    max_expansions: int = 10_000
    time_budget_ms: float = 5.0
    latency_blade: bool = True
    cost_blade: bool = True
    heuristic: Heuristic = "frontier"
    search_horizon: Horizon = "segment"
    percentile: Literal["p95", "mean"] = "p95"
    wait_for_batch: bool = True
    max_batch_wait_ms: float = 50.0
    rate_ewma_alpha: float = 0.2
    infeasible_policy: InfeasiblePolicy = "best_effort"
    best_effort_tolerance: float = 0.1
    keep_alive_s: float = 60.0
    keep_alive_by_price: bool = True
    keep_alive_policy: Literal["histogram", "fixed"] = "histogram"
    keep_alive_percentile: float = 99.0
    keep_alive_percentile_waves: float = 90.0
    keep_alive_cold_starts: float = 20.0
    best_effort_keep_alive: float = 2.0
    scale_down_utilization: float = 0.0
    scale_down_waves: float = 0.5
    shed_after_slo: float = 0.0
    redistribute_slack: bool = True
    cost_split: CostSplit = "equal"
    idle_billing: IdleBilling = "attribute"
    idle_vcpus: bool = False
    allow_eviction: bool = True
    reserve_overhead: bool = True
    correction_alpha: float = 0.25
    wait_for_busy_warm: bool = True
    idle_aware: bool = True
    wait_for_taken: float = 0.05
    consolidate_slack: float = 0.5
    consolidate_idle_ms: float = 100.0
    share_batches: bool = False
    prewarm: bool = True
    prewarm_saving: float = 0.2
    stage_plan: bool = True
    stage_plan_utilization: float = 0.6
    stage_plan_gate: float = 1.5
    stage_plan_drain: int = 0
    stage_plan_retire: float = 0.0
    stage_plan_retire_spares: int = 0
    stage_plan_retire_clump: bool = False
    stage_plan_retire_cheap_spare: float = 0.0
    lookahead_starts: bool = True
    size_aware: bool = True
    hardware_selection: bool = False
    hardware_utilization: float = 0.7
    hybrid_sharing: bool = False
    corun_table: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.config_space, ConfigSpace):
            raise ConfigError(f"config_space must be {CONFIG_SPACE_JSON}, got {self.config_space!r}")
        for name in ("tick_ms", "time_budget_ms", "keep_alive_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
        _count("max_expansions", self.max_expansions, 1, "an int >= 1")
        if not (0.0 < self.rate_ewma_alpha <= 1.0):
            raise ConfigError(f"rate_ewma_alpha must be in (0, 1], got {self.rate_ewma_alpha!r}")
        _number("correction_alpha", self.correction_alpha, lambda v: 0.0 <= v <= 1.0, "in [0, 1] (0: off)")
        for name, allowed in _CHOICES.items():
            v = getattr(self, name)
            if v not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {v!r}")
        bools = ("latency_blade", "cost_blade", "wait_for_batch", "redistribute_slack", "allow_eviction")
        more = ("reserve_overhead", "wait_for_busy_warm", "idle_aware", "size_aware", "prewarm")
        whole_bill = ("keep_alive_by_price", "share_batches", "idle_vcpus", "stage_plan", "lookahead_starts")
        retire = ("stage_plan_retire_clump",)
        for name in (*bools, *more, *whole_bill, *retire):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("hardware_selection", "hybrid_sharing"):  # PALDIA's knobs
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _number(
            "max_batch_wait_ms",
            self.max_batch_wait_ms,
            lambda v: math.isfinite(v) and v >= 0.0,
            "a finite number >= 0 (ms; 0: no bound)",
        )
        _number("wait_for_taken", self.wait_for_taken, lambda v: 0.0 <= v <= 1.0, "in [0, 1] (0: off)")
        _number("consolidate_slack", self.consolidate_slack, lambda v: 0.0 <= v <= 1.0, "in [0, 1] (0: off)")
        _number(
            "consolidate_idle_ms",
            self.consolidate_idle_ms,
            lambda v: math.isfinite(v) and v >= 0.0,
            "a finite number >= 0 (ms)",
        )
        _number("prewarm_saving", self.prewarm_saving, lambda v: 0.0 < v < 1.0, "in (0, 1)")
        _number("stage_plan_utilization", self.stage_plan_utilization, lambda v: 0.0 < v <= 1.0, "in (0, 1]")
        _number("stage_plan_gate", self.stage_plan_gate, lambda v: 1.0 < v < math.inf, "a finite number > 1")
        _count("stage_plan_drain", self.stage_plan_drain, 0, "an int >= 0 (0: off)")
        _number("stage_plan_retire", self.stage_plan_retire, lambda v: 0.0 <= v <= 1.0, "in [0, 1] (0: off)")
        _count("stage_plan_retire_spares", self.stage_plan_retire_spares, 0, "an int >= 0 (0: none)")
        _number(
            "stage_plan_retire_cheap_spare",
            self.stage_plan_retire_cheap_spare,
            lambda v: 0.0 <= v <= 1.0,
            "in [0, 1] (0: off)",
        )
        _number(
            "best_effort_tolerance",
            self.best_effort_tolerance,
            lambda v: math.isfinite(v) and v >= 0,
            "a finite number >= 0",
        )
        _number("keep_alive_percentile", self.keep_alive_percentile, lambda v: 0.0 < v <= 100.0, "in (0, 100]")
        _number(
            "keep_alive_percentile_waves", self.keep_alive_percentile_waves, lambda v: 0.0 < v <= 100.0, "in (0, 100]"
        )
        _number(
            "keep_alive_cold_starts",
            self.keep_alive_cold_starts,
            lambda v: math.isfinite(v) and v >= 0.0,
            "a finite number >= 0",
        )
        _number(
            "best_effort_keep_alive",
            self.best_effort_keep_alive,
            lambda v: math.isfinite(v) and v >= 0.0,
            "a finite number >= 0 (cold starts; 0: off)",
        )
        for name in ("scale_down_utilization", "scale_down_waves"):
            _number(name, getattr(self, name), lambda v: 0.0 <= v <= 1.0, "in [0, 1] (0: off)")
        _number(
            "shed_after_slo",
            self.shed_after_slo,
            lambda v: v == 0.0 or (math.isfinite(v) and v >= 1.0),
            "0 (off) or a finite number >= 1 (times the workflow's SLO)",
        )
        _number("hardware_utilization", self.hardware_utilization, lambda v: 0.0 < v <= 1.0, "in (0, 1]")
        if not isinstance(self.corun_table, str) or not self.corun_table:
            raise ConfigError(f"corun_table must be 'default' or a CSV path, got {self.corun_table!r}")

    @property
    def platform(self) -> PlatformSettings:
        """The knobs the platform reads (the control core, its drivers, the cost reports)."""
        return PlatformSettings(**{f.name: getattr(self, f.name) for f in fields(PlatformSettings)})

    @property
    def paldia(self) -> PaldiaSettings:
        """The knobs PALDIA's hardware selection and hybrid sharing read."""
        return PaldiaSettings(**{f.name: getattr(self, f.name) for f in fields(PaldiaSettings)})

    @property
    def cypress(self) -> CypressSettings:
        """The knobs Cypress's size-aware packing reads."""
        return CypressSettings(**{f.name: getattr(self, f.name) for f in fields(CypressSettings)})

    @property
    def pruning(self) -> bool:
        """Whether any pruning is on (both blades and the slack-aware heuristic)."""
        return self.latency_blade or self.cost_blade or self.heuristic == "frontier"

    def without_pruning(self) -> ESGSettings:
        """Plain A*: no blades, slack-blind heuristic (for ablations and checks)."""
        return replace(self, latency_blade=False, cost_blade=False, heuristic="min_cost")

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for logs, artifacts and blocks."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, ConfigSpace):
                v = {"batches": list(v.batches), "vcpus": list(v.vcpus), "gpu_shares": list(v.gpu_shares)}
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ESGSettings:
        """Inverse of :meth:`to_dict`; unknown keys raise ConfigError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            guesses = {k: close_match(k, known) for k in sorted(unknown)}
            hints = [f"{k!r}: did you mean {g!r}?" for k, g in guesses.items() if g]
            if len(hints) == len(unknown):  # near misses: the settings meant, not all ~60 names
                raise ConfigError(
                    f"unknown ESG settings {sorted(unknown)} ({'; '.join(hints)}); "
                    "`esg-prefect schedulers` lists every setting"
                )
            raise ConfigError(f"unknown ESG settings {sorted(unknown)}; known: {sorted(known)}")
        kw = dict(data)
        if isinstance(kw.get("config_space"), dict):
            cs = kw["config_space"]
            lists = {f.name for f in fields(ConfigSpace)}
            bad = sorted(k for k, v in cs.items() if k not in lists or not isinstance(v, (list, tuple)))
            if bad:
                raise ConfigError(f"config_space must be {CONFIG_SPACE_JSON}; got {cs!r} (bad: {', '.join(bad)})")
            kw["config_space"] = ConfigSpace(**{k: tuple(v) for k, v in cs.items()})
        return cls(**kw)


# ---- the knobs by who reads them -----------------------------------------------------------------
# ESGSettings is the one object users set (blocks, case files, --set); these are its knobs grouped by
# the code that reads them. They have no defaults of their own: each is built from an ESGSettings
# (ESGSettings.platform, .paldia, .cypress), so a default is written once. The knobs in none of them
# are the search's (ESG_1Q and its dispatch rules).


@dataclass(frozen=True, slots=True)
class PlatformSettings:
    """The platform's knobs: rounds, rate estimation, admission deadlines, keep-alive, billing.

    Read by the control core (:mod:`esg_prefect.control.core`) and its drivers for every scheduler.
    """

    tick_ms: float
    rate_ewma_alpha: float
    redistribute_slack: bool
    reserve_overhead: bool
    keep_alive_s: float
    keep_alive_by_price: bool
    keep_alive_policy: Literal["histogram", "fixed"]
    keep_alive_percentile: float
    keep_alive_percentile_waves: float
    keep_alive_cold_starts: float
    best_effort_keep_alive: float
    scale_down_utilization: float
    scale_down_waves: float
    shed_after_slo: float
    allow_eviction: bool
    correction_alpha: float
    cost_split: CostSplit
    idle_billing: IdleBilling
    idle_vcpus: bool


@dataclass(frozen=True, slots=True)
class PaldiaSettings:
    """PALDIA's knobs: per-stage hardware selection and hybrid spatio-temporal sharing."""

    hardware_selection: bool
    hardware_utilization: float
    hybrid_sharing: bool
    corun_table: str


@dataclass(frozen=True, slots=True)
class CypressSettings:
    """Cypress's knob: batches packed by their items' predicted time."""

    size_aware: bool


SETTINGS_GROUPS: dict[str, type] = {
    "Platform (the control core and its drivers, every scheduler)": PlatformSettings,
    "Cypress (input sizes)": CypressSettings,
    "PALDIA (heterogeneous hardware)": PaldiaSettings,
}
"""Groups of knobs by reader; the search's are the rest."""


def search_knobs() -> tuple[str, ...]:
    """The knobs only the search reads: those in no group of :data:`SETTINGS_GROUPS`."""
    grouped = {f.name for group in SETTINGS_GROUPS.values() for f in fields(group)}
    return tuple(f.name for f in fields(ESGSettings) if f.name not in grouped)
