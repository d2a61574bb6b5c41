"""``/metrics`` in the Prometheus formats: which format a request gets, and counters that count.

The counters (batches, calls, the bill) come from running totals kept as
records are made, not from the newest records a pool keeps: they equal the
counts after any number of calls, also past the records' memory, and never
decrease from one scrape to the next.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from esg_prefect.control.totals import Totals
from esg_prefect.model import PriceSheet
from esg_prefect.model.attribution import BatchItem, BatchRecord, IdleRecord, attribute_costs, idle_cost
from esg_prefect.model.config import Config
from esg_prefect.runtime import pool as pool_module
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.scheduling import ESGSettings
from esg_prefect.service.app import PoolService
from esg_prefect.service.prometheus import negotiate
from esg_prefect.service.wire import BadRequest, call_body
from tests.toy_calls import PRICES, toy_call, toy_pool
from tests.toy_stages import toy_profile

TOKEN = "a-token-of-thirty-two-characters"
TEXT = {"Accept": "text/plain"}
# What Prometheus 3 sends by default (scrape_protocols), OpenMetrics first.
SCRAPER = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def body(i: int, prefix: str = "c") -> dict[str, object]:
    return call_body(toy_call(i, call_id=f"{prefix}{i}", run=f"{prefix}-r{i}"))


@pytest.fixture
def pool() -> Iterator[Pool]:
    """A toy pool that bills an idle worker's vCPUs too (``idle_vcpus``): the CPU-only toy workers' idle time costs."""
    with toy_pool(settings=ESGSettings(idle_vcpus=True)) as p:
        yield p


def client(pool: Pool, token: str | None = TOKEN) -> TestClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(PoolService(pool, ["tests"], TOKEN).app(), headers=headers)


def scrape(http: TestClient) -> Samples:
    """Every sample of a text-format scrape, by (name, labels)."""
    resp = http.get("/metrics", headers=TEXT)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def run_calls(http: TestClient, n: int, prefix: str = "c") -> None:
    for i in range(n):
        resp = http.post("/v1/calls", json=body(i, prefix))
        assert resp.status_code == 200 and resp.json()["ok"] is True


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# ---- which format ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "fmt", "expected"),
    [
        (None, None, None),
        ("", None, None),
        ("*/*", None, None),
        ("application/json", None, None),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", None, None),  # a browser
        ("text/plain, application/json", None, None),  # a tie goes to JSON
        ("image/png", None, None),  # nothing offered is acceptable: JSON, as before
        ("text/plain", None, "text/plain"),
        ("text/plain;version=0.0.4;q=0.5, application/json;q=0.1", None, "text/plain;version=0.0.4;q=0.5"),
        ("text/*", None, "text/plain"),
        ("application/openmetrics-text", None, "application/openmetrics-text"),
        (SCRAPER, None, "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6"),
        ("text/plain;q=0, */*", None, None),
        ("text/plain, */*", None, "text/plain"),  # named beats matched by a wildcard
        ("text/plain, application/openmetrics-text", None, "text/plain"),
        ("application/*", None, None),
        ("*/*", "prometheus", "text/plain"),
        ("application/*", "prometheus", "application/openmetrics-text"),
        ("text/plain;q=nonsense", None, None),
        ("application/json", "prometheus", "text/plain"),
        (None, "prometheus", "text/plain"),
        (SCRAPER, "prometheus", "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6"),
        ("text/plain", "json", None),
        (SCRAPER, "json", None),
    ],
)
def test_negotiation(accept: str | None, fmt: str | None, expected: str | None) -> None:
    assert negotiate(accept, fmt) == expected


def test_an_unknown_format_is_a_bad_request(pool: Pool) -> None:
    with pytest.raises(BadRequest) as info:
        negotiate("text/plain", "xml")
    assert info.value.status == 400
    resp = client(pool).get("/metrics?format=xml")
    assert resp.status_code == 400 and "format" in resp.json()["error"]


def test_each_request_gets_its_format(pool: Pool) -> None:
    http = client(pool)
    run_calls(http, 2)
    default = http.get("/metrics")  # the test client sends Accept: */*
    assert default.headers["content-type"] == "application/json" and default.json()["recent_batches"] >= 1
    assert default.headers["vary"] == "Accept"
    del http.headers["accept"]
    assert http.get("/metrics").json()["paused"] is False  # no Accept at all
    assert http.get("/metrics", headers={"Accept": "application/json"}).json()["calls_in_flight"] == 0
    assert http.get("/metrics?format=json", headers=TEXT).json()["paused"] is False
    forced = http.get("/metrics?format=prometheus", headers={"Accept": "application/json"})
    assert forced.headers["content-type"].startswith("text/plain") and "esg_batches_total" in forced.text
    om = http.get("/metrics", headers={"Accept": SCRAPER})
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(om.text)}
    assert families["esg_batch_calls"].type == "counter" and families["esg_cost_dollars"].unit == "dollars"
    assert sum(s.value for s in families["esg_batch_calls"].samples if s.name == "esg_batch_calls_total") == 2


@pytest.mark.parametrize("how", [{"headers": TEXT}, {"params": {"format": "prometheus"}}])
def test_the_token_is_required(pool: Pool, how: dict[str, dict[str, str]]) -> None:
    assert client(pool, token=None).get("/metrics", **how).status_code == 401
    assert client(pool, token="wrong").get("/metrics", **how).status_code == 401
    resp = client(pool).get("/metrics", **how)
    assert resp.status_code == 200 and "esg_paused 0.0" in resp.text


# ---- what it counts ----------------------------------------------------------------------------


def test_counters_equal_the_counts_and_never_decrease(pool: Pool) -> None:
    http = client(pool)
    before = scrape(http)  # before the pool's first call: zeros, not missing
    assert value(before, "esg_cost_dollars_total", part="busy") == 0.0 and value(before, "esg_decisions_total") == 0
    run_calls(http, 7)
    first = scrape(http)
    snap = pool.snapshot()
    assert value(first, "esg_batch_calls_total", stage="inc") == 7
    assert value(first, "esg_batches_total", stage="inc") == len(snap.batches) >= 1
    assert sum(len(b.items) for b in snap.batches) == 7
    assert value(first, "esg_decisions_total") == len(snap.decisions)
    timed = [d.decision_ms for d in snap.decisions if d.decision_ms is not None]
    assert value(first, "esg_decision_seconds_count") == len(timed)
    assert value(first, "esg_decision_seconds_bucket", le="+Inf") == len(timed)
    assert value(first, "esg_decision_seconds_sum") == pytest.approx(sum(timed) / 1000.0)
    run_calls(http, 5, prefix="more")
    second = scrape(http)
    assert value(second, "esg_batch_calls_total", stage="inc") == 12
    assert value(second, "esg_batches_total", stage="inc") == len(pool.snapshot().batches)
    for key, v in first.items():
        if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
            assert second[key] >= v, key


def test_counters_keep_counting_past_the_records_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "RECORD_MEMORY", 2)  # the pool keeps 2 to 4 batches
    p = Pool(toy_profile(), PRICES, backend=InlineBackend())
    try:
        http = client(p)
        seen = 0.0
        for n in range(3):
            run_calls(http, 4, prefix=f"round{n}-")
            now = value(scrape(http), "esg_batch_calls_total", stage="inc")
            assert now == 4 * (n + 1) and now > seen
            seen = now
        snap = p.snapshot()
        assert len(snap.batches) <= 4 and snap.first_batch + len(snap.batches) == value(
            scrape(http), "esg_batches_total", stage="inc"
        )
    finally:
        p.close()


def test_the_bill_is_the_records_priced(pool: Pool) -> None:
    http = client(pool)
    run_calls(http, 6)
    snap = pool.snapshot()
    samples = scrape(http)
    after = pool.snapshot()
    batches = sum(PRICES.batch_cost(b.config, b.hardware, b.duration_ms) for b in snap.batches)
    busy, cold = (
        value(samples, "esg_cost_dollars_total", part="busy"),
        value(samples, "esg_cost_dollars_total", part="cold_start"),
    )
    assert busy + cold == pytest.approx(batches, rel=1e-9) and busy > 0 and cold >= 0
    # idle time is counted as its interval closes: between the closed intervals before and after the scrape
    closed = [sum(idle_cost(i, PRICES) for i in s.idles[: s.closed_idles]) for s in (snap, after)]
    idle = value(samples, "esg_cost_dollars_total", part="idle")
    assert closed[0] * (1 - 1e-9) <= idle <= closed[1] * (1 + 1e-9) and idle > 0  # idle vCPUs are billed
    assert value(samples, "esg_open_idle_cost_dollars") >= 0


def test_queues_pause_calls_in_flight_and_workers(pool: Pool) -> None:
    with client(pool) as http:  # one event loop for every request: the queued calls' tasks live on
        run_calls(http, 1, prefix="warm")
        assert http.post("/v1/pause").status_code == 200
        for i in range(3):
            assert http.post("/v1/calls?wait_s=0.01", json=body(i)).status_code == 202  # queued while paused
        wait_for(lambda: value(scrape(http), "esg_queue_depth", workflow="toy", stage="inc") == 3)
        samples = scrape(http)
        assert value(samples, "esg_paused") == 1 and value(samples, "esg_calls_in_flight") == 3
        workers = [w for w in pool.snapshot().workers if w.stage == "inc"]
        idle = value(samples, "esg_workers", hardware="cpu", share="0", stage="inc", state="idle")
        busy = value(samples, "esg_workers", hardware="cpu", share="0", stage="inc", state="busy")
        assert idle + busy == len(workers) >= 1 and busy == 0
        assert http.post("/v1/resume").status_code == 200
        for i in range(3):
            assert http.post("/v1/calls", json=body(i)).json()["ok"] is True  # joins the queued call
        samples = scrape(http)
        assert value(samples, "esg_paused") == 0 and value(samples, "esg_calls_in_flight") == 0
        assert value(samples, "esg_queue_depth", workflow="toy", stage="inc") == 0
        assert value(samples, "esg_batch_calls_total", stage="inc") == 4


# ---- the running totals themselves -------------------------------------------------------------


def test_the_totals_price_records_as_attribution_does() -> None:
    rng = random.Random(7)
    prices = PriceSheet(2e-5, {"T4": 3e-4, "A100": 1e-3})
    totals, batches, idles = Totals(), [], []
    for k in range(200):
        hw, share = rng.choice([("cpu", 0.0), ("T4", 0.5), ("A100", 0.25)])
        vcpus, start, length = rng.choice([1, 2, 4]), rng.uniform(0, 1e6), rng.uniform(0, 500)
        b = BatchRecord(
            f"b{k}", f"w{k}", (BatchItem(f"q{k}", "r"),), Config(1, vcpus, share), hw, start, start + length
        )
        totals.batch("s", b, 0.0)
        batches.append(b)
        loading = rng.choice([0.0, rng.uniform(0, length)])
        i = IdleRecord(f"w{k}", vcpus, share, hw, start, start + length, loading, rng.random() < 0.3)
        totals.idle(i)
        idles.append(i)
    report = attribute_costs(batches, idles, prices, idle_billing="separate")
    bill = totals.bill(prices)
    assert bill["busy"] == pytest.approx(report.busy_total, rel=1e-9) and bill["cold_start"] == 0
    assert bill["idle"] == pytest.approx(report.idle_total, rel=1e-9)
    copy = totals.copy()
    totals.batch("s", batches[0], cold_ms=1e9)  # capped at the batch's length
    assert copy.bill(prices) == bill and totals.batches == {"s": 201}
    assert totals.bill(prices)["cold_start"] == pytest.approx(
        prices.batch_cost(batches[0].config, batches[0].hardware, batches[0].duration_ms)
    )


# ---- the same totals as JSON, and `esg-prefect pool status` ------------------------------------


def test_the_json_metrics_carry_the_same_totals_as_the_counters(pool: Pool) -> None:
    http = client(pool)
    run_calls(http, 9, "j")
    wait_for(lambda: sum(pool.snapshot().queue_depths.values()) == 0)
    totals = http.get("/metrics").json()["totals"]
    counters = scrape(http)
    assert (
        sum(totals["calls"].values()) == 9 == sum(v for (n, _), v in counters.items() if n == "esg_batch_calls_total")
    )
    assert totals["batches"] == {
        dict(labels)["stage"]: v for (n, labels), v in counters.items() if n == "esg_batches_total"
    }
    for part in ("busy", "cold_start"):  # no batch ran between the two reads
        assert totals["bill_dollars"][part] == pytest.approx(value(counters, "esg_cost_dollars_total", part=part))
    # an idle interval may close between the two reads: the counter read later holds at least as much
    assert value(counters, "esg_cost_dollars_total", part="idle") >= totals["bill_dollars"]["idle"]
    assert totals["open_idle_dollars"] >= 0
    assert totals["bill_dollars"]["busy"] > 0 and totals["decisions"] >= 1


def test_the_json_metrics_carry_the_profile_corrections(pool: Pool) -> None:
    http = client(pool)
    run_calls(http, 3, "k")
    wait_for(lambda: sum(pool.snapshot().queue_depths.values()) == 0)
    rows = {r["stage"]: r for r in http.get("/metrics").json()["profile_corrections"]}
    inc = rows["inc"]
    assert set(inc) == {"stage", "hardware", "factor", "applied", "batches", "overhead_ms"}
    assert inc["batches"] >= 1 and inc["factor"] > 0
    assert inc["overhead_ms"] == 0.0  # inline workers: the round trip is the model's own time


def test_pool_status_prints_queues_workers_and_the_bill(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from esg_prefect.cli import app

    http = client(pool)
    run_calls(http, 4, "s")
    monkeypatch.setenv("ESG_PREFECT_TOKEN", TOKEN)
    seen: list[dict[str, str]] = []

    def request(method: str, url: str, headers: dict[str, str], timeout: object) -> object:
        seen.append(headers)
        return http.request(method, url.removeprefix("http://127.0.0.1:4270"), headers=headers)

    monkeypatch.setattr("httpx.request", request)
    shown = CliRunner().invoke(app, ["pool", "status"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())  # rich wraps at the terminal's width
    assert text.startswith("http://127.0.0.1:4270: dispatching; 0 calls in flight; 4 batches of 4 calls so far")
    assert "bill $" in text and "per call" in text
    assert "workers" in shown.output and "inc" in shown.output  # the worker the calls started, by stage
    assert seen[0]["Authorization"] == f"Bearer {TOKEN}" and seen[0]["Accept"] == "application/json"
    as_json = CliRunner().invoke(app, ["pool", "status", "--json"])
    assert as_json.exit_code == 0 and '"totals"' in as_json.output


def test_pool_status_splits_the_bill_as_the_artifacts_and_costs_do() -> None:
    """Busy includes the batches' cold starts, as in a run's artifacts and `esg-prefect costs`; shown as its part."""
    from esg_prefect.cli.pool import bill_text

    totals = {
        "bill_dollars": {"busy": 7.284e-06, "cold_start": 1.957e-04, "idle": 2.0e-06},
        "open_idle_dollars": 1.0e-06,
        "calls": {"a": 2, "b": 1},
    }
    assert bill_text(totals) == (
        "bill $0.000206 (busy $0.000203 + idle $0.00000300; cold starts $0.000196 of the busy part), "
        "$0.0000687 per call"
    )
    assert bill_text({}) == "bill $0 (busy $0 + idle $0; cold starts $0 of the busy part)"
    # An idle part below 1e-6: every figure of the line with an exponent (was $0.00000150 beside $5.00e-7).
    tiny = {"bill_dollars": {"busy": 1.0e-06, "cold_start": 0.5e-06, "idle": 0.5e-06}, "calls": {"a": 2}}
    assert bill_text(tiny) == (
        "bill $2.00e-6 (busy $1.50e-6 + idle $5.00e-7; cold starts $5.00e-7 of the busy part), $1.00e-6 per call"
    )


def test_pool_status_counts_in_the_singular_where_there_is_one() -> None:
    from esg_prefect.cli.pool import _headline

    one = {"calls_in_flight": 1, "totals": {"batches": {"inc": 1}, "calls": {"inc": 1}}}
    assert _headline("http://x", one).startswith("http://x: dispatching; 1 call in flight; 1 batch of 1 call so far;")
    two = {"paused": True, "calls_in_flight": 0, "totals": {"batches": {"inc": 2}, "calls": {"inc": 2, "dbl": 3}}}
    assert _headline("http://x", two).startswith("http://x: [yellow]paused[/]; 0 calls in flight; 2 batches of 5 calls")
