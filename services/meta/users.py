"""Who a caller is in the file system: bearer-token user -> uid, gid, groups.

Tokens name users and roles (``fireflyer.rpc.auth``); POSIX permissions need
numbers.  The meta service maps a caller in this order:

1. the **admin and service roles** are root: uid 0, gid 0, ``admin=True`` (the library's
   permission checks are bypassed, as for root on a local file system); see
   :func:`acts_as_root`, the one place that decides it;
2. an explicit entry in the ``[meta.users]`` setting (``FF_META_USERS`` as JSON,
   e.g. ``{"alice": {"uid": 1000, "gid": 1000, "groups": [100]}}``) wins;
3. otherwise a **deterministic uid from the name**: ``uid = gid = 100000 +
   (first 4 bytes of sha256(user) mod 2**30)``.  Every meta replica (and every
   host) computes the same number with no shared table, so a local cluster works
   with no configuration.  Two names may collide (about a 1-in-2 chance once
   ~38,000 users exist): deployments with many users should list them.

The user's own gid is its private group (the usual Linux convention); extra
groups come only from the explicit table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import msgspec

__all__ = ["UserIds", "ROOT", "uid_for_name", "ids_for", "acts_as_root"]

#: the lowest deterministic uid: well above system and typical local accounts
UID_BASE = 100_000
_UID_SPAN = 1 << 30


class UserIds(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[meta.users]`` entry."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    #: treat this user as root even without the admin role
    admin: bool = False


ROOT = UserIds(uid=0, gid=0, admin=True)


def uid_for_name(user: str) -> int:
    """The deterministic uid of a user name (also its gid)."""
    digest = hashlib.sha256(user.encode()).digest()
    return UID_BASE + int.from_bytes(digest[:4], "big") % _UID_SPAN


def acts_as_root(has_role: Callable[[str], bool]) -> bool:
    """Whether a caller (its ``Principal.has_role``) is root in the file system.

    Operators (``admin``) are, as root is on a host.  So are the cluster's own processes
    (``service``), as the kernel is: the checkpoint service writes ``MANIFEST`` files into
    users' job directories and deletes a job's shard files (after checking the job's owner
    itself), and meta's own cleaners touch every user's chunks.  Users never hold the
    service role (only ``ff up`` / deployment secrets issue it), so this grants a user nothing.
    """
    return has_role("admin") or has_role("service")


def ids_for(user: str, *, admin_role: bool, table: Mapping[str, UserIds]) -> UserIds:
    """The ids of a caller: admin role -> root, then the table, then the name hash."""
    if admin_role:
        return ROOT
    found = table.get(user)
    if found is not None:
        return found
    uid = uid_for_name(user)
    return UserIds(uid=uid, gid=uid)
