"""An in-memory model of the namespace semantics, and the concurrent workload driver.

The serializability check: clients run random mkdir/create/rename/unlink/rmdir on
``RecordingStore`` objects, which tag every call's transaction so that its position
in the KV's serial order is known afterwards; the recorded calls are then replayed in
that order on ``Model`` and every outcome (success / errno) and the final tree must
agree.  Two ways of learning the order:

- ``"log"`` (SQLite): each call also blind-writes a unique marker key; SQLite commits
  are serializable in commit order and the backend's commit log says which version
  wrote which marker.  A blind write adds no read conflicts, so this checks the
  store's *own* conflict tracking.  Failed calls commit too (marker only), so their
  reads are validated and they get a position.
- ``"seq"`` (PostgreSQL, whose SSI may serialize a transaction before one that
  committed earlier): each call reads and bumps a sequence key, which totally orders
  the calls; this checks the store's logic under real concurrency and retries there.
"""

from __future__ import annotations

import errno as E
import itertools
import random
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from fireflyer.core.errors import FsError
from fireflyer.kv import Txn, open_kv
from fireflyer.meta import Caller, FileType, MetaStore, StaticChainTables

T = TypeVar("T")
ADMIN = Caller(0, 0, admin=True)
TABLES = StaticChainTables({1: (1, (1, 2, 3, 4))})
MARK = b"TEST/mark/"
SEQ = b"TEST/seq"
NAMES = ("a", "b", "c")
RETRY = {"backoff_base_s": 0.001, "backoff_max_s": 0.02, "max_retries": 500, "max_txn_age_s": 600.0}

Path = tuple[str, ...]
Record = tuple[Any, str, tuple[str, ...], int]  # (order key, op, args, errno or 0)


