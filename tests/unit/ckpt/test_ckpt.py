from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import torch

from fireflyer.ckpt import (
    CheckpointCorrupted,
    LocalFS,
    decode_index,
    encode_index,
    flatten,
    load,
    pack,
    read_tensors,
    save,
    select,
    unflatten,
    write_shards,
)
from fireflyer.core.errors import InvalidArgument


def assert_same(a, b, path="") -> None:
    if isinstance(a, dict):  # dict subclasses (state_dict's OrderedDict) come back as dict
        assert type(b) is dict, path
        assert list(a) == list(b), path
        assert [type(k) for k in a] == [type(k) for k in b], path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
        return
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    else:
        assert a == b or (a != a and b != b), path


def nested_state():
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(3, 5, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16),
                  "idx": torch.arange(7, dtype=torch.int64), "f8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
                  "t": torch.randn(4, 3, generator=g).t(), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)},
        "np": [np.arange(6, dtype=np.float16).reshape(2, 3), np.ones((2, 2), dtype=ml_dtypes.bfloat16),
               np.float32(1.5), np.array(["ab", "c"])],
        0: ("x", 1, 2.5, None, True, b"raw", float("nan")),
        "a/b%c": {1: [], 2: {}, "x": ()},
        "step": 10,
    }


def test_round_trip_nested(tmp_path):
    fs = LocalFS(tmp_path)
    state = nested_state()
    save(fs, "ck", state, shard_bytes=64, align=16)
    assert_same(state, load(fs, "ck"))
    assert torch.frombuffer  # views of the read buffer: writable and usable in place
    out = load(fs, "ck")
    out["model"]["w"].add_(1)


def test_adam_state_dict_round_trip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    fs = LocalFS(tmp_path)
    save(fs, "ck", state)
    back = load(fs, "ck")
    assert_same(state, back)
    opt2 = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])  # the rebuilt dict is accepted by torch


def test_partial_load_by_prefix(tmp_path):
    fs = LocalFS(tmp_path)
    state = nested_state()
    save(fs, "ck", state)
    part = load(fs, "ck", keys=["model/w", ("np", 1), "a%2Fb%25c"])
    assert list(part) == ["model", "np", "a/b%c"]
    assert list(part["model"]) == ["w"]
    assert_same(part["model"]["w"], state["model"]["w"])
    assert part["np"][0] is None and part["np"][2] is None
    assert_same(part["np"][1], state["np"][1])
    assert_same(part["a/b%c"], state["a/b%c"])
    flat = flatten(state)
    assert [e.path for e in select(flat.leaves, ["model/idx", "0/2"])] == ["model/idx", "0/2"]


def test_corrupted_byte_names_tensor(tmp_path):
    fs = LocalFS(tmp_path)
    state = {"a": torch.ones(1000), "b": torch.zeros(1000)}
    index = save(fs, "ck", state, align=4096)
    eb = next(e for e in index.entries if e.path == "b")
    p = os.path.join(tmp_path, "ck", index.shards[eb.shard].name)
    with open(p, "r+b") as f:
        f.seek(eb.offset + 123)
        byte = f.read(1)
        f.seek(eb.offset + 123)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointCorrupted) as ei:
        load(fs, "ck")
    assert ei.value.path == "b" and index.shards[eb.shard].name in ei.value.shard
    assert ei.value.code == "DATA_LOSS"
    assert_same(load(fs, "ck", keys=["a"]), {"a": state["a"]})  # the good tensor still loads


def test_non_serializable_names_path_and_writes_nothing(tmp_path):
    fs = LocalFS(tmp_path)
    bad = {"model": {"w": torch.ones(3)}, "opt": [1, {"fn": object()}]}
    with pytest.raises(InvalidArgument) as ei:
        save(fs, "ck", bad)
    assert ei.value.path == "opt/1/fn" and "opt/1/fn" in str(ei.value)
    assert not os.path.exists(tmp_path / "ck")
    for obj, path in [({"s": {1, 2}}, "s"), ({(1, 2): 0}, ""), ({"x": np.array([object()])}, "x"),
                      ({"big": 1 << 70}, "big"), ({0: 1, "0": 2}, "0")]:
        with pytest.raises(InvalidArgument) as ei:
            flatten(obj)
        assert ei.value.path == path


