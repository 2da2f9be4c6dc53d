"""The CUDA path of the client: device buffers go D2H into shared staging and back H2D.

HFReduce reduces on the CPU (the paper's design: GPUs hand gradients to host memory over
PCIe and the node's CPUs reduce), so a CUDA tensor is copied into the rank's staging
segment, reduced by the worker like any host buffer, and copied back.  Copies run on a
numba-cuda stream of this rank; the staging segment is page-locked once (``mempin``) so
the copies are true DMA and can be asynchronous.

Anything with ``__cuda_array_interface__`` works (torch CUDA tensors, CuPy, numba device
arrays), as do numba simulator device arrays.  ``numba.cuda`` is imported only when the
first CUDA buffer appears, so CPU-only processes never pay for it.  Under
``NUMBA_ENABLE_CUDASIM=1`` (CI) the same code runs against numba's simulator: streams are
synchronous there and nothing is pinned, so it checks plumbing and bits, not overlap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fireflyer.core.errors import InvalidArgument

from .torch_dtypes import torch_to_numpy_dtype

__all__ = ["is_cuda_array", "CudaStaging"]


def is_cuda_array(x: Any) -> bool:
    """True for device buffers: ``__cuda_array_interface__`` or a numba (simulator) device array."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    return type(x).__name__ == "FakeCUDAArray" and hasattr(x, "copy_to_host")


def _torch_cuda_view(x: Any) -> tuple[Any, np.dtype | None]:
    """A torch CUDA tensor as something numba can wrap, and its logical numpy dtype."""
    import torch

    logical = torch_to_numpy_dtype(x.dtype)
    t = x.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    elif t.dtype.itemsize == 1 and t.dtype.is_floating_point:
        t = t.view(torch.uint8)
    return t, logical


class CudaStaging:
    """Copies between one rank's device buffers and its host staging views, on one stream."""

    def __init__(self) -> None:
        from numba import cuda
        from numba.core import config

        self.cuda = cuda
        self.simulated = bool(config.ENABLE_CUDASIM)
        self.stream = cuda.stream()
        self._pins: dict[int, Any] = {}

    def device_array(self, x: Any) -> tuple[Any, np.dtype]:
        """(numba device array over x's memory, logical dtype of x's elements)."""
        logical: np.dtype | None = None
        if type(x).__module__.startswith("torch"):
            x, logical = _torch_cuda_view(x)
        dev = x if hasattr(x, "copy_to_host") else self.cuda.as_cuda_array(x)
        if not dev.is_c_contiguous():
            raise InvalidArgument("HFReduce needs a contiguous CUDA buffer; call .contiguous() first")
        return dev, np.dtype(logical if logical is not None else dev.dtype)

    def pin(self, base: np.ndarray) -> None:
        """Page-lock a staging segment once for the life of its mapping (real CUDA only)."""
        if self.simulated:
            return
        addr = int(base.ctypes.data)
        if addr not in self._pins:
            ctx = self.cuda.current_context()
            self._pins[addr] = ctx.mempin(base, addr, base.nbytes, mapped=False)

    def unpin(self, base: np.ndarray) -> None:
        self._pins.pop(int(base.ctypes.data), None)

    def to_host(self, dev: Any, host: np.ndarray) -> None:
        """D2H into ``host`` (a flat staging view of dev.nbytes bytes), then wait for it."""
        if dev.size == 0:
            return
        target = host.view(np.uint8)[: dev.nbytes].view(dev.dtype).reshape(dev.shape)
        dev.copy_to_host(target, stream=self.stream)
        self.stream.synchronize()

    def to_device(self, host: np.ndarray, dev: Any) -> None:
        """H2D from ``host`` back into the device buffer, then wait for it."""
        if dev.size == 0:
            return
        source = host.view(np.uint8)[: dev.nbytes].view(dev.dtype).reshape(dev.shape)
        dev.copy_to_device(source, stream=self.stream)
        self.stream.synchronize()