class RecordingStore(MetaStore):
    """A MetaStore whose calls also record their place in the serial order."""

    def __init__(self, *args: Any, tag: str, mode: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.tag = tag
        self.mode = mode
        self._n = itertools.count()
        self.last_order: Any = None

    def _run(self, fn: Callable[[Txn], T], *, write: bool, **_: Any) -> T:
        marker = MARK + f"{self.tag}/{next(self._n)}".encode()

        def wrapped(txn: Txn) -> tuple[int, Any, int]:
            try:
                out: tuple[int, Any] = (0, fn(txn))
            except FsError as e:
                assert txn.read_only, "a failed call wrote something"
                out = (e.errno, None)
            seq = 0
            if self.mode == "seq":
                raw = txn.get(SEQ)
                seq = 0 if raw is None else int(raw)
                txn.set(SEQ, str(seq + 1).encode())
            else:
                txn.set(marker, b"")
            return out[0], out[1], seq

        code, result, seq = self.kv.run(wrapped)
        self.last_order = seq if self.mode == "seq" else marker
        if code:
            raise FsError("replayed", errno=code)
        return result


class Model:
    """The namespace as a dict path -> 'd' | 'f' (root is ``()``)."""

    def __init__(self) -> None:
        self.tree: dict[Path, str] = {(): "d"}

    def _parent(self, p: Path) -> int:
        for i in range(len(p) - 1):
            if self.tree.get(p[:i]) == "f":
                return E.ENOTDIR
            if p[: i + 1] not in self.tree:
                return E.ENOENT
        return E.ENOTDIR if self.tree.get(p[:-1]) == "f" else 0

    def _children(self, p: Path) -> list[Path]:
        return [q for q in self.tree if len(q) > len(p) and q[: len(p)] == p]

    def apply(self, op: str, args: tuple[Path, ...]) -> int:
        p = args[0]
        err = self._parent(p)
        if op == "rename" and not err:
            err = self._parent(args[1])
        if err:
            return err
        kind = self.tree.get(p)
        if op == "mkdir" or op == "create":
            if kind is None:
                self.tree[p] = "d" if op == "mkdir" else "f"
                return 0
            return E.EEXIST if op == "mkdir" else (E.EISDIR if kind == "d" else 0)
        if kind is None:
            return E.ENOENT
        if op == "unlink":
            if kind == "d":
                return E.EISDIR
            del self.tree[p]
            return 0
        if op == "rmdir":
            if kind != "d":
                return E.ENOTDIR
            if self._children(p):
                return E.ENOTEMPTY
            del self.tree[p]
            return 0
        d = args[1]
        if d == p:
            return 0
        if kind == "d" and len(d) > len(p) and d[: len(p)] == p:
            return E.EINVAL
        dk = self.tree.get(d)
        if dk is not None:
            if kind == "d" and dk != "d":
                return E.ENOTDIR
            if kind != "d" and dk == "d":
                return E.EISDIR
            if dk == "d" and self._children(d):
                return E.ENOTEMPTY
            del self.tree[d]
        for q in [p, *self._children(p)]:
            self.tree[d + q[len(p) :]] = self.tree.pop(q)
        return 0


def _path(p: Path) -> str:
    return "/" + "/".join(p)


def random_op(rng: random.Random) -> tuple[str, tuple[Path, ...]]:
    def rp() -> Path:
        return tuple(rng.choice(NAMES) for _ in range(rng.randint(1, 3)))

    op = rng.choices(["mkdir", "create", "rename", "unlink", "rmdir"], [4, 2, 4, 1, 2])[0]
    return op, ((rp(), rp()) if op == "rename" else (rp(),))


def run_client(store: RecordingStore, seed: int, nops: int, out: list[Record]) -> None:
    rng = random.Random(seed)
    for _ in range(nops):
        op, args = random_op(rng)
        try:
            getattr(store, op)(ADMIN, *map(_path, args))
            code = 0
        except FsError as e:
            code = e.errno
        out.append((store.last_order, op, args, code))


def client_process(url: str, tag: str, seed: int, nops: int, threads: int) -> list[Record]:
    """One process: one store, ``threads`` clients; returns their records."""
    kv = open_kv(url, **RETRY)
    try:
        store = RecordingStore(kv, tables=TABLES, tag=tag, mode="log", alloc_block=16)
        outs: list[list[Record]] = [[] for _ in range(threads)]
        ts = [
            threading.Thread(target=run_client, args=(store, seed * 100 + i, nops, outs[i]))
            for i in range(threads)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return [r for o in outs for r in o]
    finally:
        kv.close()


def sqlite_marker_versions(db_path: str) -> dict[bytes, int]:
    """marker key -> commit version, from the SQLite backend's commit log."""
    conn = sqlite3.connect(db_path)
    try:
        found: dict[bytes, int] = {}
        for version, w in conn.execute("SELECT version, w FROM ff_kv_log"):
            sets, _ = msgspec.msgpack.decode(w)
            for k in sets:
                if k.startswith(MARK):
                    found[k] = version
        return found
    finally:
        conn.close()


def tree_of(store: MetaStore) -> dict[Path, str]:
    """The namespace as seen through readdir, checking dir parent pointers on the way."""
    tree: dict[Path, str] = {(): "d"}
    todo: list[tuple[Path, int]] = [((), store.stat(ADMIN, "/").id)]
    while todo:
        p, pid = todo.pop()
        for e in store.readdir(ADMIN, _path(p) if p else "/", limit=1000).entries:
            q = (*p, e.name)
            tree[q] = "d" if e.type is FileType.DIR else "f"
            inode = store.stat_inode(ADMIN, e.inode_id)
            assert inode.type is e.type
            if e.type is FileType.DIR:
                assert (inode.parent, inode.name) == (pid, e.name), (q, inode)
                todo.append((q, e.inode_id))
            else:
                assert inode.nlink == 1
    return tree


def check_serial(records: list[Record]) -> Model:
    """Replay ``records`` (already sorted into the serial order) on a model."""
    model = Model()
    for i, (_, op, args, code) in enumerate(records):
        want = model.apply(op, args)
        assert want == code, (
            f"op #{i} {op}{tuple(map(_path, args))}: store said {E.errorcode.get(code, code)}, "
            f"the model in commit order says {E.errorcode.get(want, want)}"
        )
    return model
