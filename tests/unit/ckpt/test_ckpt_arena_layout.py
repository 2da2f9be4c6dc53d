"""Shards as images of the snapshot arena, written in whole, chunk-aligned I/Os; large-chunk
layout policies for checkpoint directories."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from fireflyer.ckpt import LocalFS, pack, read_tensors, unflatten, write_shards
from fireflyer.ckpt.layout import effective_policy, prefer_chunk_size
from fireflyer.ckpt.snapshot import Snapshotter
from fireflyer.core.errors import InvalidArgument
from fireflyer.meta import LayoutPolicy


def _state():
    g = torch.Generator().manual_seed(1)
    return {"w": [torch.randn(1000, generator=g) for _ in range(5)],  # 4000 bytes each
            "b": torch.randn(3, generator=g).to(torch.bfloat16), "ids": np.arange(7, dtype=np.int64),
            "empty": torch.zeros(0), "step": 3}


class RecordingFS(LocalFS):
    def __init__(self, root):
        super().__init__(root)
        self.writes: list[tuple[str, int, int]] = []

    def batch_write(self, ios):
        self.writes.extend((p, off, memoryview(d).nbytes) for p, off, d in ios)
        return super().batch_write(ios)


def test_pack_places_tensors_at_their_arena_offsets():
    snap = Snapshotter().take(_state())
    index, layouts = pack(snap.flat, shard_bytes=9000, arena_offsets=snap.offsets)
    tensors = [e for e in index.entries if hasattr(e, "offset")]
    assert len(layouts) > 1  # 5 x 4000 bytes do not fit in 9000-byte shards
    for e in tensors:
        lay = layouts[e.shard]
        assert lay.base >= 0
        assert e.offset == snap.offsets[e.path] - lay.base  # the shard is the arena region
        assert e.offset + e.nbytes <= lay.size
    for lay in layouts:
        assert lay.size <= 9000 or len(lay.entries) == 1
    # a shard starts at its first tensor: the first entry of every shard has offset 0
    assert all(min(index.entries[i].offset for i in lay.entries) == 0 for lay in layouts)


def test_pack_refuses_falling_arena_offsets():
    snap = Snapshotter().take(_state())
    bad = dict(snap.offsets)
    first, second = [leaf.path for leaf in snap.flat.leaves if hasattr(leaf, "data")][:2]
    bad[first], bad[second] = bad[second], bad[first]
    with pytest.raises(InvalidArgument):
        pack(snap.flat, arena_offsets=bad)


def test_arena_shards_go_out_in_whole_aligned_ios_and_load_bit_identical(tmp_path):
    state = _state()
    snap = Snapshotter().take(state)
    index, layouts = pack(snap.flat, shard_bytes=9000, arena_offsets=snap.offsets)
    fs = RecordingFS(tmp_path)
    io = 1024
    written = write_shards(fs, "d", index, snap.flat, io_bytes=io, layouts=layouts, arena=snap.arena)
    assert written == sum(lay.size for lay in layouts)
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, off, n in fs.writes:
        by_file.setdefault(path, []).append((off, n))
    assert len(by_file) == len(layouts)
    for lay in layouts:
        ios = sorted(by_file[f"d/{lay.name}"])
        assert [off for off, _ in ios] == list(range(0, lay.size, io))  # every I/O starts on a boundary
        assert all(n == io for _, n in ios[:-1]) and sum(n for _, n in ios) == lay.size
        with open(tmp_path / "d" / lay.name, "rb") as f:  # the file is the arena region
            assert f.read() == bytes(snap.arena[lay.base:lay.base + lay.size])
    back = unflatten(index.tree, read_tensors(fs, "d", index))
    assert all(a.equal(b) for a, b in zip(state["w"], back["w"], strict=True))
    assert back["b"].view(torch.int16).equal(state["b"].view(torch.int16))
    assert np.array_equal(back["ids"], state["ids"]) and back["empty"].numel() == 0 and back["step"] == 3


def test_without_arena_tensors_are_written_one_by_one(tmp_path):
    snap = Snapshotter().take(_state())
    index, layouts = pack(snap.flat, shard_bytes=9000)  # no arena offsets: packed at 4 KiB alignment
    assert all(lay.base == -1 for lay in layouts)
    fs = RecordingFS(tmp_path)
    write_shards(fs, "d", index, snap.flat, layouts=layouts, arena=snap.arena)
    assert len(fs.writes) == sum(1 for e in index.entries if getattr(e, "nbytes", 0))


class FakeMetaFS:
    """stat/set_dir_policy/write_bytes/unlink over a dict of directories, like the 3FS client."""

    def __init__(self, policies, root_layout):
        self.policies = dict(policies)
        self.root_layout = root_layout
        self.files: set[str] = set()
        self.set_calls: list[tuple[str, LayoutPolicy]] = []

    def stat(self, path):
        if path in self.files:
            return types.SimpleNamespace(dir_policy=None, layout=self.root_layout)
        return types.SimpleNamespace(dir_policy=self.policies.get(path), layout=None)

    def write_bytes(self, path, data):
        self.files.add(path)

    def unlink(self, path):
        self.files.remove(path)

    def set_dir_policy(self, path, policy):
        self.set_calls.append((path, policy))
        self.policies[path] = policy


def test_prefer_chunk_size_sets_a_larger_chunk_on_the_directory_keeping_table_and_stripe():
    fs = FakeMetaFS({"/a": LayoutPolicy(2, 4 << 20, 3)}, None)
    assert prefer_chunk_size(fs, "/a/ckpt", 64 << 20) == 64 << 20
    assert fs.set_calls == [("/a/ckpt", LayoutPolicy(2, 64 << 20, 3))]
    assert effective_policy(fs, "/a/ckpt/job/step1").chunk_size == 64 << 20  # inherited below
    assert prefer_chunk_size(fs, "/a/ckpt", 64 << 20) == 64 << 20 and len(fs.set_calls) == 1  # idempotent


def test_prefer_chunk_size_leaves_larger_chunks_and_zero_alone():
    fs = FakeMetaFS({"/": LayoutPolicy(1, 64 << 20, 2)}, None)
    assert prefer_chunk_size(fs, "/ckpt", 16 << 20) == 64 << 20
    fs2 = FakeMetaFS({"/": LayoutPolicy(1, 1 << 20, 2)}, None)
    assert prefer_chunk_size(fs2, "/ckpt", 0) == 1 << 20
    assert fs.set_calls == [] and fs2.set_calls == []


def test_without_any_policy_the_root_default_is_read_from_a_probe_file_that_is_removed():
    layout = types.SimpleNamespace(chain_table_id=1, chunk_size=4 << 20, stripe_size=2)
    fs = FakeMetaFS({}, layout)
    assert prefer_chunk_size(fs, "/ckpt", 64 << 20) == 64 << 20
    assert fs.set_calls == [("/ckpt", LayoutPolicy(1, 64 << 20, 2))]
    assert fs.files == set()  # the probe is gone