def test_pack_respects_shard_bytes_and_alignment():
    state = {f"t{i}": torch.zeros(n, dtype=torch.uint8) for i, n in enumerate([100, 3000, 5000, 9000, 1, 0, 700])}
    flat = flatten(state)
    index, layouts = pack(flat, rank=3, shard_bytes=8192, align=1024)
    tensors = [e for e in index.entries]
    for e in tensors:
        assert e.offset % 1024 == 0
        assert e.offset + e.nbytes <= max(8192, e.nbytes)
    for s in layouts:
        ends = sorted((index.entries[i].offset, index.entries[i].offset + index.entries[i].nbytes) for i in s.entries)
        assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False))  # no overlap
        assert s.size == max(e for _, e in ends) and (s.size <= 8192 or len(s.entries) == 1)
        assert s.name.startswith("rank00003-")
    big = next(e for e in index.entries if e.path == "t3")
    assert big.offset == 0 and len(layouts[big.shard].entries) == 1  # larger than a shard: its own
    assert [s.size for s in index.shards] == [s.size for s in layouts]
    assert decode_index(encode_index(index)) == index
    with pytest.raises(InvalidArgument):
        pack(flat, shard_bytes=0)


def test_write_and_read_with_plain_bytes_fs(tmp_path):
    class BytesFS(LocalFS):  # returns immutable bytes, like the 3FS client
        def batch_read(self, ios):
            out = super().batch_read(ios)
            for r in out:
                r.data = bytes(r.data)
            return out

    fs = BytesFS(tmp_path)
    state = {"x": torch.arange(10, dtype=torch.float64), "y": np.arange(4, dtype=np.int32)}
    flat = flatten(state)
    index, _ = pack(flat)
    write_shards(fs, "d", index, flat, io_bytes=16)  # many small I/Os per tensor
    got = read_tensors(fs, "d", index)
    back = unflatten(index.tree, got)
    assert_same(state, back)
    back["x"].mul_(2)  # a writable buffer even though the fs returned bytes


def test_parallel_crc_check_names_the_corrupted_tensor(tmp_path):
    """Through ParallelFS with a pool the CRCs are checked on its threads (>= 64 MiB of
    tensors); the error still names the first corrupted tensor in index order."""
    from concurrent.futures import ThreadPoolExecutor

    from fireflyer.ckpt.shard import ParallelFS

    fs = LocalFS(tmp_path)
    state = {f"t{i}": torch.full((5 << 20,), float(i)) for i in range(4)}  # 4 x 20 MiB
    with ThreadPoolExecutor(3) as pool:
        pfs = ParallelFS(fs, pool, 3, piece_bytes=4 << 20)
        flat = flatten(state)
        index, _ = pack(flat, shard_bytes=48 << 20)
        write_shards(pfs, "d", index, flat)
        assert_same(unflatten(index.tree, read_tensors(pfs, "d", index)), state)
        for name in ("t3", "t1"):  # two bad tensors: t1 comes first in the index
            e = next(e for e in index.entries if e.path == name)
            with open(os.path.join(tmp_path, "d", index.shards[e.shard].name), "r+b") as f:
                f.seek(e.offset + e.nbytes - 1)
                last = f.read(1)
                f.seek(e.offset + e.nbytes - 1)
                f.write(bytes([last[0] ^ 1]))
        with pytest.raises(CheckpointCorrupted) as ei:
            read_tensors(pfs, "d", index)
        assert ei.value.path == "t1"
        got = read_tensors(pfs, "d", index, verify=False)  # unverified reads still work
        assert got["t0"].equal(state["t0"])
