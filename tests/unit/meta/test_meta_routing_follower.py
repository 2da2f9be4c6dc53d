"""Meta's routing follower: a create naming an unknown chain table retries after a refresh.

The refresh may bring nothing newer because a periodic pull or a version event adopted the
table while the failed call ran; the follower must still say "retry" (it said "no" and the
create failed with "chain table 1 does not exist", seen once in CI).  An unreachable mgmtd
is asked again for a while: the same error came back in CI when meta had started before
mgmtd and its channel was still waiting to reconnect.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from fireflyer.core.errors import DeadlineExceeded, Unavailable
from services.meta.routing import RoutingFollower


class _Cache:
    """``refresh`` fails with ``error`` for its first ``failures`` pulls (all, when None)."""

    def __init__(self, answer: object = None, error: Exception | None = None, failures: int | None = None) -> None:
        self.answer, self.error, self.failures, self.pulls = answer, error, failures, 0

    async def refresh(self) -> object:
        self.pulls += 1
        if self.error is not None and (self.failures is None or self.pulls <= self.failures):
            raise self.error
        return self.answer


class _Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


def _follower(cache: _Cache) -> RoutingFollower:
    f = RoutingFollower.__new__(RoutingFollower)  # no service context: only the cache and a log are used
    f.cache = cache  # type: ignore[assignment]
    f.ctx = SimpleNamespace(log=_Log())  # type: ignore[assignment]
    return f


async def test_retry_even_when_a_concurrent_pull_already_adopted_the_routing() -> None:
    cache = _Cache(answer=None)
    assert await _follower(cache).refresh_now() is True
    assert cache.pulls == 1


async def test_an_unreachable_mgmtd_is_asked_again_until_it_answers() -> None:
    # meta came up before mgmtd: its channel fails calls at once until it reconnects
    cache = _Cache(error=Unavailable("failed to connect to all addresses"), failures=3)
    assert await _follower(cache).refresh_now(wait_s=5.0) is True
    assert cache.pulls == 4


async def test_false_with_a_warning_when_mgmtd_never_answers_within_the_wait() -> None:
    cache = _Cache(error=DeadlineExceeded("mgmtd slow"))
    f = _follower(cache)
    t0 = time.monotonic()
    assert await f.refresh_now(wait_s=0.3) is False
    assert 0.3 <= time.monotonic() - t0 < 2.0  # bounded by the wait (generous: CI load)
    assert cache.pulls >= 3
    assert [e for e, _ in f.ctx.log.warnings] == ["meta.routing_refresh_failed"]
