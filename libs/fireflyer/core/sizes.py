"""Byte sizes as people write them on command lines and in settings: ``4096``, ``512K``, ``4M``, ``64MiB``, ``1.5G``.

One grammar for every flag, environment variable and sysfs file that holds a size, so
that ``--size 64MiB`` means the same to ``ff bench kernels`` as ``FF_HFREDUCE_CHUNK_SIZE``
does to the worker.  Suffixes K, M, G and T are powers of 1024 (upper or lower case,
an optional trailing ``B`` or ``iB``); a fraction is allowed when it comes to whole
bytes (``1.5K`` is 1536, ``0.5`` is an error).

:func:`parse_size` raises :class:`~fireflyer.core.errors.InvalidArgument`; callers with
their own error type wrap it (the worker settings raise ``SettingsError`` naming the
key).  :func:`size_arg` is the ``type=`` for argparse flags: a positive size, and
argparse's error carrying our message.
"""

from __future__ import annotations

import argparse
import re

from fireflyer.core.errors import InvalidArgument

__all__ = ["parse_size", "size_arg"]

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
_EXAMPLES = "4096, 512K, 4M, 64MiB or 1G"


def parse_size(text: str | int, *, what: str = "size") -> int:
    """``"4M"`` -> 4194304; an int is taken as bytes.  ``what`` names the value in the error
    (empty: the message has no name, as argparse adds its own)."""
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"{what}: {why}" if what else why, value=str(text), expected="size")

    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise bad(f"expected a size such as {_EXAMPLES}, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise bad(f"a size cannot be negative, got {text}")
        return text
    m = _SIZE.fullmatch(text)
    if not m:
        raise bad(f"expected a size such as {_EXAMPLES}, got {text!r}")
    number, shift = m.group(1), _SHIFT[m.group(2).lower()]
    if "." not in number:
        return int(number) << shift
    # exact for the fractions people write (1.5G): the float error is far below one byte
    value = float(number) * (1 << shift)
    if value != int(value):
        raise bad(f"{text!r} is not a whole number of bytes")
    return int(value)


def size_arg(text: str) -> int:
    """argparse ``type=`` for a positive size (argparse prints the message as it is)."""
    try:
        value = parse_size(text, what="")
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value
