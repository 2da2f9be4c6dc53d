"""The interceptors every Fire-Flyer server and channel runs.

Server (:class:`ServerInterceptor`), per call, outermost first: a SERVER span
whose parent is the caller's (W3C ``traceparent`` in the metadata); the bearer
token mapped to a :class:`~fireflyer.rpc.auth.Principal` in a context variable;
FireFlyerError -> status with the error in the trailers, anything else ->
INTERNAL with the traceback logged; one log line (method, user, code, ms).

grpc.aio's server interceptor hook only sees the handler *lookup*, which runs
outside the handler's task, so a context variable or span set there would not
be visible to the servicer and exceptions raised by it would not pass through.
Instead the interceptor returns a copy of the method handler whose behaviour
function is wrapped, for all four arities.

Client (:class:`ClientInterceptor`), per call: ``authorization: Bearer`` and
the trace context added to the metadata, the default deadline applied when the
caller set none, a CLIENT span, and ``AioRpcError`` turned into the typed
FireFlyerError, so ``await stub.Echo(req)`` raises e.g. ``NotFound``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from fireflyer.core.errors import FireFlyerError, Unauthenticated
from fireflyer.core.log import get_logger
from fireflyer.telemetry import extract, inject, tracer

from . import auth
from .calls import (
    TypedCall,
    TypedStreamStreamCall,
    TypedStreamUnaryCall,
    TypedUnaryStreamCall,
    TypedUnaryUnaryCall,
    end_span_when_done,
)
from .errors import error_trailers, internal_error, status_for_error

__all__ = ["ServerInterceptor", "ClientInterceptor", "client_interceptors", "Inflight", "PUBLIC_METHOD_PREFIXES"]

log = get_logger("fireflyer.rpc")
_tracer = tracer("fireflyer.rpc")

#: RPCs anyone may call without a token: load balancers, `ff status`, grpcurl
PUBLIC_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_HOW_TO_GET_A_TOKEN = ("pass token= to fireflyer.rpc.connect or set FF_TOKEN; a local cluster's tokens are "
                       "in <state_dir>/tokens.json (ff up writes them)")


def _span_name(method: str) -> str:
    # OTel RPC convention: "package.Service/Method", no leading slash
    return method.lstrip("/")


def _rpc_attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


class Inflight:
    """Counts the calls a server is running (for shutdown logs and tests)."""

    def __init__(self) -> None:
        self.count = 0


# ---------------------------------------------------------------- server side


class _ServerCall:
    """What the server does around one call: span, auth, error mapping, log line."""

    __slots__ = ("interceptor", "method", "metadata", "public", "principal", "code", "started")

    def __init__(self, interceptor: ServerInterceptor, method: str, metadata: dict[str, str]) -> None:
        self.interceptor = interceptor
        self.method = method
        self.metadata = metadata
        self.public = method.startswith(PUBLIC_METHOD_PREFIXES)
        self.principal: auth.Principal | None = None
        self.code = grpc.StatusCode.OK
        self.started = time.perf_counter()

    def authenticate(self) -> auth.Principal:
        ic = self.interceptor
        if not ic.auth_enabled:
            return auth.ANONYMOUS_ADMIN
        header = self.metadata.get("authorization", "")
        scheme, _, token = header.partition(" ")
        found = ic.tokens.lookup(token.strip()) if scheme.lower() == "bearer" else None
        if found is not None:
            return found
        if self.public:
            return auth._ANONYMOUS
        if not header:
            raise Unauthenticated(f"no bearer token on {self.method}: {_HOW_TO_GET_A_TOKEN}", method=self.method)
        # never echo the token: it may be a real secret meant for another cluster
        raise Unauthenticated(f"unknown bearer token on {self.method}: {_HOW_TO_GET_A_TOKEN}", method=self.method)

    async def fail(self, exc: BaseException, context: grpc.aio.ServicerContext) -> None:
        """Turn an exception from the handler into the call's status (raises AbortError)."""
        if isinstance(exc, FireFlyerError):
            err = exc
        else:
            err = internal_error(self.method, exc)
            log.error("rpc.unexpected_error", method=self.method, exc_info=exc,
                      user=self.principal.user if self.principal else None)
        self.code = status_for_error(err)
        span = trace.get_current_span()
        span.record_exception(exc)
        await context.abort(self.code, err.message or err.kind, trailing_metadata=error_trailers(err))

    def finish(self, span: trace.Span, context: grpc.aio.ServicerContext | None, exc: BaseException | None) -> None:
        if isinstance(exc, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
        elif isinstance(exc, grpc.aio.AbortError) and context is not None:
            # the handler (or our fail()) aborted: the context knows the code
            code = context.code()
            if isinstance(code, grpc.StatusCode):
                self.code = code
        span.set_attribute("rpc.grpc.status_code", self.code.value[0])
        if self.code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, self.code.name))
        ms = round((time.perf_counter() - self.started) * 1000, 3)
        fields = {"method": self.method, "user": self.principal.user if self.principal else None,
                  "code": self.code.name, "ms": ms}
        # health probes arrive every second or so: keep them out of the info log
        (log.debug if self.public else log.info)("rpc.call", **fields)


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, *, tokens: auth.TokenStore | None, auth_enabled: bool, inflight: Inflight) -> None:
        self.tokens = tokens if tokens is not None else auth.TokenStore({}, source="<none>")
        self.auth_enabled = auth_enabled
        self.inflight = inflight

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return None
        method = handler_call_details.method  # type: ignore[attr-defined]
        md = handler_call_details.invocation_metadata  # type: ignore[attr-defined]
        metadata = {k: v for k, v in (md or ()) if isinstance(v, str)}
        return _wrap_handler(handler, lambda: _ServerCall(self, method, metadata))


