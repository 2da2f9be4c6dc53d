"""NATS subject names: ``ff.<domain>.v<version>.<entity>.<id>.<event>``.

    subject("node", "node", "n3", "heartbeat")        # ff.node.v1.node.n3.heartbeat
    pattern("node", event="heartbeat")                # ff.node.v1.*.*.heartbeat
    pattern("sched", entity="task", ident=">")        # ff.sched.v1.task.>
    parse("ff.node.v1.node.n3.heartbeat").ident       # "n3"

Pure functions, no I/O.  Every token is checked so a stray ``.`` in an id (a
hostname such as ``gpu01.rack2``) fails loudly here instead of silently landing
on another subject.
"""

from __future__ import annotations

import re

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["PREFIX", "SubjectParts", "subject", "pattern", "parse", "check_token"]

PREFIX = "ff"
_BAD = re.compile(r"[.*>\s]")
_VERSION = re.compile(r"v([1-9][0-9]*)")


class SubjectParts(msgspec.Struct, frozen=True, kw_only=True):
    """The tokens of a concrete Fire-Flyer subject."""

    domain: str
    version: int
    entity: str
    ident: str
    event: str


def check_token(name: str, value: str) -> str:
    """Return ``value`` if it is a valid literal subject token, else raise InvalidArgument."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"subject token {name!r} must be a non-empty string, got {value!r}", token=name)
    if _BAD.search(value):
        raise InvalidArgument(
            f"subject token {name!r} must not contain '.', '*', '>' or whitespace, got {value!r}",
            token=name,
            value=value,
        )
    return value


def _check_version(version: int) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgument(f"subject version must be an int >= 1, got {version!r}", token="version")
    return version


def subject(domain: str, entity: str, ident: str | int, event: str, *, version: int = 1) -> str:
    """The concrete subject for one event about one entity (``ident`` may be an int id)."""
    ident = str(ident) if isinstance(ident, int) and not isinstance(ident, bool) else ident
    return ".".join(
        (
            PREFIX,
            check_token("domain", domain),
            f"v{_check_version(version)}",
            check_token("entity", entity),
            check_token("ident", ident),
            check_token("event", event),
        )
    )


def _wild(name: str, value: str, *, tail: bool) -> str:
    if value == "*" or (tail and value == ">"):
        return value
    return check_token(name, value)


def pattern(
    domain: str,
    *,
    entity: str = "*",
    ident: str = "*",
    event: str = "*",
    version: int = 1,
) -> str:
    """A subscription pattern; each of entity/ident/event may be ``*``.

    ``>`` (everything below) is allowed as the last token given: ``entity=">"``
    or ``ident=">"`` ends the pattern there.
    """
    head = [PREFIX, check_token("domain", domain), f"v{_check_version(version)}"]
    for name, value, rest in (("entity", entity, (ident, event)), ("ident", ident, (event,))):
        if value == ">":
            if any(r != "*" for r in rest):
                raise InvalidArgument(
                    f"'>' in {name!r} must be the last token; later tokens were given", token=name
                )
            return ".".join(head + [">"])
        head.append(_wild(name, value, tail=False))
    head.append(_wild("event", event, tail=True))
    return ".".join(head)


def parse(value: str) -> SubjectParts:
    """Split a concrete subject into its parts; InvalidArgument if it is not one of ours."""
    tokens = value.split(".")
    if len(tokens) != 6 or tokens[0] != PREFIX:
        raise InvalidArgument(
            f"not a Fire-Flyer subject (want ff.<domain>.v<N>.<entity>.<id>.<event>): {value!r}",
            subject=value,
        )
    _, domain, ver, entity, ident, event = tokens
    m = _VERSION.fullmatch(ver)
    if not m:
        raise InvalidArgument(
            f"bad version token {ver!r} in subject {value!r}", subject=value, token="version"
        )
    for name, tok in (("domain", domain), ("entity", entity), ("ident", ident), ("event", event)):
        check_token(name, tok)
    return SubjectParts(domain=domain, version=int(m.group(1)), entity=entity, ident=ident, event=event)
