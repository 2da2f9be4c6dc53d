"""Batch I/O, exact length, bad input, retried writes applied once, GC of unlinked files."""

from __future__ import annotations

import errno
import io
import os

import pytest
from fsc_common import CHUNK

from fireflyer.core.errors import DeadlineExceeded, FsError, InvalidArgument
from fireflyer.fs import FileSystem
from fireflyer.fs.length import exact_length
from fireflyer.storage import ChunkId
from fireflyer.storage.client_min import ReadIo, StorageClient
from fireflyer.testing.poll import wait_until


def test_batch_write_and_read_many_small_ios_across_files(ffs: FileSystem, workdir: str) -> None:
    paths = [f"{workdir}/b{i}" for i in range(4)]
    for p in paths:
        ffs.open(p, "wb").close()
    ios = [(paths[i % 4], i * 1000 + (i % 3) * CHUNK, os.urandom(700 + i)) for i in range(60)]
    res = ffs.batch_write(ios)
    assert all(r.ok for r in res), [r.error for r in res if not r.ok]
    model = {p: bytearray() for p in paths}
    for p, off, data in ios:
        m = model[p]
        if len(m) < off + len(data):
            m.extend(bytes(off + len(data) - len(m)))
        m[off:off + len(data)] = data
    for p in paths:
        assert ffs.stat(p).length == len(model[p])
    reads = [(p, off, len(d) + 50) for p, off, d in ios]
    got = ffs.batch_read(reads)
    for (p, off, n), r in zip(reads, got, strict=True):
        assert r.ok and r.data == bytes(model[p][off:off + n])
    # per-I/O errors: a missing file and a directory fail alone, the rest succeed
    mixed = ffs.batch_read([(f"{workdir}/nope", 0, 10), (workdir, 0, 10), (paths[0], 0, 10)])
    assert isinstance(mixed[0].error, FsError) and mixed[0].error.errno == errno.ENOENT
    assert isinstance(mixed[1].error, FsError) and mixed[1].error.errno == errno.EISDIR
    assert mixed[2].data == bytes(model[paths[0]][:10])
    # an open handle works as a batch target
    with ffs.open(paths[1], "rb", buffering=0) as f:
        assert ffs.batch_read([(f, 5, 20)])[0].data == bytes(model[paths[1]][5:25])


def test_exact_length_on_close_recovers_unreported_writes(admin_fs: FileSystem, ffs: FileSystem,
                                                          workdir: str) -> None:
    path = f"{workdir}/crashed"
    with ffs.open(path, "wb"):
        pass
    inode = ffs.stat(path)
    assert inode.layout is not None
    # a writer that "crashed" after writing, before reporting: data on storage, meta says 0
    data = os.urandom(3 * CHUNK + 11)
    ffs._write_range(inode.id, inode.layout, 0, memoryview(data), path)
    assert ffs._stat_inode(inode.id).length == 0
    admin_fs.open(path, "rb").close()  # storage serves the admin too only what meta granted on open
    assert exact_length(admin_fs.storage, inode.layout, inode.id) == len(data)
    with admin_fs.open(path, "r+b"):  # open for write + close: the exact length from storage
        pass
    assert ffs.stat(path).length == len(data)
    assert ffs.read_bytes(path) == data


