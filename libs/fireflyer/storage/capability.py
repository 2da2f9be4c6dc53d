"""Chunk capabilities: meta's signed permission to touch one file's chunks (HDFS block tokens).

Storage nodes know nothing of paths, owners or modes; meta does.  So meta, after its normal
permission check on ``open`` / ``create`` (or on a renewal, :meth:`Grantor.renew`), hands the
client a :class:`Capability` naming the inode, the chunk index range, the access (read,
write or both), the user it was granted to and an expiry, signed with HMAC-SHA256 under a
key only meta and the storage nodes hold (``<state_dir>/capability.key``, setting
``capability_key_file`` / ``FF_CAPABILITY_KEY_FILE``).  The client sends it with every
chunk op; a storage node checks it with :func:`verify` (signature in constant time, user,
inode, index, mode, expiry) and refuses the op otherwise (:class:`CapabilityDenied`, a
``PermissionDenied`` with errno EACCES and a ``reason``).  Principals with role ``service``
(meta's cleaner, chain forwarding, resync) need none: :func:`exempt`.

Keys rotate: a :class:`Keyring` signs with its current key and verifies under the current
or the previous one (by ``key_id``), so a rolling restart with a new key does not refuse
capabilities granted a moment before.  Expiry is wall-clock seconds (meta and storage
clocks are assumed NTP-close; the lifetime, ten minutes by default, dwarfs the skew).

Everything here is pure (no I/O but :func:`read_key_file` / :func:`write_key_file`); the
client-side cache that renews capabilities before they expire is :class:`CapabilityCache`.
"""

from __future__ import annotations

import errno as _errno
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.core.errors import PermissionDenied, SettingsError

from .chunkid import MAX_INDEX, ChunkId

__all__ = [
    "READ",
    "WRITE",
    "KEY_BYTES",
    "KEY_FILE_NAME",
    "Capability",
    "CapabilityDenied",
    "Keyring",
    "Grantor",
    "CapabilityCache",
    "sign",
    "verify",
    "verify_all",
    "check_covers",
    "encode",
    "decode",
    "exempt",
    "mode_name",
    "read_key_file",
    "write_key_file",
    "key_path",
    "load_keyring",
]

#: access bits of a capability (a read-write capability has both)
READ, WRITE = 1, 2
KEY_BYTES = 32
KEY_FILE_NAME = "capability.key"


class CapabilityDenied(PermissionDenied):
    """A chunk op without a valid capability: ``reason`` is one of missing, expired,
    wrong_user, wrong_inode, out_of_range, wrong_mode, bad_signature, unknown_key, malformed.
    Its ``errno`` is EACCES (the fs client's callers see a PermissionError with it)."""

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message, **fields)
        self.errno = _errno.EACCES


class Capability(msgspec.Struct, frozen=True, array_like=True):
    """What meta granted: ``mode`` (READ|WRITE bits) on chunk indexes ``first..last``
    (inclusive, any track) of ``inode``, to ``user``, until ``expires`` (Unix seconds).
    ``sig`` is HMAC-SHA256 of the other fields under key ``key_id``."""

    inode: int
    first: int
    last: int
    mode: int
    expires: float
    user: str
    key_id: int
    sig: bytes = b""

    def allows(self, mode: int) -> bool:
        return self.mode & mode == mode


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Capability)


def mode_name(mode: int) -> str:
    return {READ: "read", WRITE: "write", READ | WRITE: "read-write"}.get(mode, f"mode {mode}")


def _body(cap: Capability) -> bytes:
    """The signed bytes: every field but the signature, in a fixed (array) encoding."""
    return _enc.encode((cap.inode, cap.first, cap.last, cap.mode, cap.expires, cap.user, cap.key_id))


