"""The file client on the storage nodes' host reads through the short-circuit local path by
default (files, batches, holes, readahead) and over the network when told not to: same bytes."""

from __future__ import annotations

import os

import numpy as np
from fsc_common import CHUNK

from fireflyer.fs import FileSystem, connect
from fireflyer.testing.cluster import LocalCluster


def test_file_reads_go_through_the_local_path_and_match_the_network(ffs: FileSystem, workdir: str,
                                                                     fs_cluster: LocalCluster) -> None:
    path = f"{workdir}/blob"
    data = os.urandom(7 * CHUNK + 1234)
    hole_at = len(data) + 3 * CHUNK  # a hole, then a tail
    tail = os.urandom(999)
    ffs.write_bytes(path, data)
    assert all(r.ok for r in ffs.batch_write([(path, hole_at, tail)]))
    model = data + bytes(hole_at - len(data)) + tail
    before = ffs.storage.read_stats.snapshot()
    assert ffs.storage.local_reads
    got_local = ffs.read_bytes(path)
    with ffs.open(path, "rb") as f:  # buffered and read ahead
        streamed = b"".join(iter(lambda: f.read(10_000), b""))
    buf = np.empty(len(model), dtype=np.uint8)
    [r] = ffs.batch_read_into([(path, 0, buf)])
    assert r.ok and r.written == len(model)
    after = ffs.storage.read_stats.snapshot()
    assert got_local == model and streamed == model and buf.tobytes() == model
    assert after["local_ios"] > before["local_ios"] and after["network_ios"] == before["network_ios"]

    net = connect(state_dir=fs_cluster.state_dir, local_reads=False)
    try:
        assert not net.storage.local_reads
        assert net.read_bytes(path) == got_local
        parts = net.batch_read([(path, 5, CHUNK + 17), (path, hole_at - 4, 100)])
        mine = ffs.batch_read([(path, 5, CHUNK + 17), (path, hole_at - 4, 100)])
        assert [p.data for p in parts] == [m.data for m in mine]
        assert net.storage.read_stats.local_ios == 0 and net.storage.read_stats.network_ios > 0
    finally:
        net.close()
