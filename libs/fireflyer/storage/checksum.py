"""CRC32C, the checksum of 3FS chunks and payloads (research/3fs.md §3 "Checksums").

3FS uses CRC32C by default: every replica verifies the payload's CRC against the one the
client sent, and replicas compare whole-chunk checksums along the chain.  The ``crc32c``
package uses the CPU's CRC instruction (SSE4.2 / ARMv8) where there is one, so hashing a
whole 1-64 MiB chunk per write costs less than copying it; we therefore recompute the
whole-chunk CRC of every new version instead of combining CRCs.
"""

from __future__ import annotations

from typing import Any

import crc32c as _crc32c

from .errors import ChecksumMismatch

__all__ = ["crc32c", "verify_payload", "HARDWARE"]

Buffer = bytes | bytearray | memoryview

#: True when the package found a hardware CRC32C instruction
HARDWARE: bool = bool(getattr(_crc32c, "hardware_based", False))


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (the CRC of what came before)."""
    return _crc32c.crc32c(data, value)


def verify_payload(data: Buffer, expected: int, **fields: Any) -> int:
    """Return the CRC32C of ``data``; raise :class:`ChecksumMismatch` unless it is ``expected``.

    Called by every replica before applying a payload, so a buffer corrupted in flight is
    refused before it reaches disk.
    """
    got = crc32c(data)
    if got != expected:
        raise ChecksumMismatch(
            f"payload CRC32C {got:#010x} != {expected:#010x} sent with it ({len(data)} bytes); "
            "the payload was corrupted in flight: resend it",
            expected=expected,
            got=got,
            what="payload",
            **fields,
        )
    return got