class Keyring(msgspec.Struct, frozen=True):
    """The current signing key and, during a rotation, the previous one (both verify)."""

    current: bytes
    key_id: int = 1
    previous: bytes = b""

    def __post_init__(self) -> None:
        if len(self.current) < 16:
            raise SettingsError(f"a capability key has {len(self.current)} bytes; at least 16 are needed "
                                f"(ff up writes {KEY_BYTES} random bytes)", key="capability_key_file",
                                expected=f"{KEY_BYTES} random bytes")

    def key(self, key_id: int) -> bytes | None:
        if key_id == self.key_id:
            return self.current
        if key_id == self.key_id - 1 and self.previous:
            return self.previous
        return None


def sign(keys: Keyring, *, inode: int, mode: int, expires: float, user: str, first: int = 0,
         last: int = MAX_INDEX) -> Capability:
    cap = Capability(inode=inode, first=first, last=last, mode=mode, expires=expires, user=user,
                     key_id=keys.key_id)
    return msgspec.structs.replace(cap, sig=hmac.new(keys.current, _body(cap), hashlib.sha256).digest())


def encode(cap: Capability) -> bytes:
    return _enc.encode(cap)


def decode(data: bytes) -> Capability:
    try:
        return _dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CapabilityDenied(f"capability is malformed ({e}); open the file again through meta",
                               reason="malformed") from None


def _check_signature(keys: Keyring, cap: Capability) -> None:
    key = keys.key(cap.key_id)
    if key is None:
        raise CapabilityDenied(f"capability for inode {cap.inode} is signed with key {cap.key_id}, which this "
                               f"node does not hold (current {keys.key_id}); open the file again",
                               reason="unknown_key", inode=cap.inode)
    if not hmac.compare_digest(hmac.new(key, _body(cap), hashlib.sha256).digest(), cap.sig):
        raise CapabilityDenied(f"capability for inode {cap.inode} has a bad signature (forged or altered)",
                               reason="bad_signature", inode=cap.inode)


def check_covers(cap: Capability, *, user: str, chunk: ChunkId, mode: int, now: float) -> None:
    """The non-cryptographic checks of :func:`verify` (signature checked separately)."""
    if cap.user != user:
        raise CapabilityDenied(f"capability for inode {cap.inode} was granted to {cap.user!r}, not {user!r}",
                               reason="wrong_user", inode=cap.inode, user=user)
    if cap.inode != chunk.inode:
        raise CapabilityDenied(f"capability names inode {cap.inode}, not the chunk's inode {chunk.inode}",
                               reason="wrong_inode", inode=chunk.inode, granted=cap.inode)
    if not cap.first <= chunk.index <= cap.last:
        raise CapabilityDenied(f"chunk {chunk.index} of inode {chunk.inode} is outside the capability's "
                               f"range {cap.first}..{cap.last}", reason="out_of_range", inode=chunk.inode,
                               index=chunk.index)
    if not cap.allows(mode):
        raise CapabilityDenied(f"a {mode_name(cap.mode)} capability does not allow {mode_name(mode)} of inode "
                               f"{chunk.inode}; open the file for {mode_name(mode)}", reason="wrong_mode",
                               inode=chunk.inode)
    if cap.expires <= now:
        raise CapabilityDenied(f"capability for inode {chunk.inode} expired {now - cap.expires:.1f}s ago; "
                               "the client renews it through meta", reason="expired", inode=chunk.inode)


def verify(keys: Keyring, cap: Capability, *, user: str, chunk: ChunkId, mode: int, now: float) -> None:
    """Raise :class:`CapabilityDenied` unless ``cap`` is genuine and lets ``user`` do ``mode``
    on ``chunk`` at time ``now``."""
    _check_signature(keys, cap)
    check_covers(cap, user=user, chunk=chunk, mode=mode, now=now)


