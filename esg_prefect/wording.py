"""How a count is written for people (``1 call``, ``2 calls``): one helper for every line that counts things.

``pool status``, a flow run's summary artifact, the cost report and the stage
call errors all use it, so that they agree.

Example:
    >>> counted(1, "batch", "batches"), counted(3, "batch", "batches"), counted(0, "call")
    ('1 batch', '3 batches', '0 calls')
"""

from __future__ import annotations


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and its noun: ``one`` for exactly 1, else ``many`` (default ``one`` + ``s``)."""
    return f"{n} {one if n == 1 else (many if many is not None else one + 's')}"
