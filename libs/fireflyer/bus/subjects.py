"""NATS subject names: ``ff.<domain>.v<version>.<entity>.<id>.<event>``.

    subject("node", "node", "n3", "heartbeat")        # ff.node.v1.node.n3.heartbeat
    pattern("node", event="heartbeat")                # ff.node.v1.*.*.heartbeat
    pattern("sched", entity="task", ident=">")        # ff.sched.v1.task.>
    parse("ff.node.v1.node.n3.heartbeat").ident       # "n3"

A user's own traffic (its job's telemetry, the aborts of its communicators) lives in the
user's namespace, the only subjects a user's NATS credential may use (``fireflyer.bus.auth``)::

    owned("bob", subject("coord", "comm", "j1-main", "telemetry"))
        # ff.user.bob.coord.v1.comm.j1-main.telemetry
    owned_pattern(pattern("coord", entity="comm", event="telemetry"))
        # ff.user.*.coord.v1.comm.*.telemetry   (what a service subscribes to)
    owner_of("ff.user.bob.coord.v1.comm.j1-main.telemetry")    # "bob"

Pure functions, no I/O.  Every token is checked so a stray ``.`` in an id (a
hostname such as ``gpu01.rack2``) fails loudly here instead of silently landing
on another subject.
"""

from __future__ import annotations

import re

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["PREFIX", "USER_SCOPE", "SubjectParts", "subject", "pattern", "parse", "check_token", "user_token",
           "user_namespace", "owned", "owned_pattern", "owner_of", "strip_owner"]

PREFIX = "ff"
#: ``ff.user.<user>.`` starts every subject owned by a user
USER_SCOPE = "user"
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


def user_token(user: str) -> str:
    """User name ``user`` as one subject token: ``.`` (allowed in user names) becomes ``~``
    (never in one), so distinct users get distinct tokens."""
    return check_token("user", user.replace(".", "~"))


def user_namespace(user: str) -> str:
    """``ff.user.<user>``: the subjects below it belong to ``user``."""
    return f"{PREFIX}.{USER_SCOPE}.{user_token(user)}"


def owned(user: str, value: str) -> str:
    """Subject (or pattern) ``ff.<rest>`` moved into ``user``'s namespace: ``ff.user.<user>.<rest>``."""
    head, sep, rest = value.partition(".")
    if head != PREFIX or not sep:
        raise InvalidArgument(f"not a Fire-Flyer subject: {value!r}", subject=value)
    return f"{user_namespace(user)}.{rest}"


def owned_pattern(value: str) -> str:
    """Pattern ``ff.<rest>`` in every user's namespace: ``ff.user.*.<rest>``."""
    head, sep, rest = value.partition(".")
    if head != PREFIX or not sep:
        raise InvalidArgument(f"not a Fire-Flyer subject pattern: {value!r}", subject=value)
    return f"{PREFIX}.{USER_SCOPE}.*.{rest}"


def owner_of(value: str) -> str | None:
    """The user token of a subject in a user's namespace, None for a cluster subject."""
    tokens = value.split(".", 3)
    if len(tokens) == 4 and tokens[0] == PREFIX and tokens[1] == USER_SCOPE:
        return tokens[2]
    return None


def strip_owner(value: str) -> str:
    """The cluster-form subject of ``value``: ``ff.user.<u>.<rest>`` -> ``ff.<rest>``."""
    if owner_of(value) is None:
        return value
    return f"{PREFIX}.{value.split('.', 3)[3]}"
