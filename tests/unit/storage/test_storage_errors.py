"""The storage error families a client acts on (:mod:`fireflyer.storage.errors`)."""

from __future__ import annotations

from fireflyer.core.errors import DeadlineExceeded
from fireflyer.storage.errors import (
    RETRY_AFTER_REFRESH,
    BadRequest,
    ChainVersionMismatch,
    ChecksumMismatch,
    ChunkCorrupted,
    NotHead,
    NotServing,
)


def test_routing_changes_are_retried_after_a_refresh_and_wrong_data_or_requests_are_not() -> None:
    # one set for writes, batch writes and length queries: the length query once left out
    # ChainVersionMismatch, and a second `make demo` failed its close on a chain that moved on
    for err in (ChainVersionMismatch("chain 1 is at v5"), NotHead("not the head"), NotServing("syncing"),
                DeadlineExceeded("slow")):
        assert isinstance(err, RETRY_AFTER_REFRESH), type(err).__name__
    for err in (BadRequest("offset"), ChecksumMismatch("crc"), ChunkCorrupted("bad replica")):
        assert not isinstance(err, RETRY_AFTER_REFRESH), type(err).__name__
