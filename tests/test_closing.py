"""What a client, its consumers, its elections and its transactions do when the client, a
consumer or the node goes away — the same on both backends: every call gets an answer
(a result, or a typed error in the future it returned), no thread is left waiting for
one that will never come, and what the client held goes back."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

import eomsg
import eomsg.client.transaction as transaction_module
from eomsg.client.broker import Broker
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.core.txn import TxnState
from eomsg.embedded import LocalClient
from eomsg.errors import (
    DiskFull,
    NodeClosed,
    QueueNotFound,
    StaleDelivery,
    StaleEpoch,
    Unavailable,
)
from eomsg.node.node import NodeSettings
from tests.conftest import eventually


class _Reader:
    """Iterates a consumer on a thread of its own, as an application's worker does:
    ``got`` holds each payload, then the error the iteration raised, then "ended".
    After the first message it waits for ``go`` before taking the next."""

    def __init__(self, consumer: Any) -> None:
        self.got: list[object] = []
        self.first = threading.Event()
        self.go = threading.Event()
        self._consumer = consumer
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for msg in self._consumer:
                self.got.append(msg.payload)
                self.first.set()
                self.go.wait(30)
        except Exception as e:
            self.got.append(e)
        self.got.append("ended")

    def ended(self, timeout: float = 30.0) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


@pytest.fixture
def q(broker: Broker) -> Broker:
    broker.create_queue(QueueConfig.create("q", ["q/>"]))
    return broker


def test_every_call_on_a_closed_client_is_unavailable(q: Broker) -> None:
    q.close()
    calls: list[Callable[[], object]] = [
        lambda: q.publish("q/x", b"1"),
        lambda: q.publish_async("q/x", b"1"),
        lambda: q.publish_batch_async([Outgoing("q/x", b"1")]),
        lambda: q.fetch("q"),
        lambda: q.delete("q", [(1, 1)]),
        lambda: q.delete_async("q", [(1, 1)]),
        lambda: q.release("q", [(1, 1)]),
        lambda: q.queue_names(),
        lambda: q.consumer("q").__enter__(),
        lambda: q.elect("leader").__enter__(),
    ]
    for call in calls:
        with pytest.raises(Unavailable, match="the client is closed"):
            call()


def test_refusals_come_in_the_future_not_raised(q: Broker) -> None:
    q.publish("q/x", b"1")
    (d,) = q.fetch("q", 1)
    stale = q.delete_async("q", [(d.seq, d.attempt + 1)])
    over = q.delete_async("q", [d.key], epoch=99)
    missing = q.delete_async("nosuch", [d.key])
    assert isinstance(stale.exception(10), StaleDelivery)
    assert isinstance(over.exception(10), StaleEpoch)
    assert isinstance(missing.exception(10), QueueNotFound)
    q.configure("disk-reserve", "1048576GiB")  # more than this disk has
    assert isinstance(q.publish_async("q/x", b"2").exception(10), DiskFull)
    assert isinstance(q.publish_batch_async([Outgoing("q/x", b"3")]).exception(10), DiskFull)
    assert q.delete("q", [d.key]) == [True]  # settlements go on below the reserve


def test_closing_the_client_makes_its_leader_inactive(brokers: Callable[[], Broker]) -> None:
    leaving, staying = brokers(), brokers()
    heard: list[str] = []
    leader = leaving.elect("leader", on_inactive=lambda e: heard.append(e.kind)).__enter__()
    assert leader.wait_active(10)
    leaving.close()
    assert not leader.active
    assert eventually(lambda: heard == ["inactive"])  # on the consumer's callback thread
    with staying.elect("leader") as successor:
        assert successor.wait_active(10)


def test_a_leader_that_left_leads_no_more(q: Broker) -> None:
    with q.elect("leader") as leader:
        assert leader.wait_active(10) and leader.active
    assert not leader.active
    assert not leader.wait_active(30)  # at once: it will not be elected again


def test_an_on_active_callback_sees_its_consumer_active(q: Broker) -> None:
    seen: list[bool] = []
    elected = threading.Event()

    def on_active(event: object) -> None:
        seen.append(consumer.active)
        elected.set()

    consumer = q.consumer("q", on_active=on_active)
    with consumer:
        assert elected.wait(30)
    assert seen == [True]


def test_a_consumer_closed_can_be_entered_again(q: Broker) -> None:
    q.publish("q/x", b"a")
    consumer = q.consumer("q", until_empty=True)
    with consumer:
        (a,) = list(consumer)
        a.delete()
    q.publish("q/x", b"b")
    with consumer:
        got = list(consumer)
        assert [m.payload for m in got] == [b"b"]  # not the end of the last iteration
        got[0].delete()
    assert q.stats()[0].depth == 0


def test_closing_the_client_under_an_iteration_hands_out_nothing_more(
    q: Broker, brokers: Callable[[], Broker]
) -> None:
    for i in range(5):
        q.publish("q/x", str(i).encode())
    consumer = q.consumer("q", prefetch=5).__enter__()
    reader = _Reader(consumer)
    assert reader.first.wait(30)  # it holds the first; four more are in its buffer
    q.close()
    reader.go.set()
    assert reader.ended()
    first, error, end = reader.got
    assert (first, end) == (b"0", "ended") and isinstance(error, Unavailable)
    other = brokers()
    assert eventually(lambda: other.stats()[0].depth == 5 and other.stats()[0].in_flight == 0)


def test_closing_a_consumer_ends_an_iteration_on_another_thread(q: Broker) -> None:
    q.publish("q/x", b"0")
    consumer = q.consumer("q").__enter__()
    reader = _Reader(consumer)
    reader.go.set()
    assert reader.first.wait(30)  # then it waits for more, which never comes
    consumer.close()
    assert reader.ended()
    assert reader.got == [b"0", "ended"]


def test_closing_an_asyncio_consumer_ends_an_iteration_in_another_task(
    data_dir: Path, serve: Callable[..., Any]
) -> None:
    serve()

    async def main() -> list[bytes]:
        async with await eomsg.connect_async(data_dir) as client:
            await client.create_queue(QueueConfig.create("q", ["q/>"]))
            await client.publish("q/x", b"0")
            consumer = client.consumer("q")
            await consumer.__aenter__()
            got: list[bytes] = []

            async def read() -> None:
                async for msg in consumer:
                    got.append(msg.payload)

            reader = asyncio.ensure_future(read())

            async def first() -> None:
                while not got:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(first(), 30)
            await consumer.__aexit__(None, None, None)
            await asyncio.wait_for(reader, 30)
            return got

    assert asyncio.run(main()) == [b"0"]


def test_a_client_closing_gives_back_and_disowns_even_when_a_queue_it_used_is_gone(
    brokers: Callable[[], Broker],
) -> None:
    leaving, admin = brokers(), brokers()
    for name in ("x", "z"):
        admin.create_queue(QueueConfig.create(name, [f"{name}/>"]))
    admin.publish("x/a", b"1")
    admin.publish("z/a", b"held")
    admin.publish("z/a", b"fetched")
    leaving.fetch("x", 1)
    held, _fetched = leaving.fetch("z", 2)
    leaving.prepare_txn(
        "t1", coordinator="test", messages=[], deletes=[("z", held.seq, 0, held.attempt)]
    )
    with leaving.consumer("x", until_empty=True):
        pass
    admin.delete_queue("x", force=True)  # what `leaving` fetched from it is gone with it
    leaving.close()
    # the prepared transaction is in doubt (for recovery), and the message fetched and
    # not settled went back: only the transaction's is in flight
    assert eventually(lambda: [(t.txid, t.connected) for t in admin.txns()] == [("t1", False)])
    assert eventually(lambda: (admin.stats()[0].depth, admin.stats()[0].in_flight) == (2, 1))
    assert admin.abort_txn("t1") is True


def test_a_decided_transaction_commits_though_the_client_closes_meanwhile(
    q: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = duckdb.connect(str(tmp_path / "app.duckdb"))
    real = transaction_module.failpoint

    def close_at_the_decision(name: str) -> None:
        if name == "coordinator.after_decision":
            q.close()  # another thread of the application, say
        real(name)

    monkeypatch.setattr(transaction_module, "failpoint", close_at_the_decision)
    with q.transaction(resources=[eomsg.DuckDBResource(app)]) as txn:
        txn.publish("q/x", b"1")
        txn.commit()  # does not raise: the decision is durable
    assert txn.state is TxnState.COMMITTED and not txn.completed


def test_a_transaction_rolls_back_quietly_after_the_client_closed(q: Broker) -> None:
    q.publish("q/x", b"1")
    (d,) = q.fetch("q", 1)
    with pytest.raises(ValueError), q.transaction() as txn:
        txn.delete(d)
        q.close()
        raise ValueError("the application's own error, not the client's")
    assert txn.state is TxnState.ABORTED


def test_a_standby_consumer_ends_when_the_embedded_node_closes(data_dir: Path) -> None:
    holder = LocalClient.open(data_dir, NodeSettings())
    holder.create_queue(QueueConfig.create("q", ["q/>"], max_active=1))
    standby_client = LocalClient(holder.node)
    try:
        with holder.consumer("q") as active:
            assert active.wait_active(10)
            with standby_client.consumer("q") as standby:
                assert not standby.active
                reader = _Reader(standby)
                holder.node.close()
                assert reader.ended()
    finally:
        standby_client.close()
        holder.close()
    error, end = reader.got
    assert isinstance(error, NodeClosed) and end == "ended"


def test_a_client_interrupted_while_connecting_leaves_no_task_pending() -> None:
    """An interrupt (Ctrl-C, a SIGTERM turned into an exception) during a connect stops
    the client's loop with the connect cancelled and ended, not destroyed pending."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = (
            "import eomsg\n"
            "try:\n"
            f"    eomsg.connect('tcp://127.0.0.1:{port}', timeout=60)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        conn, _ = server.accept()  # connected: its hello waits for an answer
        with conn:
            conn.recv(1)  # the hello is on its way
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, b"interrupted\n", b"")
