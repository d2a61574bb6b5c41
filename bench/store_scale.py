"""Cost store at a long-lived service's size: reads and writes on stores of 10k and 100k flow runs, side by side.

A pool service (``esg-prefect pool serve``) may run for weeks and fill its cost
store with millions of rows. This builds SQLite stores in a temporary folder
with rows as a service writes them, at a constant rate of flow runs per day (so
that a store of 10x the runs spans 10x the days, and a window of the last day
holds as many rows at either size), and times on each:

* ``esg-prefect costs``: :meth:`CostStore.priced_costs` by run, workflow,
  deployment and day over the whole store, and by run over the last day
  (``--since 1d``; ``--limit N`` only cuts the rows printed, after the same read);
* a run's end (:meth:`CostStore.record_run`) and a batch flush
  (:meth:`CostStore.record_batches`, one batch of four calls) on the full store;
* the restart reads of :mod:`esg_prefect.store.earlier`: ``earlier_parts`` for a
  run whose first calls ran on an earlier pool instance, and ``ended_elsewhere``
  for a run that instance served whole, both among workers' thousands of
  batches and idle intervals.

The rows: flow runs of three workflows (3, 5 and 7 stage calls), batches of 1-8
calls of several runs on one worker per stage, an idle interval after every
batch (up to a 60 s keep-alive) and a pre-warm load before each worker's first,
three pool instances in turn (scopes, each its own price sheet and options).
They are written through the store's own API: every batch and its calls with
:meth:`CostStore.record_batches` (in flushes of ``FLUSH`` batches, as a busy pool
hands them over), every run's end as the rows :meth:`CostStore.record_run` writes
(``rows.run_row``) in one bulk upsert (a transaction per run would take minutes
to build and time nothing of interest).

Per operation it prints the milliseconds at each size (median of its repeats),
their ratio (linear in the store's size would be 10x; near 1x is what an
indexed read or write should show) and, with ``--old``, the same on a copy of
the big store without schema versions 7's and 8's indexes (a version-6 store), so
that the effect of the migrations is measured in the same run (the reads of the
whole store are not repeated there: they use none of those indexes).

Run:  python bench/store_scale.py [--sizes 10000 100000] [--old] [--explain]
Ends with: RESULT <operation>_ratio=<x> ... (big size over small)
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from esg_prefect.control.calls import StageResult
from esg_prefect.control.records import BatchDone, CallRecord, RunRecords, RunStub
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord
from esg_prefect.model.config import Config
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.store import CostStore
from esg_prefect.store import rows as R
from esg_prefect.store import writes as W
from esg_prefect.store.billing import Billing
from esg_prefect.store.earlier import earlier_parts, ended_elsewhere
from esg_prefect.store.migrations import MIGRATIONS
from esg_prefect.store.tables import RunRow

RUNS_PER_DAY = 2000
DAY_MS = 86_400_000.0
T0_MS = 1_767_225_600_000.0  # 2026-01-01 UTC
WORKFLOWS = {"text": 3, "image": 5, "video": 7}
DEPLOYMENTS = {"text": "text/prod", "image": "image/prod", "video": None}
SLO_MS = 30_000.0
KEEP_ALIVE_MS = 60_000.0
FLUSH = 256
SCOPES = ("a1b2c3d4e5f60718", "b2c3d4e5f6071829", "c3d4e5f60718293a")
SHEETS = (
    PriceSheet(0.00001, {"T4": 0.0001, "A100": 0.0004}),
    PriceSheet(0.00001, {"T4": 0.00012, "A100": 0.0004}),
    PriceSheet(0.000012, {"T4": 0.00012, "A100": 0.00045}),
)
BILLINGS = (Billing("equal", "attribute"), Billing("input_size", "attribute"), Billing("equal", "separate"))
NEW_INDEXES = ("ix_batches_worker_end", "ix_worker_idle_worker_start", "ix_stage_calls_start_ms")
"""Schema versions 7's and 8's indexes: dropped from a copy of the store for ``--old``."""


class Built:
    """A store built at one size, and the runs the timed operations use."""

    def __init__(self, path: Path, n_runs: int, build_s: float, rows: dict[str, int], picks: dict[str, Any]) -> None:
        self.path, self.n_runs, self.build_s, self.rows, self.picks = path, n_runs, build_s, rows, picks

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"


def build(folder: Path, n_runs: int, seed: int = 0) -> Built:
    """A store of ``n_runs`` flow runs (see the module's docstring), and the runs to time against."""
    rng = random.Random(seed)
    t_start = time.perf_counter()
    span_ms = n_runs / RUNS_PER_DAY * DAY_MS
    wf_names = list(WORKFLOWS)
    runs: list[tuple[str, str, float]] = []  # run id, workflow, arrival
    calls_by_queue: dict[tuple[str, int], list[tuple[float, str, int]]] = {}
    for i in range(n_runs):
        arrival = T0_MS + (i + rng.random()) * span_ms / n_runs
        wf = rng.choice(wf_names)
        rid = f"{i:08x}-run0-4000-8000-{seed:012x}"
        runs.append((rid, wf, arrival))
        for k in range(WORKFLOWS[wf]):
            calls_by_queue.setdefault((wf, k), []).append((arrival + k * 1000.0, rid, k))

    def scope_at(t: float) -> int:
        return min(2, int(3 * (t - T0_MS) / span_ms))

    by_run: dict[str, RunStub] = {rid: RunStub(rid, wf, arr, SLO_MS, f"run-{rid[:8]}") for rid, wf, arr in runs}
    run_calls: dict[str, list[CallRecord]] = {rid: [] for rid, _, _ in runs}
    done: list[tuple[int, BatchDone]] = []  # scope, batch
    n_batches = [0, 0, 0]
    for (wf, k), queue in sorted(calls_by_queue.items()):
        worker_free = [0.0, 0.0, 0.0]
        last: list[tuple[float, BatchRecord] | None] = [None, None, None]
        w_local = f"w{sorted(WORKFLOWS).index(wf) * 10 + k + 1}"
        hardware = "A100" if k % 3 == 2 else "T4"
        i = 0
        while i < len(queue):
            size = rng.randint(1, 8)
            group = queue[i : i + size]
            i += size
            ready = max(c[0] for c in group)
            sc = scope_at(ready)
            start = max(ready + rng.uniform(5.0, 200.0), worker_free[sc])
            end = start + 20.0 + 12.0 * len(group) + rng.uniform(0.0, 10.0)
            n_batches[sc] += 1
            bid = f"b{n_batches[sc]}"
            cfg = Config(len(group), 2, 0.25)
            batch = BatchRecord(
                bid,
                w_local,
                tuple(BatchItem(f"{rid}-{kk}", rid, 1.0 + rng.random()) for _, rid, kk in group),
                cfg,
                hardware,
                start,
                end,
            )
            n_runs_in = len({rid for _, rid, _ in group})
            calls = tuple(
                CallRecord(
                    f"{rid[:8]}-call-{kk}-{seed}",
                    f"{rid}-{kk}",
                    rid,
                    wf,
                    f"stage{kk}",
                    c_ready,
                    start,
                    end,
                    True,
                    StageResult(
                        f"{rid[:8]}-call-{kk}-{seed}",
                        None,
                        bid,
                        len(group),
                        w_local,
                        hardware,
                        2,
                        0.25,
                        start - c_ready,
                        end - start,
                        end - start,
                        False,
                        False,
                        "planned",
                        n_runs_in,
                    ),
                )
                for c_ready, rid, kk in group
            )
            for c in calls:
                run_calls[c.run_id].append(c)
            idles: list[IdleRecord] = []
            prev = last[sc]
            if prev is None:  # a pre-warm load before the worker's first batch
                idles.append(IdleRecord(w_local, 2, 0.25, hardware, start - 5000.0, start - 1000.0, 3000.0))
            elif start > prev[0]:
                idles.append(IdleRecord(w_local, 2, 0.25, hardware, prev[0], min(start, prev[0] + KEEP_ALIVE_MS)))
            last[sc] = (end, batch)
            worker_free[sc] = end
            stubs = tuple(by_run[rid] for rid in sorted({rid for _, rid, _ in group}))
            done.append((sc, BatchDone(batch, calls, wf, f"stage{k}", SHEETS[sc], stubs, tuple(idles))))
    done.sort(key=lambda sd: sd[1].batch.end_ms)
    store = CostStore(f"sqlite:///{folder / f'costs-{n_runs}.db'}")
    for sc in range(3):
        mine = [d for s, d in done if s == sc]
        for j in range(0, len(mine), FLUSH):
            store.record_batches(mine[j : j + FLUSH], scope=SCOPES[sc], billing=BILLINGS[sc])
    # The runs' ends, as record_run writes them, but for the runs the timed operations leave open.
    records = {
        rid: RunRecords(
            rid,
            wf,
            tuple(run_calls[rid]),
            (),
            arr,
            max(c.end_ms for c in run_calls[rid]),
            SLO_MS,
            SHEETS[0],
            "equal",
            run_name=by_run[rid].run_name,
        )
        for rid, wf, arr in runs
    }
    picks = _picks(runs, run_calls, records, span_ms)
    open_ids = {picks["last"].run_id, picks["unseen"]}
    ends = [R.run_row(r, DEPLOYMENTS[r.workflow], r.run_name) for rid, r in records.items() if rid not in open_ids]
    with store.engine.begin() as conn:
        for j in range(0, len(ends), 5000):
            W.upsert(conn, RunRow, ends[j : j + 5000], ("run_id",), keep_if_null=W.KEEP)
    rows = {}
    with store.engine.connect() as conn:
        for table in ("runs", "stage_calls", "batches", "batch_items", "worker_idle"):
            rows[table] = conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
    store.close()
    return Built(folder / f"costs-{n_runs}.db", n_runs, time.perf_counter() - t_start, rows, picks)


def _picks(
    runs: list[tuple[str, str, float]],
    run_calls: dict[str, list[CallRecord]],
    records: dict[str, RunRecords],
    span_ms: float,
) -> dict[str, Any]:
    """The runs the timed operations use: one spanning the first restart, one served whole before it, the last."""
    boundary = T0_MS + span_ms / 3
    spanning = unseen = None
    for rid, _wf, _arr in runs:
        calls = run_calls[rid]
        ends = [c.end_ms for c in calls]
        if spanning is None and min(ends) < boundary <= max(ends) and all(c.start_ms < boundary for c in calls[:1]):
            spanning = rid
        if max(ends) < boundary - 60_000.0:
            unseen = rid
    assert spanning is not None and unseen is not None
    late = tuple(c for c in run_calls[spanning] if c.start_ms >= boundary)
    return {
        "spanning": replace(records[spanning], calls=late, arrival_ms=min(c.ready_ms for c in late)),
        "unseen": unseen,
        "last": records[runs[-1][0]],
        "end_ms": T0_MS + span_ms,
    }


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in ms over ``repeats`` calls."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(out)


def measure(built: Built, migrations: Any = None, repeats: int = 5, whole: bool = True) -> dict[str, float]:
    """Milliseconds per operation on one store (``whole``: the reads of the whole store too, once each)."""
    store = CostStore(built.url, create=False, migrations=migrations)
    p = built.picks
    day_ago = p["end_ms"] - DAY_MS
    flushes = iter(range(10_000))

    def flush() -> None:  # a batch of 4 calls of the last run: rows in stage_calls' indexes too
        n = next(flushes)
        last, t = p["last"], p["end_ms"] + n
        bid = f"new{n}"
        b = BatchRecord(
            bid, "w1", tuple(BatchItem(f"r{k}", last.run_id) for k in range(4)), Config(4, 2, 0.25), "T4", t, t + 30
        )
        calls = tuple(
            CallRecord(
                f"{bid}-c{k}",
                f"r{k}",
                last.run_id,
                last.workflow,
                "stage0",
                t - 5.0,
                t,
                t + 30.0,
                True,
                StageResult(
                    f"{bid}-c{k}", None, bid, 4, "w1", "T4", 2, 0.25, 5.0, 30.0, 30.0, False, False, "planned", 1
                ),
            )
            for k in range(4)
        )
        stub = RunStub(last.run_id, last.workflow, last.arrival_ms, SLO_MS)
        store.record_batches([BatchDone(b, calls, last.workflow, "stage0", SHEETS[2], (stub,))], scope=SCOPES[2])

    out: dict[str, float] = {}
    try:
        for by in ("run", "workflow", "deployment", "day") if whole else ():
            out[f"costs_by_{by}"] = timed(lambda by=by: store.priced_costs(by, None, None, None), 1)
        out["costs_by_run_last_day"] = timed(lambda: store.priced_costs("run", day_ago, None, None), repeats)
        out["record_run"] = timed(lambda: store.record_run(p["last"], scope=SCOPES[2], billing=BILLINGS[2]), repeats)
        out["record_batches"] = timed(flush, repeats)
        out["earlier_parts"] = timed(lambda: earlier_parts(store, p["spanning"], SCOPES[1]), repeats)
        out["ended_elsewhere"] = timed(
            lambda: ended_elsewhere(store, p["unseen"], SCOPES[1], SHEETS[1], "input_size", "attribute"), repeats
        )
        assert earlier_parts(store, p["spanning"], SCOPES[1]), "the spanning run has no earlier part"
        assert ended_elsewhere(store, p["unseen"], SCOPES[1], SHEETS[1], "input_size", "attribute") is not None
    finally:
        store.close()
    return out


def old_copy(built: Built) -> Built:
    """A copy of the store as schema version 6 left it: without versions 7's and 8's indexes."""
    path = built.path.with_name(built.path.stem + "-v6.db")
    shutil.copy(built.path, path)
    with sqlite3.connect(path) as conn:
        for name in NEW_INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        conn.execute("DELETE FROM schema_version WHERE version > 6")
    conn.close()
    return Built(path, built.n_runs, 0.0, built.rows, built.picks)


def explain(built: Built) -> None:
    """SQLite's query plans of the restart read's neighbour queries and the windowed cost read's."""
    w = f"{SCOPES[0]}:w1"
    queries = {
        "batches at an end": f"SELECT * FROM batches WHERE worker_id = '{w}' AND end_ms = 1.0",
        "next end": f"SELECT min(end_ms) FROM batches WHERE worker_id = '{w}' AND end_ms > 1.0",
        "idle in window": f"SELECT * FROM worker_idle WHERE worker_id = '{w}' AND start_ms >= 1 AND start_ms < 2",
        "lead idle": f"SELECT * FROM worker_idle WHERE worker_id = '{w}' AND start_ms < 1.0",
        "calls since": "SELECT run_id FROM stage_calls WHERE start_ms >= 1",
        "busy before": f"SELECT DISTINCT worker_id FROM batches WHERE worker_id IN ('{w}') AND start_ms < 1",
    }
    with sqlite3.connect(built.path) as conn:
        for what, q in queries.items():
            plan = "; ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {q}"))
            print(f"  {what:<20} {plan}")
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=(10_000, 100_000))
    ap.add_argument("--old", action="store_true", help="also time copies of the stores at schema version 6")
    ap.add_argument("--explain", action="store_true", help="print SQLite's plans of the neighbour queries")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    small_n, big_n = args.sizes
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        stores = [build(folder, n) for n in (small_n, big_n)]
        for b in stores:
            print(f"{b.n_runs} runs built in {b.build_s:.1f} s: {b.rows}, {b.path.stat().st_size / 2**20:.0f} MiB")
        olds = [old_copy(b) for b in stores] if args.old else []  # copied before the timed writes change them
        results = [measure(b, repeats=args.repeats) for b in stores]
        old = None
        if olds:
            old = [measure(b, migrations=MIGRATIONS[:6], repeats=args.repeats, whole=False) for b in olds]
            if args.explain:
                print("plans without versions 7's and 8's indexes:")
                explain(olds[1])
        if args.explain:
            print("plans:")
            explain(stores[1])
    head = f"{'operation':<24}{f'{small_n} ms':>12}{f'{big_n} ms':>12}{'ratio':>8}"
    if old:
        head += f"{'v6 ' + str(small_n):>12}{'v6 ' + str(big_n):>12}{'v6 ratio':>10}{'v6/new':>8}"
    print(head)
    ratios = {}
    for op in results[0]:
        a, b = results[0][op], results[1][op]
        ratios[op] = b / a
        line = f"{op:<24}{a:>12.1f}{b:>12.1f}{b / a:>8.1f}"
        if old and op in old[0]:
            oa, ob = old[0][op], old[1][op]
            line += f"{oa:>12.1f}{ob:>12.1f}{ob / oa:>10.1f}{ob / b:>8.1f}"
        print(line)
    if old:
        ratios.update({f"{op}_v6_over_new": old[1][op] / results[1][op] for op in old[1]})
    print(
        "RESULT " + " ".join(f"{op}_ratio={r:.2f}" if "_v6_" not in op else f"{op}={r:.2f}" for op, r in ratios.items())
    )


if __name__ == "__main__":
    main()
