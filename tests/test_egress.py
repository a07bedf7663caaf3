"""Egress in memory (seed 004, egress i to xi; node/egress.py): a node holds what a
linked peer sends for its own queues in memory, acknowledges it once every queue has
settled it — nothing of it written — or writes it whole when its hold ends, and the
peer keeps each message until then. In process, through the test network of
tests/test_links.py, on a clock the test moves."""

from __future__ import annotations

import json
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from eomsg.core.message import Carried, Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import InvalidConfig, LinkNotFound
from eomsg.node.node import Node
from eomsg.store.writer import RowBatch
from tests.conftest import eventually
from tests.linknet import MakeNet, Net
from tests.test_network import Network

HOLD = 1.0


def pair(net: MakeNet, *queues: QueueConfig) -> Net:
    """a linked to b; b holds what a sends for b's queues in memory."""
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].links.set_link_egress("a", "memory", HOLD)
    for config in queues:
        n.nodes["b"].admin.create_queue(config)
    n.run()
    return n


def rows(node: Node, table: str) -> int:
    node.store.writer.sync()
    return int(node.inspection.query(f"SELECT count(*) FROM {table}")[1][0][0])


def owed(n: Net, node: str = "a") -> int:
    return n.nodes[node].links.link_info()[0].pending


def settled_all(n: Net) -> bool:
    """Whether, once what moves has moved, a owes b nothing."""
    settle(n)
    return owed(n) == 0


def settle(n: Net) -> None:
    """Carry frames and acknowledgements until nothing moves (no timer runs out)."""
    while n.step():
        pass


Q = QueueConfig("q", subscriptions=("t/>",))


def test_settled_in_time_it_is_never_written_and_then_acknowledged(net: MakeNet) -> None:
    n = pair(net, Q)
    a, b = n.nodes["a"], n.nodes["b"]
    for i in range(100):
        a.ingress.publish(f"t/{i}", f"m{i}".encode())
    settle(n)
    assert b.links.link_info()[0].held == 100
    assert owed(n) == 100  # a keeps them: b has not acknowledged
    got = b.delivery.fetch("q", 1000)
    assert [m.message.payload for m in got] == [f"m{i}".encode() for i in range(100)]
    assert [m.message.headers["eomsg-origin"] for m in got[:1]] == ["a"]
    b.delivery.delete("q", [m.key for m in got[:60]])
    settle(n)
    assert owed(n) == 40 and b.links.link_info()[0].held == 40  # acknowledged as far as settled
    b.delivery.delete("q", [m.key for m in got[60:]])
    settle(n)
    assert owed(n) == 0 and b.links.link_info()[0].held == 0
    for table in ("messages", "destinations", "deliveries", "delivery_runs", "settled"):
        assert rows(b, table) == 0, table  # not one byte of them on b's disk
    assert {s.name: s.depth for s in b.inspection.stats()} == {"q": 0}


def test_not_settled_within_the_hold_it_is_written_with_what_was_recorded(
    net: MakeNet,
) -> None:
    n = pair(net, Q)
    a, b = n.nodes["a"], n.nodes["b"]
    for i in range(10):
        a.ingress.publish("t/x", f"m{i}".encode())
    settle(n)
    got = b.delivery.fetch("q", 4)  # four handed out (attempt 1)
    b.delivery.delete("q", [got[0].key])  # one deleted, in memory
    assert rows(b, "messages") == 0
    n.now += HOLD + 0.1
    b.transfer.link_tick("a")  # the hold is over: written
    assert eventually(lambda: settled_all(n))  # acknowledged once durable
    assert b.links.link_info()[0].held == 0
    # The one deleted in memory is gone, never written; the rest are written with the
    # deliveries made meanwhile.
    assert rows(b, "messages") == 9
    assert rows(b, "deliveries") == 3 and rows(b, "settled") == 0
    assert rows(b, "delivery_runs") == 0  # a row each, kept with each held message
    # From here they are stored messages: they survive a restart as recorded.
    n.restart("b")
    b = n.nodes["b"]
    n.now += 3600  # the three undeleted deliveries time out
    b.maintenance.maintain()
    again = b.delivery.fetch("q", 100)
    assert [m.message.payload for m in again] == [f"m{i}".encode() for i in range(1, 10)]
    assert [m.attempt for m in again] == [2, 2, 2, 1, 1, 1, 1, 1, 1]


