"""Artifacts and runs-list tags: the pure builders, publishing on a real flow run, and the runner's wiring."""

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
from esg_prefect.integration.artifacts import RunPublisher, publish_run, tag_run
from esg_prefect.integration.run_views import (
    CALL_COLUMNS,
    artifact_key,
    call_costs,
    is_run_tag,
    merged_tags,
    money,
    money_text,
    run_summary,
    run_table,
    run_tags,
    table_columns,
)
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.store import CostStore
from tests.cost_records import (
    EXPECTED_PER_RUN,
    RUN_A,
    T4_PRICES,
    T4InlineBackend,
    records_a,
    records_b,
    records_c,
    renamed,
    settled,
    t4_toy_profile,
)
from tests.toy_stages import double, inc, toy_profile

NONE_ROW = dict.fromkeys(CALL_COLUMNS)
COST = "cost $"


def _with_split(rec: RunRecords, split: str) -> RunRecords:
    return dataclasses.replace(rec, cost_split=split)


def _costs(rec: RunRecords) -> dict[str, tuple[float, float]]:
    return {k: (c.busy, c.idle) for k, c in call_costs(rec).items()}


# ---- pure builders -----------------------------------------------------------------------------


def test_table_of_run_a() -> None:
    """Once its cost is final: busy shares of b1 and b2, and of the idle time after each (w1's 2.5, w2's 0.2).

    Idle time is billed at the worker's GPU share only: an idle worker holds no vCPU.
    """
    detect = {
        "stage": "detect",
        "batch": "b1",
        "size": 2,
        "runs": 2,
        "worker": "w1",
        "wait ms": 100.0,
        "busy $": "0.500",  # b1: (1 vCPU x 0.5 + 0.5 T4 x 4.0) per s x 0.4 s = 1.0, half of it
        "idle $": "1.25",  # w1 idle after b1: 0.5 T4 x 4.0 per s x 1.25 s = 2.5, half of it
        "cost $": "1.75",
    }
    classify = {
        "stage": "classify",
        "batch": "b2",
        "size": 1,
        "runs": 1,
        "worker": "w2",
        "wait ms": 0.0,
        "busy $": "0.400",  # (2 vCPU x 0.5 + 0.25 T4 x 4.0) per s x 0.2 s
        "idle $": "0.200",  # w2 idle after b2: 0.25 T4 x 4.0 per s x 0.2 s, all A's
        "cost $": "0.600",
    }
    total = NONE_ROW | {"stage": "total", "busy $": "0.900", "idle $": "1.45", "cost $": "2.35"}
    rows = run_table(settled(records_a()))
    assert float(rows[-1][COST]) == EXPECTED_PER_RUN[RUN_A]  # what the cost store gives run A
    assert rows == [detect, classify, total]
    assert [tuple(r) for r in rows] == [table_columns("$")] * 3  # column order, the unit in the cost headers
    json.dumps(rows)  # what the artifact carries


def test_table_cells_are_short() -> None:
    """Three significant digits: the table reads at 1400 px; costs as the money text every surface writes."""
    rec = settled(_with_split(records_a(), "input_size"))
    rows = run_table(rec)
    assert rows[-1][COST] == "1.48"  # 0.25 + 0.625 + 0.4 + 0.2 = 1.475 (1.4750000000000000888 in binary), 3 digits
    assert rec.cost().total == pytest.approx(1.475)
    for row in rows:
        wait = row["wait ms"]
        assert wait is None or (isinstance(wait, float) and wait == float(f"{wait:.3g}"))
        for col in ("busy $", "idle $", "cost $"):
            assert isinstance(row[col], str) and row[col] == money_text(float(row[col]))


def test_table_of_a_run_with_a_failed_call() -> None:
    rows = run_table(settled(records_c()))
    assert [(r["stage"], r["batch"], r[COST]) for r in rows] == [
        ("embed", "b3", "0.0500"),
        ("embed", "failed", "0"),
        ("total", None, "0.0500"),
    ]
    assert rows[1] == NONE_ROW | {"stage": "embed", "batch": "failed", "busy $": "0", "idle $": "0", "cost $": "0"}


