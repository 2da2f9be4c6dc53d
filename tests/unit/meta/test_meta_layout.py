"""Pure parts: the chain shuffle (pinned values), layout validation, key layout."""

from __future__ import annotations

import errno

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.meta import FsInvalidArgument, Layout, LayoutPolicy
from fireflyer.meta import keys as K
from fireflyer.meta.layout import make_layout, rr_initial, shuffle_indexes, splitmix64


def test_splitmix64_reference_values() -> None:
    # the published reference stream for seed 0
    g = splitmix64(0)
    assert [next(g) for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_shuffle_is_pinned() -> None:
    # if these change, every existing file's layout silently changes: never update casually
    assert shuffle_indexes(16, 5, 8, 42) == [8, 6, 11, 7, 9, 5, 12, 10]
    assert shuffle_indexes(10, 7, 10, 217090) == [5, 3, 0, 6, 2, 8, 9, 1, 4, 7]
    assert shuffle_indexes(4, 0, 4, 1234567) == [0, 2, 3, 1]
    lay = make_layout(LayoutPolicy(1, 1 << 20, 4), 3, (11, 12, 13, 14, 15, 16), 2, 999)
    assert lay == Layout(1, 3, 1 << 20, 4, (15, 16, 14, 13))


def test_shuffle_properties() -> None:
    for seed in range(50):
        idx = shuffle_indexes(7, 5, 5, seed)
        assert sorted(idx) == sorted((5 + i) % 7 for i in range(5))
        assert idx == shuffle_indexes(7, 5, 5, seed)  # deterministic
    assert len({tuple(shuffle_indexes(8, 0, 8, s)) for s in range(50)}) > 10  # actually shuffles
    assert shuffle_indexes(8, 3, 1, 77) == [3]
    assert rr_initial(0, 8) == 0 and rr_initial(31, 64) == 62


@pytest.mark.parametrize("chunk", [0, 1, 4095, 3 << 12, 128 << 20, -4096, 1.5])
def test_bad_chunk_sizes(chunk: object) -> None:
    with pytest.raises(FsInvalidArgument) as ei:
        LayoutPolicy(1, chunk, 1).validate()  # type: ignore[arg-type]
    assert ei.value.errno == errno.EINVAL and isinstance(ei.value, InvalidArgument)
    assert ei.value.code == "INVALID_ARGUMENT"


def test_policy_and_layout_validation() -> None:
    LayoutPolicy(1, 4096, 1).validate(1)
    LayoutPolicy(1, 64 << 20, 8).validate(8)
    with pytest.raises(FsInvalidArgument):
        LayoutPolicy(1, 4096, 0).validate()
    with pytest.raises(FsInvalidArgument):
        LayoutPolicy(1, 4096, 9).validate(8)
    with pytest.raises(FsInvalidArgument):
        Layout(1, 1, 4096, 2, (1,)).validate()
    lay = Layout(1, 1, 4096, 3, (7, 8, 9))
    lay.validate()
    assert [lay.chain_of(i) for i in range(5)] == [7, 8, 9, 7, 8]


def test_key_layout() -> None:
    assert K.inode_key(1) == b"INOD" + bytes(7) + b"\x01"
    assert K.inode_key(255) < K.inode_key(256)  # big-endian: scans in id order
    b, e = K.dentry_range(5)
    assert b <= K.dentry_key(5, "") < K.dentry_key(5, "zzz\U0001f600") < e
    assert not b <= K.dentry_key(6, "a") < e and not b <= K.dentry_key(4, "\xff" * 10) < e
    assert K.dentry_name(K.dentry_key(5, "héllo")) == "héllo"
    assert K.id_from_key(K.gc_key(12345)) == 12345
