"""Experiments E1-E7 of ESG-SPEC section 8, as lists of runs and the rows they produce.

Each experiment is a set of :class:`RunSpec` (a case, a seed and labels),
run by :func:`run_spec` (one simulation, one row of plain values) or, for the
decision-time experiments, a micro-benchmark of ``ESGScheduler.decide_queue``.
The CLI (``esg-prefect compare``) and ``bench/simulator.py`` drive them, in
parallel processes, and draw the plots (:mod:`esg_prefect.simulator.plots`).

No clock is read here: wall times come from a clock the caller injects (the
CLI's ``time.perf_counter``), so this module stays as deterministic as the
simulator; rows of simulated metrics are functions of (case, seed).

=====  =====================================================  ======================
E1/E2  SLO hit rate and cost vs load, ESG vs the baselines    :func:`load_specs`
E3     decision time vs stages and configuration count         :func:`decision_time`
E4     pruning ablation: plan cost and expansions              :func:`pruning_ablation`
E5     dominator split vs whole-workflow search                :func:`horizon_specs`, :func:`dag_growth`
E6     bursty vs steady traces; SLO tightness sweep            :func:`trace_specs`, :func:`tightness_specs`
E7     stall breakdown per stage, ESG vs a baseline            :func:`stall_rows`
=====  =====================================================  ======================
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from esg_prefect.model.config import Config, ConfigSpace
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.model.profile import LatencyProfile, ProfilePoint
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import QueueState
from esg_prefect.scheduling.baselines import BASELINES
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.esg import ESGScheduler
from esg_prefect.scheduling.search import Clock
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.simulator.case import Case, resolve_profile
from esg_prefect.simulator.run import simulate
from esg_prefect.simulator.standard import STANDARD_PROFILE, standard_case, standard_cluster

Row = dict[str, Any]

ESG_FAMILY: tuple[str, ...] = ("esg", "esg-fastest", "esg-noshare", "esg-greedy")
PRIOR_WORK: tuple[str, ...] = BASELINES  # the prior-work baselines, one list (scheduling.baselines)
DEFAULT_SCHEDULERS: tuple[str, ...] = (*ESG_FAMILY, *PRIOR_WORK)
LOADS: tuple[float, ...] = (150.0, 300.0, 450.0, 600.0)
TIGHTNESS: tuple[float, ...] = (2.0, 3.0, 5.0, 8.0)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One simulation of an experiment.

    Attributes:
        experiment: ``"E1"``, ``"E6-trace"``...
        case: what to run (its scheduler included).
        seed: the seed.
        labels: extra columns of the row (the swept value, for plots).
    """

    experiment: str
    case: Case
    seed: int = 0
    labels: tuple[tuple[str, Any], ...] = field(default=())


def run_spec(spec: RunSpec, clock: Clock | None = None) -> Row:
    """Simulate ``spec`` and return its row: labels, the overall report, and speed when ``clock`` is given."""
    t0 = clock() if clock is not None else 0.0
    run = simulate(spec.case, spec.seed)
    wall_s = (clock() - t0) / 1000.0 if clock is not None else None
    return spec_row(spec, run, wall_s)


def spec_row(spec: RunSpec, run: Any, wall_s: float | None) -> Row:
    """The row of a simulated ``spec``: its labels, ``run``'s overall report, and ``wall_s`` when measured."""
    o = run.report.overall
    row: Row = {
        "experiment": spec.experiment,
        "scheduler": spec.case.scheduler,
        "seed": spec.seed,
        "rate_per_s": spec.case.workload.rate_per_s,
        "trace": spec.case.workload.trace,
        **dict(spec.labels),
        "requests": o.count,
        "slo_hit_rate": o.slo_hit_rate,
        "failed": o.failed,
        "at_risk": o.at_risk,
        "p50_ms": o.latency_p50_ms,
        "p99_ms": o.latency_p99_ms,
        "cost_per_request": o.cost_per_request,
        "batch_cost_per_request": o.batch_cost_per_request,
        "mean_batch": o.mean_batch_size,
        "cold_starts": run.cold_starts,
        "rounds": run.rounds,
        "simulated_requests": len(run.requests),
        "wall_s": wall_s,
        "per_workflow": {g.name: g.slo_hit_rate for g in run.report.workflows},
        "stages": [s.to_dict() for s in run.report.stages],
    }
    return row


