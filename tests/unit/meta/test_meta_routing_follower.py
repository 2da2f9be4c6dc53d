"""Meta's routing follower: a create naming an unknown chain table retries after a refresh.

The refresh may bring nothing newer because a periodic pull or a version event adopted the
table while the failed call ran; the follower must still say "retry" (it said "no" and the
create failed with "chain table 1 does not exist", seen once in CI).
"""

from __future__ import annotations

from fireflyer.core.errors import Unavailable
from services.meta.routing import RoutingFollower


class _Cache:
    def __init__(self, answer: object = None, error: Exception | None = None) -> None:
        self.answer, self.error, self.pulls = answer, error, 0

    async def refresh(self) -> object:
        self.pulls += 1
        if self.error is not None:
            raise self.error
        return self.answer


def _follower(cache: _Cache) -> RoutingFollower:
    f = RoutingFollower.__new__(RoutingFollower)  # no service context: only the cache is used
    f.cache = cache  # type: ignore[assignment]
    return f


async def test_retry_even_when_a_concurrent_pull_already_adopted_the_routing() -> None:
    cache = _Cache(answer=None)
    assert await _follower(cache).refresh_now() is True
    assert cache.pulls == 1


async def test_no_retry_when_mgmtd_is_unreachable() -> None:
    assert await _follower(_Cache(error=Unavailable("mgmtd down"))).refresh_now() is False
