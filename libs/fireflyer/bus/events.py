"""Typed bus events: tagged, frozen msgspec Structs, encoded as JSON.

    class Heartbeat(Event, tag="node.heartbeat.v1"):
        node: str
        load: float = 0.0

    data = encode(Heartbeat(node="n3"))          # b'{"type":"node.heartbeat.v1","node":"n3",...}'
    decode(data, Heartbeat | Suspended)          # -> Heartbeat(...)

**Wire format.** JSON (``msgspec.json``), one object per message, with the tag in
the ``"type"`` field.  JSON rather than msgpack because events are small, and
operators can read them with ``nats sub 'ff.>'``; bulk data never rides NATS.

**Tags.** Every concrete event class passes a stable tag ``<name>.v<N>`` (lower
case, dotted).  The tag, not the Python class name, is the contract: classes may
be renamed or moved freely.  ``N`` is the schema version (:func:`schema_version`).

**Schema evolution.**

- Adding a field is compatible only if it has a default (old senders omit it).
- Unknown fields are ignored on decode, so old receivers accept new senders.
- Never remove, rename or retype a field, nor reuse a tag for another meaning.
- A breaking change makes a new class with tag ``<name>.v<N+1>`` published on a
  ``v<N+1>`` subject (``subject(..., version=N+1)``); during a migration the
  sender publishes both and receivers move over, then v<N> is retired.

Every event carries ``event_id`` (unique; JetStream uses it to drop duplicate
publishes) and ``sent_at`` (sender's wall clock, seconds since the epoch; for
display and latency, never for ordering).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, TypeVar

import msgspec

from fireflyer.core.errors import ProtocolError

__all__ = [
    "Event",
    "encode",
    "decode",
    "decoder_for",
    "event_tag",
    "schema_version",
    "TAG_FIELD",
]

TAG_FIELD = "type"
_TAG = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*\.v([1-9][0-9]*)")

E = TypeVar("E", bound="Event")


def _new_id() -> str:
    return uuid.uuid4().hex


class Event(msgspec.Struct, tag=True, tag_field=TAG_FIELD, frozen=True, kw_only=True):
    """Base of every bus event; subclass with ``tag="<name>.v<N>"``."""

    event_id: str = msgspec.field(default_factory=_new_id)
    sent_at: float = msgspec.field(default_factory=time.time)


def event_tag(cls: type[Event] | Event) -> str:
    """The wire tag of an event class; TypeError if it is not ``<name>.v<N>``."""
    if isinstance(cls, Event):
        cls = type(cls)
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise TypeError(
            f"event class {cls.__qualname__} needs a stable tag of the form '<name>.v<N>', "
            f"e.g. class {cls.__name__}(Event, tag='node.heartbeat.v1'); it has {tag!r}"
        )
    return tag


def schema_version(cls: type[Event] | Event) -> int:
    """``N`` of the class's ``<name>.v<N>`` tag."""
    m = _TAG.fullmatch(event_tag(cls))
    assert m is not None  # event_tag validated it
    return int(m.group(1))


# One encoder for the process; encoders are reusable and thread-safe.
_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def encode(event: Event) -> bytes:
    """Serialize one event (JSON, tag in ``"type"``)."""
    if not isinstance(event, Event):
        raise TypeError(f"expected a fireflyer.bus Event, got {type(event).__name__}")
    event_tag(event)  # refuse classes without a stable tag before they reach the wire
    return _ENCODER.encode(event)


def _members(types: Any) -> tuple[type[Event], ...]:
    args = getattr(types, "__args__", None)
    return tuple(args) if args else (types,)


def decoder_for(types: Any) -> msgspec.json.Decoder[Any]:
    """The cached decoder for an Event class or a Union of them."""
    dec = _DECODERS.get(types)
    if dec is None:
        for t in _members(types):
            if not (isinstance(t, type) and issubclass(t, Event)):
                raise TypeError(f"decode types must be Event subclasses, got {t!r}")
            event_tag(t)
        dec = msgspec.json.Decoder(types)
        _DECODERS[types] = dec
    return dec


def decode(data: bytes | bytearray | memoryview, types: type[E] | Any) -> E:
    """Parse one event of one of ``types`` (a class or a ``Union``/``A | B``).

    Raises:
        ProtocolError: not JSON, an unknown tag, or fields of the wrong type; the
            message names what was wrong (msgspec's path, e.g. ``$.node``).
    """
    try:
        return decoder_for(types).decode(data)  # type: ignore[no-any-return]
    except msgspec.DecodeError as e:  # ValidationError is a DecodeError
        raise ProtocolError(f"malformed event: {e}", size=len(data)) from e