# ---- E1/E2, E5 (macro), E6, E7: simulation runs -------------------------------------------


def _case(scheduler: str, quick: bool, **kw: Any) -> Case:
    if quick:
        kw.setdefault("duration_s", 16.0)
        kw.setdefault("warmup_s", 6.0)
    return standard_case(scheduler, **kw)


def load_specs(
    schedulers: Sequence[str] = DEFAULT_SCHEDULERS,
    loads: Sequence[float] = LOADS,
    seeds: Sequence[int] = (0,),
    quick: bool = False,
) -> list[RunSpec]:
    """E1/E2: every scheduler at every load of the standard case."""
    return [
        RunSpec("E1", _case(s, quick, rate_per_s=r, seed=seed), seed, (("load", r),))
        for r in loads
        for s in schedulers
        for seed in seeds
    ]


def trace_specs(
    schedulers: Sequence[str] = DEFAULT_SCHEDULERS, seeds: Sequence[int] = (0,), quick: bool = False
) -> list[RunSpec]:
    """E6 (traces): the standard case on the bursty and the steady Azure LLM traces, and the standard trace."""
    traces = ("azure_llm_code", "azure_llm_conv", "azure_functions_2019")
    return [
        RunSpec("E6-trace", _case(s, quick, trace=t, seed=seed), seed, (("trace_label", t),))
        for t in traces
        for s in schedulers
        for seed in seeds
    ]


def tightness_specs(
    schedulers: Sequence[str] = DEFAULT_SCHEDULERS,
    tightness: Sequence[float] = TIGHTNESS,
    seeds: Sequence[int] = (0,),
    quick: bool = False,
) -> list[RunSpec]:
    """E6 (SLO): the standard case with SLOs of ``tightness`` x the T4 batch-1 critical path."""
    return [
        RunSpec("E6-slo", _case(s, quick, tightness=k, seed=seed), seed, (("tightness", k),))
        for k in tightness
        for s in schedulers
        for seed in seeds
    ]


def horizon_specs(seeds: Sequence[int] = (0,), quick: bool = False) -> list[RunSpec]:
    """E5 (macro): ESG with the dominator split (segment horizon) vs whole-workflow search, standard case."""
    out = []
    for horizon in ("segment", "workflow"):
        for seed in seeds:
            c = _case("esg", quick, seed=seed)
            c = c.with_(settings=replace(c.settings, search_horizon=horizon))
            out.append(RunSpec("E5-sim", c, seed, (("horizon", horizon),)))
    return out


def stall_specs(baseline: str = "fast-gshare", quick: bool = False) -> list[RunSpec]:
    """E7: ESG and one baseline on the standard case (their rows carry the per-stage breakdown)."""
    return [RunSpec("E7", _case(s, quick), 0, ()) for s in ("esg", baseline)]


def stall_rows(rows: Iterable[Row]) -> list[Row]:
    """E7 rows flattened: one per (scheduler, workflow, stage) with the mean ms of each stall."""
    out = []
    for r in rows:
        for s in r["stages"]:
            out.append({"scheduler": r["scheduler"], **{k: s[k] for k in s}})
    return out


# ---- E3, E4, E5 (micro): decision benchmarks ------------------------------------------------

MODELS: tuple[str, ...] = ("resnet50", "resnext101", "se-resnext101", "bert-base", "transformer-xl", "fastpitch")


def renamed_profile(stages: Sequence[str], profile: str = STANDARD_PROFILE) -> LatencyProfile:
    """A profile whose stage ``stages[i]`` is the measured model ``MODELS[i % 6]``: long chains of real models."""
    base = resolve_profile(profile)
    by_model: dict[str, list[ProfilePoint]] = {}
    for p in base.points:
        by_model.setdefault(p.stage, []).append(p)
    points = []
    cold = {}
    for i, st in enumerate(stages):
        model = MODELS[i % len(MODELS)]
        for p in by_model[model]:
            points.append(replace(p, stage=st))
            cold[(st, p.hardware)] = base.cold_start_ms(model, p.hardware)
    return LatencyProfile(points, cold)


