"""Users' homes: ``/home/<user>``, mode 0700, owned by the user (pure decisions).

Every caller with the ``user`` role (an admin has it too) has a home ``/home/<user>``;
``service`` principals have none.  The meta service creates a home the first time its
user asks ``WhoAmI`` (``ff up`` asks once per user of the tokens file; clients ask
when they first resolve a relative path), so users added later get one on first use.
``/home`` itself is made by the first such call: mode 0755, owned by root.  An existing
``/home`` or home is never changed (an admin may have chmod'ed or chown'ed it).

Nothing here reads the KV or the network: the store (``MetaStore.ensure_home``) asks
:func:`plan_home` what to create given what exists; :func:`denied_message` writes the
text of a permission error, saying what the caller may do instead.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

import msgspec

from .model import FsInvalidArgument

__all__ = [
    "HOME_ROOT",
    "HOME_ROOT_MODE",
    "HOME_MODE",
    "HomeStep",
    "valid_home_name",
    "home_path",
    "gets_home",
    "plan_home",
    "permission_hint",
    "denied_message",
]

HOME_ROOT = "/home"
HOME_ROOT_MODE = 0o755
HOME_MODE = 0o700
_MAX_NAME = 255


class HomeStep(msgspec.Struct, frozen=True):
    """One directory to make: ``path`` (its parent exists by then), ``mode``, owner."""

    path: str
    mode: int
    uid: int
    gid: int


def valid_home_name(user: object) -> bool:
    """A user name that can be a directory name: non-empty, no '/', no NUL, not '.' or '..'."""
    return (isinstance(user, str) and bool(user) and "/" not in user and "\0" not in user
            and user not in (".", "..") and len(user.encode("utf-8", "replace")) <= _MAX_NAME)


def home_path(user: str) -> str:
    """``/home/<user>``; ``FsInvalidArgument`` when the name cannot be a directory name."""
    if not valid_home_name(user):
        raise FsInvalidArgument(f"user name {user!r} cannot name a home directory", user=str(user)[:64])
    return f"{HOME_ROOT}/{user}"


def gets_home(roles: Iterable[str]) -> bool:
    """Whether a principal with these (implied) roles has a home: the ``user`` role does, except
    a service (its role implies user, but it is the cluster's own process, not a person)."""
    have = set(roles)
    return "user" in have and "service" not in have


def plan_home(user: str, uid: int, gid: int, *, root_exists: bool, home_exists: bool) -> list[HomeStep]:
    """What to create so that ``user`` has a home: ``/home`` (root's, 0755) if missing, then
    ``/home/<user>`` (the user's, 0700) if missing; nothing when both exist."""
    home = home_path(user)
    steps: list[HomeStep] = []
    if not root_exists:
        steps.append(HomeStep(HOME_ROOT, HOME_ROOT_MODE, 0, 0))
    if not home_exists:
        steps.append(HomeStep(home, HOME_MODE, uid, gid))
    return steps


def permission_hint(user: str, *, write: bool) -> str:
    """What a caller refused access may do instead."""
    home = home_path(user) if valid_home_name(user) else ""
    if write and home:
        return f"you may write under your home {home}, or ask an admin (ff fs chown)"
    if home:
        return (f"ask the owner to allow it (ff fs chmod) or an admin (ff fs chown); "
                f"your own files belong under your home {home}")
    return "ask the owner to allow it (ff fs chmod) or an admin (ff fs chown)"


def denied_message(what: str, path: str, user: str, *, write: bool) -> str:
    """The message of an EACCES: ``permission denied (<what>) for <path>: <hint>``.

    ``what`` ``"write on parent"`` names the (lexical) parent directory, so the message
    reads ``permission denied (write on parent /) for /data: you may write under ...``."""
    if what == "write on parent" and path.startswith("/"):
        what = f"write on parent {posixpath.dirname(posixpath.normpath(path)) or '/'}"
    return f"permission denied ({what}) for {path}: {permission_hint(user, write=write)}"
