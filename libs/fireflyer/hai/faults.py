"""Fault injection a training script opts into, for drills and demos of the health service.

``--slow-file PATH`` in ``docs/examples/train_ddp.py`` and ``hai_resumable.py``: while ``PATH``
exists and names this node (``FF_NODE_NAME``) on its first line, every step here takes the seconds
on its second line (default 1.0) longer -- a throttled GPU or a noisy neighbour, as the C4 detector
sees one: the node arrives late at the collective after each step.  Read once a step; a missing or
unreadable file is no fault.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["injected_delay"]


def injected_delay(path: str | None, environ: Mapping[str, str] | None = None) -> float:
    """The extra seconds per step ``path`` asks of this node (0 when it names another, or is absent)."""
    if not path:
        return 0.0
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
    except OSError:
        return 0.0
    env = os.environ if environ is None else environ
    if not words or words[0] != env.get("FF_NODE_NAME", ""):
        return 0.0
    try:
        return max(0.0, float(words[1])) if len(words) > 1 else 1.0
    except ValueError:
        return 1.0
