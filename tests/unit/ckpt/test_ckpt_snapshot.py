"""The snapshot phase: copies into a reused arena, isolation from later updates, refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from fireflyer.ckpt import LocalFS, pack, read_tensors, unflatten, write_shards
from fireflyer.ckpt.snapshot import LARGE, Snapshotter
from fireflyer.core.errors import InvalidArgument


def state():
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(4, 6, generator=g), "t": torch.randn(3, 5, generator=g).t(),
        "bf": torch.randn(7, generator=g).bfloat16(), "i": torch.arange(5, dtype=torch.int32),
        "c": torch.randn(3, dtype=torch.complex64, generator=g).conj(), "s": torch.tensor(1.5),
        "e": torch.zeros(0, 2), "np": np.arange(6, dtype=np.float64).reshape(2, 3),
        "npb": np.ones(3, dtype=ml_dtypes.bfloat16), "f8": np.zeros(2, dtype=ml_dtypes.float8_e4m3fn),
        "sc": np.int16(7), "str": np.array(["ab", "c"]), "v": [1, "x", None],
    }


def leaf_bytes(snap):
    return {leaf.path: bytes(leaf.data) for leaf in snap.flat.leaves if hasattr(leaf, "data")}


def expected_bytes(obj) -> bytes:
    if isinstance(obj, torch.Tensor):
        t = obj.resolve_conj().contiguous().reshape(-1)
        return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return np.ascontiguousarray(obj).tobytes()


def test_snapshot_round_trips_through_shards(tmp_path):
    s = state()
    snap = Snapshotter().take(s)
    snap.wait()
    fs = LocalFS(tmp_path)
    index, _ = pack(snap.flat, shard_bytes=128, align=16)
    write_shards(fs, "d", index, snap.flat)
    out = unflatten(index.tree, read_tensors(fs, "d", index))
    for k in ("w", "t", "bf", "i", "s", "e"):
        assert out[k].dtype == s[k].dtype and out[k].shape == s[k].shape
        assert expected_bytes(out[k]) == expected_bytes(s[k]), k
    assert torch.equal(out["c"], s["c"].resolve_conj())
    for k in ("np", "npb", "f8", "str"):
        assert out[k].dtype == s[k].dtype and out[k].tobytes() == s[k].tobytes(), k
    assert out["sc"] == s["sc"] and type(out["sc"]) is np.int16
    assert out["v"] == [1, "x", None]


def test_snapshot_is_isolated_from_later_updates_and_reuses_the_arena():
    s = state()
    sn = Snapshotter()
    first = sn.take(s)
    before = leaf_bytes(first)
    cap = sn.capacity
    s["w"].add_(1)
    s["np"] += 1
    assert leaf_bytes(first) == before  # the snapshot holds the values at take()
    second = sn.take(s)
    assert sn.capacity == cap  # same layout: same arena, no new allocation
    assert leaf_bytes(second)["w"] == expected_bytes(s["w"])
    assert leaf_bytes(second)["np"] == s["np"].tobytes()
    # a different layout still fits in the arena, or grows it
    s["extra"] = torch.ones(1000)
    third = sn.take(s)
    assert leaf_bytes(third)["extra"] == expected_bytes(s["extra"])
    assert sn.capacity >= cap


def test_large_tensor_copied_in_slices_over_threads():
    big = torch.randn(LARGE // 4 + 12345)
    sn = Snapshotter(copy_threads=2)
    try:
        snap = sn.take({"big": big, "small": torch.ones(3)})
        assert leaf_bytes(snap)["big"] == expected_bytes(big)
    finally:
        sn.release()


@pytest.mark.parametrize("bad, path", [
    ({"a": {"f": lambda x: x}}, "a/f"),
    ({"l": [1, {2, 3}]}, "l/1"),
    ({"o": np.array([object()], dtype=object)}, "o"),
])
def test_snapshot_refuses_what_cannot_be_checkpointed(bad, path):
    sn = Snapshotter()
    with pytest.raises(InvalidArgument) as e:
        sn.take(bad)
    assert path in str(e.value)
    assert sn.capacity == 0  # refused before copying anything
