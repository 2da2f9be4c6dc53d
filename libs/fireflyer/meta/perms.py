"""POSIX permission rules, as pure functions of (caller, inode).

- ``admin`` callers and uid 0 bypass every check (they are the cluster's root).
- Otherwise the owner class (uid match), else the group class (gid or a
  supplementary group matches), else other; only that one class's bits count.
- Walking a path needs search (x) on every directory walked; creating, removing or
  renaming an entry needs write and search on its parent directory.
- Sticky bit (0o1000) on a directory, implemented: an entry in it may be removed or
  renamed away (or replaced by a rename) only by the entry's owner, the directory's
  owner or a super caller, else EPERM (``/tmp`` semantics).
- chmod, set_dir_policy and setting explicit times: owner or super (EPERM);
  chown/chgrp: super only (EPERM).
"""

from __future__ import annotations

import os

from .model import Caller, Inode

__all__ = ["R", "W", "X", "allowed", "owns", "sticky_allows", "access_for_flags"]

R, W, X = 4, 2, 1


def allowed(who: Caller, inode: Inode, want: int) -> bool:
    """True if ``who`` has every bit of ``want`` (R|W|X) on ``inode``."""
    if who.is_super:
        return True
    if who.uid == inode.uid:
        bits = (inode.mode >> 6) & 7
    elif who.gid == inode.gid or inode.gid in who.groups:
        bits = (inode.mode >> 3) & 7
    else:
        bits = inode.mode & 7
    return bits & want == want


def owns(who: Caller, inode: Inode) -> bool:
    return who.is_super or who.uid == inode.uid


def sticky_allows(who: Caller, directory: Inode, entry: Inode) -> bool:
    if not directory.mode & 0o1000:
        return True
    return who.is_super or who.uid == entry.uid or who.uid == directory.uid


def access_for_flags(flags: int) -> int:
    """The R/W bits an ``open(flags)`` needs (O_TRUNC needs W as well)."""
    acc = flags & os.O_ACCMODE
    want = {os.O_RDONLY: R, os.O_WRONLY: W, os.O_RDWR: R | W}.get(acc, R | W)
    if flags & os.O_TRUNC:
        want |= W
    return want
