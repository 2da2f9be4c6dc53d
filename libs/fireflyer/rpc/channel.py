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
from typing import Any

import grpc
from grpc.aio._channel import Channel as _AioChannel

from fireflyer.core.config import RpcSettings
from fireflyer.telemetry import ensure_task_tracing

from .calls import TypedUnaryUnaryCall
from .interceptors import UnaryUnaryCaller, client_interceptors
from .options import common_options

__all__ = ["connect", "channel_options"]


class _UnaryUnaryMultiCallable(grpc.aio.UnaryUnaryMultiCallable):  # type: ignore[misc]
    """A stub method: grpc's plain multicallable, called through :class:`UnaryUnaryCaller`."""

    __slots__ = ("_inner", "_method", "_caller")

    def __init__(self, inner: Any, method: str, caller: UnaryUnaryCaller) -> None:
        self._inner = inner
        self._method = method
        self._caller = caller

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None,
                 compression: Any = None) -> TypedUnaryUnaryCall:
        return self._caller.call(self._inner, self._method, request, timeout, metadata, credentials=credentials,
                                 wait_for_ready=wait_for_ready, compression=compression)


class _Channel(_AioChannel):  # type: ignore[misc]
    """grpc.aio's channel whose unary-unary methods skip grpc's interceptor machinery
    (the other arities keep :class:`~fireflyer.rpc.interceptors.ClientInterceptor`)."""

    def __init__(self, target: str, options: list[tuple[str, int]], caller: UnaryUnaryCaller,
                 interceptors: list[Any]) -> None:
        super().__init__(target, options, None, None, interceptors)
        self._ff_caller = caller

    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                    _registered_method: bool | None = False) -> Any:
        inner = super().unary_unary(method, request_serializer, response_deserializer, _registered_method)
        return _UnaryUnaryMultiCallable(inner, method, self._ff_caller)


#: first reconnect backoff (grpc's default is 1 s); grpc adds +-20% jitter to each
_INITIAL_RECONNECT_MS = 250


def channel_options(settings: RpcSettings) -> list[tuple[str, int]]:
    """grpc core channel arguments for a client built from ``settings``.

    A channel that failed to connect fails each call at once (UNAVAILABLE) until its
    next reconnect attempt, so the backoff bounds how long a restarted service stays
    unreachable to its clients; ``reconnect_backoff_max_s`` caps it (the jitter keeps a
    thousand clients from reconnecting in step).  ``grpc.min_reconnect_backoff_ms`` stays
    at its default: grpc also uses it as the shortest connect timeout, and a shorter
    one would never outlast a dropped SYN's 1 s retransmit."""
    max_ms = max(int(settings.reconnect_backoff_max_s * 1000), 1)
    initial_ms = min(_INITIAL_RECONNECT_MS, max_ms)
    return [
        *common_options(settings),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", initial_ms),
        ("grpc.max_reconnect_backoff_ms", max_ms),
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
    # a traced task's rank process traces its calls as part of the task's trace (no-op elsewhere)
    ensure_task_tracing()
    if token is None:
        token = os.environ.get("FF_TOKEN") or None
    deadline = settings.default_deadline_s if settings.default_deadline_s > 0 else None
    interceptors = client_interceptors(target=address, token=token, default_timeout_s=deadline, unary_unary=False)
    caller = UnaryUnaryCaller(target=address, token=token, default_timeout_s=deadline)
    return _Channel(address, channel_options(settings), caller, interceptors)
