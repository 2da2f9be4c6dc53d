"""Transformer shapes the planner knows, and user-given ones.

The presets are the shapes of AxoNN's launcher (GPT-style, sequence 2048) with its minimum
tensor-parallel degree: the smallest col x row x depth that holds the model in memory.
"""

from __future__ import annotations

import re

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["ModelShape", "MODELS", "model_named", "GEMMS"]


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    layers: int
    hidden: int
    min_tensor: int = 1

    @property
    def params(self) -> int:
        """Weights of the transformer layers (12 H^2 each; embeddings left out)."""
        return 12 * self.hidden * self.hidden * self.layers


class Gemm(msgspec.Struct, frozen=True):
    """One weight matrix of a layer: H x (wide * H) or (wide * H) x H.

    ``transposed`` GEMMs have the grid roles swapped (AxoNN alternates them so that layers chain
    without re-layout): the row group then carries the wide activations instead of the column group.
    """

    name: str
    wide: int
    transposed: bool


#: the four weight matrices of a transformer layer
GEMMS: tuple[Gemm, ...] = (
    Gemm("qkv", 3, False),
    Gemm("attn-out", 1, True),
    Gemm("mlp-up", 4, False),
    Gemm("mlp-down", 4, True),
)

MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape(name="5b", layers=24, hidden=4096, min_tensor=4),
    ModelShape(name="10b", layers=32, hidden=5120, min_tensor=8),
    ModelShape(name="20b", layers=32, hidden=7168, min_tensor=16),
    ModelShape(name="40b", layers=38, hidden=9216, min_tensor=32),
    ModelShape(name="80b", layers=42, hidden=12288, min_tensor=64),
)}

_SHAPE = re.compile(r"^(\d+)x(\d+)(?:/(\d+))?$")


def model_named(spec: str) -> ModelShape:
    """A preset (``80b``) or a user shape ``LAYERSxHIDDEN[/MIN_TENSOR]`` (``24x4096/4``)."""
    key = spec.strip().lower()
    if key in MODELS:
        return MODELS[key]
    m = _SHAPE.match(key)
    if m:
        layers, hidden, min_tensor = int(m[1]), int(m[2]), int(m[3] or 1)
        if layers < 1 or hidden < 1 or min_tensor < 1:
            raise InvalidArgument(f"model shape {spec!r} needs positive layers, hidden size and minimum tensor degree",
                                  argument="model", value=spec)
        return ModelShape(name=key, layers=layers, hidden=hidden, min_tensor=min_tensor)
    raise InvalidArgument(
        f"unknown model {spec!r} (--model); use a preset ({', '.join(MODELS)}) or LAYERSxHIDDEN[/MIN_TENSOR], e.g. 24x4096/4",
        argument="model", value=spec)
