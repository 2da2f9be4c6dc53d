"""A small connection pool shared by the KV backends.

Connections are cheap to keep and slow to open (PostgreSQL) or carry per-connection
state worth reusing (SQLite pragmas).  The backend cleans a connection (rollback)
before giving it back; the pool only keeps up to ``size`` idle ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["ConnPool"]


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class ConnPool(Generic[C]):
    def __init__(self, size: int, connect: Callable[[], C]) -> None:
        self.size = size
        self._connect = connect
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> C:
        """An idle connection, or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def give(self, conn: C) -> None:
        """Keep a clean connection for reuse, or close it when the pool is full or closed."""
        with self._lock:
            if not self._closed and len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
