"""The JSON shape of a case file: every key known, every part of the right type, before a case is built.

:meth:`esg_prefect.simulator.case.Case.from_dict` reads a case from JSON; a
typo in a key would otherwise be ignored, a string of stages read as its
letters, and a value of the wrong type fail inside Python. These checks name
the key instead. The workload's weights are checked against the workflows
here too, so that a loaded case is refused at once, not when its arrivals
are drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from esg_prefect.exceptions import ConfigError

__all__ = [
    "NODE_KEYS",
    "WORKFLOW_KEYS",
    "check_parts",
    "check_seed",
    "check_weights",
    "known_keys",
    "shaped",
]


def known_keys(where: str, value: Mapping[str, Any], known: Iterable[str]) -> None:
    """Refuse a key the case format does not have (a typo would otherwise be ignored), naming it."""
    known = tuple(known)
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in the case's {where}; known: {sorted(known)}")


def shaped(key: str, value: Any, shape: type) -> None:
    """Refuse a case value of the wrong JSON type, naming its key (not a Python indexing error)."""
    if not isinstance(value, shape) or value == "":
        want = "a list" if shape is list else "a non-empty string" if shape is str else "an object"
        raise ConfigError(f"the case's {key!r} must be {want}, got {type(value).__name__} {value!r:.60}")


def check_seed(seed: Any) -> None:
    """Refuse a seed that is not an integer >= 0 (JSON gives 1.5, true, null, "3" as such), naming it."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"the case's 'seed' must be an integer >= 0, got {type(seed).__name__} {seed!r:.60}")


WORKFLOW_KEYS = ("name", "stages", "edges", "slo_ms")
NODE_KEYS = ("name", "vcpus", "gpus", "max_clients", "max_workers")
PRICE_KEYS = ("price_per_vcpu_s", "price_per_gpu_s")


def check_parts(data: Mapping[str, Any]) -> None:
    """Refuse, by key, a part of a case of the wrong JSON type or missing a key it needs.

    Unchecked, a string of stages or GPUs reads as its letters (``"T4"``: GPUs ``T`` and ``4``),
    a misspelt price key is ignored, and a value of the wrong type fails inside Python.
    """
    for key in (k for k in ("name", "profile") if k in data):
        shaped(key, data[key], str)
    parts: list[tuple[str, Any, Sequence[str], dict[str, type]]] = [
        (f"workflows[{i}]", w, WORKFLOW_KEYS, {"stages": list, "edges": list})
        for i, w in enumerate(data.get("workflows", ()))
    ]
    parts += [(f"cluster[{i}]", n, NODE_KEYS[:3], {"gpus": list}) for i, n in enumerate(data.get("cluster", ()))]
    if "prices" in data:
        known_keys("prices", data["prices"], PRICE_KEYS)
        parts.append(("prices", data["prices"], PRICE_KEYS, {"price_per_gpu_s": dict}))
    if "workload" in data:
        parts.append(("workload", data["workload"], ("trace", "rate_per_s"), {}))
    for where, part, required, shapes in parts:
        for key in (k for k in required if k not in part):
            raise ConfigError(f"the case's {where!r} is missing the key {key!r}")
        for key, shape in shapes.items():
            shaped(f"{where}.{key}", part[key], shape)
    for i, w in enumerate(data.get("workflows", ())):
        for edge in (e for e in w["edges"] if not isinstance(e, list) or len(e) != 2):
            raise ConfigError(
                f"the case's 'workflows[{i}].edges' must hold [upstream, downstream] pairs, got {edge!r:.60}"
            )


def check_weights(weights: Sequence[float] | None, workflows: Sequence[str]) -> None:
    """Refuse workload weights that cannot share requests among ``workflows``: one per workflow, a positive sum.

    Each weight is a finite number >= 0 already (``WorkloadSpec``); this is
    what only the whole case can tell. Arrivals would refuse the same when
    drawn, after the case was accepted and its notes printed.
    """
    if weights is None:
        return
    if len(weights) != len(workflows):
        raise ConfigError(
            f"workload: weights has {len(weights)} values for {len(workflows)} workflows "
            f"(one per workflow, in the case's order: {list(workflows)})"
        )
    if not math.fsum(weights) > 0:
        raise ConfigError(
            f"workload: weights must have a positive sum (some workflow must get requests), got {list(weights)}"
        )
