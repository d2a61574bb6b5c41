"""One cost per flow run under a pool's own billing options: artifacts, store and ``esg-prefect costs`` agree.

A live pool (fake backend, a clock the test moves) that splits batch costs by
input size and bills warm idle time on its own line, as a user's script set
it: each run's artifact figure is the store's and the CLI's default figure
(no ``--split`` or ``--idle-billing`` needed), and the runs plus the idle line
are the pool's whole bill. The same with the defaults: tests/test_one_cost.py.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from esg_prefect.cli import app
from esg_prefect.control.records import RunRecords
from esg_prefect.integration.artifacts import _money
from esg_prefect.integration.run_views import money_text
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.pool_records import final_records
from esg_prefect.scheduling import ESGSettings
from esg_prefect.store import IDLE_KEY, CostStore
from esg_prefect.store.billing import Billing
from tests.test_one_cost import (
    FakeBackend,
    ManualClock,
    _results,
    _t4_profile,
    _wait_for,
    _whole_bill,
    wired_t4_pool,
)
from tests.toy_calls import flow_call

USER_SETTINGS = ESGSettings(
    idle_vcpus=True,
    keep_alive_s=3.0,
    keep_alive_policy="fixed",
    cost_split="input_size",
    idle_billing="separate",
    wait_for_batch=False,
)
"""The user's pool: input-size split, idle time on its own line (and idle vCPUs billed, a short fixed keep-alive)."""


def _flows(pool: Pool, clock: ManualClock, runs: list[str], sizes: list[float]) -> None:
    """Each run: double then inc, the runs' calls together (they share batches, inputs of different sizes)."""
    calls = [flow_call("double", r, i, input_size=s) for i, (r, s) in enumerate(zip(runs, sizes, strict=True))]
    firsts = _results(clock, [pool.submit(c) for c in calls])
    _results(
        clock,
        [pool.submit(flow_call("inc", r, f.output, input_size=s)) for r, f, s in zip(runs, firsts, sizes, strict=True)],
    )
    for r in runs:
        pool.end_run(r)


def test_a_pool_billing_idle_separately_by_input_size_shows_one_figure_everywhere(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'costs.db'}"
    store = CostStore(url)  # the store's own defaults (equal, attribute), as the task runner opens it
    clock = ManualClock()
    pool, client, published, attachment = wired_t4_pool(clock, store, USER_SETTINGS)
    waves = [[str(uuid.uuid4())], [str(uuid.uuid4()) for _ in range(4)], [str(uuid.uuid4())]]  # as the user ran
    runs = [r for wave in waves for r in wave]
    try:
        for n, wave in enumerate(waves):
            _flows(pool, clock, wave, [float(1 + 3 * i + n) for i in range(len(wave))])
            clock.advance(1_000.0)  # idle warm, within the 3 s keep-alive
        _wait_for(lambda: len(published) == len(runs))  # separate idle billing: final when each run ends
    finally:
        pool.close()
    final = final_records(pool)
    assert final is not None
    assert any(len({i.input_size for i in b.items}) > 1 for b in final[0])  # shared batches of unequal inputs
    # the store: each run priced as the pool priced it, whatever the store's own defaults
    assert store.billings() == {attachment.scope: Billing("input_size", "separate")}
    rows = {r.key: r for r in store.costs("run")}
    line = rows.pop(IDLE_KEY)
    bill, _ = _whole_bill(pool)
    assert sorted(rows) == sorted(runs)
    assert math.isclose(sum(r.cost for r in rows.values()) + line.cost, bill, rel_tol=1e-9)  # the whole bill
    assert line.cost > 0 and all(r.idle_cost == 0.0 for r in rows.values())  # all idle time on its own line
    equal = {r.key: r.cost for r in store.costs("run", split="equal")}
    assert any(not math.isclose(equal[k], rows[k].cost, rel_tol=1e-6) for k in rows)  # the split matters here
    # the CLI, by default, shows the same figures and no note
    result = CliRunner().invoke(app, ["costs", "--url", url, "--format", "json"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    doc = json.loads(result.stdout)
    cli = {r["key"]: r for r in doc["rows"]}
    assert doc["priced_as"] == [{"cost_split": "input_size", "idle_billing": "separate"}]
    assert math.isclose(doc["total"], bill, rel_tol=1e-9)
    # the artifacts: the table's total, the tag and the summary show the same figure
    sent = client.sent()
    assert sorted(r.run_id for r in published) == sorted(runs)
    for rec in published:
        row, cost = rows[rec.run_id], rec.cost()
        assert cost.total == pytest.approx(row.cost, rel=1e-9) == pytest.approx(cli[rec.run_id]["cost"], rel=1e-9)
        assert cost.busy == pytest.approx(cli[rec.run_id]["busy_cost"], rel=1e-9) and cost.idle == 0.0
        assert sent[rec.run_id]["table"][-1]["cost $"] == _money(row.cost)
        assert client.tags[rec.run_id][0] == f"esg:${money_text(row.cost)}"
        summary = sent[rec.run_id]["markdown"]
        assert f"**Cost**: ${money_text(row.cost)} (busy ${money_text(row.busy_cost)} + idle $0)" in summary
        assert "Warm idle time is billed on its own line" in summary and "`esg-prefect costs` shows the same" in summary
    store.close()


def test_a_run_listener_of_its_own_gets_records_priced_with_the_pools_options() -> None:
    """Run records carry the pool's split and idle billing, not the defaults (no publisher patches them in)."""
    clock = ManualClock()
    pool = Pool(_t4_profile(), PriceSheet(1e-5, {"T4": 1e-4}), settings=USER_SETTINGS,
                backend=FakeBackend(clock, gpu=True), clock=clock)  # type: ignore[arg-type]  # fmt: skip
    ended: list[RunRecords] = []
    pool.add_run_listener(ended.append)
    runs = [str(uuid.uuid4()) for _ in range(3)]
    try:
        _flows(pool, clock, runs, [1.0, 4.0, 9.0])
        _wait_for(lambda: len(ended) == len(runs))
    finally:
        pool.close()
    assert {(r.cost_split, r.idle_billing) for r in ended} == {("input_size", "separate")}