def test_cost_shares_follow_the_split() -> None:
    a = settled(records_a())
    assert _costs(a) == {"a-detect": pytest.approx((0.5, 1.25)), "a-classify": pytest.approx((0.4, 0.2))}
    by_size = _with_split(a, "input_size")  # A is size 1 of 4 in b1: of its 1.0 and of w1's idle 2.5
    assert _costs(by_size) == {"a-detect": pytest.approx((0.25, 0.625)), "a-classify": pytest.approx((0.4, 0.2))}
    assert run_table(by_size)[-1][COST] == money(1.475)
    b = _with_split(settled(records_b()), "input_size")
    assert _costs(b) == {"b-detect": pytest.approx((0.75, 1.875))}
    # before the idle time is known: the busy part alone, said not to be final
    assert _costs(records_a()) == {"a-detect": pytest.approx((0.5, 0.0)), "a-classify": pytest.approx((0.4, 0.0))}


def test_summary_of_run_a() -> None:
    assert run_summary(settled(records_a())) == (
        "### ESG pool: flow run `9b6f0c1e-4a1d-4f7e-9a51-0c1d2e3f4a5b` of workflow `img`\n"
        "\n"
        "**SLO met**: 700.0 ms end to end, 300.0 ms inside the 1000 ms SLO.\n"
        "\n"
        "**Cost**: $2.35 (busy $0.900 + idle $1.45), this run's share of 2 batches (1 shared with other flow runs; "
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
        "- **detect**, batch b1 (2 calls of 2 flow runs) on w1 (T4 x0.50, 1 vCPU): "
        "cheapest plan within the slack over 2 stage(s) (warm worker). Predicted 380 ms, took 400 ms.\n"
        "- **classify**, batch b2 (1 call of 1 flow run) on w2 (T4 x0.25, 2 vCPU, cold start): "
        "cheapest plan within the slack over 1 stage(s) (cold start, best fit). Predicted 190 ms, took 200 ms.\n"
    )


def test_summary_says_by_how_much_the_slo_was_missed() -> None:
    lines = run_summary(records_b()).splitlines()
    assert lines[2] == "**SLO missed** by 150.0 ms: 450.0 ms end to end against a 300 ms SLO."
    assert lines[4].startswith("**Cost**: $0.500 (busy $0.500 + idle $0), this run's share of 1 batch (1 shared with")
    assert lines[4].endswith("Not final yet: idle time after its batches was still open.")
    assert run_summary(settled(records_b())).splitlines()[4].startswith("**Cost**: $1.75 (busy $0.500 + idle $1.25)")
    separate = dataclasses.replace(records_b(), settled=True, idle_billing="separate")
    assert "billed on its own line, to no run (idle billing `separate`). Final:" in run_summary(separate)
    lines = run_summary(records_c()).splitlines()
    assert lines[2] == "**Did not finish**: 1 of 2 stage calls failed, so the run counts as missing its 500 ms SLO."
    assert lines[6:9] == ["**Failed stage calls**:", "", "- **embed**: boom"]
    assert lines[-1] == (
        "- **embed**, batch b3 (1 call of 1 flow run) on w3 (cpu, 1 vCPU, cold start): "
        "cheapest plan within the slack over 1 stage(s) (cold start, best fit). Predicted 90 ms, took 100 ms."
    )


def test_summary_marks_a_batch_at_risk_and_keeps_markdown_out_of_reasons() -> None:
    rec = records_b()
    (call,) = rec.calls
    assert call.result is not None
    risky = dataclasses.replace(call.result, at_risk=True, reason="*bold* `code`\nnext line")
    rec = dataclasses.replace(rec, calls=(dataclasses.replace(call, result=risky),))
    assert run_summary(rec).splitlines()[-1] == (
        "- **detect**, batch b1 (2 calls of 2 flow runs) on w1 (T4 x0.50, 1 vCPU): "
        "\\*bold\\* 'code' next line; at risk of missing the SLO. Predicted 380 ms, took 400 ms."
    )


