"""A record list that forgets its oldest items but keeps their numbering: for pools that serve for weeks.

The runtime's records (batches, idle intervals) are numbered by position: the
cost store and the artifacts' ledger remember how far they have read
(``BatchDone.batch_index``, ``idle_index``). A :class:`Ring` answers those
positions as a list would (``len`` counts every item ever appended, ``r[i]``
and ``r[i:]`` take absolute positions, negative ones count from the end) while
holding only the newest ``keep`` to ``2 * keep`` items (trimmed in halves), so
memory stays flat. Reading a
forgotten position raises ``IndexError``; a slice starts at the oldest kept one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar, overload

__all__ = ["Ring"]

T = TypeVar("T")


class Ring(Generic[T]):
    """The newest ``keep`` (to ``2 * keep``) of the items appended, addressed by their position among all of them.

    Examples:
        >>> r = Ring(keep=2)
        >>> for x in "abcde":
        ...     r.append(x)
        >>> len(r), list(r), r[4], r[3:], r[-1], r.first
        (5, ['c', 'd', 'e'], 'e', ['d', 'e'], 'e', 2)
    """

    __slots__ = ("_items", "first", "keep")

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.first = 0  # the position of _items[0] among every item appended
        self._items: list[T] = []

    def append(self, item: T) -> None:
        self._items.append(item)
        if len(self._items) >= 2 * self.keep:  # trimmed in halves: O(1) an item
            drop = len(self._items) - self.keep
            del self._items[:drop]
            self.first += drop

    def __len__(self) -> int:
        return self.first + len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            if index.step not in (None, 1):
                raise ValueError("a Ring slices with step 1 only")
            start, stop, _ = index.indices(len(self))
            return self._items[max(start - self.first, 0) : max(stop - self.first, 0)]
        i = index + len(self) if index < 0 else index
        if not self.first <= i < len(self):
            raise IndexError(f"record {index} is not kept (kept: {self.first} to {len(self) - 1})")
        return self._items[i - self.first]
