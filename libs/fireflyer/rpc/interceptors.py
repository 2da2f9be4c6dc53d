"""The interceptors every Fire-Flyer server and channel runs.

Server (:class:`ServerInterceptor`), per call, in one wrapper: a SERVER span
whose parent is the caller's (W3C ``traceparent`` in the metadata; with none,
a root span that the tracer's sampler may drop, see
:func:`fireflyer.telemetry.default_sampler`); the bearer token mapped to a
:class:`~fireflyer.rpc.auth.Principal` in a context variable; FireFlyerError ->
status with the error in the trailers, anything else -> INTERNAL with the
traceback logged; the call log line ``rpc.call`` (method, user, code, ms) at
INFO for failed or slow (>= ``SLOW_CALL_S``) calls and at DEBUG otherwise; and,
given a :class:`~fireflyer.telemetry.metrics.RpcServerMetrics`, the call counted
by method and status code and its duration observed (Prometheus).

grpc.aio's server interceptor hook only sees the handler *lookup*, which runs
outside the handler's task, so a context variable or span set there would not
be visible to the servicer and exceptions raised by it would not pass through.
Instead the interceptor returns a copy of the method handler whose behaviour
function is wrapped, for all four arities; the copy is built once per method
and reads each call's metadata from the call's own context.

Client (:class:`ClientInterceptor`), per call: ``authorization: Bearer`` and
the trace context added to the metadata, the default deadline applied when the
caller set none, a CLIENT span, and ``AioRpcError`` turned into the typed
FireFlyerError, so ``await stub.Echo(req)`` raises e.g. ``NotFound``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from fireflyer.core.errors import FireFlyerError, Unauthenticated
from fireflyer.core.log import get_logger
from fireflyer.telemetry import extract, inject, tracer
from fireflyer.telemetry.metrics import MethodMetrics, RpcServerMetrics

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

__all__ = ["ServerInterceptor", "ClientInterceptor", "UnaryUnaryCaller", "client_interceptors", "Inflight", "PUBLIC_METHOD_PREFIXES",
           "SLOW_CALL_S"]

log = get_logger("fireflyer.rpc")
_tracer = tracer("fireflyer.rpc")

#: RPCs anyone may call without a token: load balancers, `ff status`, grpcurl
PUBLIC_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
#: a successful call taking this long still gets an INFO ``rpc.call`` line
SLOW_CALL_S = 1.0
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_NO_PARENT = otel_context.Context()
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


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Span, auth, error mapping and the call log for every method, in one wrapper.

    The wrapped handler of a method is built once and cached: the per-call state
    (metadata, principal, span) comes from the call's own ``context``, so the
    success path costs one metadata scan, a token lookup, a span start that the
    sampler may make a no-op, and no log record unless DEBUG is on.
    """

    def __init__(self, *, tokens: auth.TokenStore | None, auth_enabled: bool, inflight: Inflight,
                 metrics: RpcServerMetrics | None = None) -> None:
        self.tokens = tokens if tokens is not None else auth.TokenStore({}, source="<none>")
        self.auth_enabled = auth_enabled
        self.inflight = inflight
        self.metrics = metrics
        self._handlers: dict[str, Any] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method  # type: ignore[attr-defined]
        wrapped = self._handlers.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return None
        # grpc fixes the registered handlers when the server starts, so one lookup per method is enough
        wrapped = self._handlers[method] = _wrap_handler(handler, _Method(self, method))
        return wrapped

    def authenticate(self, m: _Method, header: str) -> auth.Principal:
        if not self.auth_enabled:
            return auth.ANONYMOUS_ADMIN
        scheme, _, token = header.partition(" ")
        found = self.tokens.lookup(token.strip()) if scheme.lower() == "bearer" else None
        if found is not None:
            return found
        if m.public:
            return auth._ANONYMOUS
        if not header:
            raise Unauthenticated(f"no bearer token on {m.name}: {_HOW_TO_GET_A_TOKEN}", method=m.name)
        refused = self.tokens.refusal(token.strip()) if scheme.lower() == "bearer" else None
        if refused is not None:  # a known token, revoked or past its expiry
            raise Unauthenticated(f"{refused[1]}; refused on {m.name}: ask an admin for a new token "
                                  "(ff admin users add)", method=m.name, reason=refused[0])
        # never echo the token: it may be a real secret meant for another cluster
        raise Unauthenticated(f"unknown bearer token on {m.name}: {_HOW_TO_GET_A_TOKEN}", method=m.name)


class _Method:
    """What is fixed per method: its name, span name and attributes, whether it is public, its metrics."""

    __slots__ = ("ic", "name", "span_name", "attributes", "public", "metrics")

    def __init__(self, ic: ServerInterceptor, name: str) -> None:
        self.ic = ic
        self.name = name
        self.span_name = _span_name(name)
        self.attributes = _rpc_attributes(name)
        self.public = name.startswith(PUBLIC_METHOD_PREFIXES)
        self.metrics: MethodMetrics | None = ic.metrics.for_method(name) if ic.metrics is not None else None


