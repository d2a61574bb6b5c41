"""ESG's rules for a stage's busy warm workers: when a queue waits for one rather than use another.

A worker warm for a stage but busy now is not among ESG_1Q's options (only
what can be placed now is). Three rules look at such workers after ESG_1Q has
chosen, each with a knob (:class:`~esg_prefect.scheduling.settings.ESGSettings`):

* **late jobs** (``wait_for_busy_warm``): when no plan meets the slack and the
  fastest option is a cold start, the jobs wait for a busy worker that would
  have run them no later (always with ``idle_aware``; else only when the start
  would stop idle workers), and past capacity they wait for it rather than
  evict another stage's idle worker: a cold-start storm otherwise;
* **no new worker** (``idle_aware``): a planned cold start is dropped when a
  busy worker of the stage frees up and runs the batch within the slack;
* **a worker this round took** (``wait_for_busy_warm``): a best-effort cold
  start (no plan met the slack) is dropped when a worker that this round gave
  a batch frees up and runs this batch within the slack and within a hundredth
  of the cold option's latency (a nearer bound cost the bursty code trace SLO hits:
  there the late starts are the next wave's capacity). The round's earlier
  dispatch took it from the options, so without the rule a queue's second
  batch of a round started a worker, late, that the first one's would have
  served in time (docs/decisions/whole-bill.md, section 14); with
  ``wait_for_taken`` > 0 (and ``idle_aware``) a planned cold start waits so
  too, within that fraction of the cold option's latency: a queue split into
  batches of one over its warm workers otherwise starts a worker for the last
  one (section 15);
* **consolidation** (``consolidate_slack``): a planned dispatch onto an idle
  worker that has idled ``consolidate_idle_ms`` or more waits instead for a
  busy worker of the stage that is no dearer per job, when that one runs the
  batch within ``consolidate_slack`` of the slack. The idle worker is surplus
  (the stage's load fits on the busy ones); using it would keep it alive
  through another keep-alive, while waiting costs the busy time only and lets
  it expire. docs/decisions/whole-bill.md, section 8.

A worker's end is the platform's prediction (``Worker.free_at_ms``). Holds of
one round book the worker they wait for (:class:`Bookings`), so two queues do
not count on the same free time.
"""

from __future__ import annotations

import math

from esg_prefect.model.config import Config
from esg_prefect.model.jobs import Job
from esg_prefect.scheduling.dispatch import ClusterView
from esg_prefect.scheduling.tables import CandidateTables, Choice, to_us

__all__ = ["Bookings", "BusyWarm"]

Bookings = dict[str, float]
"""Per busy worker id, when it is free once the round's holds for it have run (ms)."""


class BusyWarm:
    """The busy-warm-worker questions ESG asks after ESG_1Q (module docstring)."""

    def __init__(self, tables: CandidateTables) -> None:
        self.tables = tables
        self.settings = tables.settings

    @staticmethod
    def evicts(c: Choice, view: ClusterView, jobs: list[Job]) -> bool:
        """Whether starting a worker for ``c`` would stop idle workers (ESG_Dispatch's own placement)."""
        p = view.place(c.stage, c.config.vcpus, c.config.gpu_share, c.hardware, (j.input_node for j in jobs))
        return p is not None and bool(p.evict)

    def soon_us(self, stage: str, view: ClusterView, batch: int, queued: int, now_ms: float) -> float:
        """Upper bound on when a busy worker warm for ``stage`` could have run the ``queued`` jobs; inf if none.

        Its current batch ends when the platform predicts (``Worker.free_at_ms``),
        or else within the space's largest batch's latency on its resources (a
        worker still starting, within its cold start); the queue follows in
        batches of ``batch``.
        """
        top = self.settings.config_space.max_batch
        turns = -(-queued // batch)
        best = math.inf
        for w in view.busy_by_stage.get(stage, ()):
            if w.free_at_ms is not None:
                now_lat: float | None = max(0.0, w.free_at_ms - now_ms)
            elif w.starting:
                now_lat = self.tables.profile.cold_start_ms(stage, w.hardware)
            else:
                now_lat = self.tables.latency_ms(stage, top, w.vcpus, w.gpu_share, w.hardware)
            ours = self.tables.latency_ms(stage, batch, w.vcpus, w.gpu_share, w.hardware)
            if now_lat is not None and ours is not None:
                best = min(best, to_us(now_lat + turns * ours))
        return best

    def frees_in_time(self, c: Choice, left_ms: float, view: ClusterView, now_ms: float) -> bool:
        """Whether a busy worker warm for ``c``'s stage could run its batch once free within ``left_ms``."""
        for w in view.busy_by_stage.get(c.stage, ()):
            if w.free_at_ms is None:
                continue
            lat = self.tables.latency_ms(c.stage, c.config.batch, w.vcpus, w.gpu_share, w.hardware)
            if lat is not None and max(0.0, w.free_at_ms - now_ms) + lat <= left_ms:
                return True
        return False

    def consolidates(self, c: Choice, left_ms: float, view: ClusterView, now_ms: float, booked: Bookings) -> bool:
        """Whether ``c`` (onto an idle warm worker) should wait for a busy one instead; books it if so.

        True when the idle worker the placement would reuse has idled at least
        ``consolidate_idle_ms``, and a busy worker of the stage (not starting,
        its end predicted) runs the batch at no more cost per job, ending
        within ``consolidate_slack`` of ``left_ms`` after its current batch and
        the round's earlier holds for it.
        """
        since = view.warm_idle_since(c.stage).get((c.hardware, c.config.vcpus, c.config.gpu_share))
        if since is None or now_ms - since < self.settings.consolidate_idle_ms:
            return False
        limit = left_ms * self.settings.consolidate_slack
        batch = c.config.batch
        prices = self.tables.prices
        mine = prices.batch_cost(c.config, c.hardware, c.latency_ms) * (1.0 + 1e-9)
        fits: list[tuple[float, str]] = []  # (when it would end the batch, worker id) of each busy worker that may
        for w in view.busy_by_stage.get(c.stage, ()):
            if w.free_at_ms is None or w.starting:
                continue
            lat = self.tables.latency_ms(c.stage, batch, w.vcpus, w.gpu_share, w.hardware)
            if lat is None:
                continue
            free = max(now_ms, booked.get(w.worker_id, w.free_at_ms))
            if free - now_ms + lat > limit:
                continue
            if prices.batch_cost(Config(batch, w.vcpus, w.gpu_share), w.hardware, lat) <= mine:
                fits.append((free + lat, w.worker_id))
        if not fits:
            return False
        end, wid = min(fits)  # the one that ends it first (not the view's list order, which its updates change)
        booked[wid] = end
        return True

    def taken_in_time(self, c: Choice, left_ms: float, view: ClusterView, now_ms: float, booked: Bookings) -> bool:
        """Whether a worker this round took for ``c``'s stage runs ``c``'s batch once free within ``left_ms``; books it.

        The worker's end is the one its commit predicted; holds earlier in the
        round for the same worker push it later (``booked``).
        """
        for w in view.taken(c.stage):
            assert w.free_at_ms is not None  # set by the commit that took it
            lat = self.tables.latency_ms(c.stage, c.config.batch, w.vcpus, w.gpu_share, w.hardware)
            free = max(now_ms, booked.get(w.worker_id, w.free_at_ms))
            if lat is not None and free - now_ms + lat <= left_ms:
                booked[w.worker_id] = free + lat
                return True
        return False