def _wrap_handler(handler: Any, new_call: Callable[[], _ServerCall]) -> Any:
    """A copy of ``handler`` whose behaviour runs inside a :class:`_ServerCall`."""
    if handler.unary_unary is not None:
        return handler._replace(unary_unary=_unary_response(handler.unary_unary, new_call))
    if handler.stream_unary is not None:
        return handler._replace(stream_unary=_unary_response(handler.stream_unary, new_call))
    if handler.unary_stream is not None:
        return handler._replace(unary_stream=_stream_response(handler.unary_stream, new_call))
    if handler.stream_stream is not None:
        return handler._replace(stream_stream=_stream_response(handler.stream_stream, new_call))
    return handler


class _Scope:
    """Enter/leave one call: inflight count, span, principal context variable."""

    def __init__(self, call: _ServerCall, context: grpc.aio.ServicerContext) -> None:
        self.call = call
        self.context = context

    def __enter__(self) -> trace.Span:
        call = self.call
        call.interceptor.inflight.count += 1
        self._span_cm = _tracer.start_as_current_span(
            _span_name(call.method), context=extract(call.metadata), kind=SpanKind.SERVER,
            attributes=_rpc_attributes(call.method), record_exception=False, set_status_on_exception=False)
        self.span = self._span_cm.__enter__()
        return self.span

    def bind(self, principal: auth.Principal) -> None:
        self.call.principal = principal
        self._bound = auth._bind(principal, self.call.method)

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        self.call.interceptor.inflight.count -= 1
        if hasattr(self, "_bound"):
            auth._unbind(self._bound)
        self.call.finish(self.span, self.context, exc)
        self._span_cm.__exit__(et, exc, tb)


def _unary_response(behaviour: Callable[..., Any], new_call: Callable[[], _ServerCall]) -> Callable[..., Any]:
    """Wrap a unary-unary or stream-unary behaviour (returns one response)."""

    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = new_call()
        scope = _Scope(call, context)
        with scope:
            try:
                scope.bind(call.authenticate())
                result = behaviour(request, context)
                return await result if inspect.isawaitable(result) else result
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                await call.fail(exc, context)

    return wrapped


def _stream_response(behaviour: Callable[..., Any], new_call: Callable[[], _ServerCall]) -> Callable[..., Any]:
    """Wrap a unary-stream or stream-stream behaviour.

    grpc.aio tells the two handler styles apart by the function's kind (a
    coroutine writes with ``context.write``; an async generator yields), so
    the wrapper must be of the same kind as what it wraps.
    """
    if inspect.iscoroutinefunction(behaviour):
        return _unary_response(behaviour, new_call)

    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        call = new_call()
        scope = _Scope(call, context)
        with scope:
            try:
                scope.bind(call.authenticate())
                responses = behaviour(request, context)
                if hasattr(responses, "__aiter__"):
                    async for item in responses:
                        yield item
                else:  # a plain generator (sync servicer): still served on the loop
                    for item in responses:
                        yield item
            except (asyncio.CancelledError, grpc.aio.AbortError, GeneratorExit):
                raise
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                await call.fail(exc, context)

    return wrapped


# ---------------------------------------------------------------- client side


def _with_metadata(details: grpc.aio.ClientCallDetails, extra: list[tuple[str, str]],
                   default_timeout_s: float | None) -> grpc.aio.ClientCallDetails:
    md = grpc.aio.Metadata(*(details.metadata or ()))
    for k, v in extra:
        if k not in md:  # a caller's explicit header wins
            md.add(k, v)
    timeout = details.timeout if details.timeout is not None else default_timeout_s
    return details._replace(metadata=md, timeout=timeout)  # type: ignore[attr-defined]


class ClientInterceptor:
    """Token, trace context, default deadline, CLIENT span and typed errors for one channel.

    The interceptor must not await the call itself: with the ``call.write()``
    style of a client-streaming call, grpc only lets writes through once the
    interceptor has returned.  It returns a :mod:`~fireflyer.rpc.calls` proxy
    instead, which raises the typed error wherever the caller observes the
    outcome (``await call``, ``async for``, ``read()``).  grpc.aio files each
    interceptor under the first arity it implements, so :func:`client_interceptors`
    makes one subclass instance per arity.
    """

    def __init__(self, *, target: str, token: str | None, default_timeout_s: float | None) -> None:
        self.target = target
        self._auth = [("authorization", f"Bearer {token}")] if token else []
        self.default_timeout_s = default_timeout_s

    async def _intercept(self, kind: type[TypedCall], continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        span = _tracer.start_span(_span_name(method), kind=SpanKind.CLIENT, attributes=_rpc_attributes(method))
        carrier: dict[str, str] = {}
        inject(carrier, context=trace.set_span_in_context(span))
        try:
            call = await continuation(_with_metadata(details, [*self._auth, *carrier.items()],
                                                     self.default_timeout_s), request)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
            raise
        end_span_when_done(call, span)
        return kind(call, method=method, target=self.target)


class _UnaryUnary(ClientInterceptor, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._intercept(TypedUnaryUnaryCall, continuation, client_call_details, request)


class _UnaryStream(ClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await self._intercept(TypedUnaryStreamCall, continuation, client_call_details, request)


class _StreamUnary(ClientInterceptor, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await self._intercept(TypedStreamUnaryCall, continuation, client_call_details, request_iterator)


class _StreamStream(ClientInterceptor, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any,
                                      request_iterator: Any) -> Any:
        return await self._intercept(TypedStreamStreamCall, continuation, client_call_details, request_iterator)


def client_interceptors(*, target: str, token: str | None, default_timeout_s: float | None) -> list[Any]:
    """The interceptors of a channel to ``target``, one per call arity."""
    return [cls(target=target, token=token, default_timeout_s=default_timeout_s)
            for cls in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
