"""The NATS connection every Fire-Flyer process uses: :class:`Bus`.

    bus = await Bus.connect(settings.nats, name="mgmtd-0")
    await bus.publish(subject("node", "node", "n3", "heartbeat"), Heartbeat(node="n3"))
    sub = await bus.subscribe(pattern("node", event="heartbeat"), on_heartbeat, types=Heartbeat)
    reply = await bus.request(subj, Ping(), reply_types=Pong, timeout_s=1.0)
    await bus.ensure_stream("SCHED", [pattern("sched", ident=">")])     # JetStream
    await bus.publish_durable(subj, TaskState(...))
    consumer = await bus.consume("SCHED", "scheduler", on_task_state, types=TaskState)
    await bus.close()

Guarantees:

- **Reconnect.** A lost connection is retried for ever by default
  (``max_reconnect_attempts=-1``) with exponential backoff from
  ``reconnect_wait_s`` doubling up to ``max_reconnect_wait_s`` (with jitter, so a
  fleet does not reconnect in lock step).  Subscriptions are restored on
  reconnect; core NATS messages published while disconnected are lost (use
  JetStream for what must not be), publishes made while reconnecting are
  buffered by the client.
- **Bad input never kills a receiver.** A payload that does not decode is
  logged (``bus.malformed``) and counted in :attr:`Bus.stats`; a handler that
  raises is logged (``bus.handler_failed``) and counted; either way the
  subscription goes on.
- **Tracing.** Outgoing messages carry the current trace context in headers;
  handlers run in a CONSUMER span parented on it.
- **Errors over request/reply.** A serving handler that raises sends the error
  back (``Ff-Error`` header, ``FireFlyerError.to_dict()`` body) and
  :meth:`Bus.request` raises it again as the same typed error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.client import Server
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import JetStreamContext

from fireflyer.core.config import NatsSettings
from fireflyer.core.errors import (
    DeadlineExceeded,
    FireFlyerError,
    Internal,
    ProtocolError,
    Unavailable,
    error_from_dict,
)
from fireflyer.core.log import get_logger

from . import jetstream
from .auth import nats_credentials
from .backoff import backoff_delay
from .events import Event, decode, decoder_for, encode
from .stats import BusStats
from .tracing import consumer_span, outgoing_headers

__all__ = ["Bus", "Subscription", "Handler", "RequestHandler", "ERROR_HEADER"]

log = get_logger(__name__)


def _cancelled_from_outside() -> bool:
    """Whether the running task itself is being cancelled (as opposed to a CancelledError that
    escaped from a future nats-py cancelled inside its own machinery)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _why(e: BaseException) -> str:
    # many nats-py errors and TimeoutError have an empty str(); name the type then
    return str(e) or type(e).__name__


#: header marking a reply whose body is ``FireFlyerError.to_dict()`` JSON
ERROR_HEADER = "Ff-Error"

Handler = Callable[[Any, Msg], Awaitable[None]]
RequestHandler = Callable[[Any, Msg], Awaitable[Event]]

_json = msgspec.json.Encoder()


class Subscription:
    """A live subscription; :meth:`unsubscribe` ends it (idempotent)."""

    def __init__(self, sub: NatsSubscription, subject: str, queue: str | None) -> None:
        self._sub = sub
        self.subject = subject
        self.queue = queue
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    async def unsubscribe(self) -> None:
        if not self._active:
            return
        self._active = False
        try:
            await self._sub.unsubscribe()
        except nats.errors.Error as e:  # connection already closed: nothing left to undo
            log.debug("bus.unsubscribe_failed", subject=self.subject, error=str(e))

    def __repr__(self) -> str:
        return f"Subscription({self.subject!r}, queue={self.queue!r}, active={self._active})"


