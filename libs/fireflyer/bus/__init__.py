"""NATS for Fire-Flyer: the connection, subject names, typed events, JetStream.

    from fireflyer.bus import Bus, Event, subject, pattern

- :mod:`~fireflyer.bus.subjects`: ``ff.<domain>.v<N>.<entity>.<id>.<event>`` builders and parser.
- :mod:`~fireflyer.bus.events`: tagged frozen msgspec event Structs and their codec.
- :mod:`~fireflyer.bus.connection`: :class:`Bus` (reconnect, pub/sub, request/reply).
- :mod:`~fireflyer.bus.jetstream`: streams and durable, ack-after-handling consumers.
- :mod:`~fireflyer.bus.outbox`: :class:`Outbox`, durable events kept locally until JetStream acks them.
- :mod:`~fireflyer.bus.server`: run a real ``nats-server`` (tests, ``ff up``).
"""

from typing import TYPE_CHECKING

from fireflyer.core.lazy import lazy_attributes

# (lazy: the events and subjects are light, and a process that only defines or encodes an
# event -- an HFReduce worker, a training rank -- must not import nats-py for them)
__getattr__ = lazy_attributes(__name__, {
    "ERROR_HEADER": "connection", "Bus": "connection", "Handler": "connection", "RequestHandler": "connection",
    "Subscription": "connection", "Event": "events", "decode": "events", "encode": "events",
    "event_tag": "events", "schema_version": "events", "Consumer": "jetstream",
    "Outbox": "outbox", "NatsServerProcess": "server", "nats_server_binary": "server", "BusStats": "stats",
    "SubjectParts": "subjects", "parse": "subjects", "pattern": "subjects", "subject": "subjects",
})

if TYPE_CHECKING:
    from .connection import ERROR_HEADER, Bus, Handler, RequestHandler, Subscription
    from .events import Event, decode, encode, event_tag, schema_version
    from .jetstream import Consumer
    from .outbox import Outbox
    from .server import NatsServerProcess, nats_server_binary
    from .stats import BusStats
    from .subjects import SubjectParts, parse, pattern, subject

__all__ = [
    "Bus",
    "BusStats",
    "Consumer",
    "ERROR_HEADER",
    "Event",
    "Handler",
    "NatsServerProcess",
    "Outbox",
    "RequestHandler",
    "SubjectParts",
    "Subscription",
    "decode",
    "encode",
    "event_tag",
    "nats_server_binary",
    "parse",
    "pattern",
    "schema_version",
    "subject",
]
