"""Resync of a returning (SYNCING) target from its predecessor: the diff rules and a driver.

research/3fs.md §3 "Recovery of a returning target": the predecessor dumps the syncing
target's chunk metadata, diffs it with its own and streams whole-chunk replacements
under the chunk lock while normal writes continue (those reach the syncing target as
full-chunk replaces, see :mod:`fireflyer.storage.craq`).  Per chunk, ``local`` is the
predecessor's metadata and ``remote`` the syncing target's:

====  ============================================================  ========  ======
row   condition (first match wins)                                  decision  source
====  ============================================================  ========  ======
1     no local committed version, no remote                         skip      note
2     local only                                                    send      note
3     remote only (or local has only an uncommitted first write)    remove    note
4     local chain version > remote chain version                    send      note
5     remote holds an uncommitted version                           send      ours
6     equal chain versions, local committed != remote update ver    send      note
7     checksum/length differ, the remote holds the version that     send      ours
      is still pending locally (a write in flight)
8     equal-or-stale chain version and checksum/length differ       fatal     note
9     otherwise                                                     skip      note
====  ============================================================  ========  ======

Row 5 is *ours*: nothing will ever commit a pending version left on a syncing target
(its predecessor sends replaces that commit at once), so it is replaced rather than
trusted.  Row 7 is ours too: the two dumps are taken at different moments, without the
chunk locks, while writes continue.  A write in flight at the predecessor (its version
still pending here) may already have reached the syncing tail, which commits a
full-chunk replace at once: the tail then shows that version, committed, under the new
chain version while this side still shows the old one -- different content, and no fault.
Such a chunk is sent instead, which :func:`run_resync` does under the chunk lock, once the
write has committed here (a replica holds the lock from prepare to commit).  A fatal row
means two replicas hold different content for the same version: the driver raises
:class:`ResyncFatal` before changing anything and the service forces the syncing
target offline.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import msgspec

from .chunkid import ChunkId
from .chunkstore import ChunkMeta, ChunkStore
from .errors import ResyncFatal

__all__ = ["Decision", "decide", "ResyncPlan", "ResyncStats", "diff", "run_resync", "resync"]

SendReplace = Callable[[ChunkId, bytes, int, int], None]  # (chunk, data, version, chain_ver)
Remove = Callable[[ChunkId], None]


class Decision(enum.StrEnum):
    SKIP = "skip"
    SEND = "send"
    REMOVE = "remove"
    FATAL = "fatal"


def decide(local: ChunkMeta | None, remote: ChunkMeta | None) -> Decision:
    """One chunk's resync decision (the table in the module doc, in order)."""
    if local is not None and local.committed_ver == 0:
        local = None  # only an in-flight first write: it reaches the target through the chain
    if local is None:
        return Decision.REMOVE if remote is not None else Decision.SKIP
    if remote is None:
        return Decision.SEND
    if local.chain_ver > remote.chain_ver:
        return Decision.SEND
    if remote.pending:
        return Decision.SEND
    if local.chain_ver == remote.chain_ver and local.committed_ver != remote.update_ver:
        return Decision.SEND
    if local.crc != remote.crc or local.length != remote.length:
        # a torn pair of dumps, not a divergence, when the remote already holds our write in flight (row 7)
        in_flight = local.pending and remote.committed_ver == local.pending_ver
        return Decision.SEND if in_flight else Decision.FATAL
    return Decision.SKIP


class ResyncPlan(msgspec.Struct, frozen=True, kw_only=True):
    send: tuple[ChunkId, ...] = ()
    remove: tuple[ChunkId, ...] = ()
    fatal: tuple[ChunkId, ...] = ()
    skipped: int = 0


class ResyncStats(msgspec.Struct, kw_only=True):
    sent: int = 0
    removed: int = 0
    bytes_sent: int = 0


def diff(local: Iterable[ChunkMeta], remote: Iterable[ChunkMeta]) -> ResyncPlan:
    """The resync plan for a syncing target (``remote``) from its predecessor (``local``)."""
    mine = {m.chunk_id: m for m in local}
    theirs = {m.chunk_id: m for m in remote}
    out: dict[Decision, list[ChunkId]] = {d: [] for d in Decision}
    for cid in sorted(mine.keys() | theirs.keys()):
        out[decide(mine.get(cid), theirs.get(cid))].append(cid)
    return ResyncPlan(
        send=tuple(out[Decision.SEND]),
        remove=tuple(out[Decision.REMOVE]),
        fatal=tuple(out[Decision.FATAL]),
        skipped=len(out[Decision.SKIP]),
    )


def run_resync(
    store: ChunkStore,
    plan: ResyncPlan,
    *,
    send_replace: SendReplace,
    remove: Remove,
    workers: int = 4,
) -> ResyncStats:
    """Carry out ``plan`` from the predecessor's ``store``, each chunk under its lock.

    Under the lock the chunk is looked up again, because writes kept flowing since the
    metadata dump: a chunk planned for sending that is gone locally is removed remotely,
    and a chunk planned for removal that now exists locally is sent instead.  Only
    committed content is sent (read with its CRC checked, so a corrupted local copy is
    never spread); a version in flight reaches the target through the chain.
    """
    if plan.fatal:
        raise ResyncFatal(
            f"resync found {len(plan.fatal)} chunk(s) whose content differs at equal versions "
            f"(first: {plan.fatal[0]}); the syncing target must go offline",
            target=store.target_id, chunks=",".join(c.hex for c in plan.fatal[:32]),
        )  # fmt: skip
    stats = ResyncStats()
    count_lock = threading.Lock()

    def one(cid: ChunkId) -> None:
        with store.lock(cid):
            got = store.read_committed(cid)
            if got is None:
                remove(cid)
                with count_lock:
                    stats.removed += 1
                return
            data, meta = got
            send_replace(cid, data, meta.committed_ver, meta.chain_ver)
            with count_lock:
                stats.sent += 1
                stats.bytes_sent += len(data)

    todo = list(plan.send) + list(plan.remove)
    if workers <= 1:
        for cid in todo:
            one(cid)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="resync") as pool:
            for _ in pool.map(one, todo):
                pass
    return stats


def resync(
    store: ChunkStore,
    remote_meta: Iterable[ChunkMeta],
    *,
    send_replace: SendReplace,
    remove: Remove,
    workers: int = 4,
) -> ResyncStats:
    """Diff and run in one call: what the predecessor does between syncStart and syncDone."""
    plan = diff(store.all_meta(), remote_meta)
    return run_resync(store, plan, send_replace=send_replace, remove=remove, workers=workers)
