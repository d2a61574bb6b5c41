"""Unchecked constructors build the same frozen records as the checked ones, and only skip the checks."""

from __future__ import annotations

import dataclasses

import pytest

from esg_prefect.model.attribution import IdleRecord
from esg_prefect.model.cluster import ClusterSnapshot, Worker
from esg_prefect.model.jobs import Job, QueueKey
from esg_prefect.model.records import StageRecord
from esg_prefect.model.unchecked import unchecked

KEY = QueueKey("wf", "st")
CASES = [
    (Job, ("j1", "r1", "r1", KEY, 1.0, 2.0, 30.0, 40.0, "n0", 1.5)),
    (StageRecord, ("j1", "r1", "wf", "st", "b1", 2, "w1", "T4", 0.5, 1, 1.0, 2.0, 9.0, 6.5, 0.0, 0.25)),
    (IdleRecord, ("w1", 2, 0.25, "T4", 10.0, 20.0, 2.5, True)),
    (Worker, ("w1", "n0", "g0", "T4", 1, 0.5, "wf/st", True, None, False, 12.5, True)),
]


@pytest.mark.parametrize(("cls", "values"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_unchecked_builds_the_same_frozen_record(cls: type, values: tuple[object, ...]) -> None:
    fast = unchecked(cls)(*values)
    checked = cls(*values)
    assert type(fast) is cls
    assert fast == checked and hash(fast) == hash(checked)
    assert dataclasses.astuple(fast) == dataclasses.astuple(checked)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.__setattr__(dataclasses.fields(cls)[0].name, "x")


def test_unchecked_skips_the_checks_and_only_them() -> None:
    bad = ("", "r1", "r1", KEY, 1.0, 2.0, 30.0, 40.0, None, 1.0)
    with pytest.raises(Exception, match="job_id"):
        Job(*bad)
    assert unchecked(Job)(*bad).job_id == ""  # the caller vouches for its values
    with pytest.raises(TypeError):
        unchecked(Job)("j1", "r1")  # every field is positional and required


def test_unchecked_refuses_classes_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(TypeError, match="NoSlots"):
        unchecked(NoSlots)
    with pytest.raises(TypeError, match="_index"):
        unchecked(ClusterSnapshot)  # a field set outside __init__ would be missing
    with pytest.raises(TypeError, match="slotted dataclass"):
        unchecked(int)
