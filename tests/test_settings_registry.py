"""ESG knobs: defaults from ESG-SPEC, validation naming the bad value, round trip."""

from __future__ import annotations

import pytest

from esg_prefect.exceptions import ConfigError, InvalidInputError
from esg_prefect.model import ConfigSpace, LatencyProfile, PriceSheet, ProfilePoint
from esg_prefect.scheduling import ESGScheduler, ESGSettings, describe_schedulers, register_scheduler


def test_defaults_are_the_specs() -> None:
    s = ESGSettings()
    assert (s.tick_ms, s.max_expansions, s.time_budget_ms, s.keep_alive_s) == (5.0, 10_000, 5.0, 60.0)
    assert (s.latency_blade, s.cost_blade, s.heuristic, s.search_horizon) == (True, True, "frontier", "segment")
    assert (s.percentile, s.infeasible_policy, s.redistribute_slack) == ("p95", "best_effort", True)
    assert len(s.config_space) == 198
    assert s.shed_after_slo == 0.0  # no load shedding unless asked for


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tick_ms", 0),
        ("tick_ms", float("nan")),
        ("time_budget_ms", -1.0),
        ("keep_alive_s", True),
        ("max_expansions", 0),
        ("max_expansions", 2.5),
        ("rate_ewma_alpha", 0.0),
        ("rate_ewma_alpha", 1.5),
        ("heuristic", "greedy"),
        ("search_horizon", "dag"),
        ("infeasible_policy", "drop"),
        ("percentile", "p99"),
        ("cost_split", "by_weight"),
        ("idle_billing", "never"),
        ("latency_blade", "yes"),
        ("config_space", [1, 2]),
        ("prewarm", "on"),
        ("prewarm_saving", 0.0),
        ("prewarm_saving", 1.0),
        ("prewarm_saving", True),
        ("best_effort_tolerance", -0.1),
        ("best_effort_tolerance", float("nan")),
        ("best_effort_tolerance", True),
        ("keep_alive_by_price", "yes"),
        ("idle_vcpus", 1),
        ("shed_after_slo", 0.5),
        ("shed_after_slo", -1.0),
        ("shed_after_slo", float("inf")),
        ("shed_after_slo", float("nan")),
        ("shed_after_slo", True),
    ],
)
def test_bad_knob_is_named(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        ESGSettings(**{field: value})  # type: ignore[arg-type]


def test_round_trip_and_unknown_keys() -> None:
    s = ESGSettings(config_space=ConfigSpace((1, 8), (2,), (0.0, 0.5)), search_horizon="workflow")
    assert ESGSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ConfigError, match="'tick'"):
        ESGSettings.from_dict({"tick": 3})
    partial = ESGSettings.from_dict({"config_space": {"batches": [1, 2]}})  # the lists left out keep their defaults
    assert partial.config_space == ConfigSpace((1, 2))
    with pytest.raises(ConfigError, match=r"bad: batch, vcpus"):
        ESGSettings.from_dict({"config_space": {"batch": [1], "vcpus": 2}})


def test_without_pruning_turns_everything_off() -> None:
    s = ESGSettings().without_pruning()
    assert (s.latency_blade, s.cost_blade, s.heuristic, s.pruning) == (False, False, "min_cost", False)


def test_register_rejects_bad_and_taken_names() -> None:
    with pytest.raises(InvalidInputError, match="'bad name'"):
        register_scheduler("bad name", ESGScheduler, "x")
    with pytest.raises(InvalidInputError, match="'esg' is already registered"):
        register_scheduler("esg", ESGScheduler, "x")
    register_scheduler("esg-test-copy", ESGScheduler, "a copy for this test", replace=True)
    assert describe_schedulers()["esg-test-copy"] == "a copy for this test"


def test_scheduler_clock_measures_decision_time() -> None:
    from esg_prefect.model import Job, QueueKey, Workflow, cpu_cluster
    from esg_prefect.scheduling import QueueState, Snapshot

    ticks = iter(range(100))
    prof = LatencyProfile([ProfilePoint("m", "cpu", 1, 1, 0.0, 5.0)])
    sched = ESGScheduler(
        prof,
        PriceSheet(1e-5, {}),
        ESGSettings(config_space=ConfigSpace((1,), (1,), (0.0,))),
        clock=lambda: float(next(ticks)),
    )
    q = QueueKey("w", "m")
    job = Job("j", "r", "r", q, 0.0, 0.0, 50.0, 50.0)
    wf = Workflow.chain("w", ["m"], 50)
    res = sched.decide(Snapshot((QueueState(q, (job,)),), cpu_cluster(1, 1), {"w": wf}), 0.0)
    # Reads: decision start (0) and end (1): a one-stage search is answered in one pass and reads no
    # clock of its own, so the decision took 1 ms of this clock.
    assert res.stats[0].decision_ms == 1.0
    # A second round with the same inputs reuses the kept answer and is timed anew: reads 2 and 3.
    res = sched.decide(Snapshot((QueueState(q, (job,)),), cpu_cluster(1, 1), {"w": wf}), 0.0)
    assert res.stats[0].decision_ms == 1.0 and next(ticks) == 4


def test_a_misspelt_setting_gets_the_likely_one_not_the_whole_list() -> None:
    """A near miss (``keep_alive`` for ``keep_alive_s``) is answered with the setting meant, in a line
    short enough to read; a name like none of them still lists every setting."""
    with pytest.raises(ConfigError) as near:
        ESGSettings.from_dict({"keep_alive": 10})
    msg = str(near.value)
    assert "unknown ESG settings ['keep_alive']" in msg and "did you mean 'keep_alive_s'?" in msg
    assert len(msg) < 200 and "esg-prefect schedulers" in msg
    with pytest.raises(ConfigError, match=r"unknown ESG settings \['zzz'\]; known: \[.*'keep_alive_s'"):
        ESGSettings.from_dict({"zzz": 3})
