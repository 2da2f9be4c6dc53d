"""File length while writing: periodic reports of the highest written end, exact length at close.

In 3FS the inode's length may lag the data (research/3fs.md §2 "File length"):
writers report their highest written position every few seconds and meta adopts it
if larger; on close/fsync the exact length comes from the storage side, by asking
every chain of the layout for the file's last chunk (chunk ids of one file are a
contiguous range per target, so that is one ``stor.query_last`` per chain).

Here: :class:`LengthReporter` is one daemon thread per :class:`~.client.FileSystem`
that reports, every ``report_interval_s``, each open writable handle whose highest
written end grew since its last report.  :func:`exact_length` computes
``max over chains of (last index * chunk_size + last chunk length)``.

Meta has no RPC that *sets* a smaller exact length, and must not have one for this:
a file extended by ``truncate`` has no chunk at its end, so the storage view is
legitimately shorter than the inode.  The close path therefore only ever raises the
length (``ReportLength`` adopts larger values); shrinking is ``Truncate``.
``stor.query_last`` needs a read capability for the file (a write-only handle has
none: its close then uses the handle's own highest written end, exact for one writer);
a storage service refusing the op to every user makes the client stop asking.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

import msgspec

from fireflyer.core.errors import FireFlyerError, PermissionDenied
from fireflyer.core.log import get_logger
from fireflyer.meta import Layout
from fireflyer.storage.capability import READ, CapabilityDenied
from fireflyer.storage.client_min import StorageClient
from fireflyer.storage.errors import RETRY_AFTER_REFRESH, NotServing
from fireflyer.storage.protocol import OP_QUERY_LAST, LastChunk, QueryLastMsg, to_meta

__all__ = ["LengthReporter", "Reported", "exact_length"]

log = get_logger(__name__)


class Reported(Protocol):
    """What the reporter needs of an open file (a :class:`fireflyer.fs.file.File`)."""

    name: str
    inode_id: int

    @property
    def written_end(self) -> int: ...

    @property
    def needs_report(self) -> bool: ...

    def report_length(self) -> None: ...


def _last_on_chain(storage: StorageClient, chain_id: int, inode_id: int) -> LastChunk:
    """Ask the chain's serving targets, tail first, for the file's last chunk; on errors a
    newer routing may cure (a chain newer than our snapshot: ``NotServing`` when it is missing,
    ``ChainVersionMismatch`` when its version moved on; a node that restarted on a new port:
    ``ff down`` then ``ff up`` on the same state dir) refresh it and retry, with backoff,
    within the storage client's retry deadline like its reads and writes."""
    deadline = time.monotonic() + storage.retry_deadline_s
    attempt = 0
    while True:
        try:
            return _query_last(storage, chain_id, inode_id)
        except RETRY_AFTER_REFRESH as e:
            storage._backoff(attempt, deadline, e)  # refreshes routing; re-raises e past the deadline
            attempt += 1


def _query_last(storage: StorageClient, chain_id: int, inode_id: int) -> LastChunk:
    chain = storage.chain(chain_id)
    caps = storage.caps_for((inode_id,), READ)
    err: FireFlyerError | None = None
    for target in reversed(list(chain.serving())):  # the tail first: it commits first
        try:
            _, addr = storage.address(target)
            msg = QueryLastMsg(target=target, chain_id=chain_id, chain_ver=chain.version, inode=inode_id, track=0,
                               caps=caps)
            reply = storage._call(addr, OP_QUERY_LAST, meta=to_meta(msg))
            return msgspec.convert(reply.meta, LastChunk)
        except PermissionDenied:
            raise
        except FireFlyerError as e:
            err = e
    raise err or NotServing(f"chain {chain_id} has no serving target", chain=chain_id)


def exact_length(storage: StorageClient, layout: Layout, inode_id: int) -> int | None:
    """The file's length as storage sees it (0: no chunk); None when this token may not ask."""
    best = 0
    for chain_id in dict.fromkeys(layout.chains):
        try:
            last = _last_on_chain(storage, chain_id, inode_id)
        except CapabilityDenied:
            raise  # this file's access, not the op: the caller falls back for this file only
        except PermissionDenied:
            return None
        if last.chunk_id is not None:
            best = max(best, last.chunk_id.index * layout.chunk_size + last.length)
    return best


class LengthReporter:
    """Reports dirty handles' highest written ends every ``interval_s`` (one daemon thread)."""

    def __init__(self, report: Callable[[Reported], None], interval_s: float) -> None:
        self._report = report
        self.interval_s = interval_s
        self._files: weakref.WeakSet[Reported] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports = 0

    def register(self, f: Reported) -> None:
        with self._lock:
            self._files.add(f)
            if self._thread is None and self.interval_s > 0:
                self._thread = threading.Thread(target=self._loop, name="ff-fs-length", daemon=True)
                self._thread.start()

    def unregister(self, f: Reported) -> None:
        with self._lock:
            self._files.discard(f)

    def written_end(self, inode_id: int) -> int:
        """The highest end written through open handles of this client (0: none)."""
        with self._lock:
            files = list(self._files)
        return max((f.written_end for f in files if f.inode_id == inode_id), default=0)

    def report_all(self) -> None:
        with self._lock:
            files = list(self._files)
        for f in files:
            if f.needs_report:
                try:
                    self._report(f)
                    self.reports += 1
                except FireFlyerError as e:  # meta away: the next round or close reports it
                    log.warning("fs.length_report_failed", path=f.name, error=str(e))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report_all()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
