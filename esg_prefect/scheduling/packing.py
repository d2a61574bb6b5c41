"""Size-aware batch packing (Cypress): fill a batch by its items' predicted time, not their count.

ESG plans with the profile table, which answers for batches of *typical*
items: a plan of batch 8 on one vCPU budgets the time 8 typical items take.
When the items waiting are longer than typical (long texts, many crops), 8 of
them overrun that budget and the request misses its deadline; when they are
shorter, the budget would have carried more of them, and the queue pays for
more batches (more workers, more busy time) than it needs.

:func:`pack` keeps ESG's choice of resources and re-sizes the batch to a
time budget: what the plan leaves this stage (the slack of the queue's most
urgent job minus the planned latencies of the plan's later stages), or the
planned batch latency (cold start included) when that is larger. Jobs are
taken in EDF order, and the batch holds the number ``k`` of them whose
size-aware prediction, ``L(stage, k) x size_factor(sizes of those k jobs)``
(:meth:`esg_prefect.model.profile.LatencyProfile.size_factor`; plus the
per-batch overhead of a corrected profile, which does not scale), fits the
budget at the least predicted time per job (ESG's own criterion, on fixed
resources; ties go to the larger batch). The later stages' planned latencies
are summed: exact for a chain, conservative where the plan branches. At
least one job always goes (a single job longer than the budget runs alone,
as it would have anyway). At most the configuration space's
largest batch: the table is not measured beyond it. The plan's later stages
are untouched, so the plan stays within its slack when the predictions hold.

Choices, stated:

* EDF order is kept, never skipping a long job to fit shorter ones behind it:
  a skipped job would wait longer than its deadline order says, and Cypress's
  gain comes from the batch size, not from reordering.
* Only dispatch decisions are re-sized; a decision to wait for a fuller batch
  stands (its wait is a projection from the arrival rate anyway).
* With a count-only profile, or items of typical size, the batch is the one
  ESG chose (the factor is 1), so paper-faithful ESG is what runs without a
  size model.

Example:
    >>> from esg_prefect.model import Config, LatencyProfile, ProfilePoint, PriceSheet
    >>> from esg_prefect.model.size_model import SizeModel, SizeSample
    >>> from esg_prefect.scheduling.settings import ESGSettings
    >>> from esg_prefect.scheduling.tables import CandidateTables
    >>> samples = [SizeSample("enc", "cpu", b, 1, 0.0, b * z, 2.0 * b + 0.1 * b * z)
    ...            for b in (1, 2, 4, 8) for z in (50.0, 100.0, 150.0)]
    >>> sizes = SizeModel.fit(samples)
    >>> prof = LatencyProfile([ProfilePoint("enc", "cpu", b, 1, 0.0, 12.0 * b) for b in (1, 2, 4, 8)],
    ...                       sizes=sizes)
    >>> tables = CandidateTables(prof, PriceSheet(1e-5, {}), ESGSettings())
    >>> plan = Choice("enc", Config(4, 1, 0.0), "cpu", 48.0)  # 4 typical (100-word) items
    >>> short = [25.0] * 8  # eight 25-word items fit the time of four typical ones
    >>> packed = pack(tables, plan, short, max_batch=8)
    >>> packed.config.batch, round(packed.latency_ms, 1)
    (8, 36.0)
    >>> pack(tables, plan, [300.0] * 4, max_batch=8).config.batch  # long items: fewer per batch
    1
"""

from __future__ import annotations

from collections.abc import Sequence

from esg_prefect.model.config import Config
from esg_prefect.scheduling.tables import CandidateTables, Choice

__all__ = ["pack", "packed_stages", "packs"]

_EPS_MS = 1e-6


def packs(tables: CandidateTables) -> bool:
    """Whether packing by predicted time is on for these tables (knob on and a size model present)."""
    return tables.settings.cypress.size_aware and tables.profile.sizes is not None


def packed_stages(tables: CandidateTables) -> frozenset[str]:
    """The stages whose batches :func:`pack` may re-size; none when packing is off.

    A stage with a reliable size fit on any hardware or configuration: :func:`pack`
    re-sizes only by :meth:`~esg_prefect.model.size_model.SizeModel.steering_fit`,
    which falls back only to reliable fits of the same stage. Per stage, not per
    configuration, so a stage's batches are either packed or shared (``share_batches``), never both.
    """
    sizes = tables.profile.sizes
    if sizes is None or not packs(tables):
        return frozenset()
    return frozenset(f.stage for f in sizes.fits if f.reliable)


def pack(
    tables: CandidateTables,
    choice: Choice,
    item_sizes: Sequence[float],
    max_batch: int,
    budget_ms: float | None = None,
) -> Choice:
    """``choice`` re-sized to the jobs (sizes given in EDF order) whose predicted time fits its budget.

    Args:
        tables: the scheduler's tables (latency model, with its size model).
        choice: the dispatch ESG chose: resources, planned batch and latency.
        item_sizes: input sizes of the queue's jobs in EDF order (at least one).
        max_batch: the configuration space's largest batch.
        budget_ms: the time the plan leaves this stage (the slack minus the
            plan's later stages); the planned latency when larger or not given.

    Returns:
        A choice on the same resources whose ``config.batch`` is the number of
        leading jobs to send and whose ``latency_ms`` is their size-aware
        prediction (cold start included). ``choice`` itself when nothing changes.
    """
    profile = tables.profile
    sizes = profile.sizes
    if sizes is None or not item_sizes:
        return choice
    stage, cfg, hw = choice.stage, choice.config, choice.hardware
    if sizes.steering_fit(stage, hw, cfg.vcpus, cfg.gpu_share) is None:
        return choice  # the stage's time does not depend on size (or no reliable fit says it does)
    cold_ms = profile.cold_start_ms(stage, hw) if choice.cold else 0.0
    budget = max(choice.latency_ms, budget_ms or 0.0) + _EPS_MS
    top = min(len(item_sizes), max_batch)
    best: tuple[int, float] | None = None
    first: float | None = None
    total = 0.0
    for k in range(1, top + 1):
        total += item_sizes[k - 1]
        factor = sizes.total_factor(stage, k, total, hardware=hw, vcpus=cfg.vcpus, gpu_share=cfg.gpu_share)
        sized = tables.sized_latency_ms(stage, k, cfg.vcpus, cfg.gpu_share, hw, factor)
        if sized is None:
            continue  # a batch size the table does not cover on these resources
        pred = sized + cold_ms
        if first is None:
            first = pred
        # Within the budget, the cheapest per job (ESG's own criterion; the resources are fixed, so the
        # price per ms is too); ties go to the larger batch (fewer batches for the queue).
        if pred <= budget and (best is None or pred / k <= best[1] / best[0] + _EPS_MS):
            best = (k, pred)
    if best is None:  # even one job overruns the budget: it goes alone
        if first is None:
            return choice
        best = (1, first)
    k, pred = best
    if k == cfg.batch and abs(pred - choice.latency_ms) <= _EPS_MS:
        return choice
    return Choice(stage, Config(k, cfg.vcpus, cfg.gpu_share), hw, pred, 0.0, choice.cold)
