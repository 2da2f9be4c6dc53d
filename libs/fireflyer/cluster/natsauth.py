"""The managed nats-server's config: users and permissions from the tokens file (docs/nats-auth.md).

    <state>/nats.conf        what ``ff up`` starts nats-server with (``-c``): includes the next file
    <state>/nats-auth.conf   the ``authorization`` block, one NATS user per usable token (0600)

Both sit beside ``tokens.json``.  ``ff up`` writes them before it starts NATS, so no client ever
connects anonymously; ``ff admin users add|revoke`` rewrites ``nats-auth.conf`` and sends the
running nats-server SIGHUP (its pid from its own pid file, ``nats.pid``), which re-reads it: a
revoked token's next connect is refused at once.  A NATS restarted with the command line
``cluster.json`` records reads the same ``nats.conf``.  The user and permission scheme is
:mod:`fireflyer.bus.auth`'s.

A deployment (compose, k8s) makes the same file from its tokens secret and mounts it beside
``deploy/nats.conf``, which includes it::

    python -m fireflyer.cluster.natsauth TOKENS_JSON NATS_AUTH_CONF
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fireflyer.bus.auth import write_auth_config
from fireflyer.core.errors import FireFlyerError
from fireflyer.core.log import get_logger
from fireflyer.rpc.auth import TokenEntry, read_token_entries

from .procs import cmdline, read_pid_file

__all__ = ["NATS_CONF", "NATS_AUTH_CONF", "NATS_PID", "main_config", "write_nats_config", "sync_nats_auth", "main"]

log = get_logger(__name__)

NATS_CONF = "nats.conf"
NATS_AUTH_CONF = "nats-auth.conf"
#: nats-server's own pid file (records.StatePaths.nats_pid)
NATS_PID = "nats.pid"


def main_config() -> str:
    """The text of ``nats.conf``: listen address, port and store stay on the command line."""
    return ("# written by ff up (docs/nats-auth.md): the users are in nats-auth.conf, rewritten by\n"
            "# ff admin users add|revoke; there is no anonymous access\n"
            f'include "{NATS_AUTH_CONF}"\n')


def write_nats_config(state_dir: Path, entries: Sequence[TokenEntry], *, now: float | None = None) -> Path:
    """Write ``nats.conf`` and ``nats-auth.conf`` under ``state_dir``; the path of ``nats.conf``."""
    write_auth_config(state_dir / NATS_AUTH_CONF, entries, now=time.time() if now is None else now)
    conf = state_dir / NATS_CONF
    conf.write_text(main_config())
    os.chmod(conf, 0o600)
    return conf


def _is_nats_server(pid: int) -> bool:
    argv = cmdline(pid)
    return argv is not None and bool(argv) and Path(argv[0]).name.startswith("nats-server")


def sync_nats_auth(tokens_file: Path, entries: Sequence[TokenEntry], *, now: float | None = None) -> bool:
    """After the tokens file changed: rewrite the NATS users beside it and make its NATS re-read them.

    Only where ``ff up`` made a NATS config (a ``nats-auth.conf`` beside ``tokens_file``);
    True when a running nats-server was told to reload.
    """
    state_dir = tokens_file.parent
    if not (state_dir / NATS_AUTH_CONF).exists():
        return False
    write_auth_config(state_dir / NATS_AUTH_CONF, entries, now=time.time() if now is None else now)
    pid = read_pid_file(state_dir / NATS_PID)
    if pid is None or not _is_nats_server(pid):
        return False
    try:
        os.kill(pid, signal.SIGHUP)
    except (ProcessLookupError, PermissionError) as e:
        log.warning("cluster.nats_reload_failed", pid=pid, error=str(e))
        return False
    log.info("cluster.nats_reloaded", pid=pid)
    return True


def main(argv: list[str] | None = None) -> int:
    """Write a deployment's ``nats-auth.conf`` from its tokens file (the compose/k8s secret)."""
    p = argparse.ArgumentParser(prog="python -m fireflyer.cluster.natsauth",
                                description="write the NATS users of a tokens file (docs/nats-auth.md)")
    p.add_argument("tokens", type=Path, help="tokens.json (the format ff up writes)")
    p.add_argument("out", type=Path, help="the nats-auth.conf to write (mode 0600)")
    ns = p.parse_args(argv)
    try:
        entries = read_token_entries(ns.tokens)
        write_auth_config(ns.out, entries, now=time.time())
    except (FireFlyerError, OSError) as e:
        print(f"natsauth: {e}", file=sys.stderr)
        return 2
    print(f"wrote {ns.out}: {len(entries)} token entries", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