def test_artifact_keys() -> None:
    assert artifact_key("esg-cost", RUN_A) == f"esg-cost-{RUN_A}"
    assert artifact_key("esg-cost", "AB_CD.EF-123") == "esg-cost-ab-cd-ef-123"
    assert artifact_key("esg-summary", "local-xyz") == "esg-summary-local-xyz"
    # Prefect's run ids are time-ordered: runs of one minute share their first characters, not their key.
    same_minute = ("01a21f3b-5c2e-7d10-8a3b-0c1d2e3f4a5b", "01a21f3b-9f00-7e22-b1c4-5d6e7f8a9b0c")
    assert len({artifact_key("esg-cost", r) for r in same_minute}) == 2


# ---- runs-list tags ----------------------------------------------------------------------------


def test_money_text_always_shows_three_significant_digits() -> None:
    """Three significant digits, trailing zeros kept (0.000150, not 0.00015); positional from 1e-6 up, an
    exponent below as a browser writes it (no padding zero); zero is 0."""
    cases = {
        2.15: "2.15",
        0.7: "0.700",
        0.00015: "0.000150",
        1.275: "1.27",  # 1.275 is 1.27499... in binary
        3.2047e-06: "0.00000320",
        5.02416e-05: "0.0000502",
        9.996e-07: "0.00000100",  # rounds up to 1e-6: positional
        9.012e-07: "9.01e-7",
        1.15e-07: "1.15e-7",  # a small CPU model's cost per run
        5e-08: "5.00e-8",
        3.5e21: "3.50e+21",
        1234.5: "1230",
        120.0: "120",
        0.0: "0",
    }
    assert {v: money_text(v) for v in cases} == cases
    for v, text in cases.items():  # the table's cell is the same text, and reads back as the rounded number
        assert money_text(v) == money(v)
        assert money_text(float(text)) == text
        assert is_run_tag(f"esg:${text}", "$")


def test_run_tags_are_the_tables_total_and_the_stores_slo() -> None:
    a, b, c = settled(records_a()), settled(records_b()), settled(records_c())
    assert run_tags(a) == ("esg:$2.35", "esg:slo-met")
    assert run_tags(b) == ("esg:$1.75", "esg:slo-missed")  # 450 ms against a 300 ms SLO
    assert run_tags(c) == ("esg:$0.0500", "esg:slo-missed")  # a call failed: the run never finished
    for rec in (a, b, c):
        cost_tag = run_tags(rec)[0]
        assert cost_tag.removeprefix("esg:$") == run_table(rec)[-1][COST] == money(rec.cost().total)
    # before the idle time is known, the tag says what the (not final) artifact says
    assert run_tags(records_a())[0] == "esg:$0.900" == f"esg:${run_table(records_a())[-1][COST]}"


def test_merged_tags_keep_the_runs_own_tags_and_replace_earlier_esg_tags() -> None:
    a = settled(records_a())
    assert merged_tags([], a) == ["esg:$2.35", "esg:slo-met"]
    own = ["nightly", "team:vision", "esg:v2", "esg:slo-metrics"]  # look alike, but the user's own
    assert merged_tags(own, a) == ["esg:$2.35", "esg:slo-met", *own]
    earlier = ["nightly", "esg:$0.9", "esg:$0.900", "esg:slo-missed", "team:vision"]  # earlier publications
    assert merged_tags(earlier, a) == ["esg:$2.35", "esg:slo-met", "nightly", "team:vision"]
    assert merged_tags(merged_tags(own, a), a) == merged_tags(own, a)  # setting them again changes nothing
    assert [t for t in ("esg:$1e-7", "esg:$3.5e+21", "esg:$0", "esg:€1", "esg:$v2") if is_run_tag(t, "$")] == [
        "esg:$1e-7",
        "esg:$3.5e+21",
        "esg:$0",
    ]


