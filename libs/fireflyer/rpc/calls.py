"""Client call proxies that raise typed FireFlyerErrors instead of AioRpcError.

:class:`~fireflyer.rpc.interceptors.ClientInterceptor` wraps each grpc.aio call
in one of these.  They are real ``grpc.aio.*Call`` instances (grpc checks),
delegate everything to the call they wrap, and translate a failed status
where the caller sees it: ``await call`` and ``await stub.M(req)``,
``async for r in call``, ``await call.read()``.  ``code()``, ``details()`` and
the metadata still answer as grpc does, for callers that want the raw status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from fireflyer.core.errors import FireFlyerError

from .errors import error_from_rpc_error

__all__ = [
    "TypedCall",
    "TypedUnaryUnaryCall",
    "TypedUnaryStreamCall",
    "TypedStreamUnaryCall",
    "TypedStreamStreamCall",
    "end_span_when_done",
]

# strong references to the span-ending tasks until they finish (asyncio keeps weak ones)
_pending: set[asyncio.Task[None]] = set()


def end_span_when_done(call: Any, span: trace.Span) -> None:
    """End a CLIENT span with the call's status when the call finishes, however it is used."""

    async def finish(end_ns: int) -> None:
        try:
            code = await call.code()
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.end(end_time=end_ns)

    def on_done(_: Any) -> None:
        # code() is a coroutine even on a finished call: read it in a task,
        # but stamp the span's end now, when the call actually ended
        task = asyncio.get_running_loop().create_task(finish(time.time_ns()))
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    call.add_done_callback(on_done)


class TypedCall:
    """Delegates to a grpc.aio call; subclasses translate failures where they surface."""

    def __init__(self, call: Any, *, method: str, target: str) -> None:
        self._call = call
        self.method = method
        self.target = target

    def __getattr__(self, name: str) -> Any:
        # grpc's own wrapper reads private state of the call (e.g. _done_writing_flag)
        if name == "_call":  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._call, name)

    def _typed(self, exc: grpc.aio.AioRpcError) -> FireFlyerError:
        return error_from_rpc_error(exc, method=self.method, target=self.target)

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def cancelled(self) -> bool:
        return bool(self._call.cancelled())

    def done(self) -> bool:
        return bool(self._call.done())

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._call.add_done_callback(lambda _call: callback(self))

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()  # type: ignore[no-any-return]

    async def initial_metadata(self) -> Any:
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        return await self._call.trailing_metadata()

    async def code(self) -> grpc.StatusCode:
        return await self._call.code()  # type: ignore[no-any-return]

    async def details(self) -> str:
        return await self._call.details()  # type: ignore[no-any-return]

    async def wait_for_connection(self) -> None:
        try:
            await self._call.wait_for_connection()
        except grpc.aio.AioRpcError as exc:
            raise self._typed(exc) from None


class _UnaryResponse(TypedCall):
    def __await__(self) -> Generator[Any, None, Any]:
        try:
            return (yield from self._call.__await__())
        except grpc.aio.AioRpcError as exc:
            # `from None`: grpc's traceback adds nothing the typed error lacks
            raise self._typed(exc) from None


class _StreamResponse(TypedCall):
    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[Any]:
        try:
            async for response in self._call:
                yield response
        except grpc.aio.AioRpcError as exc:
            raise self._typed(exc) from None

    async def read(self) -> Any:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise self._typed(exc) from None


class _StreamRequest(TypedCall):
    async def write(self, request: Any) -> None:
        await self._call.write(request)

    async def done_writing(self) -> None:
        await self._call.done_writing()


class TypedUnaryUnaryCall(_UnaryResponse, grpc.aio.UnaryUnaryCall):
    pass


class TypedUnaryStreamCall(_StreamResponse, grpc.aio.UnaryStreamCall):
    pass


class TypedStreamUnaryCall(_UnaryResponse, _StreamRequest, grpc.aio.StreamUnaryCall):
    pass


class TypedStreamStreamCall(_StreamResponse, _StreamRequest, grpc.aio.StreamStreamCall):
    pass