def verify_all(keys: Keyring, caps: Iterable[bytes], *, user: str, wants: Iterable[tuple[ChunkId, int]],
               now: float) -> None:
    """Every ``(chunk, mode)`` of one request must be covered by one of the request's ``caps``
    (encoded).  Each capability's signature is checked once however many chunks it covers."""
    by_inode: dict[int, list[Capability]] = {}
    for raw in caps:
        cap = decode(raw)
        _check_signature(keys, cap)
        by_inode.setdefault(cap.inode, []).append(cap)
    for chunk, mode in wants:
        cands = by_inode.get(chunk.inode)
        if not cands:
            if by_inode:  # a capability for something else: say which (bob's cap on alice's inode)
                other = next(iter(by_inode.values()))[0]
                check_covers(other, user=user, chunk=chunk, mode=mode, now=now)
            raise CapabilityDenied(f"no capability for inode {chunk.inode}: open the file through meta "
                                   "(storage serves chunks only to holders of meta's capability)",
                                   reason="missing", inode=chunk.inode)
        err: CapabilityDenied | None = None
        for cap in cands:
            try:
                check_covers(cap, user=user, chunk=chunk, mode=mode, now=now)
                break
            except CapabilityDenied as e:
                err = e
        else:
            assert err is not None
            raise err


def exempt(principal: object) -> bool:
    """Whether ``principal`` needs no capability: the cluster's own processes (role
    ``service``: meta's cleaner, chain forwarding, resync).  Admins are not exempt: meta
    grants them capabilities for everything, and they present them like anyone."""
    has_role = getattr(principal, "has_role", None)
    return has_role is not None and bool(has_role("service"))


