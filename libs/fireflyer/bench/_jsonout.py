"""``--json [PATH]``, the same on every ``ff bench`` verb.

- ``--json`` or ``--json -``: the result as one JSON line on stdout, and nothing else there
  (progress goes to stderr);
- ``--json PATH``: the verb prints what it prints without ``--json`` and also writes the
  result (indented) to ``PATH``;
- no ``--json``: only the verb's own output.

A ``PATH`` whose directory does not exist or cannot be written, or that names a directory,
is refused when the arguments are parsed, before the benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["STDOUT", "add_json_option", "json_path", "emit"]

#: the value of ``--json`` given alone or as ``-``
STDOUT = "-"


def json_path(text: str) -> str:
    """``--json``'s argparse type: ``-`` or a file path that can be written (else ArgumentTypeError)."""
    if text == STDOUT:
        return text
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path (give a file path, or '-' for stdout)")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path inside it")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist; create it first or give "
                                         "another path ('-' prints to stdout)")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text} (permission denied); give a path you may "
                                         "write ('-' prints to stdout)")
    return text


def add_json_option(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    """Add ``--json [PATH]`` to a verb's parser (``ns.json``: None, ``"-"`` or the path)."""
    parser.add_argument("--json", nargs="?", const=STDOUT, default=None, type=json_path, metavar="PATH",
                        help=f"{what} as JSON: one line on stdout (no PATH, or '-'), or also written to PATH")


def _plain(obj: object) -> Any:
    import msgspec  # (structs and other msgspec-encodable values inside a result)

    return msgspec.to_builtins(obj)


def emit(target: str | None, result: Any, human: Callable[[], object] | None = None) -> int:
    """Report ``result`` as ``--json`` asks: one line on stdout (``-``: ``human`` is not called),
    else ``human()`` prints the verb's own output and a ``PATH`` also gets the JSON.  Returns 0."""
    if target == STDOUT:
        print(json.dumps(result, default=_plain), flush=True)
        return 0
    if human is not None:
        human()
    if target:
        path = Path(target)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, indent=2, default=_plain) + "\n")
        os.replace(tmp, path)
    return 0