SPACES: dict[str, ConfigSpace] = {
    "coarse": ConfigSpace((1, 4, 16), (1,), (0.0, 0.5, 1.0)),
    "default": ConfigSpace(vcpus=(1,)),
    "fine": ConfigSpace((1, 2, 3, 4, 6, 8, 12, 16, 24, 32), (1,), tuple(round(0.05 * i, 2) for i in range(0, 21))),
}
"""Configuration spaces of E3 (per stage: GPU configurations x GPU types)."""


def _decisions(
    sched: ESGScheduler, wf: Workflow, entry: str, n_decisions: int, seed: int
) -> list[tuple[float | None, int, float]]:
    """(decision ms, expansions, plan cost) of seeded random decisions at ``entry`` on an empty standard cluster."""
    cluster = standard_cluster().snapshot()
    view0 = ClusterView(cluster)
    hardware = frozenset(view0.hardware)
    horizon = sched.tables.horizon(wf, entry, hardware)
    rest_fastest = sum(sched.tables.min_latency_ms(s, hardware) for s in horizon[1:])
    resources = sched.placeable_resources(entry, view0)
    q = QueueKey(wf.name, entry)
    rng = random.Random(seed)
    out = []
    for i in range(n_decisions):
        n = rng.randint(1, 40)
        rate = rng.uniform(0.0, 400.0)
        first_ms = sched.tables.first_options(entry, n, resources, rate)[0].latency_us / 1000.0
        slack = (first_ms + rest_fastest) * rng.uniform(0.9, 4.0)
        jobs = [Job(f"j{i}-{k}", f"r{k}", f"r{k}", q, 0.0, 0.0, slack, slack) for k in range(n)]
        dec = sched.decide_queue(QueueState(q, tuple(jobs), rate), jobs, wf, ClusterView(cluster), 0.0)
        cost = 0.0
        if dec.choice is not None and not dec.at_risk:
            plan = (dec.choice, *dec.plan)
            prices = sched.tables.prices
            cost = sum(prices.cost_per_request(c.config, c.hardware, c.latency_ms) for c in plan)
        out.append((dec.stats.decision_ms, dec.stats.expansions, cost))
    return out


def _summary(label: dict[str, Any], res: list[tuple[float | None, int, float]]) -> Row:
    times = sorted(t for t, _, _ in res if t is not None)
    return {
        **label,
        "decisions": len(res),
        "p50_ms": statistics.median(times) if times else None,
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))] if times else None,
        "mean_expansions": statistics.fmean(e for _, e, _ in res),
    }


def decision_time(
    clock: Clock, stages: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8), spaces: Sequence[str] = tuple(SPACES), n: int = 200
) -> list[Row]:
    """E3: ESG_1Q decision time on chains of K real models, whole-workflow horizon, per configuration space."""
    rows = []
    for space in spaces:
        for k in stages:
            names = [f"s{i}" for i in range(k)]
            wf = Workflow.chain(f"chain{k}", names, 1000.0)
            settings = ESGSettings(config_space=SPACES[space], search_horizon="workflow")
            sched = ESGScheduler(renamed_profile(names), _prices(), settings, clock)
            hardware = frozenset(standard_cluster().snapshot().hardware_types())
            options = len(sched.tables.stage_options(names[0], hardware))
            res = _decisions(sched, wf, "s0", n, seed=k)
            label = {
                "experiment": "E3",
                "space": space,
                "stages": k,
                "configs": configs_per_stage(SPACES[space]),
                "pareto_options": options,
            }
            rows.append(_summary(label, res))
    return rows


def _prices() -> PriceSheet:
    return PriceSheet.default()


def configs_per_stage(space: ConfigSpace, gpu_types: int = 3) -> int:
    """GPU configurations of ``space`` per stage over ``gpu_types`` GPU types."""
    shares = sum(1 for s in space.gpu_shares if s > 0)
    return len(space.batches) * len(space.vcpus) * shares * gpu_types


PRUNING: dict[str, dict[str, Any]] = {
    "none": {"latency_blade": False, "cost_blade": False, "heuristic": "min_cost"},
    "latency blade": {"latency_blade": True, "cost_blade": False, "heuristic": "min_cost"},
    "cost blade": {"latency_blade": False, "cost_blade": True, "heuristic": "min_cost"},
    "both blades": {"latency_blade": True, "cost_blade": True, "heuristic": "min_cost"},
    "both + frontier": {"latency_blade": True, "cost_blade": True, "heuristic": "frontier"},
}
"""E4's settings: no pruning, each blade, both, and both with the slack-aware heuristic (the default)."""


