"""Shared batches: one stage's batch takes on waiting calls of other workflows' queues.

ESG keeps one queue per (workflow, stage): the SLO split, the deadlines and
the arrival rate are a workflow's own. But a worker runs a model, not a
workflow: when two pipelines use the same stage (resnet50 in image-classify
and image-tag), a batch dispatched for one can carry the other's waiting
calls for the price of a larger batch on a share that is paid for anyway.
Without it each queue fills its own small batches. Measured on the whole-bill
grid it cuts the bill in some cells and costs SLO hits in others, so it is
off by default (docs/decisions/whole-bill.md, "Shared batches").

The rule (``ESGSettings.share_batches``), applied after ESG_1Q chose a
dispatch that meets its plan (never to a best-effort one): add the other
queues' waiting calls of the stage in order of their deadline while

* the batch stays within the configuration space's largest batch;
* the latency the larger batch adds fits the slack the dispatching queue's
  plan left (its first job's deadline, less the plan, less the batch); and
* the larger batch, its cold start included, ends before each added call's
  own stage deadline; and
* the added call's input is on a node the batch's inputs are on already
  (a transfer is not in the profile's latency).

The calls taken leave their queues' lists for the rest of the round.

A stage whose batches Cypress's packing may re-size (``size_aware``, a
reliable size fit of the stage: :func:`~esg_prefect.scheduling.packing.packed_stages`)
is left out: its batches are sized by their items' predicted time, and a
top-up would add items that time never counted. Its dispatches take no riders
and its calls ride no other batch (a top-up takes calls of its own stage only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.scheduling.tables import CandidateTables, Choice


class SharedBatches:
    """Per round: which calls are still free, and the top-up of a dispatch from other queues of its stage.

    Args:
        tables: the scheduler's tables (the batch latencies).
        max_batch: the largest batch of the configuration space.
        packed: the stages packing re-sizes, whose batches are never shared.
    """

    def __init__(self, tables: CandidateTables, max_batch: int, packed: frozenset[str] = frozenset()) -> None:
        self.tables = tables
        self.max_batch = max_batch
        self.packed = packed
        self._pending: dict[QueueKey, list[Job]] = {}
        self._by_stage: dict[str, list[QueueKey]] = {}
        self.taken: set[str] = set()

    def begin(self, pending: dict[QueueKey, list[Job]]) -> None:
        """Start a round over these queues (each one's jobs in EDF order)."""
        self._pending = pending
        self.taken = set()
        by_stage: dict[str, list[QueueKey]] = {}
        for key in pending:
            by_stage.setdefault(key.stage, []).append(key)
        self._by_stage = {s: keys for s, keys in by_stage.items() if len(keys) > 1 and s not in self.packed}

    def free(self, key: QueueKey) -> list[Job]:
        """The queue's jobs that no dispatch of this round took (EDF order)."""
        jobs = self._pending[key]
        if not self.taken:
            return list(jobs)
        return [j for j in jobs if j.job_id not in self.taken]

    def dispatched(self, jobs: Iterable[Job]) -> None:
        """These jobs left for a batch this round."""
        self.taken.update(j.job_id for j in jobs)

    def top_up(
        self, key: QueueKey, c: Choice, batch: list[Job], room_ms: float, now_ms: float
    ) -> tuple[Choice, list[Job]]:
        """The choice and batch grown with other queues' calls of the stage (unchanged when none fits)."""
        others = self._by_stage.get(key.stage)
        b = len(batch)
        if not others or b >= self.max_batch or room_ms <= 0:
            return c, batch
        cand = sorted(
            (j for k in others if k != key for j in self._pending[k] if j.job_id not in self.taken),
            key=_by_deadline,
        )
        if not cand:
            return c, batch
        cfg, hw = c.config, c.hardware
        base = self.tables.latency_ms(key.stage, b, cfg.vcpus, cfg.gpu_share, hw)
        if base is None:
            return c, batch
        extra = c.latency_ms - base  # the cold start, where the choice has one
        added: list[Job] = []
        tightest = float("inf")
        latency = c.latency_ms
        nodes = {j.input_node for j in batch}
        for j in cand:
            if j.input_node not in nodes:
                continue  # its input is elsewhere: the transfer is not in the batch's latency
            size = b + len(added) + 1
            if size > self.max_batch:
                break
            lat = self.tables.latency_ms(key.stage, size, cfg.vcpus, cfg.gpu_share, hw)
            if lat is None or lat - base > room_ms:
                break
            if now_ms + lat + extra > min(tightest, j.deadline_ms):
                continue  # this call cannot ride; a later deadline may
            added.append(j)
            tightest = min(tightest, j.deadline_ms)
            latency = lat + extra
        if not added:
            return c, batch
        grown = dataclasses.replace(c, config=dataclasses.replace(cfg, batch=b + len(added)), latency_ms=latency)
        return grown, batch + added


def _by_deadline(job: Job) -> tuple[float, float, str]:
    return (job.deadline_ms, job.ready_ms, job.job_id)
