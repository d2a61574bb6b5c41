"""One cache for a scheduler's answers between rounds, with one eviction rule.

A scheduler asked the same questions round after round (which resources a
stage can take now, a queue's EDF order, its latest one-stage answer, the warm
options of a set of cold resources) keeps the answers here, under keys that
start with what the answer is for. An entry may be *anchored* to an object:
it is found only while the very same object is given again (a tuple of jobs or
resources that the caller keeps while nothing changed), so a recycled ``id``
never matches. When the cache holds ``limit`` entries it is emptied at once:
every entry is cheap to rebuild, and a long-lived runtime whose queues and
workers come and go cannot grow it without bound.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

_NOTHING = object()


class Memo:
    """Answers by key, each with the object it holds for (or None); emptied whole at ``limit`` entries."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int = 16_384) -> None:
        self.limit = limit
        self._entries: dict[Hashable, tuple[object, Any]] = {}

    def get(self, key: Hashable, anchor: object = None) -> Any:
        """The answer kept under ``key`` for ``anchor`` (the same object), or None."""
        got = self._entries.get(key)
        if got is None or got[0] is not anchor:
            return None
        return got[1]

    def put(self, key: Hashable, value: Any, anchor: object = None) -> Any:
        """Keep ``value`` under ``key`` for ``anchor``; returns ``value``."""
        entries = self._entries
        if len(entries) >= self.limit:
            entries.clear()
        entries[key] = (anchor, value)
        return value
