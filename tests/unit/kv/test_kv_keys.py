"""Key packing preserves order; range-set algebra used by conflict checks."""

from __future__ import annotations

import itertools
import random

import pytest

from fireflyer.kv import KVInvalidArgument
from fireflyer.kv.keys import key_after, pack, prefix_range, strinc, unpack
from fireflyer.kv.ranges import RangeSet

SAMPLES: list[tuple] = [
    (),
    (None,),
    (b"",),
    (b"\x00",),
    (b"\x00\xff",),
    (b"a",),
    (b"a\x00",),
    (b"ab",),
    ("",),
    ("a",),
    ("a\x00b",),
    ("é",),
    (-(2**64) + 1,),
    (-(2**32),),
    (-1,),
    (0,),
    (1,),
    (255,),
    (256,),
    (2**64 - 1,),
    ("INOD", 42),
    ("INOD", 42, "x"),
    ("DENT", 1, "a"),
    ("DENT", 1, "a", None),
    ("DENT", 1, "b"),
    ("DENT", 2, ""),
]


def _order_key(t: tuple) -> tuple:
    rank = {type(None): 0, bytes: 1, str: 2, int: 3}
    return tuple(
        (rank[type(e)], e.encode() if isinstance(e, str) else e) if e is not None else (0, 0) for e in t
    )


def test_pack_round_trips() -> None:
    for t in SAMPLES:
        assert unpack(pack(t)) == t


def test_pack_preserves_order() -> None:
    expected = sorted(SAMPLES, key=_order_key)
    assert sorted(SAMPLES, key=pack) == expected
    rng = random.Random(7)
    ints = [rng.randrange(-(2**63), 2**63) for _ in range(300)]
    assert sorted(ints, key=lambda n: pack((n,))) == sorted(ints)
    blobs = [bytes(rng.randrange(3) for _ in range(rng.randrange(4))) for _ in range(300)]
    assert sorted(blobs, key=lambda b: pack((b, 1))) == sorted(blobs)


def test_ints_are_big_endian_fixed_width() -> None:
    assert pack((42,)) == b"\x20" + (42).to_bytes(8, "big")
    assert pack(("INOD", 42)) == b"\x02INOD\x00\x20" + (42).to_bytes(8, "big")


def test_prefix_range_covers_extensions_only() -> None:
    b, e = prefix_range(pack(("DENT", 1)))
    for t in SAMPLES:
        inside = b <= pack(t) < e
        assert inside == (t[:2] == ("DENT", 1)), t


@pytest.mark.parametrize("bad", [(1.5,), (True,), ([1],), (2**64,), (-(2**64),)])
def test_pack_rejects(bad: tuple) -> None:
    with pytest.raises(KVInvalidArgument):
        pack(bad)


@pytest.mark.parametrize("bad", [b"\x01abc", b"\x20\x00", b"\x77"])
def test_unpack_rejects(bad: bytes) -> None:
    with pytest.raises(KVInvalidArgument):
        unpack(bad)


def test_strinc_and_key_after() -> None:
    assert strinc(b"ab") == b"ac"
    assert strinc(b"a\xff\xff") == b"b"
    assert key_after(b"a") == b"a\x00"
    with pytest.raises(KVInvalidArgument):
        strinc(b"\xff")


def _brute(ranges, universe):
    return {k for k in universe if any(b <= k < e for b, e in ranges)}


def test_rangeset_matches_brute_force() -> None:
    rng = random.Random(3)
    alphabet = [bytes([c]) for c in b"abcdefgh"]
    universe = [b"".join(p) for n in (1, 2) for p in itertools.product(alphabet, repeat=n)]
    for _ in range(200):
        ranges = []
        for _ in range(rng.randrange(6)):
            b, e = sorted(rng.sample(universe, 2))
            ranges.append((b, e))
        rs = RangeSet(ranges)
        members = _brute(ranges, universe)
        assert {k for k in universe if rs.contains(k)} == members
        b, e = sorted(rng.sample(universe, 2))
        hit = rs.overlap(b, e)
        inside = sorted(k for k in members if b <= k < e)
        assert (hit is None) == (not inside and not any(rb < e and b < re for rb, re in ranges))
        gaps = rs.gaps(b, e)
        assert {k for k in universe if any(gb <= k < ge for gb, ge in gaps)} == {
            k for k in universe if b <= k < e and k not in members
        }
        assert list(rs) == sorted(rs) and all(x[1] < y[0] for x, y in itertools.pairwise(rs))