def test_length_reported_while_writing(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/growing"
    f = ffs.open(path, "wb", buffering=0)
    try:
        f.write(b"x" * (CHUNK + 1))
        ffs.lengths.report_all()  # what the reporter thread does every report_interval_s
        assert ffs._stat_inode(f.inode_id).length == CHUNK + 1
        assert ffs.stat(path).length == CHUNK + 1
    finally:
        f.close()


def test_bad_input_is_refused_and_writes_nothing(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/bad"
    with ffs.open(path, "wb") as f:
        f.write(b"keep")
    with ffs.open(path, "r+b", buffering=0) as f:
        with pytest.raises(InvalidArgument):
            f.pwrite(b"x", -1)
        with pytest.raises(InvalidArgument):
            f.pread(-5, 0)
        with pytest.raises(InvalidArgument):
            f.pread(ffs.settings.max_io_bytes + 1, 0)
        with pytest.raises(InvalidArgument):
            f.pwrite("text", 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):  # one bad item: the whole batch is refused up front
        ffs.batch_write([(path, 0, b"AAAA"), (path, -3, b"B")])
    with pytest.raises(InvalidArgument):
        ffs.open(path, "rw")
    with pytest.raises(FsError) as e:
        ffs.open(f"{workdir}/missing", "rb")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(FsError) as e:
        ffs.open(workdir, "wb")
    assert e.value.errno == errno.EISDIR
    with pytest.raises(FsError) as e:
        ffs.open(workdir, "rb")
    assert e.value.errno == errno.EISDIR
    ffs.chmod(path, 0o444)
    with pytest.raises(FsError) as e:
        ffs.open(path, "r+b")
    assert e.value.errno == errno.EACCES
    with pytest.raises(FsError) as e:
        ffs.open(f"{workdir}/x", "xb").close()
        ffs.open(f"{workdir}/x", "xb")
    assert e.value.errno == errno.EEXIST
    with ffs.open(path, "rb") as f, pytest.raises(io.UnsupportedOperation):
        f.write(b"no")
    assert ffs.read_bytes(path) == b"keep"


def test_retried_write_is_applied_once(ffs: FileSystem, workdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = f"{workdir}/once"
    with ffs.open(path, "wb"):
        pass
    inode = ffs.stat(path)
    assert inode.layout is not None
    real = ffs.storage._call
    dropped: list[str] = []

    def lose_first_reply(addr: str, op: str, *args: object, **kw: object) -> object:
        reply = real(addr, op, *args, **kw)  # the head applied it ...
        if op == "stor.batch_write" and not dropped:
            dropped.append(op)
            raise DeadlineExceeded("reply lost (injected)")  # ... but the client never heard
        return reply

    monkeypatch.setattr(ffs.storage, "_call", lose_first_reply)
    with ffs.open(path, "r+b", buffering=0) as f:
        f.pwrite(b"hello", 0)
    monkeypatch.undo()
    assert dropped
    chain = inode.layout.chain_of(0)
    res = ffs.storage.batch_read([ReadIo(chain_id=chain, chunk_id=ChunkId(inode.id, 0, 0))])[0]
    assert res.error is None and res.data == b"hello"
    assert res.version == 1  # a second application would have made version 2


def test_gc_removes_unlinked_files_chunks(service_storage: StorageClient, ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/garbage"
    data = os.urandom(4 * CHUNK + 1)
    ffs.write_bytes(path, data)
    inode = ffs.stat(path)
    assert inode.layout is not None
    assert exact_length(service_storage, inode.layout, inode.id) == len(data)
    keep = f"{workdir}/keep"
    ffs.write_bytes(keep, b"k" * (CHUNK + 3))
    ffs.unlink(path)
    wait_until(lambda: exact_length(service_storage, inode.layout, inode.id) == 0, timeout_s=15.0,
               interval_s=0.2, what="GC to remove the unlinked file's chunks")
    assert ffs.read_bytes(keep) == b"k" * (CHUNK + 3)


def test_truncate_cuts_storage_exactly(service_storage: StorageClient, ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/trunc"
    data = os.urandom(3 * CHUNK + 100)
    ffs.write_bytes(path, data)
    inode = ffs.truncate(path, CHUNK + 7)
    assert inode.layout is not None
    assert exact_length(service_storage, inode.layout, inode.id) == CHUNK + 7
    with ffs.open(path, "r+b", buffering=0) as f:
        f.pwrite(b"#", 3 * CHUNK)
    assert ffs.read_bytes(path) == data[:CHUNK + 7] + bytes(2 * CHUNK - 7) + b"#"


def test_exact_length_refreshes_routing_older_than_the_files_chains(service_storage: StorageClient, ffs: FileSystem,
                                                                     workdir: str) -> None:
    """A client whose routing snapshot predates the file's chains (the checkpoint service connects
    while the cluster comes up) refreshes it instead of failing every close with NotServing."""
    import msgspec

    path = f"{workdir}/stale-routing"
    ffs.write_bytes(path, b"x" * 10)
    inode = ffs.stat(path)
    assert inode.layout is not None
    storage = service_storage
    storage.routing = msgspec.structs.replace(storage.routing, chains=[], version=1)
    assert exact_length(storage, inode.layout, inode.id) == 10
    assert storage.routing.version > 1 and storage.routing.chains


def test_exact_length_refreshes_routing_whose_chain_version_is_behind(service_storage: StorageClient, ffs: FileSystem,
                                                                      workdir: str) -> None:
    """A snapshot that names the file's chains at an older version (a second ``make demo`` on the
    same state dir: the restarted targets bumped chain 1 from v4 to v5 after the checkpoint
    service read routing) gets ChainVersionMismatch from storage: refresh and retry, not fail."""
    import msgspec

    path = f"{workdir}/stale-version"
    ffs.write_bytes(path, b"v" * 11)
    inode = ffs.stat(path)
    assert inode.layout is not None
    storage = service_storage
    real = storage.routing
    older = [msgspec.structs.replace(c, version=c.version - 1) for c in real.chains]
    storage.routing = msgspec.structs.replace(real, chains=older, version=1)
    assert exact_length(storage, inode.layout, inode.id) == 11
    assert storage.routing.version == real.version


def test_exact_length_retries_a_node_address_that_went_stale(service_storage: StorageClient, ffs: FileSystem,
                                                            workdir: str) -> None:
    """After ``ff down`` / ``ff up`` on the same state dir the storage nodes listen on new ports
    and a routing snapshot can still name the old ones (a second ``make demo`` failed every close
    with "cannot connect"): the query refreshes routing and retries instead of failing."""
    import socket

    import msgspec

    path = f"{workdir}/stale-address"
    ffs.write_bytes(path, b"y" * 12)
    inode = ffs.stat(path)
    assert inode.layout is not None
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    storage = service_storage
    real = storage.routing
    stale = tuple(msgspec.structs.replace(n, tags=tuple(f"wire={dead}" if t.startswith("wire=") else t
                                                        for t in n.tags)) for n in real.nodes)
    storage.routing = msgspec.structs.replace(real, nodes=stale, version=1)
    storage._avoid.clear()
    assert exact_length(storage, inode.layout, inode.id) == 12
    assert storage.routing.version == real.version
