"""Readahead for sequential reads of one open file: the next reads are in flight before they are asked.

A reader that calls ``pread(n, off)`` and then ``pread(n, off + n)`` (``File.read`` loops,
``io.BufferedReader``, a benchmark) would otherwise keep one request in flight and leave the
network idle while it handles each answer.  Each read that starts where the last one ended (the
first read at offset 0 counts) keeps up to ``depth`` segments of its size ahead of the reader
(at most ``window`` bytes), each read by a pool thread into a buffer of its own, all their chunk
pieces in flight at once.  Segment buffers are recycled once their bytes are handed over: a
fresh multi-MiB buffer per read costs a memset and a page fault per page, about as much as the
copy out of it.

Rules, so a prefetched byte is never wrong in ways a plain read could not be:

- a segment is used only by a read of exactly its offset and length (the length already cut at
  the file's size as the handle knew it), so growth, short reads and holes behave as without it;
- any other read (a seek, a different size) drops every segment (their buffers are freed when
  their reads end; requests already sent are not recalled);
- a segment whose read failed is dropped and the read is done again in the caller, which then
  sees the error as it would have without readahead;
- it serves read-only handles only (``File`` decides): their own writes cannot make a segment
  stale.  Another client's writes show up at the next segment read after them, as with a
  kernel's page-cache readahead over a network file system (close-to-open consistency).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["Readahead"]

Fetch = Callable[[int, memoryview], None]  # (offset, buffer): fill it with the file's bytes (holes zero)
Submit = Callable[..., "Future[bytearray]"]


class Readahead:
    """Prefetched segments of one handle; thread safe (reads of one handle may come from several threads)."""

    def __init__(self, fetch: Fetch, submit: Submit, *, window: int, depth: int = 4) -> None:
        self._fetch, self._submit = fetch, submit
        self.window, self.depth = window, depth
        self._segs: collections.deque[tuple[int, int, Future[bytearray]]] = collections.deque()
        self._end = 0  # where the last read ended: a read starting here is sequential
        self._lock = threading.Lock()
        self._free: list[bytearray] = []  # recycled segment buffers
        self.hits = 0
        self.misses = 0

    def read(self, offset: int, n: int, size: int, into: memoryview | None = None) -> bytes | int | None:
        """The bytes of ``[offset, offset+n)`` if prefetched (waiting for them if still in flight),
        copied into ``into`` (then their count) or as ``bytes``; None: the caller reads them itself.
        Also schedules the segments after this read."""
        with self._lock:
            sequential = offset == self._end
            hit = None
            if self._segs and sequential and self._segs[0][:2] == (offset, n):
                hit = self._segs.popleft()[2]
            elif self._segs:
                self._drop()
            self._end = offset + n
            if sequential:
                self._top_up(n, size)
        if hit is None:
            self.misses += 1
            return None
        try:
            buf = hit.result()
        except Exception:  # noqa: BLE001 - read again in the caller, which then sees the error itself
            self.misses += 1
            return None
        self.hits += 1
        if into is None:
            out: bytes | int = bytes(buf)
        else:
            into[:n] = buf
            out = n
        with self._lock:
            if len(self._free) < self.depth:
                self._free.append(buf)
        return out

    def _load(self, offset: int, n: int) -> bytearray:
        with self._lock:
            buf = next((b for b in self._free if len(b) == n), None)
            if buf is not None:
                self._free.remove(buf)
        if buf is None:
            buf = bytearray(n)
        self._fetch(offset, memoryview(buf))
        return buf

    def _top_up(self, n: int, size: int) -> None:
        start = self._segs[-1][0] + self._segs[-1][1] if self._segs else self._end
        count = min(self.depth, max(1, self.window // max(n, 1)))
        while len(self._segs) < count and start < size:
            k = min(n, size - start)
            try:
                fut = self._submit(self._load, start, k)
            except RuntimeError:  # the client's pool is shut down: reads go on without readahead
                return
            self._segs.append((start, k, fut))
            start += k

    def _drop(self) -> None:
        for _, _, fut in self._segs:
            fut.cancel()  # one not yet started never runs; a running one ends on its own
        self._segs.clear()
        self._free.clear()

    def close(self) -> None:
        with self._lock:
            self._drop()
