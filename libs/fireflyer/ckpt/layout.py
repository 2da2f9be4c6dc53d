"""Large chunks for checkpoint directories in 3FS.

Every chunk a storage target writes costs an fsync of its file and directory and two
metadata commits, so a checkpoint written in 4 MiB chunks pays those ~256 times per GiB;
64 MiB chunks (the largest 3FS allows) pay them 16 times.  Large chunks only help when
writes cover whole chunks -- a partial write of a chunk copies the rest of it (copy-on-write
versions) -- which is why shards are written as images of the staging arena in I/Os that
start on chunk boundaries (:func:`fireflyer.ckpt.shard.pack`).

The checkpoint service gives its root directory such a layout policy when it creates it;
new files take the policy of their nearest ancestor that has one, so every checkpoint
directory below the root inherits it.
"""

from __future__ import annotations

from typing import Any

from fireflyer.core.ids import new_id
from fireflyer.core.log import get_logger

__all__ = ["CKPT_CHUNK_BYTES", "effective_policy", "prefer_chunk_size"]

log = get_logger(__name__)

#: the chunk size checkpoint directories get by default (3FS's largest)
CKPT_CHUNK_BYTES = 64 << 20


def effective_policy(fs: Any, directory: str) -> Any:
    """The layout new files in ``directory`` get: a ``LayoutPolicy``-like object with
    ``chain_table_id``, ``chunk_size`` and ``stripe_size``.

    The nearest ancestor's ``dir_policy`` when one has it; otherwise the file system's root
    default, which only meta knows, so a probe file is created (and removed) to read it."""
    path = directory.rstrip("/") or "/"
    while True:
        policy = fs.stat(path).dir_policy
        if policy is not None:
            return policy
        if path == "/":
            break
        path = path.rsplit("/", 1)[0] or "/"
    probe = f"{directory.rstrip('/')}/.layout-probe-{new_id()}"
    fs.write_bytes(probe, b"")
    try:
        return fs.stat(probe).layout
    finally:
        fs.unlink(probe)


def prefer_chunk_size(fs: Any, directory: str, chunk_bytes: int = CKPT_CHUNK_BYTES) -> int:
    """Give ``directory`` a policy with ``chunk_bytes`` chunks (same chain table and stripe)
    when the layout its new files get has smaller ones; returns the chunk size new files in
    it get.  ``chunk_bytes`` 0 leaves the layout alone."""
    current = effective_policy(fs, directory)
    if not chunk_bytes or current.chunk_size >= chunk_bytes:
        return int(current.chunk_size)
    from fireflyer.meta import LayoutPolicy

    fs.set_dir_policy(directory, LayoutPolicy(current.chain_table_id, chunk_bytes, current.stripe_size))
    log.info("ckpt.layout.chunk_size", directory=directory, chunk_bytes=chunk_bytes, was=current.chunk_size)
    return chunk_bytes
