"""The pure chunk-capability rules: signing, every refusal reason, key rotation, the client cache."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import msgspec
import pytest

from fireflyer.core.errors import PermissionDenied, SettingsError
from fireflyer.rpc.auth import Principal
from fireflyer.storage.capability import (
    READ,
    WRITE,
    CapabilityCache,
    CapabilityDenied,
    Grantor,
    Keyring,
    decode,
    encode,
    exempt,
    read_key_file,
    sign,
    verify,
    verify_all,
    write_key_file,
)
from fireflyer.storage.chunkid import ChunkId

KEYS = Keyring(b"k" * 32)
NOW = 1_000_000.0


def cap(**kw: object) -> bytes:
    args: dict[str, object] = dict(inode=500, mode=READ, expires=NOW + 60, user="alice")
    args.update(kw)
    return encode(sign(KEYS, **args))  # type: ignore[arg-type]


def denied(reason: str, raw: bytes, *, user: str = "alice", chunk: ChunkId = ChunkId(500, 0, 3),
           mode: int = READ, keys: Keyring = KEYS, now: float = NOW) -> CapabilityDenied:
    with pytest.raises(CapabilityDenied) as ei:
        verify(keys, decode(raw), user=user, chunk=chunk, mode=mode, now=now)
    assert ei.value.fields["reason"] == reason, ei.value
    return ei.value


def test_a_genuine_capability_passes() -> None:
    verify(KEYS, decode(cap()), user="alice", chunk=ChunkId(500, 0, 3), mode=READ, now=NOW)
    verify(KEYS, decode(cap(mode=READ | WRITE)), user="alice", chunk=ChunkId(500, 2, 9), mode=WRITE, now=NOW)


def test_each_refusal_says_what_is_wrong() -> None:
    e = denied("expired", cap(expires=NOW - 1))
    assert isinstance(e, PermissionDenied) and e.errno == errno.EACCES and "expired" in e.message
    denied("wrong_user", cap(), user="bob")
    denied("wrong_inode", cap(), chunk=ChunkId(501, 0, 0))
    denied("out_of_range", cap(first=0, last=2), chunk=ChunkId(500, 0, 3))
    denied("wrong_mode", cap(mode=READ), mode=WRITE)
    denied("unknown_key", cap(), keys=Keyring(b"z" * 32, key_id=7))


def test_tampering_breaks_the_signature() -> None:
    c = decode(cap())
    for field, value in (("inode", 501), ("mode", READ | WRITE), ("expires", NOW + 10**6), ("user", "bob"),
                         ("last", 10**9)):
        forged = encode(msgspec.structs.replace(c, **{field: value}))
        denied("bad_signature", forged, user=str(value) if field == "user" else "alice",
               chunk=ChunkId(501 if field == "inode" else 500, 0, 3))
    flipped = bytearray(c.sig)
    flipped[0] ^= 1
    denied("bad_signature", encode(msgspec.structs.replace(c, sig=bytes(flipped))))
    denied("bad_signature", cap(), keys=Keyring(b"x" * 32))  # same key id, another key
    with pytest.raises(CapabilityDenied) as ei:
        decode(b"\x01garbage")
    assert ei.value.fields["reason"] == "malformed"


def test_rotation_accepts_the_previous_key_only() -> None:
    old = Keyring(b"o" * 32, key_id=4)
    raw = encode(sign(old, inode=500, mode=READ, expires=NOW + 60, user="alice"))
    rotated = Keyring(b"n" * 32, key_id=5, previous=b"o" * 32)
    verify(rotated, decode(raw), user="alice", chunk=ChunkId(500, 0, 0), mode=READ, now=NOW)
    assert decode(encode(sign(rotated, inode=1, mode=READ, expires=NOW, user="a"))).key_id == 5
    denied("unknown_key", raw, keys=Keyring(b"m" * 32, key_id=6, previous=b"n" * 32))


def test_verify_all_covers_every_io_of_a_request() -> None:
    mine, theirs = cap(inode=7, user="bob", mode=READ | WRITE), cap(inode=500)
    wants = [(ChunkId(7, 0, 0), WRITE), (ChunkId(7, 0, 1), WRITE)]
    verify_all(KEYS, [mine], user="bob", wants=wants, now=NOW)
    with pytest.raises(CapabilityDenied) as ei:  # bob's capability for his file, on alice's inode
        verify_all(KEYS, [mine], user="bob", wants=[(ChunkId(500, 0, 0), READ)], now=NOW)
    assert ei.value.fields["reason"] == "wrong_inode"
    with pytest.raises(CapabilityDenied) as ei:
        verify_all(KEYS, [], user="bob", wants=wants, now=NOW)
    assert ei.value.fields["reason"] == "missing"
    with pytest.raises(CapabilityDenied) as ei:  # alice's capability, presented by bob
        verify_all(KEYS, [theirs], user="bob", wants=[(ChunkId(500, 0, 0), READ)], now=NOW)
    assert ei.value.fields["reason"] == "wrong_user"


def test_service_principals_are_exempt_admins_are_not() -> None:
    assert exempt(Principal("svc-meta", frozenset({"service"})))
    assert not exempt(Principal("root", frozenset({"admin"})))
    assert not exempt(Principal("bob", frozenset({"user"})))


def test_renewal_needs_a_genuine_capability_for_that_inode_and_user() -> None:
    g = Grantor(KEYS, lifetime_s=600, clock=lambda: NOW)
    raw = g.grant(inode=500, mode=READ, user="alice")
    assert decode(raw).expires == NOW + 600
    g2 = Grantor(KEYS, lifetime_s=600, clock=lambda: NOW + 10**5)
    g2.check_renewal(raw, inode=500, mode=READ, user="alice")  # long expired: still proof of open
    for kw, reason in (({"inode": 501}, "wrong_inode"), ({"user": "bob"}, "wrong_user"),
                       ({"mode": WRITE}, "wrong_mode")):
        args: dict[str, object] = {"inode": 500, "mode": READ, "user": "alice", **kw}
        with pytest.raises(CapabilityDenied) as ei:
            g2.check_renewal(raw, **args)  # type: ignore[arg-type]
        assert ei.value.fields["reason"] == reason
    with pytest.raises(SettingsError):
        Grantor(KEYS, lifetime_s=0)


def test_cache_renews_before_expiry_and_keeps_the_wider_grant() -> None:
    now = [NOW]
    g = Grantor(KEYS, lifetime_s=600, clock=lambda: now[0])
    calls: list[tuple[int, int, bytes | None]] = []

    def renew(inode: int, mode: int, old: bytes | None) -> bytes:
        calls.append((inode, mode, old))
        return g.grant(inode=inode, mode=mode, user="alice")

    c = CapabilityCache(renew, margin_s=60, clock=lambda: now[0])
    rw = g.grant(inode=500, mode=READ | WRITE, user="alice")
    c.put(rw)
    c.put(g.grant(inode=500, mode=READ, user="alice"))  # a later read-only open keeps read-write
    assert c.get(500, WRITE) == rw and not calls
    now[0] += 600 - 30  # inside the margin: renewed first, with the old one as proof
    fresh = c.get(500, READ)
    assert calls == [(500, READ | WRITE, rw)] and fresh != rw and decode(fresh).expires == now[0] + 600
    c.stale(500)  # a storage node said expired (clocks differ): the next use renews
    c.get(500, READ)
    assert len(calls) == 2
    assert CapabilityCache(None).get(9, READ) is None  # nothing cached, nothing to renew with


def test_key_file_is_private_random_and_read_back(tmp_path: Path) -> None:
    p = tmp_path / "state" / "capability.key"
    assert write_key_file(p) and not write_key_file(p)  # kept once made
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert len(read_key_file(p).current) == 32
    with pytest.raises(SettingsError) as ei:
        read_key_file(tmp_path / "missing")
    assert ei.value.fields["key"] == "capability_key_file" and "FF_CAPABILITY_KEY_FILE" in ei.value.message
    (tmp_path / "bad").write_text("not-hex\n")
    with pytest.raises(SettingsError):
        read_key_file(tmp_path / "bad")
    (tmp_path / "rot").write_text(f"{'ab' * 32}\n3 {'cd' * 32}\n")
    k = read_key_file(tmp_path / "rot")
    assert (k.key_id, k.previous) == (4, bytes.fromhex("cd" * 32))


def test_cache_is_bounded_dropping_expired_entries_first() -> None:
    now = [NOW]
    g = Grantor(KEYS, lifetime_s=10, clock=lambda: now[0])
    c = CapabilityCache(None, clock=lambda: now[0], max_entries=3)
    c.put(g.grant(inode=1, mode=READ, user="a"))
    now[0] += 20  # inode 1's expired
    for i in (2, 3):
        c.put(g.grant(inode=i, mode=READ, user="a"))
    c.put(g.grant(inode=4, mode=READ, user="a"))  # full: the expired one goes, the live ones stay
    assert c.peek(1) == b"" and all(c.peek(i) for i in (2, 3, 4))
    c.put(g.grant(inode=5, mode=READ, user="a"))  # full, none expired: the oldest goes
    assert c.peek(2) == b"" and all(c.peek(i) for i in (3, 4, 5))
