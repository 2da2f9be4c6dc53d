"""numba's on-disk cache (``cache=True``), kept true to every source a module compiles in.

numba checks a cached function against its *own* source file only (its modification time
and size).  A function that calls, and so compiles into its machine code, a jitted function
or intrinsic of another module keeps the old machine code after that other module changes:
edit a kernel in :mod:`.kernels` or the root pass in :mod:`._rootpass`, and the block loops of
:mod:`._blocks` go on running what was cached before, tests included, until their own file
changes too (seen: a deliberate error in ``_rootpass._tail`` left every block-loop test green).

So each jitted module of HFReduce names the sources it compiles in (``JIT_SOURCES``: its own
file and those of the jitted modules it calls, transitively) and calls :func:`drop_stale` once
it is defined: when their digest differs from the one recorded beside its cache, the module's
cached machine code is removed, and numba compiles it again on first use (``make setup``'s
precompile does that once for a fresh tree).  Reading the sources costs well under a
millisecond per import.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["STAMP_SUFFIX", "sources_digest", "cache_dir", "drop_stale"]

#: the file beside a module's cache that records the digest its cache was made with
STAMP_SUFFIX = ".sources"


def sources_digest(paths: Iterable[str | os.PathLike[str]]) -> str:
    """SHA-256 over the names and contents of ``paths`` (their order does not matter)."""
    h = hashlib.sha256()
    for p in sorted({Path(x).resolve() for x in paths}):
        h.update(p.name.encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def cache_dir(dispatcher: object, module_file: str | os.PathLike[str]) -> Path:
    """Where numba caches ``dispatcher`` (a ``cache=True`` function): the directory its cache
    locator chose (``__pycache__`` beside the source, or under ``NUMBA_CACHE_DIR``); the
    in-tree ``__pycache__`` where this numba does not say."""
    path = getattr(getattr(dispatcher, "_cache", None), "cache_path", None)
    return Path(path) if path else Path(module_file).parent / "__pycache__"


def drop_stale(module_file: str | os.PathLike[str], dispatcher: object,
               sources: Iterable[str | os.PathLike[str]]) -> bool:
    """Remove the cached machine code of ``module_file``'s functions (numba's
    ``<stem>.<function>-<line>.<python>.nbi`` / ``.nbc`` files, in the cache directory of
    ``dispatcher``, one of them) unless ``sources`` are those it was recorded with; record
    them.  True if the cache was dropped.

    Processes that import the module at once agree once the digest is recorded; between an
    edit and the first import after it, two of them may both drop and both compile, which
    costs time, never a stale result.  A cache directory that cannot be written is left as it
    is (numba cannot cache there either)."""
    stem = Path(module_file).stem
    cache = cache_dir(dispatcher, module_file)
    stamp = cache / f"{stem}{STAMP_SUFFIX}"
    digest = sources_digest(sources)
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:
        pass  # never recorded: what is cached (if anything) is of unknown sources
    try:
        for f in [*cache.glob(f"{stem}.*.nbi"), *cache.glob(f"{stem}.*.nbc")]:
            f.unlink(missing_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{stem}{STAMP_SUFFIX}.{os.getpid()}"
        tmp.write_text(digest)
        os.replace(tmp, stamp)
    except OSError:
        pass
    return True