def pruning_ablation(clock: Clock | None, stages: int = 4, n: int = 200) -> list[Row]:
    """E4: the same decisions under each pruning setting; plan costs must be equal, expansions differ."""
    names = [f"s{i}" for i in range(stages)]
    wf = Workflow.chain(f"chain{stages}", names, 1000.0)
    profile = renamed_profile(names)
    rows = []
    reference: list[float] | None = None
    for label, knobs in PRUNING.items():
        settings = ESGSettings(
            config_space=SPACES["default"],
            search_horizon="workflow",
            max_expansions=1_000_000,
            time_budget_ms=1e9,
            **knobs,
        )
        sched = ESGScheduler(profile, _prices(), settings, clock)
        res = _decisions(sched, wf, "s0", n, seed=stages)
        costs = [c for _, _, c in res]
        if reference is None:
            reference = costs
        diff = max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(costs, reference, strict=True))
        row = _summary({"experiment": "E4", "pruning": label, "stages": stages}, res)
        row["max_rel_cost_diff_vs_none"] = diff
        rows.append(row)
    return rows


def ladder(width: int, rungs: int, slo_ms: float = 1000.0) -> Workflow:
    """A DAG of ``rungs`` fork-join regions of ``width`` parallel stages between single stages."""
    stages = ["d0"]
    edges: list[tuple[str, str]] = []
    for r in range(rungs):
        head, tail = f"d{r}", f"d{r + 1}"
        branch = [f"r{r}b{i}" for i in range(width)]
        stages.extend(branch)
        stages.append(tail)
        edges.extend((head, b) for b in branch)
        edges.extend((b, tail) for b in branch)
    return Workflow(f"ladder{width}x{rungs}", stages, edges, slo_ms)


def dag_growth(
    clock: Clock, sizes: Sequence[tuple[int, int]] = ((2, 1), (2, 2), (3, 3), (3, 5), (4, 7)), n: int = 100
) -> list[Row]:
    """E5 (micro): decision time at the entry of growing ladder DAGs, segment vs whole-workflow horizon."""
    rows = []
    for width, rungs in sizes:
        wf = ladder(width, rungs)
        profile = renamed_profile(list(wf.stages))
        for horizon in ("segment", "workflow"):
            settings = ESGSettings(config_space=SPACES["default"], search_horizon=horizon)
            sched = ESGScheduler(profile, _prices(), settings, clock)
            res = _decisions(sched, wf, "d0", n, seed=width * 100 + rungs)
            hw = frozenset(standard_cluster().snapshot().hardware_types())
            label = {
                "experiment": "E5",
                "dag": f"{width}x{rungs}",
                "dag_stages": len(wf.stages),
                "horizon": horizon,
                "horizon_stages": len(sched.tables.horizon(wf, "d0", hw)),
            }
            rows.append(_summary(label, res))
    return rows


# ---- the room batching leaves (why the cost ratio is what it is) -----------------------------------


def batching_headroom(
    profile: str | LatencyProfile = STANDARD_PROFILE,
    prices: PriceSheet | None = None,
    space: ConfigSpace | None = None,
    percentile: str = "p95",
    stages: Sequence[str] = MODELS,
) -> list[Row]:
    """Per (stage, GPU type): the least cost per request at batch 1 and at any batch, over every share.

    A scheduler that runs each request alone on the cheapest share (the
    FaST-GShare-like baseline) pays at least the batch-1 figure; one that
    batches (ESG) at least the any-batch figure, whatever its slack allows.
    Their ratio bounds from above what batching can save on that stage with
    this profile and these prices, before any SLO is applied: under the
    profile's GPU-share model (:mod:`esg_prefect.workload.gpu_profiles`) a
    share sized to a small batch runs it at nearly the GPU's best throughput
    per share, so the bound is small where small batches already fill a
    sizeable share of the GPU.
    """
    prof = resolve_profile(profile)
    sheet = prices or PriceSheet.default()
    cs = space or ConfigSpace(vcpus=(1,))
    rows: list[Row] = []
    for stage in stages:
        for hw in sorted(h for h in prof.hardware_types(stage) if h != "cpu"):
            best: dict[int, tuple[float, float]] = {}
            for b in cs.batches:
                for v in cs.vcpus:
                    for share in cs.gpu_shares:
                        if share <= 0:
                            continue
                        cfg = Config(b, v, share)
                        lat = prof.try_latency_ms(stage, cfg, hw, percentile)  # type: ignore[arg-type]
                        if lat is None:
                            continue
                        cost = sheet.cost_per_request(cfg, hw, lat)
                        if b not in best or cost < best[b][0]:
                            best[b] = (cost, share)
            if 1 not in best:
                continue
            top = min(best, key=lambda b: best[b][0])
            rows.append(
                {
                    "stage": stage,
                    "hardware": hw,
                    "batch1_cost": best[1][0],
                    "batch1_share": best[1][1],
                    "best_cost": best[top][0],
                    "best_batch": top,
                    "best_share": best[top][1],
                    "headroom": best[1][0] / best[top][0],
                }
            )
    return rows


