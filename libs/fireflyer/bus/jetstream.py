"""JetStream: streams for subjects whose messages must not be lost, and durable consumers.

Use through :class:`~fireflyer.bus.Bus` (``ensure_stream``, ``publish_durable``,
``consume``).  Delivery is *at least once*: a message is acknowledged only after
its handler returned, so a crash, a lost ack or a NATS restart can deliver it
again.  Handlers must therefore be idempotent (key effects on ``event.event_id``
or on a version carried in the event).

- A handler that raises: the message is nak'ed and redelivered after a delay
  that doubles per attempt (from ``nak_delay_s``); after ``max_deliver``
  attempts it is terminated, logged as ``bus.gave_up`` and counted.
- A payload that does not decode: terminated at once (redelivery cannot fix
  it), logged as ``bus.malformed`` and counted.
- A handler that needs longer than ``ack_wait_s`` gets the message redelivered
  to someone else meanwhile; set ``ack_wait_s`` above the slowest handler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from fireflyer.core.errors import FailedPrecondition, NotFound, ProtocolError, Unavailable
from fireflyer.core.log import get_logger

from .backoff import backoff_delay
from .events import Event, decode, decoder_for, encode
from .stats import BusStats
from .tracing import outgoing_headers

__all__ = ["Consumer", "JetStreamHost", "ensure_stream", "publish_durable", "MSG_ID_HEADER"]

#: a durable consumer's handler: ``await handler(event, msg)`` (as :data:`fireflyer.bus.Handler`)
Handler = Callable[[Any, Msg], Awaitable[None]]


class JetStreamHost(Protocol):
    """What these helpers need of the :class:`~fireflyer.bus.Bus` that runs them (the bus is
    above this module: it calls in, and hands itself over as this)."""

    stats: BusStats

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def is_closed(self) -> bool: ...

    def note_malformed(self, subject: str, error: Exception, **fields: Any) -> None: ...

    async def _run_handler(self, handler: Callable[[Any, Msg], Awaitable[Any]], event: Any, msg: Msg,
                           op: str) -> tuple[bool, Any]: ...

    def forget_consumer(self, consumer: Consumer) -> None: ...

log = get_logger(__name__)


def _why(e: BaseException) -> str:
    # many nats-py errors and TimeoutError have an empty str(); name the type then
    return str(e) or type(e).__name__


#: JetStream drops a second publish with the same id within the stream's
#: duplicate window, which makes publish retries safe
MSG_ID_HEADER = "Nats-Msg-Id"
_ALREADY_IN_USE = 10058  # JetStream err_code: stream name already in use


def _unavailable(what: str, e: BaseException, **fields: Any) -> Unavailable:
    return Unavailable(f"{what}: {_why(e)}; is JetStream enabled (nats-server -js)?", **fields)


async def ensure_stream(
    bus: JetStreamHost,
    name: str,
    subjects: Sequence[str],
    *,
    max_age_s: float | None = None,
    storage: Literal["file", "memory"] = "file",
) -> None:
    """Create the stream, or update its subjects/max age if they changed (idempotent).

    Several processes may call this at start-up at once; the loser of the
    creation race falls through to the update check.  Storage cannot change on
    a live stream; a mismatch is logged and left alone.
    """
    js = bus.js
    want_age = max_age_s or 0.0
    try:
        try:
            info = await js.stream_info(name)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(
                    name=name,
                    subjects=list(subjects),
                    storage=api.StorageType(storage),
                    max_age=want_age or None,
                )
                log.info("bus.stream_created", stream=name, subjects=list(subjects), storage=storage)
                return
            except nats.js.errors.BadRequestError as e:
                if e.err_code != _ALREADY_IN_USE:
                    raise
                info = await js.stream_info(name)
        cur = info.config
        if set(cur.subjects or ()) != set(subjects) or abs((cur.max_age or 0.0) - want_age) > 1e-3:
            await js.update_stream(cur.evolve(subjects=list(subjects), max_age=want_age or None))
            log.info("bus.stream_updated", stream=name, subjects=list(subjects), max_age_s=want_age)
        have = str(getattr(cur.storage, "value", cur.storage) or "file")  # nats-py gives str or enum
        if have != storage:
            log.warning("bus.stream_storage_differs", stream=name, have=have, want=storage)
    except nats.js.errors.APIError as e:
        raise FailedPrecondition(
            f"JetStream refused stream {name!r}: {e.description}", stream=name, err_code=e.err_code
        ) from e
    except (nats.errors.Error, TimeoutError) as e:
        raise _unavailable(f"cannot set up stream {name!r}", e, stream=name) from e


async def publish_durable(
    bus: JetStreamHost,
    subject: str,
    event: Event,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
) -> int:
    """Publish and wait until JetStream has stored the message; return its stream sequence.

    Retries until ``timeout_s`` while the connection or JetStream is not ready
    (a NATS restart); ``event.event_id`` goes in ``Nats-Msg-Id`` so a retry of a
    publish that did land is dropped by the server, not stored twice.

    Raises:
        NotFound: no stream captures ``subject`` (after retrying to ``timeout_s``).
        Unavailable: no ack within ``timeout_s``.
        FailedPrecondition: JetStream refused the message (limits).
    """
    data = encode(event)
    hdrs = outgoing_headers(headers) or {}
    hdrs[MSG_ID_HEADER] = event.event_id
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            ack = await bus.js.publish(subject, data, timeout=max(0.05, min(remaining, 1.0)), headers=hdrs)
            return int(ack.seq)
        except nats.js.errors.APIError as e:
            raise FailedPrecondition(
                f"JetStream refused a message on {subject}: {e.description}",
                subject=subject,
                err_code=e.err_code,
            ) from e
        except nats.js.errors.NoStreamResponseError as e:
            last: BaseException = e
            no_stream = True
        except (nats.errors.Error, TimeoutError) as e:
            if bus.is_closed:
                raise Unavailable(f"cannot publish to {subject}: the bus is closed", subject=subject) from e
            last, no_stream = e, False
        attempt += 1
        if time.monotonic() + 0.01 >= deadline:
            if no_stream:
                raise NotFound(
                    f"no JetStream stream captures {subject} (or JetStream is not ready); "
                    "call ensure_stream for it first",
                    subject=subject,
                ) from last
            raise Unavailable(
                f"no JetStream ack for {subject} within {timeout_s}s: {_why(last)}", subject=subject
            ) from last
        await asyncio.sleep(min(backoff_delay(attempt, 0.02, 0.5), max(0.0, deadline - time.monotonic())))


class Consumer:
    """A durable pull consumer with a background fetch loop (see the module doc).

    Stopping it keeps the durable consumer on the server: messages published
    meanwhile wait there and are delivered when a consumer with the same
    ``durable`` name starts again, in this process or another.
    """

    def __init__(
        self,
        bus: JetStreamHost,
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
    ) -> None:
        decoder_for(types)
        if max_deliver < 1:
            raise ValueError("max_deliver must be >= 1")
        self.bus = bus
        self.stream = stream
        self.durable = durable
        self.handler = handler
        self.types = types
        self.subject_filter = subject_filter
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.nak_delay_s = nak_delay_s
        self.batch = batch
        self.fetch_timeout_s = fetch_timeout_s
        self._psub: JetStreamContext.PullSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Create or update the durable consumer on the server, then start fetching."""
        config = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            filter_subject=self.subject_filter,
        )
        js = self.bus.js
        try:
            await js.add_consumer(self.stream, config)
            self._psub = await js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
        except nats.js.errors.NotFoundError as e:
            raise NotFound(
                f"no JetStream stream {self.stream!r}; call ensure_stream first", stream=self.stream
            ) from e
        except nats.js.errors.APIError as e:
            raise FailedPrecondition(
                f"JetStream refused consumer {self.durable!r} on {self.stream!r}: {e.description}",
                stream=self.stream,
                durable=self.durable,
            ) from e
        except (nats.errors.Error, TimeoutError) as e:
            raise _unavailable(f"cannot create consumer {self.durable!r}", e, stream=self.stream) from e
        self._task = asyncio.create_task(self._run(), name=f"bus.consume.{self.stream}.{self.durable}")
        log.info("bus.consumer_started", stream=self.stream, durable=self.durable, filter=self.subject_filter)

    async def _run(self) -> None:
        assert self._psub is not None
        failures = 0
        while not self._stopping:
            try:
                msgs = await self._psub.fetch(self.batch, timeout=self.fetch_timeout_s)
            except TimeoutError:  # nothing to do (or the server is away): ask again
                continue
            except (nats.errors.Error, OSError) as e:
                if self._stopping or self.bus.is_closed:
                    break
                failures += 1
                log.debug("bus.fetch_failed", stream=self.stream, durable=self.durable, error=repr(e))
                # a fetch loop must not spin while the server is restarting
                await asyncio.sleep(backoff_delay(failures, 0.05, 2.0))
                continue
            failures = 0
            # a fetched batch is always handled to the end, even when stopping,
            # so nothing is left delivered-but-unacknowledged until ack_wait
            for m in msgs:
                await self._handle(m)

    async def _handle(self, m: Msg) -> None:
        try:
            delivered = m.metadata.num_delivered
            seq = m.metadata.sequence.stream
        except Exception:  # not a JetStream message (cannot happen on a pull subscription)
            delivered, seq = 1, 0
        try:
            event = decode(m.data, self.types)
        except ProtocolError as e:
            self.bus.note_malformed(m.subject, e, stream=self.stream, durable=self.durable, seq=seq)
            await self._settle(m.term(), m, "term")
            return
        self.bus.stats.count_delivered()
        ok, result = await self.bus._run_handler(self.handler, event, m, "process")
        if m.is_acked:  # the handler acked, nak'ed or terminated it itself
            return
        if ok:
            await self._settle(m.ack(), m, "ack")
        elif delivered >= self.max_deliver:
            self.bus.stats.gave_up_total += 1
            log.error(
                "bus.gave_up",
                stream=self.stream,
                durable=self.durable,
                subject=m.subject,
                seq=seq,
                attempts=delivered,
                error=repr(result),
            )
            await self._settle(m.term(), m, "term")
        else:
            delay = backoff_delay(delivered - 1, self.nak_delay_s, max(self.nak_delay_s, 30.0))
            await self._settle(m.nak(delay=delay), m, "nak")

    async def _settle(self, op: Awaitable[None], m: Msg, what: str) -> None:
        try:
            await op
        except nats.errors.Error as e:
            # connection lost: the server redelivers after ack_wait, which is the
            # at-least-once contract anyway
            log.warning("bus.settle_failed", stream=self.stream, durable=self.durable, op=what, error=repr(e))

    async def info(self) -> api.ConsumerInfo:
        """The server's view: ``num_pending``, ``num_ack_pending``, ``num_redelivered`` ..."""
        try:
            return await self.bus.js.consumer_info(self.stream, self.durable)
        except (nats.errors.Error, TimeoutError) as e:
            raise _unavailable(f"cannot read consumer {self.durable!r}", e, stream=self.stream) from e

    async def stop(self, timeout_s: float | None = None) -> None:
        """Finish the batch in hand, stop fetching, unsubscribe (the durable stays)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            # the fetch in flight returns within fetch_timeout_s; waiting for it
            # (instead of cancelling) leaves no pull request behind on the server
            wait = self.fetch_timeout_s + 5.0 if timeout_s is None else timeout_s
            done, _ = await asyncio.wait({task}, timeout=wait)
            if not done:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._psub is not None:
            psub, self._psub = self._psub, None
            try:
                await psub.unsubscribe()
            except (nats.errors.Error, TimeoutError) as e:
                log.debug("bus.unsubscribe_failed", stream=self.stream, durable=self.durable, error=repr(e))
        self.bus.forget_consumer(self)
        log.info("bus.consumer_stopped", stream=self.stream, durable=self.durable)

    def __repr__(self) -> str:
        return f"Consumer(stream={self.stream!r}, durable={self.durable!r}, running={self.running})"
