"""Re-checking an open connection's token, so a revoked or expired token stops working on
connections opened before the change too (a connection authenticates once, at its hello).

Each connection keeps its hello's token and asks the server's ``authenticate`` again before a
request when the last check is ``interval_s`` old: one ``time.monotonic()`` per request
otherwise.  A token refused once stays refused on that connection (every later request fails
with the same ``Unauthenticated``); the client reconnects with a new token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fireflyer.core.errors import Unauthenticated

__all__ = ["REAUTH_INTERVAL_S", "Reauth"]

#: how often an open connection's token is looked up again (the token store itself re-reads
#: its file at most once a second)
REAUTH_INTERVAL_S = 1.0


class Reauth:
    __slots__ = ("_authenticate", "_token", "_interval_s", "_next_at", "refused", "server")

    def __init__(self, authenticate: Callable[[str], Any], token: str, *, server: str,
                 interval_s: float | None = None) -> None:
        self._authenticate = authenticate
        self._token = token
        self._interval_s = REAUTH_INTERVAL_S if interval_s is None else interval_s
        self._next_at = time.monotonic() + self._interval_s
        self.refused: Unauthenticated | None = None
        self.server = server

    def check(self) -> Unauthenticated | None:
        """None while the token is still good; the error to answer with once it is not."""
        if self.refused is not None:
            return self.refused
        now = time.monotonic()
        if now < self._next_at:
            return None
        self._next_at = now + self._interval_s
        try:
            principal = self._authenticate(self._token)
        except Unauthenticated as e:
            principal, why = None, str(e)
        except Exception:  # an authenticator bug: keep the principal the hello established
            return None
        else:
            why = "the token is no longer known"
        if principal is None:
            self.refused = Unauthenticated(f"{self.server}: this connection's token stopped working: {why}",
                                           server=self.server)
        return self.refused
