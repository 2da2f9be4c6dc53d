"""Flatten a nested training state into (path, leaf) entries and rebuild it exactly.

A state is dicts (``str``/``int`` keys), lists and tuples of leaves: torch tensors (any
dtype, incl. bfloat16 and float8), numpy arrays and scalars (incl. ml_dtypes bfloat16 /
float8) and plain values (None, bool, int, float, str, bytes).  :func:`flatten` returns the
structure (:class:`~fireflyer.ckpt.index.Node`) and the leaves; :func:`unflatten` rebuilds it,
key types, tuples and lists included.

Paths join components with ``/``: a str key percent-escapes ``%`` and ``/``; an int key or
a list/tuple index is its decimal (``optim/state/0/exp_avg``).  Anything else (a set, a
module, an object tensor) is refused with :class:`InvalidArgument` naming its path, before
anything is written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from fireflyer.core.errors import InvalidArgument

from .index import DictNode, Entry, LeafNode, ListNode, Node, TupleNode


def _loaded_torch() -> Any:
    """torch if this process imported it, else None: a state can only hold torch tensors when
    torch is loaded, so services that never see tensors (the checkpoint catalog) skip its
    multi-second import, and numpy-only states work without torch installed."""
    return sys.modules.get("torch")


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise InvalidArgument(f"this checkpoint holds torch tensors and torch is not installed: {e}") from None
    return torch

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None  # type: ignore[assignment]

__all__ = [
    "TensorLeaf", "ValueLeaf", "Leaf", "FlatState", "flatten", "unflatten", "select",
    "join_path", "escape_key", "numpy_dtype", "numpy_dtype_name", "torch_dtype", "decode_value",
    "check_tensor", "ArrayHook",
]

_PLAIN = (type(None), bool, int, float, str, bytes)
_NUMPY_KINDS = "biufcSUmM"


class TensorLeaf(msgspec.Struct, frozen=True):
    """A tensor or array as C-contiguous bytes (``data``); ``kind``/``dtype``/``shape`` as in the index."""

    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


class ValueLeaf(msgspec.Struct, frozen=True):
    path: str
    value_bytes: bytes


Leaf = TensorLeaf | ValueLeaf


class FlatState(msgspec.Struct, frozen=True):
    tree: Node
    leaves: list[Leaf]

    def buffers(self) -> dict[str, memoryview]:
        return {leaf.path: leaf.data for leaf in self.leaves if isinstance(leaf, TensorLeaf)}


def escape_key(key: str) -> str:
    return key.replace("%", "%25").replace("/", "%2F")


def join_path(parent: str, key: int | str) -> str:
    part = str(key) if isinstance(key, int) else escape_key(key)
    return f"{parent}/{part}" if parent else part


def _as_path(key: str | Sequence[int | str]) -> str:
    if isinstance(key, str):
        return key
    path = ""
    for k in key:
        path = join_path(path, k)
    return path


# -- dtypes ----------------------------------------------------------------------------
def numpy_dtype_name(dtype: np.dtype, path: str) -> str:
    # ml_dtypes first: some of its types (float8_e5m2) report kind "f", and their ``dtype.str``
    # (``<f1``) does not name them
    if ml_dtypes is not None and isinstance(getattr(ml_dtypes, dtype.name, None), type):
        if np.dtype(getattr(ml_dtypes, dtype.name)) == dtype:
            return dtype.name
    if dtype.kind in _NUMPY_KINDS and dtype.fields is None:
        return dtype.str
    raise InvalidArgument(f"{path or '<root>'}: numpy dtype {dtype} cannot be checkpointed "
                          "(object and structured arrays are not supported)", path=path, dtype=str(dtype))


def numpy_dtype(name: str) -> np.dtype:
    if ml_dtypes is not None and name[:1] not in "<>|=" and hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def torch_dtype(name: str) -> Any:
    torch = _import_torch()
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise InvalidArgument(f"torch has no dtype {name!r} (saved by a newer torch?)", dtype=name)
    return dt


# -- flatten ---------------------------------------------------------------------------
def check_tensor(path: str, t: Any) -> str:
    """Refuse what cannot be stored as plain bytes; returns the dtype's name (``"bfloat16"``)."""
    if t.layout != _loaded_torch().strided or t.is_quantized:  # sparse tensors have a non-strided layout
        raise InvalidArgument(f"{path or '<root>'}: only dense (strided) tensors can be checkpointed, "
                              f"got layout {t.layout}", path=path)
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:  # cached: this runs once per tensor of every snapshot
        name = _DTYPE_NAMES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


_DTYPE_NAMES: dict[Any, str] = {}


def _tensor_leaf(path: str, t: Any) -> TensorLeaf:
    name = check_tensor(path, t)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    shape = tuple(t.shape)
    flat = t.contiguous().reshape(-1)
    data = memoryview(flat.view(_loaded_torch().uint8).numpy()) if flat.numel() else memoryview(b"")
    return TensorLeaf(path, "torch", name, shape, data)


def _array_leaf(path: str, a: np.ndarray, kind: str) -> TensorLeaf:
    name = numpy_dtype_name(a.dtype, path)
    c = np.ascontiguousarray(a)
    return TensorLeaf(path, kind, name, tuple(a.shape), memoryview(c.reshape(-1).view(np.uint8)))


