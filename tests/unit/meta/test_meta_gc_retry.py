"""Which storage errors a chunk removal (GC, truncate) waits out and which fail it at once.

Truncation runs inside the caller's RPC: retrying an error that stays (a refused token, a
bad request) until the storage client's 20 s deadline would hang the call for nothing.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from fireflyer.core.errors import FireFlyerError, PermissionDenied
from fireflyer.storage.chunkid import file_range
from fireflyer.storage.client_min import StorageClient
from fireflyer.storage.errors import BadRequest, ChainVersionMismatch, NotServing
from services.meta.gc import StorageCleaner


class _Storage:
    """The parts of StorageClient that ``_remove`` uses; ``errors`` are raised by the first calls."""

    retry_deadline_s = 5.0

    def __init__(self, errors: list[FireFlyerError], head: int | None = 101) -> None:
        self.errors, self.head, self.calls, self.refreshes = list(errors), head, 0, 0
        self._rng = random.Random(0)

    def chain(self, chain_id: int) -> Any:
        head, self.head = self.head, 101  # no head the first time when head=None
        return SimpleNamespace(head=head, version=3)

    def address(self, target_id: int) -> tuple[str, str]:
        return "storage-0", "127.0.0.1:1"

    def _call(self, address: str, op: str, *, meta: dict[str, Any]) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return SimpleNamespace(meta={"removed": 7})

    def refresh(self) -> None:
        self.refreshes += 1

    _backoff = StorageClient._backoff  # the real backoff: sleeps, refreshes, raises near the deadline


def _remove(storage: _Storage) -> int:
    cleaner = StorageCleaner(lambda: storage)  # type: ignore[arg-type, return-value]
    begin, end = file_range(42)
    return cleaner._remove(1, begin, end)


def test_routing_changes_and_a_chain_without_head_are_waited_out() -> None:
    s = _Storage([ChainVersionMismatch("chain 1 is at v4"), NotServing("target 101 is syncing")], head=None)
    assert _remove(s) == 7
    assert s.calls == 3 and s.refreshes == 3  # the headless look-up, then two failed calls


@pytest.mark.parametrize("err", [PermissionDenied("token refused"), BadRequest("range is inverted")])
def test_an_error_that_stays_fails_at_once(err: FireFlyerError) -> None:
    s = _Storage([err])
    with pytest.raises(type(err)):
        _remove(s)
    assert s.calls == 1 and s.refreshes == 0
