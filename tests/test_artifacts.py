"""Artifacts: the pure table and summary builders, publishing on a real flow run, and the runner's wiring."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from esg_prefect import ESGTaskRunner
from esg_prefect.control.records import RunRecords
from esg_prefect.exceptions import InvalidInputError
from esg_prefect.integration import artifacts as art
from esg_prefect.integration import recording
from esg_prefect.integration.artifacts import (
    TABLE_COLUMNS,
    RunPublisher,
    artifact_key,
    call_costs,
    publish_run,
    run_summary,
    run_table,
)
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.store import CostStore
from tests.cost_records import EXPECTED_PER_RUN, RUN_A, records_a, records_b, records_c, renamed, settled
from tests.toy_stages import double, inc, toy_profile

NONE_ROW = dict.fromkeys(TABLE_COLUMNS)


def _with_split(rec: RunRecords, split: str) -> RunRecords:
    return dataclasses.replace(rec, cost_split=split)


def _costs(rec: RunRecords) -> dict[str, tuple[float, float]]:
    return {k: (c.busy, c.idle) for k, c in call_costs(rec).items()}


# ---- pure builders -----------------------------------------------------------------------------


def test_table_of_run_a() -> None:
    """Once its cost is final: busy shares of b1 and b2, and of the idle time after each (w1's 2.5, w2's 0.2)."""
    detect = {
        "stage": "detect",
        "status": "ok",
        "batch_id": "b1",
        "batch_size": 2,
        "runs_in_batch": 2,
        "worker": "w1",
        "device": "T4",
        "gpu_share": 0.5,
        "vcpus": 1,
        "queue_wait_ms": 100.0,
        "predicted_ms": 380.0,
        "actual_ms": 400.0,
        "busy_cost": 0.5,  # b1: (1 vCPU x 0.5 + 0.5 T4 x 4.0) per s x 0.4 s = 1.0, half of it
        "idle_cost": 1.25,  # w1 idle after b1: 2.5 per s x 1 s = 2.5, half of it
        "cost": 1.75,
        "unit": "$",
    }
    classify = {
        "stage": "classify",
        "status": "ok",
        "batch_id": "b2",
        "batch_size": 1,
        "runs_in_batch": 1,
        "worker": "w2",
        "device": "cpu",
        "gpu_share": 0.0,
        "vcpus": 2,
        "queue_wait_ms": 0.0,
        "predicted_ms": 190.0,
        "actual_ms": 200.0,
        "busy_cost": 0.2,  # 2 vCPU x 0.5 per s x 0.2 s
        "idle_cost": 0.2,  # w2 idle after b2: 1.0 per s x 0.2 s, all A's
        "cost": 0.4,
        "unit": "$",
    }
    total = NONE_ROW | {"stage": "total", "status": "", "busy_cost": 0.7, "idle_cost": 1.45, "cost": 2.15, "unit": "$"}
    rows = run_table(settled(records_a()))
    assert rows[-1]["cost"] == EXPECTED_PER_RUN[RUN_A]  # what the cost store gives run A
    assert rows == [detect, classify, total]
    assert [list(r) for r in rows] == [list(TABLE_COLUMNS)] * 3  # column order
    json.dumps(rows)  # what the artifact carries


def test_table_of_a_run_with_a_failed_call() -> None:
    rows = run_table(settled(records_c()))
    assert [(r["stage"], r["status"], r["batch_id"], r["cost"]) for r in rows] == [
        ("embed", "ok", "b3", 0.05),
        ("embed", "failed: boom", None, 0.0),
        ("total", "", None, 0.05),
    ]
    no_cost = {"busy_cost": 0.0, "idle_cost": 0.0, "cost": 0.0, "unit": "$"}
    assert rows[1] == NONE_ROW | {"stage": "embed", "status": "failed: boom"} | no_cost


def test_cost_shares_follow_the_split() -> None:
    a = settled(records_a())
    assert _costs(a) == {"a-detect": pytest.approx((0.5, 1.25)), "a-classify": pytest.approx((0.2, 0.2))}
    by_size = _with_split(a, "input_size")  # A is size 1 of 4 in b1: of its 1.0 and of w1's idle 2.5
    assert _costs(by_size) == {"a-detect": pytest.approx((0.25, 0.625)), "a-classify": pytest.approx((0.2, 0.2))}
    assert run_table(by_size)[-1]["cost"] == 1.275
    b = _with_split(settled(records_b()), "input_size")
    assert _costs(b) == {"b-detect": pytest.approx((0.75, 1.875))}
    # before the idle time is known: the busy part alone, said not to be final
    assert _costs(records_a()) == {"a-detect": pytest.approx((0.5, 0.0)), "a-classify": pytest.approx((0.2, 0.0))}


def test_summary_of_run_a() -> None:
    assert run_summary(settled(records_a())) == (
        "### ESG pool: flow run `9b6f0c1e` of workflow `img`\n"
        "\n"
        "**SLO met**: 700.0 ms end to end, 300.0 ms inside the 1000 ms SLO.\n"
        "\n"
        "**Cost**: $2.15 (busy $0.7 + idle $1.45), this run's share of 2 batches (1 shared with other flow runs; "
        "equal split of each batch's cost) and, split the same way, of the warm idle time those batches caused: "
        "a worker's idle time goes to the batch that ended just before it, a worker's idle time before its first "
        "batch to that batch. Final: the idle time after each of its batches has closed; `esg-prefect costs` shows "
        "the same.\n"
        "\n"
        "#### Why the batches were this size\n"
        "\n"
        "Each stage's calls from concurrent flow runs wait in one queue; a batch takes the calls waiting when "
        "the scheduler dispatches, up to the size it chose for the reason given.\n"
        "\n"
        "| stage | batch | size | flow runs | worker | scheduler's reason |\n"
        "|---|---|---|---|---|---|\n"
        "| detect | b1 | 2 | 2 | w1 (T4 x0.50, 1 vCPU) "
        "| cheapest plan within the slack over 2 stage(s) (warm worker) |\n"
        "| classify | b2 | 1 | 1 | w2 (cpu, 2 vCPU, cold start) "
        "| cheapest plan within the slack over 1 stage(s) (cold start, best fit) |\n"
    )


def test_summary_says_by_how_much_the_slo_was_missed() -> None:
    lines = run_summary(records_b()).splitlines()
    assert lines[2] == "**SLO missed** by 150.0 ms: 450.0 ms end to end against a 300 ms SLO."
    assert lines[4].startswith("**Cost**: $0.5 (busy $0.5 + idle $0), this run's share of 1 batch (1 shared with")
    assert lines[4].endswith("Not final yet: idle time after its batches was still open.")
    assert run_summary(settled(records_b())).splitlines()[4].startswith("**Cost**: $1.75 (busy $0.5 + idle $1.25)")
    separate = dataclasses.replace(records_b(), settled=True, idle_billing="separate")
    assert "billed on its own line, to no run (idle billing `separate`). Final:" in run_summary(separate)
    lines = run_summary(records_c()).splitlines()
    assert lines[2] == "**Did not finish**: 1 of 2 stage calls failed, so the run counts as missing its 500 ms SLO."
    assert lines[-1] == (
        "| embed | b3 | 1 | 1 | w3 (cpu, 1 vCPU, cold start) "
        "| cheapest plan within the slack over 1 stage(s) (cold start, best fit) |"
    )


def test_artifact_keys() -> None:
    assert artifact_key("esg-cost", RUN_A) == "esg-cost-9b6f0c1e"
    assert artifact_key("esg-cost", "AB_CD.EF-123") == "esg-cost-ab-cd-ef"
    assert artifact_key("esg-summary", "local-xyz") == "esg-summary-local-xy"


def test_publisher_warns_once_when_the_api_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def down(records: RunRecords, client: Any = None) -> None:
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(art, "publish_run", down)
    publisher = RunPublisher()
    with caplog.at_level(logging.DEBUG, logger=art.__name__):
        publisher.publish(records_a())
        publisher.publish(records_b())
    mine = [r for r in caplog.records if r.name == art.__name__]
    assert [r.levelname for r in mine] == ["WARNING", "DEBUG"]
    assert "ESGTaskRunner(artifacts=False)" in mine[0].getMessage() and "connection refused" in mine[0].getMessage()


def test_a_run_without_a_flow_run_id_is_not_published() -> None:
    rec = records_a()
    local = RunRecords(
        "local-123", rec.workflow, rec.calls, rec.batches, rec.arrival_ms, rec.finish_ms, rec.slo_ms, rec.prices,
        rec.cost_split,
    )  # fmt: skip
    assert publish_run(local) is None


# ---- runner options ----------------------------------------------------------------------------


def test_runner_options_are_checked_and_kept() -> None:
    with pytest.raises(InvalidInputError, match="got 3"):
        ESGTaskRunner(store=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="got ''"):
        ESGTaskRunner(store="")
    with pytest.raises(InvalidInputError, match="got 'yes'"):
        ESGTaskRunner(artifacts="yes")  # type: ignore[arg-type]
    r = ESGTaskRunner(artifacts=False, store="sqlite:////tmp/x.db")
    assert r != ESGTaskRunner() and r.duplicate() == r
    clone = pickle.loads(pickle.dumps(r))
    assert clone._config["artifacts"] is False and clone._config["store"] == "sqlite:////tmp/x.db"


def test_recorders_attach_once_per_pool(tmp_path: Path) -> None:
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend(vcpus=1))
    url = f"sqlite:///{tmp_path / 'once.db'}"
    try:
        for _ in range(3):
            recording.attach_recorders(pool, artifacts=True, store=url)
        kinds = sorted(type(listener).__name__ for listener in pool._listeners)
        assert kinds == ["RunPublisher", "StoreAttachment"]
        other = Pool(toy_profile(), backend=InlineBackend(vcpus=1))
        recording.attach_recorders(other, artifacts=False, store=False)
        assert other._listeners == []
        other.close()
    finally:
        pool.close()
        recording.close_stores()


def test_deployment_names_come_from_the_runs_context(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    dep = uuid.uuid4()
    reads: list[uuid.UUID] = []

    class FakeClient:
        def read_deployment(self, deployment_id: uuid.UUID) -> Any:
            reads.append(deployment_id)
            return SimpleNamespace(name="nightly")

    monkeypatch.setattr(recording, "api_client", FakeClient)
    runs = [str(uuid.uuid4()) for _ in range(3)]
    assert recording.remember_run(SimpleNamespace(id=uuid.UUID(runs[0]), deployment_id=dep)) == runs[0]
    recording.remember_run(SimpleNamespace(id=uuid.UUID(runs[1]), deployment_id=dep))
    recording.remember_run(SimpleNamespace(id=uuid.UUID(runs[2]), deployment_id=None))
    assert [recording.deployment_name(r) for r in runs] == ["nightly", "nightly", None]
    assert reads == [dep]  # one API read per deployment
    assert recording.deployment_name(runs[0]) is None  # forgotten once recorded


# ---- publishing on real flow runs --------------------------------------------------------------


def read_artifacts(flow_run_id: uuid.UUID) -> list[Any]:
    """The artifacts of a flow run, markdown first, read back through the client."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import Artifact

    with get_client(sync_client=True) as client:
        # The request by hand: client.read_artifacts sends null for the filters it is not given,
        # which this server refuses (422), and an empty task-run filter drops flow-level artifacts.
        body = {"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 10, "offset": 0}
        response = client.request("POST", "/artifacts/filter", json=body)
        response.raise_for_status()
    return sorted(Artifact.model_validate_list(response.json()), key=lambda a: a.type or "")


@pytest.mark.usefixtures("prefect_harness")
def test_publish_on_a_flow_run() -> None:
    from prefect import flow
    from prefect.context import FlowRunContext

    @flow
    def empty() -> str:
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        return str(ctx.flow_run.id)

    run_id = empty()
    rec = renamed(records_a(), run_id)
    ids = publish_run(rec)  # from this thread, outside any flow run context
    assert ids is not None
    markdown, table = read_artifacts(uuid.UUID(run_id))
    assert (markdown.type, table.type) == ("markdown", "table")
    assert {markdown.id, table.id} == set(ids)
    assert table.key == f"esg-cost-{run_id[:8]}" and markdown.key == f"esg-summary-{run_id[:8]}"
    rows = json.loads(table.data)
    assert rows == run_table(rec)
    assert rows[-1]["stage"] == "total" and rows[-1]["cost"] == 0.7
    assert markdown.data == run_summary(rec)


@pytest.mark.usefixtures("prefect_harness")
def test_runner_publishes_and_records_each_flow_run(tmp_path: Path) -> None:
    from prefect import flow

    url = f"sqlite:///{tmp_path / 'runner.db'}"
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend(vcpus=2))
    try:

        @flow(task_runner=ESGTaskRunner(pool=pool, store=url))
        def toy_flow(x: int) -> str:
            from prefect.context import FlowRunContext

            assert inc(double(x)) == 2 * x + 1
            ctx = FlowRunContext.get()
            assert ctx is not None and ctx.flow_run is not None
            return str(ctx.flow_run.id)

        run_id = toy_flow(4)
        # Its workers idle for their 60 s keep-alive: the run's cost is not final, nothing is published yet.
        assert read_artifacts(uuid.UUID(run_id)) == []
        pool.close()  # the idle time closes: the publisher posts the run's artifacts before close returns
        found = read_artifacts(uuid.UUID(run_id))
        assert [a.type for a in found] == ["markdown", "table"]
        rows = json.loads(found[1].data)
        assert [r["stage"] for r in rows] == ["double", "inc", "total"]
        assert "**SLO met**" in found[0].data or "**SLO missed**" in found[0].data
        assert "Final: the idle time after each of its batches has closed" in found[0].data
        with CostStore(url) as store:  # the same figure, and split, as the store's
            (row,) = [r for r in store.costs("run") if not r.idle]
        assert row.key == run_id and row.idle_cost > 0 and row.busy_cost > 0
        total = rows[-1]
        assert (total["cost"], total["busy_cost"], total["idle_cost"], total["unit"]) == (
            pytest.approx(row.cost, rel=1e-5),
            pytest.approx(row.busy_cost, rel=1e-5),
            pytest.approx(row.idle_cost, rel=1e-5),
            row.unit,
        )
    finally:
        pool.close()
        recording.close_stores()
