"""POSIX shared-memory segments shared by a rank and its node worker (``/dev/shm``).

Lifecycle, chosen so that no segment outlives its users whoever is killed:

1. the rank creates ``/dev/shm/ffhr-<pid>-<nonce>-<n>`` (``O_EXCL``, mode 0600) and maps it;
2. it sends ``Register(seg, name)``; the worker maps it and **unlinks the name** at once,
   then acknowledges;
3. from then on the memory lives exactly as long as the two mappings: a ``kill -9`` of
   either process frees its mapping, and the kernel frees the pages with the last one.

The name exists only between steps 1 and 2.  If the rank dies inside that window,
:func:`sweep_stale` (run by the worker at start and every few seconds) removes names
whose creator pid is gone; a rank that sees the worker die unlinks its own un-acked names.

We use ``os.open`` on ``/dev/shm`` rather than :mod:`multiprocessing.shared_memory`
because the latter registers every segment with a resource tracker process that warns
about, and unlinks, segments it did not expect to lose -- the opposite of what a
hand-over between processes needs.  Linux only, like the rest of the worker.
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

import numpy as np

__all__ = ["SHM_DIR", "PREFIX", "Segment", "sweep_stale", "list_segments", "page_round"]

SHM_DIR = Path("/dev/shm")
PREFIX = "ffhr-"
_PAGE = mmap.PAGESIZE
_nonce = secrets.token_hex(4)
_counter = 0


def page_round(nbytes: int) -> int:
    """At least one page, rounded up to whole pages (mmap cannot map 0 bytes)."""
    return max(_PAGE, -(-nbytes // _PAGE) * _PAGE)


def _new_name() -> str:
    global _counter
    _counter += 1
    return f"{PREFIX}{os.getpid()}-{_nonce}-{_counter}"


class Segment:
    """One mapped shared-memory segment; ``base`` is a uint8 view of all of it."""

    def __init__(self, name: str, mm: mmap.mmap, nbytes: int, *, owner: bool) -> None:
        self.name = name
        self.nbytes = nbytes
        self.owner = owner
        self._mm: mmap.mmap | None = mm
        self.base: np.ndarray | None = np.frombuffer(mm, dtype=np.uint8, count=nbytes)
        self.address = int(self.base.ctypes.data)
        self.unlinked = False
        #: the last view :meth:`array` made, with its (dtype, count, offset): a rank usually
        #: reduces the same buffer op after op, and a fresh view costs a few microseconds
        self._last: tuple[np.dtype, int, int, np.ndarray] | None = None

    @classmethod
    def create(cls, nbytes: int) -> Segment:
        """A new segment of at least ``nbytes`` (whole pages), zero-filled by the kernel."""
        size = page_round(nbytes)
        name = _new_name()
        fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        return cls(name, mm, size, owner=True)

    @classmethod
    def attach(cls, name: str, nbytes: int) -> Segment:
        """Map an existing segment by name (the worker side); checks it is big enough."""
        if "/" in name or not name.startswith(PREFIX):
            raise ValueError(f"not an HFReduce segment name: {name!r}")
        fd = os.open(SHM_DIR / name, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < nbytes or nbytes <= 0:
                raise ValueError(f"segment {name} has {size} bytes, the rank announced {nbytes}")
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, mm, nbytes, owner=False)

    def array(self, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        """A 1-D view of ``count`` elements of ``dtype`` at byte ``offset``."""
        last = self._last
        if last is not None and last[0] is dtype and last[1] == count and last[2] == offset:
            return last[3]
        if self.base is None:
            raise ValueError(f"segment {self.name} is closed")
        dt = np.dtype(dtype)
        end = offset + count * dt.itemsize
        if offset < 0 or end > self.nbytes:
            raise ValueError(f"range [{offset}, {end}) outside segment {self.name} of {self.nbytes} bytes")
        view = self.base[offset:end].view(dt)
        self._last = (dtype, count, offset, view)
        return view

    def contains(self, address: int, nbytes: int) -> bool:
        return self.base is not None and self.address <= address and address + nbytes <= self.address + self.nbytes

    def unlink(self) -> None:
        if not self.unlinked:
            self.unlinked = True
            _unlink(self.name)

    def close(self) -> None:
        """Drop our mapping; views still alive keep it mapped until they die."""
        self.base = None
        self._last = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a user still holds a view: the GC unmaps with the last one

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, {self.nbytes} B)"


def _unlink(name: str) -> None:
    try:
        os.unlink(SHM_DIR / name)
    except FileNotFoundError:
        pass


def list_segments() -> list[str]:
    """Names of HFReduce segments currently in ``/dev/shm`` (tests assert none leak)."""
    try:
        return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX))
    except FileNotFoundError:
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Unlink segments whose creating process is dead; returns their names."""
    removed = []
    for name in list_segments():
        try:
            pid = int(name[len(PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if not _pid_alive(pid):
            _unlink(name)
            removed.append(name)
    return removed
