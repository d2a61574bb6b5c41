"""Input sizes of requests from a real trace, seeded: the workload side of Cypress.

A size-aware scheduler (:mod:`esg_prefect.scheduling.packing`) helps only when
requests differ in size, so a workload says how large each request is.
``request_sizes(source, count, seed)`` gives one *relative* size per request:
1.0 is a typical request (the source's median), 2.0 twice as long. The
simulator turns it into each stage's own unit by multiplying with the size the
stage was profiled with (its typical item); a live run turns it into real
inputs (the text benchmark writes texts that many times its typical length).

Sources:

``none``
    Every request typical (1.0): the count model's world.
``azure_llm_conv`` / ``azure_llm_code``
    Prompt lengths (``ContextTokens``) of the Azure LLM 2023 conversation or
    code trace (shipped, CC-BY 4.0), drawn at random (seeded) from the trace
    and divided by its median. Conversation prompts spread from 0.2x (10th
    percentile) to 2.7x (90th) the median, code prompts wider.
``lognormal:<sigma>``
    A log-normal with median 1 and shape ``sigma``: a control with a chosen spread.

Relative sizes are clamped to [1/8, 8]: beyond that the fitted size model
extrapolates too far (:data:`esg_prefect.model.size_model.FACTOR_BOUNDS`).
Drawn independently of arrival times (choice: the traces' arrivals are
rescaled and repeated, so aligning each arrival with its own prompt would tie
sizes to the rate; an independent draw keeps the distribution and the seed).

Example:
    >>> s = request_sizes("azure_llm_conv", 1000, seed=0)
    >>> len(s), 0.125 <= min(s) and max(s) <= 8.0
    (1000, True)
    >>> request_sizes("none", 3, seed=0)
    [1.0, 1.0, 1.0]
"""

from __future__ import annotations

import math
import random
import statistics

from esg_prefect.exceptions import InvalidInputError
from esg_prefect.workload.traces import llm_context_tokens

__all__ = ["SIZE_BOUNDS", "check_size_source", "request_sizes", "size_sources"]

SIZE_BOUNDS = (0.125, 8.0)
_LLM = {"azure_llm_conv": "conv", "azure_llm_code": "code"}


def size_sources() -> list[str]:
    """Names accepted by :func:`request_sizes` (``lognormal:<sigma>`` takes any sigma > 0)."""
    return ["none", *sorted(_LLM), "lognormal:<sigma>"]


def _clamp(x: float) -> float:
    return min(max(x, SIZE_BOUNDS[0]), SIZE_BOUNDS[1])


def request_sizes(source: str, count: int, seed: int) -> list[float]:
    """``count`` relative request sizes from ``source`` (module docstring), a function of its arguments.

    Raises:
        InvalidInputError: naming an unknown source, a bad sigma or a negative count.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidInputError(f"count must be an int >= 0, got {count!r}")
    sigma = check_size_source(source)
    if source == "none":
        return [1.0] * count
    rng = random.Random(f"sizes:{source}:{seed}")
    if source in _LLM:
        tokens = llm_context_tokens(_LLM[source])
        median = statistics.median(tokens)
        return [_clamp(rng.choice(tokens) / median) for _ in range(count)]
    return [_clamp(rng.lognormvariate(0.0, sigma)) for _ in range(count)]


def check_size_source(source: str) -> float:
    """Check a source name without reading any trace; returns the log-normal's sigma (0 for other sources).

    Raises:
        InvalidInputError: naming an unknown source or a bad sigma.
    """
    if source == "none" or source in _LLM:
        return 0.0
    if isinstance(source, str) and source.startswith("lognormal:"):
        text = source.partition(":")[2]
        try:
            sigma = float(text)
        except ValueError:
            sigma = math.nan
        if not (math.isfinite(sigma) and sigma > 0):
            raise InvalidInputError(f"size source {source!r}: sigma must be a number > 0, got {text!r}")
        return sigma
    raise InvalidInputError(f"size source must be one of {size_sources()}, got {source!r}")
