"""Torch tensors as numpy: the dtype table and the zero-copy CPU view.

Shared by the rank's client (CPU tensors) and the CUDA staging (device tensors), below
both.  ``torch`` is imported only when a function is called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fireflyer.core.errors import InvalidArgument

from . import kernels

__all__ = ["torch_to_numpy_dtype", "torch_cpu_view"]


def torch_to_numpy_dtype(tdtype: Any) -> np.dtype:
    """The numpy dtype HFReduce reduces a torch dtype as (InvalidArgument if it does not)."""
    import torch

    table = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: "bfloat16",
             torch.int32: np.int32, torch.int64: np.int64, torch.float8_e4m3fn: "float8_e4m3fn",
             torch.float8_e5m2: "float8_e5m2"}
    if tdtype not in table:
        raise InvalidArgument(f"HFReduce does not reduce torch dtype {tdtype}")
    return kernels.dtype_from_name(table[tdtype])


def torch_cpu_view(t: Any) -> np.ndarray:
    """A numpy view sharing a CPU tensor's memory (bf16 / fp8 through an integer view)."""
    import torch

    dt = torch_to_numpy_dtype(t.dtype)
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dt)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(dt)
    return t.numpy()
