"""A consumer as the application reads it, the same on both backends (a node embedded in
this process and one served by ``eomsg serve``): what it hands out, what its deletes
and its exit settle, and what it gives back."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from eomsg.client.broker import Broker, require_served
from eomsg.core.queues import QueueConfig
from eomsg.errors import StaleDelivery, UsageError


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
