"""``ff bench fs-small``: random small-read IOPS, batched vs unbatched (see :mod:`.fs`)."""

from __future__ import annotations

from .fs import main_small as main

__all__ = ["main"]