class Grantor:
    """Meta's side: sign capabilities for a caller, ``lifetime_s`` from ``clock()``."""

    def __init__(self, keys: Keyring, *, lifetime_s: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        if lifetime_s <= 0:
            raise SettingsError(f"capability lifetime must be > 0 s, got {lifetime_s}",
                                key="capability_lifetime_s", expected="float > 0")
        self.keys = keys
        self.lifetime_s = lifetime_s
        self.clock = clock

    def grant(self, *, inode: int, mode: int, user: str) -> bytes:
        return encode(sign(self.keys, inode=inode, mode=mode, expires=self.clock() + self.lifetime_s, user=user))

    def check_renewal(self, raw: bytes, *, inode: int, mode: int, user: str) -> None:
        """A renewal presents the capability it replaces: genuine (any age, as long as its
        key is still held), granted to this user for this inode, with at least ``mode``.
        So renewing needs a file that was opened, never just a guessed inode id; meta
        then checks the inode's permission bits again (a chmod revokes at renewal)."""
        cap = decode(raw)
        _check_signature(self.keys, cap)
        check_covers(cap, user=user, chunk=ChunkId(inode, 0, cap.first), mode=mode, now=float("-inf"))


class CapabilityCache:
    """The client's capabilities by inode, renewed through ``renew`` before they expire.

    ``renew(inode, mode, old)`` asks meta for a fresh capability (``old``: the encoded one
    it replaces, or None) and returns it encoded.  A capability is used while more than
    ``margin_s`` (or a quarter of its life, if less) remains; after that the next chunk op
    renews it first.  Thread safe; renewal happens outside the lock."""

    def __init__(self, renew: Callable[[int, int, bytes | None], bytes] | None = None, *,
                 margin_s: float = 60.0, clock: Callable[[], float] = time.time, max_entries: int = 65536) -> None:
        self._renew = renew
        self.margin_s = margin_s
        self.clock = clock
        self.max_entries = max_entries
        self._caps: dict[int, tuple[Capability, bytes, float]] = {}  # inode -> (cap, encoded, use until)
        self._lock = threading.Lock()

    def put(self, raw: bytes) -> None:
        if not raw:
            return
        cap = decode(raw)
        now = self.clock()
        until = cap.expires - min(self.margin_s, max(0.0, cap.expires - now) / 4)
        with self._lock:
            old = self._caps.get(cap.inode)
            if old is not None and old[0].allows(cap.mode) and not cap.allows(old[0].mode) and old[2] > now:
                return  # keep a live read-write capability over a new read-only one (both are genuine)
            if len(self._caps) >= self.max_entries and cap.inode not in self._caps:
                # bounded: drop what expired first (files long closed), else the oldest entry
                gone = [i for i, (c, _, _) in self._caps.items() if c.expires <= now]
                for i in gone or [next(iter(self._caps))]:
                    del self._caps[i]
            self._caps[cap.inode] = (cap, raw, until)

    def drop(self, inode: int) -> None:
        with self._lock:
            self._caps.pop(inode, None)

    def peek(self, inode: int) -> bytes:
        """The cached encoded capability of ``inode`` as it is (maybe expired), or b""."""
        with self._lock:
            got = self._caps.get(inode)
        return got[1] if got is not None else b""

    def stale(self, inode: int) -> None:
        """A storage node found the capability expired (clocks differ): renew it on next use."""
        with self._lock:
            got = self._caps.get(inode)
            if got is not None:
                self._caps[inode] = (got[0], got[1], 0.0)

    def get(self, inode: int, mode: int) -> bytes | None:
        """An encoded capability for ``mode`` on ``inode``: cached, else renewed (None when
        there is none and no ``renew``: the storage node then refuses the op)."""
        now = self.clock()
        with self._lock:
            got = self._caps.get(inode)
        if got is not None and got[0].allows(mode) and got[2] > now:
            return got[1]
        if self._renew is None:
            return got[1] if got is not None and got[0].allows(mode) else None
        # renew what was granted (meta re-checks the bits and may grant less, never more)
        raw = self._renew(inode, got[0].mode if got is not None else mode, got[1] if got is not None else None)
        self.put(raw)
        cap = decode(raw)
        if not cap.allows(mode):
            raise CapabilityDenied(f"meta granted {mode_name(cap.mode)} on inode {inode}, not {mode_name(mode)}",
                                   reason="wrong_mode", inode=inode)
        return raw

    def for_inodes(self, inodes: Iterable[int], mode: int) -> list[bytes]:
        out = []
        for i in dict.fromkeys(inodes):
            raw = self.get(i, mode)
            if raw is not None:
                out.append(raw)
        return out


def read_key_file(path: str | Path, *, key: str = "capability_key_file") -> Keyring:
    """The keyring in ``path``: the current key's hex on the first line; optionally a second
    line ``<key id> <previous key hex>`` during a rotation (the current key's id is then
    that id + 1).  A missing or unreadable file is a :class:`SettingsError` naming ``key``."""
    p = Path(path)
    try:
        lines = p.read_text().split()
    except OSError as e:
        raise SettingsError(f"capability key file {p} cannot be read ({e.strerror}): set {key} "
                            f"(FF_{key.upper()}) to the key file meta and the storage nodes share; "
                            "ff up writes <state_dir>/capability.key", key=key, expected="a readable key file",
                            path=str(p)) from None
    try:
        current = bytes.fromhex(lines[0])
        if len(lines) >= 3:
            prev_id = int(lines[1])
            return Keyring(current, key_id=prev_id + 1, previous=bytes.fromhex(lines[2]))
        return Keyring(current)
    except (IndexError, ValueError):
        raise SettingsError(f"capability key file {p} is not a hex key (optionally followed by "
                            "'<previous id> <previous key hex>')", key=key, expected="hex key",
                            path=str(p)) from None


def key_path(key_file: str, state_dir: str | Path) -> Path:
    """The key file a service reads: the setting ``capability_key_file``, or
    ``<state_dir>/capability.key`` when it is empty."""
    return Path(key_file) if key_file else Path(state_dir) / KEY_FILE_NAME


def load_keyring(key_file: str, state_dir: str | Path) -> Keyring:
    return read_key_file(key_path(key_file, state_dir))


def write_key_file(path: str | Path) -> bool:
    """Create ``path`` (mode 0600) with a random key unless it exists; True if created.
    The key then lives as long as the file (``ff up`` keeps it with the state dir)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_bytes(KEY_BYTES).hex() + "\n")
    return True
