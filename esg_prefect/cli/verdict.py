"""The comparison in words: who is cheapest on the whole bill, who meets the most SLOs, who has the best p99.

``compare --case`` prints a table of every scheduler and ESG's ratios to the
best baseline; a reader still had to work out which scheduler wins and in
which direction a ratio reads. These sentences say it, with units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["verdict"]


def _name(row: Mapping[str, Any]) -> str:
    return str(row["scheduler"])


def _times(a: float, b: float) -> str:
    """``a`` against ``b`` as "N.NNx cheaper/dearer" (both > 0)."""
    if b <= 0 or a <= 0:
        return "n/a"
    return f"{b / a:.2f}x cheaper" if a < b else f"{a / b:.2f}x dearer" if a > b else "the same"


def _ties(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any], key: str) -> int:
    """How many rows have exactly ``best``'s value of ``key`` (``best`` among them)."""
    return sum(1 for r in rows if r[key] == best[key])


def _winner(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any], key: str, value: str, rule: str) -> str:
    """``"name, value"``, or ``"N schedulers at value; rule: name"`` when others share the value."""
    n = _ties(rows, best, key)
    return f"{_name(best)}, {value}" if n == 1 else f"{n} schedulers at {value}; {rule}: {_name(best)}"


def verdict(rows: Sequence[Mapping[str, Any]], esg: str = "esg") -> list[str]:
    """Sentences for one comparison's rows (one seed): whole bill, SLO hit rate, p99, and ESG against the best.

    ``cost_per_request`` is the whole bill per request (busy, idle and cold
    starts, in dollars, written as every cost is: :mod:`esg_prefect.model.money`);
    the best baseline is the one meeting the most SLOs (ties: the cheaper),
    :func:`esg_prefect.simulator.experiments.best_baseline`, the one the
    headline table names.
    """
    from esg_prefect.model.money import money_str
    from esg_prefect.simulator.experiments import best_baseline

    if not rows:
        return []
    cheapest = min(rows, key=lambda r: (r["cost_per_request"], _name(r)))
    most = max(rows, key=lambda r: (r["slo_hit_rate"], -r["cost_per_request"]))
    fastest = min(rows, key=lambda r: (r["p99_ms"], _name(r)))
    cost, at = money_str(cheapest["cost_per_request"]), money_str(most["cost_per_request"])
    at = f" (at {at} per request)" if _ties(rows, most, "slo_hit_rate") == 1 else f", at {at} per request"
    out = [
        "Cheapest on the whole bill (busy + idle + cold starts): "
        + _winner(rows, cheapest, "cost_per_request", f"{cost} per request", "first by name")
        + ".",
        "Most SLOs met: "
        + _winner(rows, most, "slo_hit_rate", f"{most['slo_hit_rate']:.2%}", "the cheapest of them")
        + f"{at}.",
        "Lowest p99 latency: " + _winner(rows, fastest, "p99_ms", f"{fastest['p99_ms']:.1f} ms", "first by name") + ".",
    ]
    mine = [r for r in rows if _name(r) == esg]
    best = best_baseline(rows, esg)
    if mine and best is not None:
        e = mine[0]
        baselines = [r for r in rows if best_baseline([r], esg) is not None]  # best_baseline's own candidates
        n = _ties(baselines, best, "slo_hit_rate")
        which = _name(best) if n == 1 else f"{_name(best)}, the cheapest of {n} at {best['slo_hit_rate']:.2%}"
        points = (e["slo_hit_rate"] - best["slo_hit_rate"]) * 100
        out.append(
            f"ESG against the baseline meeting the most SLOs ({which}): "
            f"{_times(e['cost_per_request'], best['cost_per_request'])} on the whole bill "
            f"({money_str(e['cost_per_request'])} vs {money_str(best['cost_per_request'])} per request), "
            f"SLO hit rate {points:+.2f} points ({e['slo_hit_rate']:.2%} vs {best['slo_hit_rate']:.2%}), "
            f"p99 {e['p99_ms']:.1f} vs {best['p99_ms']:.1f} ms."
        )
    return out
