"""Settings: frozen msgspec Structs loaded by one loader with one precedence.

    defaults  <  TOML file  <  FF_* environment  <  command line

A settings class is a frozen ``msgspec.Struct``; nested Structs are sections.
A field's environment name is ``FF_`` plus its path in upper case joined by
``_``: field ``port`` of section ``rpc`` is ``FF_RPC_PORT``, top-level
``state_dir`` is ``FF_STATE_DIR``.  On the command line the same field is
``--set rpc.port=7000`` (see :func:`add_settings_args`).

A bad value stops start-up with a :class:`SettingsError` that names the key,
the expected type and where the value came from::

    setting 'rpc.port' (from environment FF_RPC_PORT): expected int, got 'abc'

Nothing is read at import time; callers pass ``env`` explicitly in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from .errors import SettingsError

__all__ = ["load_settings", "add_settings_args", "overrides_from_args", "env_name", "settings_keys"]

T = TypeVar("T", bound=msgspec.Struct)

_MISSING = object()


def env_name(path: Sequence[str], prefix: str = "FF") -> str:
    return "_".join([prefix, *(p.upper() for p in path)])


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _leaves(cls: type[msgspec.Struct], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Yield (path, type) for every non-section field, depth first."""
    hints = typing.get_type_hints(cls)
    for f in msgspec.structs.fields(cls):
        tp = hints.get(f.name, f.type)
        if _is_struct(tp):
            yield from _leaves(tp, (*path, f.name))
        else:
            yield (*path, f.name), tp


def settings_keys(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """Dotted key -> type for every settable leaf (for docs and ``--help``)."""
    return {".".join(p): tp for p, tp in _leaves(cls)}


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "none"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    name = getattr(origin, "__name__", str(origin))
    return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name


def _accepts_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _container(tp: Any) -> bool:
    base = tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        base = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    return typing.get_origin(base) in (list, tuple, set, frozenset, dict) or base in (list, tuple, dict)


def _from_text(text: str, tp: Any) -> Any:
    """Turn an environment/CLI string into something msgspec can convert to tp."""
    stripped = text.strip()
    if _accepts_none(tp) and stripped.lower() in ("", "none", "null"):
        return None
    if _container(tp):
        if stripped.startswith(("[", "{")):
            return json.loads(stripped)
        return [s.strip() for s in stripped.split(",") if s.strip()]
    return text


def _convert_leaf(value: Any, tp: Any, key: str, source: str, *, from_text: bool) -> Any:
    try:
        raw = _from_text(value, tp) if from_text and isinstance(value, str) else value
        return msgspec.convert(raw, tp, strict=not from_text, dec_hook=_dec_hook)
    except (msgspec.ValidationError, json.JSONDecodeError, ValueError, TypeError) as e:
        raise SettingsError(
            f"setting {key!r} ({source}): expected {_type_name(tp)}, got {value!r}",
            key=key,
            expected=_type_name(tp),
            source=source,
            value=repr(value),
        ) from e


def _dec_hook(tp: Any, obj: Any) -> Any:
    if tp is Path and isinstance(obj, str):
        return Path(obj)
    raise NotImplementedError


def _set_path(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = tree
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value


def _flatten_file(doc: Mapping[str, Any], leaves: dict[tuple[str, ...], Any], source: str) -> dict[tuple[str, ...], Any]:
    sections = {p[:i] for p in leaves for i in range(1, len(p))}
    out: dict[tuple[str, ...], Any] = {}

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for k, v in node.items():
            p = (*path, k)
            if p in leaves:
                out[p] = v
            elif p in sections and isinstance(v, Mapping):
                walk(v, p)
            else:
                raise SettingsError(
                    f"unknown setting {'.'.join(p)!r} in {source}; known: {', '.join('.'.join(x) for x in leaves)}",
                    key=".".join(p),
                    source=source,
                )

    walk(doc, ())
    return out


def load_settings(
    cls: type[T],
    *,
    file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    prefix: str = "FF",
    section: str | None = None,
) -> T:
    """Build ``cls`` from defaults, a TOML ``file``, ``env`` and ``overrides``.

    Args:
        file: TOML file; if ``section`` is given only that table is read.
        env: the environment (``os.environ`` when None).
        overrides: dotted key -> value from the command line (strings are parsed
            like environment values).
    """
    leaves = dict(_leaves(cls))
    values: dict[tuple[str, ...], Any] = {}

    if file is not None:
        path = Path(file)
        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError as e:
            raise SettingsError(f"settings file {str(path)!r} does not exist", key="config", source=str(path)) from e
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"settings file {str(path)!r} is not valid TOML: {e}", key="config", source=str(path)) from e
        if section is not None:
            doc = doc.get(section, {})
        for p, v in _flatten_file(doc, leaves, f"file {path}").items():
            values[p] = _convert_leaf(v, leaves[p], ".".join(p), f"from file {path}", from_text=False)

    environ = os.environ if env is None else env
    for p, tp in leaves.items():
        name = env_name(p, prefix)
        if name in environ:
            values[p] = _convert_leaf(environ[name], tp, ".".join(p), f"from environment {name}", from_text=True)

    for key, v in (overrides or {}).items():
        p = tuple(key.split("."))
        if p not in leaves:
            raise SettingsError(
                f"unknown setting {key!r} on the command line; known: {', '.join(settings_keys(cls))}",
                key=key,
                source="command line",
            )
        values[p] = _convert_leaf(v, leaves[p], key, "from the command line", from_text=isinstance(v, str))

    tree: dict[str, Any] = {}
    for p, v in values.items():
        _set_path(tree, p, v)
    try:
        return msgspec.convert(tree, cls, dec_hook=_dec_hook)
    except msgspec.ValidationError as e:
        # a cross-field check (__post_init__) or a required field with no value
        raise SettingsError(f"settings for {cls.__name__}: {e}", key=_key_from_msgspec(str(e)), source="merged") from e


def _key_from_msgspec(msg: str) -> str:
    # msgspec says "... - at `$.rpc.port`"; keep the dotted path
    if "`$." in msg:
        return msg.rsplit("`$.", 1)[1].rstrip("`")
    return ""


def add_settings_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` and repeatable ``--set key=value`` to a parser."""
    parser.add_argument("--config", metavar="FILE", default=None, help="TOML settings file")
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="settings_overrides",
        help="override one setting, e.g. --set rpc.port=7000 (repeatable; wins over FF_* environment)",
    )


def overrides_from_args(ns: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in getattr(ns, "settings_overrides", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SettingsError(f"--set expects KEY=VALUE, got {item!r}", key=item, source="command line")
        out[key.strip()] = value
    return out
