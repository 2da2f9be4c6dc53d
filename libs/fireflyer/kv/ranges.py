"""Sets of half-open byte-key ranges ``[begin, end)``: the pure part of conflict checking.

Used for a transaction's read-conflict set, its pending clears (read-your-writes)
and, in the SQLite backend, to test a recent commit's write set against a reader.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

__all__ = ["RangeSet"]


class RangeSet:
    """Disjoint, sorted, merged ranges; adding is O(n), membership O(log n)."""

    __slots__ = ("_begins", "_ends")

    def __init__(self, ranges: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self._begins: list[bytes] = []
        self._ends: list[bytes] = []
        for b, e in ranges:
            self.add(b, e)

    def __bool__(self) -> bool:
        return bool(self._begins)

    def __len__(self) -> int:
        return len(self._begins)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(zip(self._begins, self._ends, strict=True))

    def add(self, begin: bytes, end: bytes) -> None:
        if begin >= end:
            return
        # first range that could touch [begin, end): the one starting at or before begin
        i = bisect_right(self._begins, begin) - 1
        if i < 0 or self._ends[i] < begin:
            i += 1
        j = i
        while j < len(self._begins) and self._begins[j] <= end:
            begin = min(begin, self._begins[j])
            end = max(end, self._ends[j])
            j += 1
        self._begins[i:j] = [begin]
        self._ends[i:j] = [end]

    def contains(self, key: bytes) -> bool:
        i = bisect_right(self._begins, key) - 1
        return i >= 0 and key < self._ends[i]

    def overlap(self, begin: bytes, end: bytes) -> bytes | None:
        """The first key of ``[begin, end)`` inside the set, or None if they are disjoint."""
        if begin >= end:
            return None
        i = bisect_right(self._begins, begin) - 1
        if i >= 0 and begin < self._ends[i]:
            return begin
        i += 1
        if i < len(self._begins) and self._begins[i] < end:
            return self._begins[i]
        return None

    def gaps(self, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The parts of ``[begin, end)`` not covered by the set, in order."""
        out: list[tuple[bytes, bytes]] = []
        cur = begin
        i = max(bisect_right(self._begins, begin) - 1, 0)
        while cur < end and i < len(self._begins):
            b, e = self._begins[i], self._ends[i]
            if b >= end:
                break
            if e > cur:
                if b > cur:
                    out.append((cur, b))
                cur = max(cur, e)
            i += 1
        if cur < end:
            out.append((cur, end))
        return out
