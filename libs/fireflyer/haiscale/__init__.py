"""HaiScale: data-parallel training over HFReduce (the Fire-Flyer paper's §V-A).

- :mod:`.ddp` -- ``DistributedDataParallel``: torch DDP's interface, gradients averaged
  through HFReduce in buckets that are reduced while backward goes on;
- :mod:`.hooks` -- communication hooks (the default allreduce, fp16 / bf16 compression);
- :mod:`.buckets` -- the bucket plan (pure);
- :mod:`.backend` -- HFReduce as a ``torch.distributed`` backend: importing this package
  registers it, so ``dist.init_process_group("hfreduce")`` works.

See docs/haiscale.md.
"""

from __future__ import annotations

from typing import Any

from . import backend as _backend

_backend.register()

__all__ = ["ddp", "hooks", "buckets", "backend"]


def __getattr__(name: str) -> Any:
    if name in ("ddp", "hooks", "buckets", "backend"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'fireflyer.haiscale' has no attribute {name!r}")