class Bus:
    """One NATS connection with typed publish/subscribe, request/reply and JetStream."""

    def __init__(self, nc: NatsClient, settings: NatsSettings, name: str) -> None:
        # Use Bus.connect(); the constructor only wires an already connected client.
        self._nc = nc
        self.settings = settings
        self.name = name
        self.stats = BusStats()
        self._consumers: list[jetstream.Consumer] = []
        self._js: JetStreamContext | None = None
        #: the last error the client reported (an auth refusal surfaces only here while connecting)
        self._last_error = ""
        #: the server refused our credentials (kept: a connection reset that follows must not hide it)
        self._auth_error = ""

    # -- connection ---------------------------------------------------------

    @classmethod
    async def connect(cls, settings: NatsSettings, *, name: str, wait_s: float | None = None,
                      token: str | None = None) -> Bus:
        """Connect to ``settings.url`` (comma-separated URLs: a cluster).

        Args:
            settings: the NATS section of the service's settings.
            name: connection name shown by the server (``nats-server`` monitoring).
            token: the process's bearer token (``FF_TOKEN``); it connects as the NATS user
                derived from it (:mod:`fireflyer.bus.auth`), with that user's reply inbox.
                A server without auth ignores it.  None: anonymous (or ``settings.credentials``).
            wait_s: how long to keep trying the *first* connection; default
                ``settings.connect_timeout_s``.  Later losses are retried as the
                settings say.

        Raises:
            Unavailable: no server answered within ``wait_s``.
        """
        nc = NatsClient()
        bus = cls(nc, settings, name)
        servers = [u.strip() for u in settings.url.split(",") if u.strip()]
        wait = settings.connect_timeout_s if wait_s is None else wait_s
        auth: dict[str, Any] = {}
        if token and not settings.credentials:
            creds = nats_credentials(token)
            auth = {"user": creds.user, "password": creds.password, "inbox_prefix": creds.inbox_prefix}
        try:
            await asyncio.wait_for(
                nc.connect(
                    servers,
                    name=name,
                    connect_timeout=settings.connect_timeout_s,  # type: ignore[arg-type]
                    reconnect_time_wait=settings.reconnect_wait_s,  # type: ignore[arg-type]
                    allow_reconnect=True,
                    max_reconnect_attempts=settings.max_reconnect_attempts,
                    drain_timeout=settings.drain_timeout_s,  # type: ignore[arg-type]
                    user_credentials=settings.credentials,
                    reconnect_to_server_handler=bus._pick_server,
                    error_cb=bus._on_error,
                    disconnected_cb=bus._on_disconnected,
                    reconnected_cb=bus._on_reconnected,
                    closed_cb=bus._on_closed,
                    **auth,
                ),
                timeout=wait,
            )
        except (TimeoutError, OSError, nats.errors.Error, asyncio.CancelledError) as e:
            if isinstance(e, asyncio.CancelledError) and _cancelled_from_outside():
                raise  # our caller cancelled us; a CancelledError of nats-py's own tasks is a failed connect
            await nc.close()
            # a refusal of the credentials outranks a later reset: the server refuses, then hangs up
            last = bus._auth_error or bus._last_error
            if "authorization violation" in (last + _why(e)).lower():
                hint = ("the server refused the credentials: this process's token (FF_TOKEN) is not a NATS user "
                        "of this cluster (revoked, expired, or another cluster's; see docs/nats-auth.md)")
            else:
                hint = "is nats-server running (`ff up`)?"
            raise Unavailable(
                f"cannot connect to NATS at {settings.url} within {wait}s: {_why(e)}"
                + (f" (last error: {last})" if last else "") + f"; {hint}",
                url=settings.url,
                name=name,
            ) from e
        log.info("bus.connected", name=name, url=str(nc.connected_url.geturl() if nc.connected_url else ""))
        return bus

    def _pick_server(self, servers: list[Server], info: dict[str, Any]) -> tuple[Server | None, float]:
        # nats-py calls this before each reconnect attempt: try the server with the
        # fewest failed attempts, after a delay that doubles with its failures.
        best = min(servers, key=lambda s: s.reconnects)
        delay = backoff_delay(
            best.reconnects, self.settings.reconnect_wait_s, self.settings.max_reconnect_wait_s
        )
        return best, delay

    async def _on_error(self, e: Exception) -> None:
        self._last_error = _why(e)
        if "authorization violation" in self._last_error.lower():
            self._auth_error = self._last_error
        if isinstance(e, OSError | asyncio.TimeoutError | nats.errors.StaleConnectionError):
            # every failed reconnect attempt lands here: keep them out of warnings
            log.debug("bus.connection_error", name=self.name, error=repr(e))
        else:
            log.warning("bus.error", name=self.name, error=repr(e))

    async def _on_disconnected(self) -> None:
        if self._nc.is_closed:
            return
        self.stats.disconnects += 1
        log.warning("bus.disconnected", name=self.name, url=self.settings.url)

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        url = self._nc.connected_url.geturl() if self._nc.connected_url else ""
        log.info("bus.reconnected", name=self.name, url=url, reconnects=self.stats.reconnects)

    async def _on_closed(self) -> None:
        log.info("bus.closed", name=self.name)

    @property
    def nc(self) -> NatsClient:
        """The underlying nats-py client (raw access for tests and tools)."""
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            self._js = self._nc.jetstream()
        return self._js

    @property
    def is_connected(self) -> bool:
        return bool(self._nc.is_connected)

    @property
    def is_closed(self) -> bool:
        return bool(self._nc.is_closed)

    async def flush(self, timeout_s: float = 2.0) -> None:
        """Round trip to the server: everything sent before has been processed by it."""
        try:
            await self._nc.flush(timeout=timeout_s)  # type: ignore[arg-type]
        except (nats.errors.Error, TimeoutError) as e:
            raise Unavailable(f"NATS flush failed: {_why(e)}", name=self.name) from e

    async def drain(self) -> None:
        """Stop consumers, let in-flight handlers finish, flush, then close."""
        await self._stop_consumers()
        if not self._nc.is_closed:
            try:
                await self._nc.drain()
            except (nats.errors.Error, TimeoutError) as e:
                log.warning("bus.drain_failed", name=self.name, error=repr(e))
                await self._nc.close()

    async def close(self) -> None:
        """Stop consumers and close at once (idempotent)."""
        await self._stop_consumers()
        if not self._nc.is_closed:
            try:
                await self._nc.close()
            except asyncio.CancelledError:
                if _cancelled_from_outside():
                    raise
                # nats-py's own transport, torn down by the server at the same moment (a revoked
                # user's connection), lets its close-waiter's cancellation out: it is closed all the same
                log.debug("bus.close_cancelled_inside", name=self.name)

    async def _stop_consumers(self) -> None:
        consumers, self._consumers = self._consumers, []
        await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- core publish / subscribe ------------------------------------------

    async def publish(self, subject: str, event: Event, *, headers: Mapping[str, str] | None = None) -> None:
        """Fire and forget (at most once); use :meth:`publish_durable` for what must arrive."""
        await self.publish_raw(subject, encode(event), headers=headers)

    async def publish_raw(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        try:
            await self._nc.publish(subject, data, headers=outgoing_headers(headers))
        except nats.errors.Error as e:
            raise Unavailable(f"cannot publish to {subject}: {_why(e)}", subject=subject) from e

    async def subscribe(
        self,
        subject: str,
        handler: Handler,
        *,
        types: Any,
        queue: str | None = None,
    ) -> Subscription:
        """Call ``await handler(event, msg)`` for each message on ``subject`` (wildcards allowed).

        Messages of one subscription are handled one at a time, in order.  With
        ``queue`` set, subscribers sharing that queue name split the messages
        (each goes to one of them).  ``types`` is an Event class or a Union.
        """
        decoder_for(types)  # fail now, not on the first message, if types is wrong

        async def on_msg(msg: Msg) -> None:
            event = self._decode(msg, types)
            if event is not None:
                await self._run_handler(handler, event, msg, "process")

        return await self._subscribe(subject, queue, on_msg)

    async def _subscribe(
        self, subject: str, queue: str | None, cb: Callable[[Msg], Awaitable[None]]
    ) -> Subscription:
        try:
            raw = await self._nc.subscribe(subject, queue=queue or "", cb=cb)
        except nats.errors.Error as e:
            raise Unavailable(f"cannot subscribe to {subject}: {_why(e)}", subject=subject) from e
        return Subscription(raw, subject, queue)

    def _decode(self, msg: Msg, types: Any) -> Any:
        try:
            event = decode(msg.data, types)
        except ProtocolError as e:
            self.note_malformed(msg.subject, e, size=len(msg.data))
            return None
        self.stats.count_delivered()
        return event

    def note_malformed(self, subject: str, error: Exception, **fields: Any) -> None:
        self.stats.count_malformed(subject)
        log.warning("bus.malformed", name=self.name, subject=subject, error=str(error), **fields)

    async def _run_handler(
        self, handler: Callable[[Any, Msg], Awaitable[Any]], event: Any, msg: Msg, op: str
    ) -> tuple[bool, Any]:
        """Run a handler in a consumer span; (True, result) or (False, the exception).  Never raises."""
        try:
            with consumer_span(msg.subject, msg.headers, op):
                return True, await handler(event, msg)
        except Exception as e:
            self.stats.count_handler_error(msg.subject)
            log.exception("bus.handler_failed", name=self.name, subject=msg.subject, error=repr(e))
            return False, e

    # -- request / reply ----------------------------------------------------

    async def request(
        self,
        subject: str,
        event: Event,
        *,
        reply_types: Any,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send ``event`` and wait for one reply of ``reply_types``.

        Raises:
            Unavailable: nobody serves ``subject`` (or the connection is down).
            DeadlineExceeded: no reply within ``timeout_s``.
            FireFlyerError: the server's handler raised; the same typed error.
            ProtocolError: the reply did not decode.
        """
        try:
            msg = await self._nc.request(
                subject, encode(event), timeout=timeout_s, headers=outgoing_headers(headers)
            )
        except nats.errors.NoRespondersError as e:
            raise Unavailable(f"no service is serving {subject}", subject=subject) from e
        except nats.errors.TimeoutError as e:
            raise DeadlineExceeded(f"no reply on {subject} within {timeout_s}s", subject=subject) from e
        except nats.errors.Error as e:
            raise Unavailable(f"request on {subject} failed: {_why(e)}", subject=subject) from e
        if msg.headers and ERROR_HEADER in msg.headers:
            try:
                body = msgspec.json.decode(msg.data)
            except msgspec.DecodeError as e:
                raise ProtocolError(f"undecodable error reply on {subject}", subject=subject) from e
            raise error_from_dict(body if isinstance(body, dict) else {"message": str(body)})
        return decode(msg.data, reply_types)

    async def serve(
        self,
        subject: str,
        handler: RequestHandler,
        *,
        types: Any,
        queue: str | None = None,
    ) -> Subscription:
        """Answer requests on ``subject``: ``reply = await handler(event, msg)``.

        A handler that raises a FireFlyerError sends it back typed; any other
        exception goes back as Internal.  A request that does not decode is
        counted as malformed and answered with a ProtocolError.  Use ``queue``
        to spread requests over several replicas.
        """
        decoder_for(types)

        async def on_msg(msg: Msg) -> None:
            if not msg.reply:
                self.note_malformed(msg.subject, ProtocolError("request without a reply subject"))
                return
            try:
                event = decode(msg.data, types)
            except ProtocolError as e:
                self.note_malformed(msg.subject, e, size=len(msg.data))
                await self._reply_error(msg, e)
                return
            self.stats.count_delivered()
            ok, result = await self._run_handler(handler, event, msg, "serve")
            if not ok:
                err = (
                    result
                    if isinstance(result, FireFlyerError)
                    else Internal(f"{type(result).__name__}: {result}", subject=msg.subject)
                )
                await self._reply_error(msg, err)
                return
            try:
                data = encode(result)
            except TypeError as e:
                await self._reply_error(
                    msg, Internal(f"handler returned a non-event: {e}", subject=msg.subject)
                )
                return
            await self._reply(msg, data, None)

        return await self._subscribe(subject, queue, on_msg)

    async def _reply_error(self, msg: Msg, err: FireFlyerError) -> None:
        await self._reply(msg, _json.encode(err.to_dict()), {ERROR_HEADER: err.code})

    async def _reply(self, msg: Msg, data: bytes, headers: dict[str, str] | None) -> None:
        try:
            await self._nc.publish(msg.reply, data, headers=headers)
        except nats.errors.Error as e:  # the requester will time out; nothing else to do
            log.warning("bus.reply_failed", name=self.name, subject=msg.subject, error=repr(e))

    # -- JetStream ------------------------------------------------------------

    async def ensure_stream(
        self,
        name: str,
        subjects: Sequence[str],
        *,
        max_age_s: float | None = None,
        storage: Literal["file", "memory"] = "file",
    ) -> None:
        """Create stream ``name`` over ``subjects``, or bring an existing one up to date."""
        await jetstream.ensure_stream(self, name, subjects, max_age_s=max_age_s, storage=storage)

    async def publish_durable(
        self,
        subject: str,
        event: Event,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
    ) -> int:
        """Publish into a JetStream stream and wait for its ack; returns the stream sequence."""
        return await jetstream.publish_durable(self, subject, event, headers=headers, timeout_s=timeout_s)

    async def consume(
        self,
        stream: str,
        durable: str,
        handler: Handler,
        *,
        types: Any,
        subject_filter: str | None = None,
        ack_wait_s: float = 30.0,
        max_deliver: int = 5,
        nak_delay_s: float = 1.0,
        batch: int = 16,
        fetch_timeout_s: float = 1.0,
    ) -> jetstream.Consumer:
        """Start a durable pull consumer; see :class:`fireflyer.bus.jetstream.Consumer`."""
        consumer = jetstream.Consumer(
            self,
            stream,
            durable,
            handler,
            types=types,
            subject_filter=subject_filter,
            ack_wait_s=ack_wait_s,
            max_deliver=max_deliver,
            nak_delay_s=nak_delay_s,
            batch=batch,
            fetch_timeout_s=fetch_timeout_s,
        )
        await consumer.start()
        self._consumers.append(consumer)
        return consumer

    def forget_consumer(self, consumer: jetstream.Consumer) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)
