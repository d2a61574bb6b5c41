"""counted: the one helper that writes a count and its noun (``pool status``, run summaries, errors)."""

from __future__ import annotations

import pytest

from esg_prefect.wording import counted


@pytest.mark.parametrize(
    ("n", "one", "many", "says"),
    [
        (1, "call", None, "1 call"),
        (0, "call", None, "0 calls"),
        (2, "stage call", None, "2 stage calls"),
        (1, "batch", "batches", "1 batch"),
        (3, "batch", "batches", "3 batches"),
    ],
)
def test_a_count_takes_its_noun_in_the_singular_only_for_one(n: int, one: str, many: str | None, says: str) -> None:
    assert counted(n, one, many) == says
