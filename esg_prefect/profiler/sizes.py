"""The Cypress size model fitted on a profile run's samples, and how much it explains.

For each stage the profiler records every timed call's total input size
(:class:`~esg_prefect.profiler.results.Sample`); this module fits
:class:`~esg_prefect.model.size_model.SizeModel` on them and reports, per
stage, whether the size term was kept, the fit of the largest batch, and the
held-out error of the size model against the count model (the profile table's
mean per batch size) on alternate calls. A stage whose size model does not
beat the count model is not worth predicting by size.
"""

from __future__ import annotations

from collections.abc import Sequence

from esg_prefect.model.size_model import SizeModel, holdout_errors
from esg_prefect.profiler.results import Sample

FIT_MIN_SAMPLES = 3
"""Calls of one stage on one configuration that a size fit needs (``SizeModel.fit``'s default)."""


def size_report(samples: Sequence[Sample]) -> str:
    """A text table per stage: size term kept, coefficients at the first configuration, held-out errors."""
    model = SizeModel.fit(samples, FIT_MIN_SAMPLES)
    errs = {e.stage: e for e in holdout_errors(samples)}
    head = (
        f"{'stage':<14}{'size?':>6}{'a[b1] ms':>9}{'a[bmax] ms':>11}{'c ms/unit':>11}{'R2':>7}"
        f"{'held-out MdAPE: size':>22}{'count':>8}{'calls':>7}"
    )
    lines = [head, "-" * len(head)]
    seen: set[str] = set()
    for f in model.fits:
        if f.stage in seen:
            continue
        seen.add(f.stage)
        e = errs.get(f.stage)
        tail = f"{e.size_mape:22.1%}{e.count_mape:8.1%}{e.calls:7d}" if e else f"{'-':>22}{'-':>8}{'-':>7}"
        lines.append(
            f"{f.stage:<14}{'yes' if model.size_sensitive(f.stage) else 'no':>6}{f.intercepts_ms[0][1]:9.2f}"
            f"{f.intercepts_ms[-1][1]:11.2f}{f.per_size_ms:11.4f}{f.r2:7.2f}{tail}"
        )
    if not seen:  # an empty table would say nothing: say why
        lines.append(
            f"(no stage fitted: {len(samples)} sample(s), and a fit needs {FIT_MIN_SAMPLES} or more calls of one "
            "stage on one configuration; profile without --quick for more)"
        )
    lines.append(
        "(a[b]: intercept at the smallest and largest batch, c: slope per unit of size, both of the first "
        "configuration of each stage; held-out errors over all configurations)"
    )
    return "\n".join(lines)
