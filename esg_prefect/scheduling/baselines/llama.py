"""Llama-like: per-invocation latency targets, batch and hardware choice, whole GPUs only.

``llama`` — Llama (Romero et al., "Llama: A Heterogeneous & Serverless
Framework for Auto-Tuning Video Analytics Pipelines", SoCC '21)

What it models: each invocation gets its own latency target from the slack
its request has left, split over the stages still ahead in proportion to
their fastest latencies (Llama's slack-based per-invocation targets). For the
most urgent job of a queue it picks the cheapest configuration (batch size up
to what is queued, vCPUs, hardware type) whose latency, with a cold start when
no idle warm worker has it, meets that target; the batch goes at once (Llama
batches what is queued; it does not hold requests for a fuller batch). When
nothing meets the target it uses the fastest placeable configuration for the
largest batch it can (Llama's "safe" configuration). Devices are used whole: a GPU
configuration takes the whole GPU (Llama does not share GPUs spatially).
New workers: one starting at a time per stage.

What it leaves out: Llama's knob tuning of the models themselves (frame
sampling, resolution), its dynamic priority queues across pipelines beyond
EDF, and its own placement (ESG_Dispatch's placement is used).
"""

from __future__ import annotations

from esg_prefect.model.slo import critical_path
from esg_prefect.model.workflow import Workflow
from esg_prefect.scheduling.base import DecisionStats, Dispatch, Hold, SchedulingResult, Snapshot, plain_stats
from esg_prefect.scheduling.baselines.common import BaselineBase, Resource
from esg_prefect.scheduling.dispatch import ClusterView


class LlamaScheduler(BaselineBase):
    """Per-invocation targets from the remaining slack; whole GPUs (module docstring)."""

    name = "llama"

    def _setup(self) -> None:
        self._shares: dict[tuple[Workflow, str, frozenset[str]], float] = {}
        self._whole: dict[tuple[str, frozenset[str]], list[Resource]] = {}

    def stage_share(self, workflow: Workflow, stage: str, hardware: frozenset[str]) -> float:
        """Fraction of the remaining slack that ``stage`` gets: its fastest latency over the path ahead's."""
        key = (workflow, stage, hardware)
        got = self._shares.get(key)
        if got is None:  # static given the profile: cached (a topological sort per queue per round otherwise)
            mins = {s: self.tables.min_latency_ms(s, hardware) for s in workflow.stages}
            path = critical_path(workflow, workflow.topological_order(), mins, start=stage)
            total = sum(mins[s] for s in path)
            got = self._shares[key] = mins[stage] / total if total > 0 else 1.0
        return got

    def whole_device_resources(self, stage: str, view: ClusterView) -> list[Resource]:
        """The space's resources for ``stage`` that take a device whole (share 1) or the CPU (cached)."""
        key = (stage, view.hardware)
        got = self._whole.get(key)
        if got is None:
            got = self._whole[key] = [r for r in self.resources(stage, view) if r[2] in (0.0, 1.0)]
        return got

    def decide(self, snapshot: Snapshot, now_ms: float) -> SchedulingResult:
        """Serve queues by urgency; per batch, the cheapest whole-device configuration meeting the target."""
        view = self._views.view(snapshot.cluster)
        hardware = frozenset(view.hardware)
        dispatches: list[Dispatch] = []
        holds: list[Hold] = []
        stats: list[DecisionStats] = []
        pending = {q.key: self.edf_of(q) for q in snapshot.queues}
        for q in sorted(snapshot.queues, key=lambda q: (pending[q.key][0].e2e_deadline_ms, q.key)):
            stage = q.key.stage
            wf = snapshot.workflows[q.key.workflow]
            share = self.stage_share(wf, stage, hardware)
            jobs = pending[q.key]
            resources = self.whole_device_resources(stage, view)
            while jobs:
                target = (jobs[0].e2e_deadline_ms - now_ms) * share
                options = self._candidates(stage, len(jobs), resources, view, now_ms)
                fits = [o for o in options if o[1] <= target]
                if fits:
                    _cost, lat, res, b = min(fits, key=lambda o: (o[0], o[1]))
                    at_risk = False
                elif options:
                    top = max(o[3] for o in options)
                    _cost, lat, res, b = min((o for o in options if o[3] == top), key=lambda o: (o[1], o[0]))
                    at_risk = True
                else:
                    holds.append(Hold(q.key, "no placeable whole-device configuration now"))
                    break
                placement = self.place(view, stage, res, jobs[:b], now_ms)
                stats.append(plain_stats(q.key, not at_risk, len(options)))
                if placement is None:
                    holds.append(Hold(q.key, "waiting for a worker to start or free up"))
                    break
                batch, jobs = jobs[:b], jobs[b:]
                busy = lat - (self.profile.cold_start_ms(stage, res[0]) if placement.cold else 0.0)
                reason = f"llama: target {target:.1f} ms, batch {b} on {res[0]}"
                dispatches.append(self.dispatch(q, batch, res, placement, busy, at_risk, reason))
        return SchedulingResult(tuple(dispatches), tuple(holds), (), tuple(stats))

    def _candidates(
        self, stage: str, n: int, resources: list[Resource], view: ClusterView, now_ms: float
    ) -> list[tuple[float, float, Resource, int]]:
        """(cost per request, latency with cold start, resources, batch) placeable now, for batches up to ``n``.

        Placeable: an idle warm worker with compute free, or room for a new one
        when no worker of the stage is starting.
        """
        space = self.settings.config_space
        sizes = sorted({b for b in space.batches if b <= n} | {min(n, space.max_batch)})
        warm_now = view.warm_resources(stage)
        may_start = not self.starting(stage, now_ms)
        out = []
        for res in resources:
            hw, v, s = res
            warm = res in warm_now
            if not warm and not (may_start and view.can_start(v, s, hw)):
                continue
            cold = 0.0 if warm else self.profile.cold_start_ms(stage, hw)
            for b in sizes:
                lat = self.latency_ms(stage, b, res)
                if lat is None:
                    continue
                total = lat + cold
                out.append((self.cost_per_request(stage, b, res, total), total, res, b))
        return out
