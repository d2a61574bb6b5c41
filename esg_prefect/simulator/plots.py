"""PNG plots of the experiments (matplotlib, Agg backend: no display needed).

One function per figure; each takes the rows of :mod:`esg_prefect.simulator.experiments`
and a path, and writes a small PNG. matplotlib is imported when a plot is drawn,
so the simulator itself does not need it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]

_STYLE = {
    "esg": ("C3", "o", "-"),
    "esg-noshare": ("C1", "s", "--"),
    "esg-greedy": ("C5", "^", "--"),
    "esg-fastest": ("C9", "<", "--"),
    "esg-unpruned": ("C6", "v", ":"),
    "per-invocation": ("C7", "x", ":"),
    "triton": ("C0", "D", "-"),
    "infless": ("C2", "P", "-"),
    "fast-gshare": ("C4", "*", "-"),
    "llama": ("C8", "h", "-"),
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(name: str) -> dict[str, Any]:
    color, marker, line = _STYLE.get(name, ("C9", ".", "-"))
    return {"color": color, "marker": marker, "linestyle": line, "label": name}


def _by_scheduler(rows: Sequence[Row], x: str) -> dict[str, list[tuple[float, Row]]]:
    out: dict[str, list[tuple[float, Row]]] = defaultdict(list)
    for r in rows:
        out[r["scheduler"]].append((float(r[x]), r))
    for v in out.values():
        v.sort(key=lambda t: t[0])
    return out


def _mean_by(rows: Sequence[Row], x: str, y: str) -> dict[str, tuple[list[float], list[float]]]:
    """Mean of ``y`` per (scheduler, x) over seeds."""
    acc: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in rows:
        if r.get(y) is not None:
            acc[(r["scheduler"], float(r[x]))].append(float(r[y]))
    out: dict[str, tuple[list[float], list[float]]] = {}
    for (s, xv), ys in sorted(acc.items()):
        xs, vals = out.setdefault(s, ([], []))
        xs.append(xv)
        vals.append(sum(ys) / len(ys))
    return out


def slo_and_cost(rows: Sequence[Row], x: str, xlabel: str, path: Path, title: str) -> None:
    """Two panels: SLO hit rate and batch cost per request against ``x``."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for s, (xs, ys) in _mean_by(rows, x, "slo_hit_rate").items():
        a.plot(xs, [100 * y for y in ys], **_style(s))
    for s, (xs, ys) in _mean_by(rows, x, "batch_cost_per_request").items():
        b.plot(xs, [1e6 * y for y in ys], **_style(s))
    a.set_xlabel(xlabel)
    a.set_ylabel("SLO hit rate (%)")
    a.set_ylim(-3, 103)
    b.set_xlabel(xlabel)
    b.set_ylabel("batch cost per request (µ$)")
    b.set_yscale("log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def bars(rows: Sequence[Row], group: str, path: Path, title: str) -> None:
    """SLO hit rate and batch cost per request as grouped bars (one group per value of ``group``)."""
    plt = _plt()
    groups = sorted({str(r[group]) for r in rows})
    scheds = sorted({r["scheduler"] for r in rows}, key=lambda s: list(_STYLE).index(s) if s in _STYLE else 99)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / max(1, len(scheds))
    for i, s in enumerate(scheds):
        slo = []
        cost = []
        for g in groups:
            rs = [r for r in rows if r["scheduler"] == s and str(r[group]) == g]
            slo.append(100 * sum(r["slo_hit_rate"] for r in rs) / len(rs) if rs else 0)
            cost.append(1e6 * sum(r["batch_cost_per_request"] for r in rs) / len(rs) if rs else 0)
        xs = [j + i * width for j in range(len(groups))]
        color = _style(s)["color"]
        a.bar(xs, slo, width, label=s, color=color)
        b.bar(xs, cost, width, label=s, color=color)
    for ax in (a, b):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
        ax.set_xticklabels(groups, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    a.set_ylabel("SLO hit rate (%)")
    b.set_ylabel("batch cost per request (µ$)")
    b.set_yscale("log")
    a.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def decision_time(rows: Sequence[Row], path: Path) -> None:
    """E3: decision time p50/p99 against the number of stages, one line per configuration space."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, space in enumerate(sorted({r["space"] for r in rows})):
        rs = sorted((r for r in rows if r["space"] == space), key=lambda r: r["stages"])
        ks = [r["stages"] for r in rs]
        cfg = rs[0]["configs"]
        a.plot(ks, [r["p99_ms"] for r in rs], marker="o", color=f"C{i}", label=f"{space} ({cfg} configs) p99")
        a.plot(ks, [r["p50_ms"] for r in rs], marker=".", color=f"C{i}", linestyle=":", label=f"{space} p50")
        b.plot(ks, [r["mean_expansions"] for r in rs], marker="o", color=f"C{i}", label=space)
    a.axhline(10.0, color="k", linewidth=0.8, linestyle="--", label="10 ms (paper)")
    a.set_xlabel("stages planned together")
    a.set_ylabel("decision time (ms)")
    a.set_yscale("log")
    b.set_xlabel("stages planned together")
    b.set_ylabel("A* expansions (mean)")
    b.set_yscale("log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("E3: ESG_1Q decision time vs stages and configuration count", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def pruning(rows: Sequence[Row], path: Path) -> None:
    """E4: mean expansions and p99 decision time per pruning setting."""
    plt = _plt()
    labels = [r["pruning"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(labels, [r["mean_expansions"] for r in rows], color="C0")
    a.set_ylabel("A* expansions (mean)")
    a.set_yscale("log")
    b.bar(labels, [r["p99_ms"] or 0 for r in rows], color="C3")
    b.set_ylabel("decision time p99 (ms)")
    b.set_yscale("log")
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7, rotation=15)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("E4: pruning ablation, 4-stage chain (plan cost identical in every setting)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def dag_growth(rows: Sequence[Row], path: Path) -> None:
    """E5: decision time against DAG size, segment (dominator split) vs whole-workflow horizon."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, h in enumerate(("segment", "workflow")):
        rs = sorted((r for r in rows if r["horizon"] == h), key=lambda r: r["dag_stages"])
        ax.plot([r["dag_stages"] for r in rs], [r["p99_ms"] for r in rs], marker="o", color=f"C{i}", label=f"{h} p99")
        ax.plot(
            [r["dag_stages"] for r in rs],
            [r["p50_ms"] for r in rs],
            marker=".",
            linestyle=":",
            color=f"C{i}",
            label=f"{h} p50",
        )
    ax.set_xlabel("stages in the DAG")
    ax.set_ylabel("decision time (ms)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("E5: dominator split vs whole-workflow search", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def stalls(rows: Sequence[Row], path: Path) -> None:
    """E7: stacked mean queue / cold start / transfer / execution time per stage, per scheduler."""
    plt = _plt()
    scheds = sorted({r["scheduler"] for r in rows})
    fig, axes = plt.subplots(1, len(scheds), figsize=(5 * len(scheds), 3.8), sharey=True, squeeze=False)
    parts = (
        ("queue_ms", "queue", "C0"),
        ("cold_start_ms", "cold start", "C3"),
        ("transfer_ms", "transfer", "C2"),
        ("exec_ms", "execution", "C7"),
    )
    for ax, s in zip(axes[0], scheds, strict=True):
        rs = [r for r in rows if r["scheduler"] == s]
        labels = [f"{r['workflow'][:8]}/{r['stage'][:10]}" for r in rs]
        bottom = [0.0] * len(rs)
        for key, name, color in parts:
            vals = [r[key] for r in rs]
            ax.bar(labels, vals, bottom=bottom, label=name, color=color)
            bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
        ax.set_title(s, fontsize=9)
        ax.tick_params(axis="x", labelsize=6, rotation=70)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("mean ms per job")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("E7: where a job's time goes, per stage", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
