"""``ff bench fs-small``: random small-read IOPS, batched vs unbatched (see :mod:`.bench_fs`)."""

from __future__ import annotations

from .bench_fs import main_small as main

__all__ = ["main"]
