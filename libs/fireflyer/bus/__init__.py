"""NATS for Fire-Flyer: the connection, subject names, typed events, JetStream.

    from fireflyer.bus import Bus, Event, subject, pattern

- :mod:`~fireflyer.bus.subjects`: ``ff.<domain>.v<N>.<entity>.<id>.<event>`` builders and parser.
- :mod:`~fireflyer.bus.events`: tagged frozen msgspec event Structs and their codec.
- :mod:`~fireflyer.bus.connection`: :class:`Bus` (reconnect, pub/sub, request/reply).
- :mod:`~fireflyer.bus.jetstream`: streams and durable, ack-after-handling consumers.
- :mod:`~fireflyer.bus.server`: run a real ``nats-server`` (tests, ``ff up``).
"""

from .connection import ERROR_HEADER, Bus, Handler, RequestHandler, Subscription
from .events import Event, decode, encode, event_tag, schema_version
from .jetstream import Consumer
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