def _read_metadata(context: grpc.aio.ServicerContext) -> tuple[str, dict[str, str] | None]:
    """(authorization header, trace headers or None) from the call's metadata in one pass."""
    header = ""
    carrier: dict[str, str] | None = None
    for k, v in context.invocation_metadata() or ():
        if k == "authorization":
            if isinstance(v, str):
                header = v
        elif k in _TRACE_HEADERS and isinstance(v, str):
            if carrier is None:
                carrier = {}
            carrier[k] = v
    return header, carrier


class _Call:
    """One call on the server: the span it runs in, the caller, and how it ended."""

    __slots__ = ("m", "context", "started", "span", "_otel_token", "_header", "principal", "_bound", "code",
                 "routine", "_finished")

    def __init__(self, m: _Method, context: grpc.aio.ServicerContext) -> None:
        self.m = m
        self.context = context
        self.started = time.perf_counter()
        self.principal: auth.Principal | None = None
        self._bound: Any = None
        self.code = grpc.StatusCode.OK
        #: the handler answered with an error of normal life (FireFlyerError.routine: NotPrimary)
        self.routine = False
        self._finished = False
        header, carrier = _read_metadata(context)
        # no trace headers: a root span (the sampler decides whether it records); never the
        # ambient context, which belongs to whatever grpc task happens to run the handler
        parent = extract(carrier) if carrier else _NO_PARENT
        self.span = _tracer.start_span(m.span_name, context=parent, kind=SpanKind.SERVER, attributes=m.attributes,
                                       record_exception=False, set_status_on_exception=False)
        self._otel_token = otel_context.attach(trace.set_span_in_context(self.span, parent))
        self._header = header
        m.ic.inflight.count += 1

    def authenticate(self) -> None:
        """Bind the caller for the handler (raises Unauthenticated, which fail() maps)."""
        self.principal = self.m.ic.authenticate(self.m, self._header)
        self._bound = auth._bind(self.principal, self.m.name)

    async def fail(self, exc: BaseException) -> None:
        """Turn an exception from the handler into the call's status (raises AbortError)."""
        if isinstance(exc, FireFlyerError):
            err = exc
        else:
            err = internal_error(self.m.name, exc)
            log.error("rpc.unexpected_error", method=self.m.name, exc_info=exc,
                      user=self.principal.user if self.principal else None)
        self.code = status_for_error(err)
        self.routine = err.routine
        if self.span.is_recording():
            self.span.record_exception(exc)
        # finish (metrics, span, the rpc.call line) before the abort: the abort sends the status, and
        # whoever sees the failure must be able to find its log line and count already
        self.finish(exc)
        await self.context.abort(self.code, err.message or err.kind, trailing_metadata=error_trailers(err))

    def finish(self, exc: BaseException | None) -> None:
        if self._finished:
            return
        self._finished = True
        m = self.m
        m.ic.inflight.count -= 1
        if self._bound is not None:
            auth._unbind(self._bound)
        if isinstance(exc, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
        elif isinstance(exc, grpc.aio.AbortError):
            # the handler (or our fail()) aborted: the context knows the code
            code = self.context.code()
            if isinstance(code, grpc.StatusCode):
                self.code = code
        span = self.span
        if span.is_recording():
            span.set_attribute("rpc.grpc.status_code", self.code.value[0])
            if self.code is not grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, self.code.name))
        span.end()
        otel_context.detach(self._otel_token)
        elapsed = time.perf_counter() - self.started
        if m.metrics is not None:
            m.metrics.observe(self.code.name, elapsed)
        self._log(elapsed)

    def _log(self, elapsed_s: float) -> None:
        # Successful calls log at DEBUG: at thousands of calls per second an INFO line each
        # was a measurable share of a server's CPU and drowns the lines that matter.  Failed
        # and slow calls stay at INFO (health probes, which arrive every second, and routine
        # answers such as a NotPrimary redirect, at DEBUG).
        ms = elapsed_s * 1000
        quiet = self.m.public or ((self.code is grpc.StatusCode.OK or self.routine) and ms < SLOW_CALL_S * 1000)
        level = logging.DEBUG if quiet else logging.INFO
        if log.is_enabled(level):
            (log.debug if quiet else log.info)(
                "rpc.call", method=self.m.name, user=self.principal.user if self.principal else None,
                code=self.code.name, ms=round(ms, 3))


