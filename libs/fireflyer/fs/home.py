"""Relative paths: resolved against the caller's home, as HDFS resolves against ``/user/<name>``.

``ff fs``, :class:`~fireflyer.fs.client.FileSystem` and the fsspec ``ff3fs`` filesystem all
send absolute paths to meta; a path without a leading ``/`` means "under my home"
(``/home/<user>``, which meta's ``WhoAmI`` reports and creates on first use).  The one
rule lives here::

    resolve_path("data/x.bin", "/home/alice")   # "/home/alice/data/x.bin"
    resolve_path("", "/home/alice")             # "/home/alice"  ("." too)
    resolve_path("/ckpt/a", "/home/alice")      # "/ckpt/a" (absolute: unchanged)

``..`` is left for meta to resolve (physically, through the parent pointer), so
``../bob`` from ``/home/alice`` is ``/home/bob``.
"""

from __future__ import annotations

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["Identity", "resolve_path", "is_relative"]


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """Who the client's token is (meta's ``WhoAmI``)."""

    user: str
    roles: tuple[str, ...] = ()
    #: "/home/<user>"; "" for a principal without a home (a service)
    home: str = ""
    uid: int = 0
    gid: int = 0
    #: the WhoAmI call that returned this made the home
    home_created: bool = False


def is_relative(path: str) -> bool:
    return not path.startswith("/")


def resolve_path(path: str, home: str | None) -> str:
    """``path`` if absolute, else ``path`` under ``home`` (see the module doc).

    A relative path with no home (``home`` empty or None) is ``InvalidArgument``."""
    if not isinstance(path, str):
        raise InvalidArgument(f"path must be a str, got {type(path).__name__}")
    if path.startswith("/"):
        return path
    if not home:
        raise InvalidArgument(f"relative path {path!r} needs a home directory, and this caller has none: "
                              "give an absolute path", path=path)
    rel = path[2:] if path.startswith("./") else path
    if rel in ("", "."):
        return home.rstrip("/") or "/"
    return f"{home.rstrip('/')}/{rel}"