class FakeClient:
    """A flow run's tags as the Prefect API keeps them."""

    def __init__(self, tags: list[str] | None) -> None:
        self.tags = tags
        self.patches: list[list[str]] = []

    def read_flow_run(self, flow_run_id: uuid.UUID) -> Any:
        from types import SimpleNamespace

        from prefect.exceptions import ObjectNotFound

        if self.tags is None:
            raise ObjectNotFound(http_exc=Exception("404"))
        return SimpleNamespace(id=flow_run_id, tags=list(self.tags))

    def update_flow_run(self, flow_run_id: uuid.UUID, tags: list[str]) -> None:
        self.patches.append(list(tags))
        self.tags = list(tags)


def test_tag_run_writes_only_when_the_tags_change() -> None:
    client = FakeClient(["nightly"])
    a = settled(records_a())
    assert tag_run(a, client) == ["esg:$2.35", "esg:slo-met", "nightly"]  # type: ignore[arg-type]
    assert tag_run(a, client) == ["esg:$2.35", "esg:slo-met", "nightly"]  # type: ignore[arg-type]
    assert client.patches == [["esg:$2.35", "esg:slo-met", "nightly"]]
    assert tag_run(a, FakeClient(None)) is None  # type: ignore[arg-type]  # the flow run was deleted
    assert tag_run(dataclasses.replace(a, run_id="local-1"), client) is None  # type: ignore[arg-type]


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