def test_a_stop_writes_what_is_held(net: MakeNet) -> None:
    n = pair(net, Q)
    for i in range(5):
        n.nodes["a"].ingress.publish("t/x", f"m{i}".encode())
    settle(n)
    n.restart("b")  # a graceful stop: what is held is written, nothing comes twice
    n.heal()
    n.run()
    assert owed(n) == 0
    assert [p for _, p in n.drain("b", "q")] == [f"m{i}" for i in range(5)]


def test_a_dead_letter_or_a_transaction_writes_the_held_message_first(net: MakeNet) -> None:
    dlq = QueueConfig("q", subscriptions=("t/>",), max_redeliveries=0, dead_letter="dead")
    n = pair(net, dlq)
    a, b = n.nodes["a"], n.nodes["b"]
    a.ingress.publish("t/1", b"to the dead", ttl=600)
    a.ingress.publish("t/2", b"in a transaction")
    settle(n)
    first, second = b.delivery.fetch("q", 2)
    b.delivery.release("q", [first.key])  # past max-redeliveries: to the dead-letter queue
    assert rows(b, "messages") == 1  # written whole, with its move
    dead = b.delivery.fetch("dead", 10)
    assert [m.message.payload for m in dead] == [b"to the dead"]
    assert dead[0].message.expires_at == pytest.approx(first.message.expires_at)
    b.participant.prepare_txn(
        "t1", coordinator="test", deletes=[("q", second.message.seq, second.epoch, second.attempt)]
    )
    assert rows(b, "messages") == 2  # a prepared delete needs the message stored
    b.participant.commit_txn("t1")
    b.delivery.delete("dead", [dead[0].key])
    settle(n)
    assert owed(n) == 0 and b.links.link_info()[0].held == 0


def test_the_log_is_read_no_further_than_the_lowest_held_message(net: MakeNet) -> None:
    n = pair(net, Q)
    a, b = n.nodes["a"], n.nodes["b"]
    b.admin.create_queue(QueueConfig("local", subscriptions=("here",)))
    a.ingress.publish("t/x", b"held")
    settle(n)
    (held,) = b.delivery.fetch("q", 1)
    b.ingress.publish("here", b"stored after it")
    from eomsg.core.replay import Selection

    assert b.inspection.log_bounds(Selection()) is None  # the only stored one is above the held one
    n.now += HOLD + 0.1
    b.transfer.link_tick("a")
    assert eventually(lambda: settled_all(n))
    assert b.inspection.log_bounds(Selection()) == (held.message.seq, held.message.seq + 1)


def test_what_is_carried_further_or_arrives_mixed_keeps_its_order(net: MakeNet) -> None:
    """b's queue wants every topic; c wants t/x through b: those b must store (they go
    further), the others it holds — and b's queue sees them in a's order."""
    n = net("abc")
    n.link("a", "b")
    n.link("b", "c")
    n.nodes["b"].links.set_link_egress("a", "memory", HOLD)
    n.nodes["b"].admin.create_queue(Q)
    n.nodes["c"].admin.create_queue(QueueConfig("x", subscriptions=("t/x",)))
    n.run()
    for i in range(40):
        n.nodes["a"].ingress.publish("t/x" if i % 7 == 0 else "t/y", str(i).encode())
        n.step()
    n.run()
    assert [p for _, p in n.drain("b", "q")] == [str(i) for i in range(40)]
    assert [p for _, p in n.drain("c", "x")] == [str(i) for i in range(0, 40, 7)]