def workflow_headroom(workflows: Sequence[Workflow], rows: Sequence[Row]) -> dict[str, float]:
    """Per workflow (and ``"all"``, an equal mix): batch-1 floor cost over any-batch floor cost.

    Each stage at its cheapest GPU type and share (rows of
    :func:`batching_headroom`), summed over the workflow's stages: the most
    any batching scheduler can save over a right-sized batch-1 one on these
    workflows, with unlimited slack and load.
    """
    b1: dict[str, float] = {}
    best: dict[str, float] = {}
    for r in rows:
        b1[r["stage"]] = min(b1.get(r["stage"], math.inf), r["batch1_cost"])
        best[r["stage"]] = min(best.get(r["stage"], math.inf), r["best_cost"])
    out: dict[str, float] = {}
    num = den = 0.0
    for wf in workflows:
        a = sum(b1[s] for s in wf.stages)
        b = sum(best[s] for s in wf.stages)
        out[wf.name] = a / b
        num += a
        den += b
    out["all"] = num / den
    return out


# ---- headline numbers -----------------------------------------------------------------------------


def best_baseline(
    rows: Sequence[Mapping[str, Any]], esg: str = "esg", baselines: Sequence[str] | None = None
) -> Mapping[str, Any] | None:
    """The baseline ESG is judged against: the most SLOs met, ties to the cheaper whole bill.

    ``baselines`` names the candidates; by default every scheduler in ``rows``
    outside ESG and its ablations (a user's registered scheduler included), so
    the headline table and ``compare``'s sentences name the same one.
    """
    if baselines is None:
        names = [str(r["scheduler"]) for r in rows]
        baselines = [n for n in names if n != esg and n not in ESG_FAMILY and not n.startswith(f"{esg}-")]
    cands = [r for r in rows if r["scheduler"] in baselines]
    if not cands:
        return None
    return max(cands, key=lambda r: (r["slo_hit_rate"], -r["cost_per_request"], -r.get("batch_cost_per_request", 0.0)))


def headline(rows: Sequence[Row], esg: str = "esg", baselines: Sequence[str] | None = None) -> Row:
    """ESG against the best baseline in ``rows`` (one load, one trace; :func:`best_baseline`).

    Costs compared are the whole bill per request (busy, idle and cold
    starts: what an owner pays) and, beside it, the batch cost alone
    (ESG-SPEC section 2, the paper's cost model).
    """
    by = {r["scheduler"]: r for r in rows}
    e = by[esg]
    best = best_baseline(rows, esg, baselines)
    if best is None:
        raise ValueError(f"no baseline among the schedulers {sorted(by)} to compare {esg!r} with")
    gain = e["slo_hit_rate"] / best["slo_hit_rate"] if best["slo_hit_rate"] > 0 else float("inf")
    return {
        "best_baseline": best["scheduler"],
        "esg_slo": e["slo_hit_rate"],
        "baseline_slo": best["slo_hit_rate"],
        "slo_gain": gain,
        "cost_ratio": best["batch_cost_per_request"] / e["batch_cost_per_request"],
        "cost_ratio_with_idle": best["cost_per_request"] / e["cost_per_request"],
    }


ParallelRunner = Callable[[Sequence[RunSpec]], list[Row]]
