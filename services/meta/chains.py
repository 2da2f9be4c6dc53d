"""Where the meta service gets chain tables (``fireflyer.meta.ChainTableSource``).

A file's layout is fixed at create from a chain table: (table id, version,
chain ids).  Two sources, chosen at start-up:

- **mgmtd** (``FF_MGMTD_ADDR`` set): :class:`RoutedChainTables` keeps the
  tables of mgmtd's routing info in memory.  ``MetaStore`` reads them
  synchronously inside its transactions, so they must be local; the service
  refreshes them in the background (every ``meta.routing_refresh_s`` and when
  mgmtd's routing version moves) and once more when a create names a table the
  cache has not seen yet.
- **static** (no mgmtd, the default of ``ff up`` until storage lands): one table
  from settings, ``meta.static_table_id`` with chains ``meta.static_chains``
  at version 1.  Layouts made this way name chains that only exist once a real
  chain table with the same id is uploaded to mgmtd; that is fine for a
  metadata-only cluster and for benchmarks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from fireflyer.core.errors import NotFound
from fireflyer.mgmt.model import ChainTable

__all__ = ["RoutedChainTables"]


class RoutedChainTables:
    """Chain tables from mgmtd routing info, replaced wholesale on each refresh (thread safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[int, tuple[int, tuple[int, ...]]] = {}
        #: routing version the tables came from (-1: none yet)
        self.routing_version = -1
        #: lookups of a table the cache did not have (each triggers a refresh)
        self.misses = 0

    def load(self, tables: Iterable[ChainTable], routing_version: int) -> bool:
        """Adopt the tables of a routing snapshot; False when it is not newer than what we have."""
        with self._lock:
            if routing_version <= self.routing_version:
                return False
            newest: dict[int, ChainTable] = {}
            for t in tables:  # routing keeps old versions too (old layouts name them): take the newest
                if t.table_id not in newest or t.version > newest[t.table_id].version:
                    newest[t.table_id] = t
            self._tables = {i: (t.version, tuple(t.chain_ids)) for i, t in newest.items()}
            self.routing_version = routing_version
            return True

    def get_table(self, table_id: int) -> tuple[int, tuple[int, ...]]:
        with self._lock:
            found = self._tables.get(table_id)
            if found is None:
                self.misses += 1
        if found is None:
            raise NotFound(f"chain table {table_id} is not in mgmtd's routing info (version "
                           f"{self.routing_version}); upload it to mgmtd first", table=table_id,
                           routing_version=self.routing_version)
        return found
