"""``haiscale.ddp``: re-exports :mod:`fireflyer.haiscale.ddp`."""

from __future__ import annotations

from fireflyer.haiscale.ddp import DistributedDataParallel, Reducer, UnreadyGradients

__all__ = ["DistributedDataParallel", "Reducer", "UnreadyGradients"]
