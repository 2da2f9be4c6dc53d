"""``haiscale.hooks``: re-exports :mod:`fireflyer.haiscale.hooks`."""

from __future__ import annotations

from fireflyer.haiscale.hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]
