"""The checkpoint index: what a rank saved and where each tensor lies (msgspec Structs).

One :class:`ShardIndex` per rank and checkpoint: the structure of the saved state
(:class:`Tree`), one entry per leaf (:class:`TensorEntry` for tensors and arrays, whose
bytes live in a shard file; :class:`ValueEntry` for plain Python values, stored inline),
and the shard files with their sizes.  Encoded with msgpack.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = [
    "TensorEntry", "ValueEntry", "Entry", "ShardFile", "ShardIndex",
    "DictNode", "ListNode", "TupleNode", "LeafNode", "Node",
    "encode_index", "decode_index", "FORMAT_VERSION", "index_name",
]

FORMAT_VERSION = 1


class TensorEntry(msgspec.Struct, frozen=True, tag="t"):
    """A tensor (``kind="torch"``) or array (``"numpy"``, ``"numpy_scalar"``) stored in shard ``shard``."""

    path: str
    kind: Literal["torch", "numpy", "numpy_scalar"]
    #: torch: the dtype's name (``"bfloat16"``); numpy: ``dtype.str`` or an ml_dtypes name
    dtype: str
    shape: tuple[int, ...]
    #: index into :attr:`ShardIndex.shards`
    shard: int
    offset: int
    nbytes: int
    crc32c: int


class ValueEntry(msgspec.Struct, frozen=True, tag="v"):
    """A plain Python value (None, bool, int, float, str, bytes), msgpack-encoded."""

    path: str
    value_bytes: bytes


Entry = TensorEntry | ValueEntry


class ShardFile(msgspec.Struct, frozen=True):
    name: str
    size: int


# -- the structure of the state: containers with their key types, leaves by path ----------
class LeafNode(msgspec.Struct, frozen=True, tag="x", array_like=True):
    path: str


class DictNode(msgspec.Struct, frozen=True, tag="d", array_like=True):
    path: str
    items: list[tuple[int | str, Node]]


class ListNode(msgspec.Struct, frozen=True, tag="l", array_like=True):
    path: str
    items: list[Node]


class TupleNode(msgspec.Struct, frozen=True, tag="u", array_like=True):
    path: str
    items: list[Node]


Node = LeafNode | DictNode | ListNode | TupleNode


class ShardIndex(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    tree: Node
    entries: list[Entry]
    shards: list[ShardFile]
    version: int = FORMAT_VERSION

    def tensor_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries if isinstance(e, TensorEntry))


def index_name(rank: int) -> str:
    """The file name of a rank's index inside a checkpoint directory."""
    return f"rank{rank:05d}.index"


_decoder = msgspec.msgpack.Decoder(ShardIndex)


def encode_index(index: ShardIndex) -> bytes:
    return msgspec.msgpack.encode(index)


def decode_index(data: bytes | bytearray | memoryview) -> ShardIndex:
    try:
        index = _decoder.decode(data)
    except msgspec.DecodeError as e:
        raise InvalidArgument(f"not a checkpoint shard index: {e}") from e
    if index.version > FORMAT_VERSION:
        raise InvalidArgument(f"checkpoint index format {index.version} is newer than this client "
                              f"({FORMAT_VERSION}); upgrade fireflyer", version=index.version)
    return index