def test_a_cost_store_that_cannot_be_read_is_warned_of_once_and_the_run_still_published(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store down (Postgres, say) logged a full traceback for every run published."""
    published: list[str] = []

    def store_down(records: RunRecords) -> RunRecords:
        raise ConnectionError("store at db:5432 refused")

    publisher = RunPublisher(publish=lambda records: published.append(records.run_id), complete=store_down)
    with caplog.at_level(logging.DEBUG, logger=art.__name__):
        publisher.publish(records_a())
        publisher.publish(records_b())
    mine = [r for r in caplog.records if r.name == art.__name__]
    assert [r.levelname for r in mine] == ["WARNING", "DEBUG"], caplog.text
    assert all(r.exc_info is None for r in mine) and "Traceback" not in caplog.text
    line = mine[0].getMessage()
    assert records_a().run_id in line and "ConnectionError: store at db:5432 refused" in line and "\n" not in line
    assert published == [records_a().run_id, records_b().run_id]  # this pool's part of each, all the same


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


def read_name(flow_run_id: uuid.UUID) -> str:
    """A flow run's name, read back through the client."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.read_flow_run(flow_run_id).name)


def read_tags(flow_run_id: uuid.UUID) -> list[str]:
    """A flow run's tags, read back through the client."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return list(client.read_flow_run(flow_run_id).tags)


@pytest.mark.usefixtures("prefect_harness")
def test_publish_on_a_flow_run() -> None:
    from prefect import flow, tags
    from prefect.context import FlowRunContext

    @flow
    def empty() -> str:
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        return str(ctx.flow_run.id)

    with tags("team-a", "nightly"):
        run_id = empty()
    assert sorted(read_tags(uuid.UUID(run_id))) == ["nightly", "team-a"]
    rec = renamed(records_a(), run_id)
    ids = publish_run(rec)  # from this thread, outside any flow run context
    assert ids is not None
    markdown, table = read_artifacts(uuid.UUID(run_id))
    assert (markdown.type, table.type) == ("markdown", "table")
    assert {markdown.id, table.id} == set(ids)
    assert table.key == f"esg-cost-{run_id}" and markdown.key == f"esg-summary-{run_id}"
    rows = json.loads(table.data)
    assert rows == run_table(rec)
    assert rows[-1]["stage"] == "total" and rows[-1][COST] == "0.900"
    assert markdown.data == run_summary(rec)
    # The runs list: the table's total and the SLO outcome in front, the run's own tags kept.
    found = read_tags(uuid.UUID(run_id))
    assert found[:2] == ["esg:$0.900", "esg:slo-met"] and sorted(found[2:]) == ["nightly", "team-a"]
    assert found[0].removeprefix("esg:$") == rows[-1][COST]
    # Published again (the same run, its cost now final): the ESG tags are replaced, not added.
    publish_run(renamed(settled(records_a()), run_id))
    again = read_tags(uuid.UUID(run_id))
    assert again[:2] == ["esg:$2.35", "esg:slo-met"] and sorted(again[2:]) == ["nightly", "team-a"]


@pytest.mark.usefixtures("prefect_harness")
def test_runner_publishes_and_records_each_flow_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from prefect import flow, tags

    url = f"sqlite:///{tmp_path / 'runner.db'}"
    # workers on shares of a T4: their idle time costs (a CPU-only worker's idle time is free)
    pool = Pool(t4_toy_profile(), T4_PRICES, backend=T4InlineBackend(vcpus=2))
    try:

        @flow(task_runner=ESGTaskRunner(pool=pool, store=url))
        def toy_flow(x: int) -> str:
            from prefect.context import FlowRunContext

            assert inc(double(x)) == 2 * x + 1
            ctx = FlowRunContext.get()
            assert ctx is not None and ctx.flow_run is not None
            return str(ctx.flow_run.id)

        with tags("mine"), caplog.at_level(logging.INFO):
            run_id = toy_flow(4)
        # Its workers idle for their 60 s keep-alive: the run's cost is not final, nothing is published yet.
        assert read_artifacts(uuid.UUID(run_id)) == []
        # ... and the run's last log line says where and when it will be, on the run itself.
        (notice,) = [r for r in caplog.records if r.getMessage().startswith("cost of this run: ")]
        assert notice.levelno == logging.INFO and getattr(notice, "flow_run_id", None) == run_id
        keep_s = max(pool.keep_alive_ms().values()) / 1000.0
        assert f"'esg-cost-{run_id}'" in notice.getMessage() and f"up to {keep_s:g} s" in notice.getMessage()
        assert read_tags(uuid.UUID(run_id)) == ["mine"]
        pool.close()  # the idle time closes: the publisher posts the run's artifacts before close returns
        found = read_artifacts(uuid.UUID(run_id))
        assert [a.type for a in found] == ["markdown", "table"]
        rows = json.loads(found[1].data)
        assert [r["stage"] for r in rows] == ["double", "inc", "total"]
        assert "**SLO met**" in found[0].data or "**SLO missed**" in found[0].data
        assert "Final: the idle time after each of its batches has closed" in found[0].data
        with CostStore(url) as store:  # the same figure, and split, as the store's
            (row,) = [r for r in store.costs("run") if not r.idle]
        assert row.key == run_id and row.idle_cost > 0 and row.busy_cost > 0 and row.unit == "$"
        assert row.name == read_name(uuid.UUID(run_id))  # the name the UI shows, for `costs --by run`
        total = rows[-1]
        assert (total["cost $"], total["busy $"], total["idle $"]) == (
            money(row.cost),
            money(row.busy_cost),
            money(row.idle_cost),
        )
        # The runs list shows that figure and the store's SLO outcome, before the run's own tag.
        slo = "esg:slo-met" if row.slo_met == 1 else "esg:slo-missed"
        assert row.slo_met + row.slo_missed == 1
        assert read_tags(uuid.UUID(run_id)) == [f"esg:${money_text(row.cost)}", slo, "mine"]
        assert money_text(row.cost) == total[COST]
        assert f"**SLO {slo.removeprefix('esg:slo-')}**" in found[0].data  # the summary says the same
    finally:
        pool.close()
        recording.close_stores()
