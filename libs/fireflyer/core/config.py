"""Settings every service process shares.

A service's own settings class subclasses :class:`ServiceSettings` and adds a
section of its own (``class MgmtdSettings(ServiceSettings): mgmtd: MgmtdSection``).
Environment names follow ``FF_<SECTION>_<FIELD>`` (see ``core.settings``)::

    FF_STATE_DIR  FF_GRACE_S  FF_LOG_LEVEL  FF_TOKEN
    FF_NATS_URL   FF_RPC_HOST FF_RPC_PORT   FF_AUTH_TOKENS_FILE
    FF_TELEMETRY_SPAN_FILE  FF_METRICS_PORT ...
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "NatsSettings",
    "RpcSettings",
    "AuthSettings",
    "TelemetrySettings",
    "MetricsSettings",
    "ServiceSettings",
]


class NatsSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: one URL or several, comma separated (a NATS cluster)
    url: str = "nats://127.0.0.1:4222"
    connect_timeout_s: float = 2.0
    #: first reconnect wait; doubles per failed attempt up to max_reconnect_wait_s (1 s: a restarted
    #: server is found again within about a second of listening)
    reconnect_wait_s: float = 0.25
    max_reconnect_wait_s: float = 1.0
    #: -1: keep trying for ever (a service outlives a NATS restart)
    max_reconnect_attempts: int = -1
    #: NATS credentials file (outside local mode)
    credentials: str | None = None
    drain_timeout_s: float = 5.0


class RpcSettings(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    #: 0 picks a free port (the runtime logs and reports the bound one)
    port: int = 0
    max_message_mb: int = 64
    keepalive_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    #: deadline a client applies to a call that sets none
    default_deadline_s: float = 30.0
    #: longest wait between a client channel's reconnect attempts.  grpc's own default
    #: (120 s, growing 1.6x per failed attempt) fails every call fast for up to that long
    #: after the server is back; a service that restarts in seconds must be seen in seconds.
    reconnect_backoff_max_s: float = 2.0


class AuthSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: JSON file mapping bearer tokens to users and roles (``ff up`` writes one)
    tokens_file: str | None = None
    #: when False every call runs as an anonymous admin (single-user dev only)
    enabled: bool = True
    #: how often (at most) a service stats the tokens file to pick up ``ff admin users`` changes
    reload_interval_s: float = 1.0


class TelemetrySettings(msgspec.Struct, frozen=True, kw_only=True):
    #: OTLP/gRPC endpoint; OTEL_EXPORTER_OTLP_ENDPOINT also sets it
    otlp_endpoint: str | None = None
    #: JSON-lines span file; default <state_dir>/spans.jsonl
    span_file: str | None = None
    enabled: bool = True


class MetricsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The Prometheus endpoint (``GET /metrics``, fireflyer.telemetry.metrics; docs/metrics.md)."""

    #: None: no endpoint (metrics are still kept); 0: a free port (logged); ``ff up`` sets one per process
    port: int | None = None
    #: None: the gRPC server's host (rpc.host)
    host: str | None = None


class ServiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: instance name; default service@host:pid
    instance: str = ""
    state_dir: str = ".ff"
    #: how long in-flight RPCs may run after SIGTERM before they are cancelled
    grace_s: float = 10.0
    log_level: str = "info"
    log_format: Literal["json", "text"] = "json"
    #: bearer token this process presents when it calls other services
    token: str | None = None
    nats: NatsSettings = msgspec.field(default_factory=NatsSettings)
    rpc: RpcSettings = msgspec.field(default_factory=RpcSettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    telemetry: TelemetrySettings = msgspec.field(default_factory=TelemetrySettings)
    metrics: MetricsSettings = msgspec.field(default_factory=MetricsSettings)
