"""A consumer as the application reads it, the same on both backends (a node embedded in
this process and one served by ``eomsg serve``): what it hands out, what its deletes
and its exit settle, and what it gives back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eomsg.client.blocking import PRUNE_AT, BlockingConsumer
from eomsg.client.broker import Broker, require_served
from eomsg.client.consumer import Item, Pushed
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Message, Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import (
    InvalidDuration,
    StaleDelivery,
    StaleEpoch,
    Unavailable,
    Unbound,
    UsageError,
)
from eomsg.server.pump import forget_settled
from tests.conftest import eventually


@pytest.fixture
def q(broker: Broker) -> Broker:
    broker.create_queue(QueueConfig.create("q", ["q/>"]))
    return broker


def test_until_empty_hands_out_each_message_once_and_deletes_are_durable_at_exit(
    q: Broker,
) -> None:
    for i in range(50):
        q.publish_async("q/x", str(i).encode())
    q.publish("q/x", b"last")
    got = []
    with q.consumer("q", prefetch=8, until_empty=True) as consumer:
        for msg in consumer:
            got.append(msg.payload)
            msg.delete()
    assert got == [str(i).encode() for i in range(50)] + [b"last"]
    (stats,) = q.stats()
    assert (stats.depth, stats.deleted) == (0, 51)


def test_waiting_on_a_delete_makes_it_durable_then(q: Broker) -> None:
    q.publish("q/x", b"1")
    with q.consumer("q", until_empty=True) as consumer:
        (msg,) = list(consumer)
        assert msg.delete().result(10) is True
        assert q.stats()[0].deleted == 1  # before the consumer's exit


def test_exit_gives_back_what_was_not_deleted_counting_only_what_was_seen(q: Broker) -> None:
    for i in range(5):
        q.publish("q/x", str(i).encode())
    with q.consumer("q", prefetch=5) as consumer:
        it = iter(consumer)
        first, second = next(it), next(it)
        first.delete()
    # `second` was handed out and not settled: it counts; the other three never left
    # the buffer: given back un-counted
    again = q.fetch("q", 10)
    assert [(d.seq, d.attempt) for d in again] == [(second.seq, 2), (3, 1), (4, 1), (5, 1)]
    q.delete("q", [d.key for d in again])


def test_a_stale_delete_is_refused_alone(q: Broker, brokers: Callable[[], Broker]) -> None:
    q.publish("q/x", b"1")
    q.publish("q/x", b"2")
    with q.consumer("q", until_empty=True) as consumer:
        one, two = list(consumer)
        q.release("q", [one.delivered.key], epoch=one.epoch)
        # handed out again — to another client, or pushed back to this consumer — so
        # the first delivery is over; the deletes below cross to the node together
        brokers().fetch("q", 10, wait=5)
        refused, deleted = one.delete(), two.delete()
        with pytest.raises(StaleDelivery):
            refused.result(10)
        assert deleted.result(10) is True
    assert q.stats()[0].deleted == 1


def test_a_waiting_consumer_receives_what_is_published_later(q: Broker) -> None:
    received = threading.Event()
    got: list[bytes] = []
    with q.consumer("q", idle_timeout=30) as consumer:

        def read() -> None:
            for msg in consumer:
                got.append(msg.payload)
                msg.delete()
                received.set()
                return

        reader = threading.Thread(target=read)
        reader.start()
        q.publish("q/x", b"late")
        assert received.wait(30)
        reader.join()
    assert got == [b"late"]


def test_only_a_served_node_can_be_followed(broker: Broker) -> None:
    if broker.embedded:
        with pytest.raises(UsageError, match="--follow needs a running node"):
            require_served(broker, "--follow")
    else:
        require_served(broker, "--follow")


def test_deletes_made_by_transactions_free_the_prefetch_window(q: Broker) -> None:
    for i in range(10):
        q.publish("q/x", str(i).encode())
    got = []
    with q.consumer("q", prefetch=3, until_empty=True) as consumer:
        for msg in consumer:
            with q.transaction() as tx:
                tx.delete(msg)
            got.append(msg.payload)
    assert got == [str(i).encode() for i in range(10)]
    assert q.stats()[0].depth == 0


def test_a_delete_completes_without_being_waited_on(q: Broker) -> None:
    q.publish("q/x", b"1")
    q.publish("q/x", b"2")
    with q.consumer("q", prefetch=2) as consumer:
        it = iter(consumer)
        deleted = next(it).delete()
        assert eventually(deleted.done)  # while the application holds the next one
        assert deleted.result() is True and q.stats()[0].deleted == 1
        next(it).delete()


def test_a_message_settled_after_its_consumer_closed_gets_a_verdict_not_a_wait(
    q: Broker,
) -> None:
    q.publish("q/x", b"1")
    q.publish("q/x", b"2")
    with q.consumer("q", until_empty=True) as consumer:
        kept, released = list(consumer)
    # the consumer's exit gave both back: its epoch is over, so both are refused
    with pytest.raises(StaleEpoch):
        kept.delete().result(10)
    with pytest.raises(StaleEpoch):
        released.release().result(10)
    q.close()
    with pytest.raises(Unavailable):
        kept.delete().result(10)
    with pytest.raises(Unavailable):
        released.release().result(10)


def test_an_administrators_unbind_ends_the_iteration(q: Broker) -> None:
    seen: list[object] = []
    with q.consumer("q") as consumer:

        def read() -> None:
            try:
                seen.extend(consumer.events())
            except Unbound as e:
                seen.append(e)

        reader = threading.Thread(target=read)
        reader.start()
        assert eventually(lambda: len(seen) == 1)  # told it is active
        q.unbind("q", consumer.flow)
        reader.join(30)
        assert not reader.is_alive()
    kinds = [e.kind if isinstance(e, FlowEvent) else type(e).__name__ for e in seen]
    assert kinds == ["active", "inactive", "Unbound"]


def test_leaving_an_election_is_not_losing_it(q: Broker) -> None:
    heard: list[str] = []
    with q.elect("leader", on_active=lambda e: heard.append(e.kind),
                 on_inactive=lambda e: heard.append(e.kind)) as leadership:  # fmt: skip
        assert leadership.wait_active(10)
    assert heard == ["active"]


def test_a_client_that_goes_away_gives_back_what_it_fetched_and_leaves_its_transactions_in_doubt(
    q: Broker, brokers: Callable[[], Broker]
) -> None:
    q.publish("q/x", b"1")
    leaving = brokers()
    (d,) = leaving.fetch("q", 1)
    leaving.prepare_txn("t1", coordinator="x", messages=[Outgoing("q/y", b"2")])
    leaving.close()
    (again,) = q.fetch("q", 1, wait=10)  # at once, not after the ack timeout
    assert (again.seq, again.attempt) == (d.seq, 2)
    # the node learns its coordinator is gone as the session ends, apart from the release
    assert eventually(lambda: [(t.txid, t.connected) for t in q.txns()] == [("t1", False)])
    assert q.abort_txn("t1") is True


class _Scripted(BlockingConsumer):
    """A consumer whose inbox is a script of items, as a connection's loop would queue
    them; it notes in ``log`` each time it would wait for the node."""

    def __init__(self, script: list[Item], log: list[object]) -> None:
        super().__init__("q", 100, None)
        self._script = script
        self.log = log
        self._subscription = 1

    def _next_item(self) -> Item | None:
        if not self._script:
            self.log.append("wait")
            return None  # the idle timeout: the iteration ends
        item = self._script.pop(0)
        if isinstance(item, FlowEvent):
            self._noted(item)
        elif isinstance(item, Pushed):
            self._buffer.arrived(item.deliveries, item.node_now, time.monotonic())
        return item

    def _more_arrived(self) -> bool:
        return bool(self._script)

    def _renew_lease(self) -> None:
        raise AssertionError("the lease is always valid here")

    def _lease_valid(self) -> bool:
        return True

    def _settle(self, how: str, d: Delivered, delay: float | None) -> None:
        raise AssertionError("nothing is settled here")


def _pushed(*seqs: int) -> Pushed:
    now = time.time()
    return Pushed([Delivered("q", Message(s, "q/x", b""), 1, now + 30, 7) for s in seqs], now)


def test_a_batch_goes_out_before_the_consumer_waits() -> None:
    """What arrived goes out as a batch before the consumer waits for more, even when
    the node's "nothing more for now" came right behind it: a batch held across the
    wait would be handed out after its deliveries are over (seen as a served `consume
    --follow` whose last printed messages were never deleted)."""
    log: list[object] = []
    script: list[Item] = [FlowEvent("q", 1, "bound", True, 7), _pushed(1, 2), _pushed()]
    for item in _Scripted(script, log).batches(100):
        log.append(item.kind if isinstance(item, FlowEvent) else [r.seq for r in item])
    assert log == ["bound", [1, 2], "wait"]


@pytest.mark.parametrize(
    ("max_messages", "limit", "batches"),
    [(2, None, [[1, 2], [3, 4], [5, 6]]), (2, 3, [[1, 2], [3]]), (10, None, [[1, 2, 3, 4, 5, 6]])],
)
def test_batches_are_at_most_max_messages_and_end_at_the_limit(
    max_messages: int, limit: int | None, batches: list[list[int]]
) -> None:
    """A batch takes in what had arrived, across the node's pushes, up to its size."""
    log: list[object] = []
    script: list[Item] = [FlowEvent("q", 1, "bound", True, 7), _pushed(1, 2, 3, 4, 5), _pushed(6)]
    got = [
        [r.seq for r in item]
        for item in _Scripted(script, log).batches(max_messages, limit)
        if not isinstance(item, FlowEvent)
    ]
    assert got == batches


