"""``ff bench incast``: batch-read fan-in with and without request-to-send (see :mod:`.fs`)."""

from __future__ import annotations

from .fs import main_incast as main

__all__ = ["main"]
