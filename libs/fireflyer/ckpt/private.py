"""Checkpoint files are private to the job's owner.

A rank writes its shards and index with its user's token, so in 3FS meta makes the rank's
user the owner of every directory and file it creates; the modes come from here: the job's
directory and each checkpoint directory 0700, every file 0600.  Another user can then
neither list nor open them (the checkpoint service, an admin, still reads the index files
and writes ``MANIFEST``).  Groups: a job shared with a group is not modelled yet, so there
is no 0750/0640 variant.

The file systems the checkpoint code is handed are duck-typed (the 3FS client,
:class:`~fireflyer.ckpt.localfs.LocalFS`, test fakes); a ``write_bytes`` without a ``mode``
keyword gets the file system's default mode.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["DIR_MODE", "FILE_MODE", "make_private_dir", "write_private"]

#: the mode of a job's directory and of each checkpoint directory
DIR_MODE = 0o700
#: the mode of every shard, index and DCP file a rank creates
FILE_MODE = 0o600


def make_private_dir(fs: Any, path: str) -> None:
    """``mkdir -p path`` with :data:`DIR_MODE` for every directory it makes."""
    fs.mkdir(path, DIR_MODE, parents=True, exist_ok=True)


def _takes_mode(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "mode" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def write_private(fs: Any, path: str, data: Any) -> int:
    """``fs.write_bytes(path, data)``, creating the file with :data:`FILE_MODE` where ``fs`` can."""
    write = fs.write_bytes
    if _takes_mode(write):
        return int(write(path, data, mode=FILE_MODE))
    return int(write(path, data) or 0)