def _wrap_handler(handler: Any, m: _Method) -> Any:
    """A copy of ``handler`` whose behaviour runs inside a :class:`_Call`."""
    if handler.unary_unary is not None:
        return handler._replace(unary_unary=_unary_response(handler.unary_unary, m))
    if handler.stream_unary is not None:
        return handler._replace(stream_unary=_unary_response(handler.stream_unary, m))
    if handler.unary_stream is not None:
        return handler._replace(unary_stream=_stream_response(handler.unary_stream, m))
    if handler.stream_stream is not None:
        return handler._replace(stream_stream=_stream_response(handler.stream_stream, m))
    return handler


def _unary_response(behaviour: Callable[..., Any], m: _Method) -> Callable[..., Any]:
    """Wrap a unary-unary or stream-unary behaviour (returns one response)."""

    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = _Call(m, context)
        ended: BaseException | None = None
        try:
            call.authenticate()
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result
        except (asyncio.CancelledError, grpc.aio.AbortError) as exc:
            ended = exc
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status
            ended = exc
            await call.fail(exc)  # raises AbortError
        finally:
            call.finish(ended)

    return wrapped


def _stream_response(behaviour: Callable[..., Any], m: _Method) -> Callable[..., Any]:
    """Wrap a unary-stream or stream-stream behaviour.

    grpc.aio tells the two handler styles apart by the function's kind (a
    coroutine writes with ``context.write``; an async generator yields), so
    the wrapper must be of the same kind as what it wraps.
    """
    if inspect.iscoroutinefunction(behaviour):
        return _unary_response(behaviour, m)

    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        call = _Call(m, context)
        ended: BaseException | None = None
        try:
            call.authenticate()
            responses = behaviour(request, context)
            if hasattr(responses, "__aiter__"):
                async for item in responses:
                    yield item
            else:  # a plain generator (sync servicer): still served on the loop
                for item in responses:
                    yield item
        except (asyncio.CancelledError, grpc.aio.AbortError, GeneratorExit) as exc:
            ended = exc
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status
            ended = exc
            await call.fail(exc)  # raises AbortError
        finally:
            call.finish(ended)

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
    makes one subclass instance per arity.  Unary-unary calls, the common case,
    skip grpc's interceptor machinery (a task per call): see :class:`UnaryUnaryCaller`.
    """

    def __init__(self, *, target: str, token: str | None, default_timeout_s: float | None) -> None:
        self.target = target
        self._auth = [("authorization", f"Bearer {token}")] if token else []
        self.default_timeout_s = default_timeout_s

    async def _intercept(self, kind: type[TypedCall], continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        span = _tracer.start_span(_span_name(method), kind=SpanKind.CLIENT, attributes=_rpc_attributes(method))
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            inject(carrier, context=trace.set_span_in_context(span))
        try:
            call = await continuation(_with_metadata(details, [*self._auth, *carrier.items()],
                                                     self.default_timeout_s), request)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
            raise
        if span.is_recording():
            end_span_when_done(call, span)
        return kind(call, method=method, target=self.target)


class UnaryUnaryCaller(ClientInterceptor):
    """What :class:`ClientInterceptor` does, for unary-unary calls, without grpc's interceptors.

    grpc.aio runs every intercepted call through an extra task and a chain of
    callbacks; for a small RPC that was about a third of the client's CPU.  The
    channel built by :func:`fireflyer.rpc.connect` hands its unary-unary
    multicallables to :meth:`call`, which adds the same metadata, deadline and
    span and returns the same typed call proxy, around grpc's plain call.
    """

    def call(self, inner: Any, method: str, request: Any, timeout: float | None, metadata: Any,
             **kw: Any) -> TypedUnaryUnaryCall:
        span = _tracer.start_span(_span_name(method), kind=SpanKind.CLIENT, attributes=_rpc_attributes(method))
        extra = list(self._auth)
        if span.get_span_context().is_valid:  # no tracer provider: nothing to propagate
            carrier: dict[str, str] = {}
            inject(carrier, context=trace.set_span_in_context(span))
            extra.extend(carrier.items())
        if metadata:
            md = list(metadata)
            have = {k for k, _ in md}
            md.extend(kv for kv in extra if kv[0] not in have)  # a caller's explicit header wins
        else:
            md = extra
        if timeout is None:
            timeout = self.default_timeout_s
        try:
            call = inner(request, timeout=timeout, metadata=md, **kw)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
            raise
        if span.is_recording():
            end_span_when_done(call, span)
        return TypedUnaryUnaryCall(call, method=method, target=self.target)


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


def client_interceptors(*, target: str, token: str | None, default_timeout_s: float | None,
                        unary_unary: bool = True) -> list[Any]:
    """The interceptors of a channel to ``target``, one per call arity (``unary_unary=False``:
    none for unary-unary calls, which the channel then routes through :class:`UnaryUnaryCaller`)."""
    kinds = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream) if unary_unary else \
        (_UnaryStream, _StreamUnary, _StreamStream)
    return [cls(target=target, token=token, default_timeout_s=default_timeout_s) for cls in kinds]
