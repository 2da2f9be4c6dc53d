"""kill -9 of a process in the middle of a chunk write, at each step of the
copy-on-write protocol: the committed version survives intact, the store reopens
consistent and the orphaned files are swept (fireflyer.storage.chunkstore module doc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fireflyer.storage import ChunkId, ChunkState, ChunkStore

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from fireflyer.storage import ChunkId, ChunkStore, crc32c

    path, point = sys.argv[1], sys.argv[2]
    cid = ChunkId(77, 0, 3)
    armed = False

    def hook(p, c):
        if armed and p == point:
            os.kill(os.getpid(), signal.SIGKILL)

    store = ChunkStore(path, hook=hook)  # durable: fsync on
    old = bytes(range(256)) * 16
    store.prepare_write(cid, 0, old, update_ver=1, chain_ver=1, chunk_size=1 << 20, payload_crc=crc32c(old))
    store.commit(cid, 1, 1)
    armed = True
    new = b"N" * 1000
    store.prepare_write(cid, 100, new, update_ver=2, chain_ver=1, chunk_size=1 << 20, payload_crc=crc32c(new))
    store.commit(cid, 2, 1)
    print("no crash")
    """
)


@pytest.mark.parametrize("point", ["data_written", "pending_recorded", "commit_recorded"])
def test_sigkill_mid_write_keeps_committed_version(tmp_path: Path, point: str) -> None:
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), point], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    cid = ChunkId(77, 0, 3)
    old = bytes(range(256)) * 16
    new = bytearray(old)
    new[100:1100] = b"N" * 1000
    with ChunkStore(tmp_path, verify_reads=True) as store:
        m = store.meta(cid)
        assert m is not None
        if point == "data_written":
            assert (m.committed_ver, m.state, store.swept) == (1, ChunkState.COMMIT, 1)
            assert store.read(cid) == old
        elif point == "pending_recorded":
            assert (m.committed_ver, m.pending_ver, m.state) == (1, 2, ChunkState.CLEAN)
            assert store.read_committed(cid)[0] == old  # type: ignore[index]
            assert store.read(cid, allow_uncommitted=True) == new
            store.commit(cid, 2, 1)  # the predecessor's retry would commit it
        else:
            assert m.committed_ver == 2 and store.swept == 1
        store.verify(cid)
        assert store.read(cid) == (old if point == "data_written" else new)
        assert sum(1 for p in (tmp_path / "chunks").rglob("*") if p.is_file()) == 1
