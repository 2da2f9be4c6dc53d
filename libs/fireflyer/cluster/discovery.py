"""Finding the cluster: one precedence for every client (DESIGN.md §3, "Finding the cluster").

    from fireflyer.cluster.discovery import find_cluster
    c = find_cluster(need=("ckpt",))      # raises NoClusterFound when there is none
    c.ckpt[0], c.token

Each field is taken from the first of

1. the explicit argument (``meta=``, ``token=`` ...; a CLI's ``--address`` / ``--token``);
2. the environment: ``FF_MGMTD_ADDR``, ``FF_META_ADDR``, ``FF_COORD_ADDR``, ``FF_CKPT_ADDR``,
   ``FF_SCHED_ADDR``, ``FF_HEALTH_ADDR`` (comma separated), ``FF_NATS_URL`` and ``FF_TOKEN`` (an empty value counts
   as unset);
3. the local cluster that ``ff up`` recorded in a state dir: ``state_dir=`` (``--state-dir``),
   else ``FF_STATE_DIR``, else ``.ff`` in the working directory.  Its ``cluster.json`` gives the
   addresses of the services it runs, its ``tokens.json`` the token of ``role`` (``user`` unless
   asked otherwise; the format is in ``docs/tokens.md``).

The state dir is only read when a field is still missing after 1 and 2.  ``need`` names what the
caller cannot work without (services, and ``"token"``); if one of them is still missing,
:class:`~fireflyer.core.errors.NoClusterFound` says how to point the client at a cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec

from fireflyer.core.errors import NoClusterFound

__all__ = ["Cluster", "find_cluster", "state_dir_of", "SERVICES", "ADDR_ENV", "DEFAULT_STATE_DIR",
           "NO_CLUSTER_HELP", "parse_addresses"]

DEFAULT_STATE_DIR = ".ff"

#: the services a client may look for, and the variable that names each
ADDR_ENV: dict[str, str] = {
    "mgmtd": "FF_MGMTD_ADDR",
    "meta": "FF_META_ADDR",
    "coord": "FF_COORD_ADDR",
    "ckpt": "FF_CKPT_ADDR",
    "sched": "FF_SCHED_ADDR",
    "health": "FF_HEALTH_ADDR",
    "nats": "FF_NATS_URL",
}
SERVICES = tuple(ADDR_ENV)
#: the process name ``ff up`` records for each service (cluster.json ``processes[].name``)
_RECORD_NAME = {"mgmtd": "mgmtd", "meta": "meta", "coord": "coord", "ckpt": "checkpoint", "sched": "scheduler",
                "health": "health"}

#: how to point a client at a cluster (the tail of every NoClusterFound message)
NO_CLUSTER_HELP = ("pass --state-dir DIR, set FF_STATE_DIR, run `ff up` here (.ff), "
                   "or set FF_META_ADDR/FF_MGMTD_ADDR/FF_CKPT_ADDR/FF_COORD_ADDR/FF_SCHED_ADDR and FF_TOKEN")


def parse_addresses(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"a:1, b:2"`` or ``["a:1", "b:2"]`` -> ``("a:1", "b:2")``; None or empty -> ``()``."""
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(a.strip() for a in items if a and a.strip())


class Cluster(msgspec.Struct, frozen=True, kw_only=True):
    """Where the services are and the token to call them with; see the module doc.

    Addresses are tuples (a service may run replicas); ``state_dir`` is the state dir whose
    ``cluster.json`` was read (None when arguments and the environment gave everything, or when
    there was no local cluster)."""

    mgmtd: tuple[str, ...] = ()
    meta: tuple[str, ...] = ()
    coord: tuple[str, ...] = ()
    ckpt: tuple[str, ...] = ()
    sched: tuple[str, ...] = ()
    health: tuple[str, ...] = ()
    nats: str | None = None
    token: str | None = None
    state_dir: str | None = None

    def first(self, service: str) -> str | None:
        """The first address of ``service`` (``nats``: its URL), or None."""
        value = getattr(self, service)
        if isinstance(value, tuple):
            return value[0] if value else None
        return value or None

    def env(self) -> dict[str, str]:
        """The ``FF_*`` variables that hand this cluster to a child process (only what is known)."""
        out: dict[str, str] = {}
        for svc, var in ADDR_ENV.items():
            value = getattr(self, svc)
            text = ",".join(value) if isinstance(value, tuple) else (value or "")
            if text:
                out[var] = text
        if self.token:
            out["FF_TOKEN"] = self.token
        if self.state_dir:
            out["FF_STATE_DIR"] = self.state_dir
        return out


