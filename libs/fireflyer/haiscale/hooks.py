"""Communication hooks: how one bucket of gradients is reduced (HaiScale's, over HFReduce).

A hook is ``hook(state, bucket) -> pending``: ``bucket`` is a :class:`GradBucket`
(its flat buffer holds this rank's gradients, not yet averaged), ``pending`` anything
with ``wait()`` returning the averaged flat tensor (an HFReduce ``Work``, a
``torch.futures.Future``, :class:`Then`).  Hooks submit asynchronously: the wrapper
waits only at the end of backward, so the reduction runs while backward goes on.

- :func:`allreduce_hook` (the default): one ``avg`` allreduce of the buffer, in place,
  zero copy (the buffer lives in memory the HFReduce worker has mapped);
- :func:`fp16_compress_hook`, :func:`bf16_compress_hook`: the buffer cast to 16 bits
  into a shared scratch buffer, averaged there (HFReduce accumulates 16-bit floats in
  float32), cast back: half the bytes on the wire, 16-bit rounding of the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["GradBucket", "Pending", "Then", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


class Pending(Protocol):
    def wait(self) -> Any: ...


class GradBucket(Protocol):
    """What a hook sees of a bucket (torch's ``GradBucket`` names, where they exist)."""

    comm: Any

    def index(self) -> int: ...

    def buffer(self) -> Any: ...

    def parameters(self) -> list[Any]: ...

    def is_last(self) -> bool: ...

    def scratch(self, dtype: Any) -> Any: ...


class Then:
    """``pending`` followed by ``fn(result)``: what ``wait()`` returns is ``fn``'s result."""

    def __init__(self, pending: Pending, fn: Callable[[Any], Any]) -> None:
        self.pending, self.fn = pending, fn

    def wait(self) -> Any:
        return self.fn(self.pending.wait())


def allreduce_hook(state: Any, bucket: GradBucket) -> Pending:
    """Average the bucket over all ranks in place (one asynchronous HFReduce allreduce)."""
    return bucket.comm.allreduce(bucket.buffer(), op="avg", async_op=True)


def _compressed(state: Any, bucket: GradBucket, dtype_name: str) -> Pending:
    import torch

    buf = bucket.buffer()
    low = bucket.scratch(getattr(torch, dtype_name))
    low.copy_(buf)
    work = bucket.comm.allreduce(low, op="avg", async_op=True)
    return Then(work, lambda _: buf.copy_(low))


def fp16_compress_hook(state: Any, bucket: GradBucket) -> Pending:
    """The bucket travels as float16 (inf beyond 65504: scale the loss if gradients can be that large)."""
    return _compressed(state, bucket, "float16")


def bf16_compress_hook(state: Any, bucket: GradBucket) -> Pending:
    """The bucket travels as bfloat16 (float32's range, 8 bits of mantissa)."""
    return _compressed(state, bucket, "bfloat16")
