"""The one way Fire-Flyer dials a gRPC service.

    async with connect(settings.mgmtd_addr, token=settings.token) as channel:
        stub = mgmtd_pb2_grpc.MgmtdServiceStub(channel)
        try:
            reply = await stub.GetChain(req)              # default deadline applies
        except NotFound as e:                             # typed, with e.fields
            ...

Every call carries ``authorization: Bearer <token>`` and the current trace
context, gets ``default_deadline_s`` when the caller passes no ``timeout=``
(streams included: pass a longer ``timeout=`` for a long watch), runs in a
CLIENT span, and fails with the FireFlyerError the server raised (see
:mod:`fireflyer.rpc.errors`) rather than ``grpc.aio.AioRpcError``.
"""

from __future__ import annotations

import os

import grpc

from fireflyer.core.config import RpcSettings

from .interceptors import client_interceptors
from .options import common_options

__all__ = ["connect", "channel_options"]


def channel_options(settings: RpcSettings) -> list[tuple[str, int]]:
    """grpc core channel arguments for a client built from ``settings``."""
    return [
        *common_options(settings),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def connect(address: str, *, token: str | None = None, settings: RpcSettings | None = None) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to ``address`` ("host:port") with Fire-Flyer's interceptors.

    ``token=None`` uses ``FF_TOKEN`` from the environment as it is now (read
    here, not at import, so tests and ``ff`` can set it late); ``token=""`` or
    no token at all sends none, which only health and reflection accept.
    Close the channel (``async with`` or ``await channel.close()``) when done;
    keep a reference to it while stubs are in use, since a garbage-collected
    grpc.aio channel closes itself under its stubs.
    """
    settings = settings or RpcSettings()
    if token is None:
        token = os.environ.get("FF_TOKEN") or None
    deadline = settings.default_deadline_s if settings.default_deadline_s > 0 else None
    interceptors = client_interceptors(target=address, token=token, default_timeout_s=deadline)
    return grpc.aio.insecure_channel(address, options=channel_options(settings), interceptors=interceptors)
