"""``ff up``'s last step: a home ``/home/<user>`` for every user of the tokens file.

Meta makes a caller's home on its first ``WhoAmI`` (see :mod:`fireflyer.meta.homes`),
so ``ff up`` asks once with each user-role token once meta answers; users added to
the tokens file later get theirs on first use the same way.  The step never fails
``ff up``: a home not made now is made on first use.  It prints one line::

    homes: /home/alice, /home/bob
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fireflyer.rpc import TokenEntry

__all__ = ["home_users", "make_homes", "homes_line"]


def home_users(tokens: Sequence[TokenEntry]) -> list[TokenEntry]:
    """The entries granted the ``user`` role (an admin-only token has no home made for it) whose
    token ``ff up`` holds: plain (a hashed one's user gets the home on first use), not revoked
    or expired."""
    now = time.time()
    return [t for t in tokens if "user" in t.roles and t.token and t.state(now) == "active"]


async def make_homes(meta: Sequence[str], entries: Sequence[TokenEntry], *, timeout_s: float = 10.0) -> list[str]:
    """Ask meta ``WhoAmI`` as each entry (making its home); the homes, in the entries' order."""
    from fireflyer.fs.meta_client import MetaClient

    homes: list[str] = []
    for entry in entries:
        async with await MetaClient.connect(list(meta), entry.token, failover_timeout_s=timeout_s) as client:
            ident = await client.whoami()
        if ident.home and ident.home not in homes:
            homes.append(ident.home)
    return homes


def homes_line(homes: Sequence[str]) -> str:
    return "homes: " + (", ".join(homes) if homes else "(none: the tokens file has no user-role token)")