#: ``on_array(path, kind, obj)``: the leaf for a tensor (``kind="torch"``), an array (``"numpy"``)
#: or a numpy scalar (``"numpy_scalar"``, passed as a 0-d array)
ArrayHook = Callable[[str, str, Any], Leaf]


def flatten(state: Any, *, on_array: ArrayHook | None = None) -> FlatState:
    """Split ``state`` into its structure and leaves; raises :class:`InvalidArgument` naming
    the path of the first thing it cannot checkpoint.

    By default a tensor's leaf is a view of its (CPU, contiguous) bytes.  ``on_array``
    replaces that step, so the snapshot (:mod:`.snapshot`) reuses this walk and its checks
    while copying the bytes into its own staging buffers."""
    leaves: list[Leaf] = []
    seen: set[str] = set()
    active: set[int] = set()
    torch = _loaded_torch()

    def claim(path: str) -> None:
        if path in seen:
            raise InvalidArgument(f"{path or '<root>'}: two entries map to the same checkpoint path "
                                  "(an int key and a str key with the same digits?)", path=path)
        seen.add(path)

    def walk(path: str, obj: Any) -> Node:
        if isinstance(obj, Mapping | list | tuple):
            if id(obj) in active:
                raise InvalidArgument(f"{path or '<root>'}: the state contains a reference cycle", path=path)
            active.add(id(obj))
            try:
                return walk_container(path, obj)
            finally:
                active.discard(id(obj))
        claim(path)
        if torch is not None and isinstance(obj, torch.Tensor):
            leaves.append(_tensor_leaf(path, obj) if on_array is None else on_array(path, "torch", obj))
        elif isinstance(obj, np.ndarray | np.generic):
            kind = "numpy" if isinstance(obj, np.ndarray) else "numpy_scalar"
            arr = np.asarray(obj)
            leaves.append(_array_leaf(path, arr, kind) if on_array is None else on_array(path, kind, arr))
        elif type(obj) in _PLAIN:
            try:
                leaves.append(ValueLeaf(path, msgspec.msgpack.encode(obj)))
            except (OverflowError, msgspec.EncodeError) as e:
                raise InvalidArgument(f"{path or '<root>'}: cannot encode {obj!r}: {e}", path=path) from e
        else:
            raise InvalidArgument(
                f"{path or '<root>'}: cannot checkpoint a {type(obj).__module__}.{type(obj).__qualname__}; "
                "convert it to tensors, arrays, dicts, lists or plain values (None, bool, int, float, str, "
                "bytes)", path=path, type=type(obj).__qualname__)
        return LeafNode(path)

    def walk_container(path: str, obj: Any) -> Node:
        if isinstance(obj, Mapping):
            if type(obj) is not dict and not isinstance(obj, dict):
                raise InvalidArgument(f"{path or '<root>'}: only dict mappings are supported, got "
                                      f"{type(obj).__qualname__}", path=path)
            items: list[tuple[int | str, Node]] = []
            for k, v in obj.items():
                if type(k) is not str and type(k) is not int:
                    raise InvalidArgument(f"{path or '<root>'}: dict key {k!r} is a {type(k).__qualname__}; "
                                          "only str and int keys can be checkpointed", path=path)
                items.append((k, walk(join_path(path, k), v)))
            return DictNode(path, items)
        nodes = [walk(join_path(path, i), v) for i, v in enumerate(obj)]
        return TupleNode(path, nodes) if isinstance(obj, tuple) else ListNode(path, nodes)

    tree = walk("", state)
    return FlatState(tree, leaves)


# -- rebuild and select ------------------------------------------------------------------
def _matches(path: str, prefixes: Sequence[str]) -> bool:
    return any(p == "" or path == p or path.startswith(p + "/") for p in prefixes)


def _under(path: str, prefixes: Sequence[str]) -> bool:
    """Whether some selected prefix lies at or below ``path`` (the container must be kept)."""
    return any(path == "" or p == path or p.startswith(path + "/") for p in prefixes)


def select(entries: Iterable[Entry | Leaf], keys: Iterable[str | Sequence[int | str]]) -> list[Any]:
    """The entries whose path is one of ``keys`` or lies under one (a key is a path string
    ``"optim/state/0"`` or a sequence of components ``("optim", "state", 0)``)."""
    prefixes = [_as_path(k) for k in keys]
    return [e for e in entries if _matches(e.path, prefixes)]


def unflatten(tree: Node, leaves: Mapping[str, Any], keys: Iterable[str | Sequence[int | str]] | None = None) -> Any:
    """Rebuild the state from ``tree`` and the leaf values by path.

    With ``keys`` (a partial load), dict items with nothing selected are left out, while a
    list or tuple keeps its length with ``None`` in the places not selected."""
    prefixes = None if keys is None else [_as_path(k) for k in keys]
    missing = object()

    def build(node: Node) -> Any:
        if prefixes is not None and not (_matches(node.path, prefixes) or _under(node.path, prefixes)):
            return missing
        if isinstance(node, LeafNode):
            return leaves[node.path]
        if isinstance(node, DictNode):
            out = {}
            for k, child in node.items:
                v = build(child)
                if v is not missing:
                    out[k] = v
            return out
        items = [build(child) for child in node.items]
        items = [None if v is missing else v for v in items]
        return tuple(items) if isinstance(node, TupleNode) else items

    out = build(tree)
    return None if out is missing else out


def decode_value(value_bytes: bytes) -> Any:
    return msgspec.msgpack.decode(value_bytes)
