from fireflyer.kv.pool import ConnPool


class Conn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_pool_reuses_keeps_at_most_size_and_closes_on_close():
    made: list[Conn] = []

    def connect() -> Conn:
        made.append(Conn())
        return made[-1]

    pool = ConnPool(1, connect)
    a, b = pool.take(), pool.take()
    assert len(made) == 2
    pool.give(a)
    pool.give(b)  # pool full: closed, not kept
    assert not a.closed and b.closed
    assert pool.take() is a  # reused, no new connection
    pool.give(a)
    pool.close()
    assert a.closed
    c = pool.take()
    pool.give(c)  # a closed pool keeps nothing
    assert c.closed