SCRIPT = """
import asyncio, sys, eomsg
from eomsg.errors import UsageError

def sync(client):
    for msg in client.consumer("q"):
        print("received", msg.seq)

async def asyncio_client(target):
    async with await eomsg.connect_async(target) as client:
        async for msg in client.consumer("q"):
            print("received", msg.seq)

kind, target = sys.argv[1], sys.argv[2]
try:
    if kind == "embedded":
        with eomsg.LocalClient.open(target) as client:
            client.create_queue(eomsg.QueueConfig.create("q", ["q/>"]))
            client.publish("q/x", b"waiting")
            sync(client)
    elif kind == "served":
        with eomsg.connect(target) as client:
            sync(client)
    else:
        asyncio.run(asyncio_client(target))
except UsageError as e:
    print(e)
"""


def test_iterating_a_consumer_outside_with_raises_at_once(
    data_dir: Path, serve: Callable[..., Any]
) -> None:
    """``for msg in client.consumer(q)`` (and ``async for``) without entering it: a
    one-line UsageError at once, on every client, never a wait for ever."""
    said = (
        "the consumer of 'q' is not open: use it in a `with` block (`async with` for the "
        "asyncio client) before iterating\n"
    )
    for kind in ("embedded", "served", "asyncio"):
        if kind == "served":
            serve()
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, kind, str(data_dir)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert (done.stdout, done.stderr) == (said, ""), kind


