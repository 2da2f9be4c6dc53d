"""The outbox's decisions (which message next, how long to wait, when to give up) and its store,
without a server."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from fireflyer.bus import Event
from fireflyer.bus.outbox import Outbox, OutboxEntry, after_failure, plan_next
from fireflyer.core.errors import ResourceExhausted, Unavailable


class Done(Event, tag="outboxtest.done.v1"):
    n: int


def entry(seq: int) -> OutboxEntry:
    return OutboxEntry(seq=seq, subject=f"ff.t.v1.x.{seq}.done", msg_id=f"id{seq}", data=b"{}")


def test_plan_sends_the_oldest_entry_only_when_the_backoff_is_over() -> None:
    assert plan_next([], now=10.0, retry_at=0.0).entry is None
    assert math.isinf(plan_next([], now=10.0, retry_at=0.0).wait_s)
    pending = [entry(3), entry(1), entry(2)]
    plan = plan_next(pending, now=10.0, retry_at=9.0)
    assert plan.entry is not None and plan.entry.seq == 1 and plan.wait_s == 0.0
    waiting = plan_next(pending, now=10.0, retry_at=10.75)
    assert waiting.entry is None and waiting.wait_s == pytest.approx(0.75)


def test_backoff_doubles_to_the_cap_and_never_drops_on_connection_errors() -> None:
    delays = [after_failure(f, 0, base_s=0.1, cap_s=1.0, max_refusals=5, jitter=0.0).delay_s for f in range(1, 8)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    for failures in (1, 10, 10_000):  # an outage of any length: keep the message, wait at most the cap
        v = after_failure(failures, 0, base_s=0.1, cap_s=1.0, max_refusals=5)
        assert not v.drop and 0.0 <= v.delay_s <= 1.0


def test_a_message_refused_max_refusals_times_is_dropped() -> None:
    assert not after_failure(4, 4, base_s=0.1, cap_s=1.0, max_refusals=5).drop
    v = after_failure(5, 5, base_s=0.1, cap_s=1.0, max_refusals=5)
    assert v.drop and v.delay_s == 0.0


def test_append_is_ordered_bounded_and_thread_safe() -> None:
    box = Outbox(bus=None, max_entries=200)  # type: ignore[arg-type]  # never started: no bus needed
    threads = [threading.Thread(target=lambda k=k: [box.append("ff.t.v1.x.y.done", Done(n=k * 50 + i))
                                                   for i in range(50)]) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert box.pending == 200
    assert len(set(box.pending_ids())) == 200
    with pytest.raises(ResourceExhausted) as err:
        box.append("ff.t.v1.x.y.done", Done(n=999))
    assert err.value.fields["max_entries"] == 200
    assert "full" in str(err.value)


def test_unsent_messages_survive_in_the_file_in_order(tmp_path: Path) -> None:
    path = tmp_path / "svc.outbox.db"
    first = Outbox(bus=None, path=path)  # type: ignore[arg-type]
    ids = [Done(n=i) for i in range(5)]
    seqs = [first.append(f"ff.t.v1.x.{i}.done", ev) for i, ev in enumerate(ids)]
    assert seqs == [1, 2, 3, 4, 5]
    first._remove(first._head()[0])  # as an ack of the oldest would
    first._store.close()

    again = Outbox(bus=None, path=path)  # type: ignore[arg-type]  # a restarted service
    assert again.pending_ids() == [ev.event_id for ev in ids[1:]]
    assert again.append("ff.t.v1.x.9.done", Done(n=9)) == 6  # numbering continues after the loaded ones
    again._store.close()


async def test_append_after_stop_is_refused_with_a_typed_error(tmp_path: Path) -> None:
    box = Outbox(bus=None, path=tmp_path / "o.db")  # type: ignore[arg-type]
    box.append("ff.t.v1.x.y.done", Done(n=1))
    await box.stop()
    with pytest.raises(Unavailable) as err:
        box.append("ff.t.v1.x.y.done", Done(n=2))
    assert "stopped" in str(err.value) and err.value.fields["outbox"] == "outbox"
    assert Outbox(bus=None, path=tmp_path / "o.db").pending == 1  # type: ignore[arg-type]  # the first one kept
