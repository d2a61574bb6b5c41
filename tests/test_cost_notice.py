"""The line a flow run's log ends with: where and when its cost appears, never a figure."""

from __future__ import annotations

from esg_prefect import ESGTaskRunner
from esg_prefect.integration.run_views import cost_notice
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from tests.toy_stages import toy_profile


def test_the_cost_notice_says_where_and_when_never_a_figure() -> None:
    """A run's log had no word of its cost; the figure is not known when it ends, so the line says when it comes."""
    line = cost_notice("R1", keep_alive_s=12.5)
    assert "artifact 'esg-cost-r1' (with the run's summary" in line and "keep-alive of up to 12.5 s" in line
    assert "pool's close" in line and "$" not in line and "\n" not in line
    assert "now (idle time is billed apart)" in cost_notice("R1", keep_alive_s=12.5, settled=True)
    remote = ESGTaskRunner(address="http://127.0.0.1:4270")._cost_notice("R1")
    assert remote is not None and "by the pool service at http://127.0.0.1:4270" in remote
    assert "the keep-alive," in remote and "service's close" in remote
    pool = Pool(toy_profile(), backend=InlineBackend())
    try:  # no recorders attached (they are, at its first stage call, with artifacts=False): nothing is published
        assert ESGTaskRunner(pool=pool, artifacts=False)._cost_notice("R1") is None
    finally:
        pool.close()