def test_a_ttl_is_seconds_or_a_duration_as_the_cli_takes_it(q: Broker) -> None:
    q.publish("q/x", b"1h", ttl="1h")
    q.publish_async("q/x", b"90s", ttl="90s").result()
    q.publish("q/x", b"seconds", ttl=30.0)
    with q.transaction() as tx:
        tx.publish("q/x", b"in a transaction", ttl="2m")
    got = {d.message.payload: d.message for d in q.fetch("q", 10)}
    for payload, seconds in (
        (b"1h", 3600),
        (b"90s", 90),
        (b"seconds", 30),
        (b"in a transaction", 120),
    ):
        m = got[payload]
        assert m.expires_at is not None
        assert m.expires_at - m.published_at == pytest.approx(seconds, abs=0.01)
    with pytest.raises(InvalidDuration, match="duration 'soon' is not understood"):
        q.publish("q/x", b"never", ttl="soon")


@given(
    st.dictionaries(st.integers(0, 6), st.integers(1, 3)),
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 3)), max_size=30),  # some twice
)
def test_a_window_forgets_exactly_the_deliveries_settled_at_their_attempt(
    held: dict[int, int], keys: list[tuple[int, int]]
) -> None:
    expected = dict(held)
    for seq, attempt in keys:  # the rule, one key at a time
        if expected.get(seq) == attempt:
            del expected[seq]
    before = len(held)
    assert forget_settled(held, keys) == before - len(expected)
    assert held == expected


def test_tracking_settlements_looks_at_each_about_once_however_many_are_in_flight() -> None:
    """More settlements in flight than PRUNE_AT (a large prefetch, a slow node): the
    list of them is pruned when it has doubled, not rescanned at every settlement."""
    looked = [0]

    class InFlight:
        def done(self) -> bool:
            looked[0] += 1
            return False

        def exception(self, timeout: float | None = None) -> BaseException | None:
            return None

    consumer = _Scripted([], [])
    n = 5 * PRUNE_AT
    for _ in range(n):
        consumer._track(InFlight())
    assert len(consumer._pending) == n
    assert looked[0] < 2 * n