def test_settings_of_the_egress(net: MakeNet) -> None:
    n = pair(net, Q)
    b = n.nodes["b"]
    assert not b.links.set_link_egress("a", "memory", HOLD)  # as it is
    with pytest.raises(InvalidConfig, match="egress 'disk': use store or memory"):
        b.links.set_link_egress("a", "disk")
    with pytest.raises(InvalidConfig, match="--hold must be between 10 ms and 60 s"):
        b.links.set_link_egress("a", "memory", 120)
    with pytest.raises(LinkNotFound):
        b.links.set_link_egress("zz", "memory")
    assert b.links.set_link_egress("a", "store")
    n.nodes["a"].ingress.publish_batch([Outgoing("t/x", b"stored")])
    settle(n)
    assert b.links.link_info()[0].held == 0 and rows(b, "messages") == 1


def test_a_killed_egress_node_loses_nothing_it_held(
    eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Real processes: b holds what a sends (a long hold: nothing written), its consumer
    lands 50 in an application table and deletes them in memory; b is SIGKILLed and
    started again. Nothing held is lost (a sends again what b had not acknowledged),
    and the inbox keeps the application's table exactly once."""
    network = Network(eomsg_bin, tmp_path, cli_env)
    try:
        network.start("a")
        network.start("b")
        db = str(tmp_path / "b")

        def run(*args: str) -> str:
            done = subprocess.run(
                [eomsg_bin, *args], env=cli_env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        network.link("b", "a")  # b dials: it finds a again when it restarts
        run("queue", "create", "q", "--subscribe", "orders/>", "--data", db)
        assert run("link", "set", "a", "--egress", "memory", "--hold", "60s", "--data", db) == (
            "link to a: egress memory, hold 1m00s\n"
        )
        with network.client("a") as a:
            assert eventually(lambda: a.link_info()[0].reaches == ("b",))
            a.publish_batch([Outgoing("orders/x", f"m{i}".encode(), f"id-{i}") for i in range(200)])

        def held() -> int:
            links = json.loads(run("inspect", "links", "--json", "--data", db))
            return int(links[0]["held"])

        assert eventually(lambda: held() == 200)
        app = tmp_path / "app.duckdb"
        run("consume", "q", "--into", f"duckdb:{app}:orders", "--max", "50", "--data", db)
        network.procs["b"].kill()  # SIGKILL: what b held is gone with it
        network.start("b")
        assert eventually(lambda: network.up("b", "a"))
        with network.client("a") as a:  # a sent again what b had not acknowledged
            assert eventually(lambda: a.link_info()[0].pending == 0 or held() > 0)
        run("link", "set", "a", "--egress", "store", "--data", db)  # then drain it all
        with network.client("a") as a:
            assert eventually(lambda: a.link_info()[0].pending == 0, timeout=60)
        run("consume", "q", "--into", f"duckdb:{app}:orders", "--data", db)
        import duckdb

        with duckdb.connect(str(app)) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM orders").fetchall()]
        assert sorted(ids) == sorted(f"id-{i}" for i in range(200))  # each once, none lost
    finally:
        network.close()


def test_a_queue_deleted_no_longer_keeps_a_held_message(net: MakeNet) -> None:
    n = pair(net, Q, QueueConfig("r", subscriptions=("t/>",)))
    a, b = n.nodes["a"], n.nodes["b"]
    a.ingress.publish("t/x", b"for q and r")
    settle(n)
    assert b.admin.delete_queue("r", force=True) == 1
    (m,) = b.delivery.fetch("q", 10)
    b.delivery.delete("q", [m.key])  # q was the last queue to settle it
    settle(n)
    assert owed(n) == 0 and rows(b, "messages") == 0


def test_a_held_message_requeued_is_acknowledged_once_its_copy_is_durable(
    net: MakeNet,
) -> None:
    n = pair(net, Q, QueueConfig("other"))
    a, b = n.nodes["a"], n.nodes["b"]
    a.ingress.publish("t/x", b"only copy")
    settle(n)
    real, parked = b.store.writer.write, []

    def park(batch: RowBatch) -> Future[None]:  # the requeue's commit, held back
        if "messages" in batch.tables:
            parked.append((batch, Future()))
            return parked[-1][1]
        return real(batch)

    b.store.writer.write = park  # type: ignore[method-assign]
    mover = threading.Thread(target=b.ingress.requeue, args=("q", "other"), daemon=True)
    mover.start()
    assert eventually(lambda: bool(parked))
    assert b.transfer.link_ack("a") is None  # the original is settled, its copy not yet durable
    b.store.writer.write = real  # type: ignore[method-assign]
    batch, future = parked[0]
    real(batch).add_done_callback(lambda f: future.set_result(None))
    mover.join(10)
    assert eventually(lambda: settled_all(n))


def test_a_frame_stored_after_held_ones_writes_them_with_it(net: MakeNet) -> None:
    """b holds a frame; the next cannot be held (no queue wants one of its messages):
    the held one is written with it, so the read kept on disk passes both and a restart
    takes neither again."""
    n = pair(net, Q)
    b = n.nodes["b"]
    read = b.links.link_info()[0].read
    assert b.intake.accept_transfer("a", read, [carried(read + 1, "t/x")]).result(5)[0] == read
    assert b.links.link_info()[0].held == 1
    assert b.intake.accept_transfer("a", read + 1, [carried(read + 2, "nobody")]).result(5) == (
        read + 2,
        False,
    )
    b.store.writer.sync()
    assert json.loads(b.store.meta("link/a/read") or "{}")["read"] == read + 2
    assert b.links.link_info()[0].held == 0 and rows(b, "messages") == 2  # both in the log


def test_no_frame_is_held_while_one_stored_before_is_not_durable(net: MakeNet) -> None:
    """Held, a frame would reach the queues before the stored one ahead of it, and be
    acknowledged past it: it is stored too, behind it."""
    n = pair(net, Q)
    b = n.nodes["b"]
    read = b.links.link_info()[0].read
    real, parked = b.store.writer.write, []

    def park(batch: RowBatch) -> Future[None]:
        if "messages" in batch.tables or any(k == "node_meta" for k in batch.tables):
            parked.append((batch, Future()))
            return parked[-1][1]
        return real(batch)

    b.store.writer.write = park  # type: ignore[method-assign]
    first = b.intake.accept_transfer("a", read, [carried(read + 1, "nobody")])
    second = b.intake.accept_transfer("a", read + 1, [carried(read + 2, "t/x")])
    assert not first.done() and not second.done()  # both wait for their commits
    assert b.links.link_info()[0].held == 0
    b.store.writer.write = real  # type: ignore[method-assign]
    for batch, future in parked:
        real(batch).add_done_callback(lambda f, future=future: future.set_result(None))
    assert first.result(10) == (read + 1, False) and second.result(10) == (read + 2, False)


def carried(seq: int, topic: str) -> Carried:
    """A message as node a sends it to b."""
    return Carried(seq, topic, f"m{seq}".encode(), None, None, {}, ("b",), "a", str(seq))


def test_a_new_incarnation_of_the_peer_gets_nothing_of_the_old_ones_holds(
    net: MakeNet,
) -> None:
    """a's data directory is rebuilt from nothing (a new incarnation) while b holds
    what the old one sent: b writes it — it is b's now — and tells the new one it has
    taken nothing of it; the new one's messages are held apart from the old ones'."""
    n = pair(net, Q)
    a, b = n.nodes["a"], n.nodes["b"]
    for i in range(3):
        a.ingress.publish("t/x", f"old{i}".encode())
    settle(n)
    assert b.links.link_info()[0].held == 3
    assert b.transfer.link_hello("a", "a-rebuilt") == 0
    assert eventually(lambda: rows(b, "messages") == 3)
    assert b.links.link_info()[0].held == 0
    b.intake.accept_transfer("a", 0, [carried(1, "t/x")]).result(5)  # the new a's first message
    assert (
        b.links.link_info()[0].held == 1 and b.transfer.link_ack("a") is None
    )  # not acknowledged yet
    got = b.delivery.fetch("q", 10)
    assert [m.message.payload for m in got] == [b"old0", b"old1", b"old2", b"m1"]
    b.delivery.delete("q", [m.key for m in got])
    assert b.transfer.link_ack("a") == 1