def state_dir_of(state_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The state dir a client looks in: ``state_dir``, else ``FF_STATE_DIR``, else ``./.ff`` (absolute)."""
    environ = os.environ if env is None else env
    return Path(state_dir or environ.get("FF_STATE_DIR") or DEFAULT_STATE_DIR).absolute()


def find_cluster(state_dir: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None,
                 need: Iterable[str] = (), role: str = "user", live_only: bool = False,
                 mgmtd: str | Sequence[str] | None = None, meta: str | Sequence[str] | None = None,
                 coord: str | Sequence[str] | None = None, ckpt: str | Sequence[str] | None = None,
                 sched: str | Sequence[str] | None = None, health: str | Sequence[str] | None = None,
                 nats: str | None = None,
                 token: str | None = None) -> Cluster:
    """The cluster by the one precedence (arguments, ``FF_*``, the local cluster); see the module doc.

    ``need``: names of :data:`SERVICES` and/or ``"token"`` that must be found, else
    :class:`NoClusterFound`.  ``role``: whose token to take from ``tokens.json`` (``user``, or
    ``admin`` for operator commands; a file without that role gives no token).  ``token=""`` is an
    explicit "no token".  ``live_only``: skip recorded processes that are no longer running (a
    cluster that crashed without ``ff down``).
    """
    environ = os.environ if env is None else env
    needed = set(need)
    unknown = needed - set(SERVICES) - {"token"}
    if unknown:
        raise ValueError(f"find_cluster: unknown need {sorted(unknown)} (known: {', '.join(SERVICES)}, token)")
    given = {"mgmtd": mgmtd, "meta": meta, "coord": coord, "ckpt": ckpt, "sched": sched, "health": health}
    found: dict[str, tuple[str, ...]] = {}
    for svc, value in given.items():
        found[svc] = parse_addresses(value) or parse_addresses(environ.get(ADDR_ENV[svc]))
    nats_url = nats or environ.get("FF_NATS_URL") or None
    tok = token if token is not None else (environ.get("FF_TOKEN") or None)

    missing_before = [s for s in found if not found[s]] + ([] if nats_url else ["nats"]) + \
        ([] if tok is not None else ["token"])
    used_dir: str | None = None
    root = state_dir_of(state_dir, environ)
    record_found = False
    if missing_before:
        from fireflyer.cluster.records import StatePaths, read_record, read_tokens

        paths = StatePaths(root)
        record = read_record(paths)
        if record is not None:
            record_found = True
            used_dir = str(paths.root)
            procs = [p for p in record.processes if p.address]
            if live_only:
                from fireflyer.cluster.procs import alive

                procs = [p for p in procs if alive(p.pid, p.start_ticks)]
            for svc in found:
                if not found[svc]:
                    found[svc] = tuple(p.address for p in procs if p.name == _RECORD_NAME[svc])
            if not nats_url and record.nats.url:
                nats_url = record.nats.url
            if tok is None:
                tokens_path = Path(record.tokens_file) if record.tokens_file else paths.tokens
                if tokens_path.exists():
                    entry = read_tokens(tokens_path).for_role(role)
                    if entry is not None:
                        tok = entry.token
    cluster = Cluster(mgmtd=found["mgmtd"], meta=found["meta"], coord=found["coord"], ckpt=found["ckpt"],
                      sched=found["sched"], health=found["health"], nats=nats_url, token=tok, state_dir=used_dir)
    missing = sorted(n for n in needed if (not cluster.token if n == "token" else not cluster.first(n)))
    if missing:
        raise _no_cluster(missing, root, record_found, role)
    return cluster


def _no_cluster(missing: list[str], root: Path, record_found: bool, role: str) -> NoClusterFound:
    what = ", ".join(f"a {role} token" if m == "token" else f"{m} ({ADDR_ENV[m]})" for m in missing)
    if not record_found:
        return NoClusterFound(f"no Fire-Flyer cluster found (needed {what}; no {root}/cluster.json): "
                              f"{NO_CLUSTER_HELP}", missing=",".join(missing), state_dir=str(root))
    if missing == ["token"]:
        return NoClusterFound(f"no {role} token for the cluster under {root} (its tokens.json has none): "
                              "pass --token or set FF_TOKEN", missing="token", state_dir=str(root))
    return NoClusterFound(f"the Fire-Flyer cluster under {root} runs no {what}: add the service to its "
                          f"cluster file, or {NO_CLUSTER_HELP}", missing=",".join(missing), state_dir=str(root))
