"""grpc core arguments shared by Fire-Flyer's servers and channels."""

from __future__ import annotations

from fireflyer.core.config import RpcSettings

__all__ = ["common_options"]

_MB = 1024 * 1024


def common_options(settings: RpcSettings) -> list[tuple[str, int]]:
    """Message-size limits and keepalive, the same on both ends.

    Keepalive pings let either side notice a dead peer (kill -9, a pulled cable)
    within keepalive_s + keepalive_timeout_s instead of TCP's much longer timeout,
    so a killed node's calls are freed and a client fails over.
    """
    size = settings.max_message_mb * _MB
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.keepalive_time_ms", int(settings.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
