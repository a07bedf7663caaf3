"""The node end to end on a real data directory: ingress, delivery, recovery. Tests
taking ``broker`` run on both backends: a node embedded in the test's process and one
served by ``eomsg serve``."""

from __future__ import annotations

import contextlib
import random
import tempfile
import threading
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg import failpoints
from eomsg.client.broker import Broker
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import (
    DataDirError,
    DataDirLocked,
    EomsgError,
    FlowNotFound,
    InvalidConfig,
    InvalidTopic,
    NotActive,
    NotInFlight,
    PayloadTooLarge,
    QueueExists,
    QueueNotEmpty,
    QueueNotFound,
    SchemaTooNew,
    StaleEpoch,
    StorageError,
)
from eomsg.node.node import Node, NodeSettings
from eomsg.store.files import DB_NAME

from .conftest import FakeClock, NodeFactory


def orders(node: Node | Broker, **kw: object) -> None:
    admin = node.admin if isinstance(node, Node) else node
    admin.create_queue(QueueConfig.create("orders", ["orders/>"], **kw))  # type: ignore[arg-type]


def test_publish_routes_by_subscription(broker: Broker) -> None:
    orders(broker)
    broker.create_queue(QueueConfig.create("eu", ["*/eu/*"]))
    r = broker.publish("orders/eu/new", b"1")
    assert (r.seq, r.duplicate, r.queues) == (1, False, 2)
    assert broker.publish("orders/us/new", b"2").queues == 1
    assert broker.publish("billing/x", b"3").queues == 0  # kept in the log only
    assert [d.seq for d in broker.fetch("orders", 10)] == [1, 2]
    assert [d.seq for d in broker.fetch("eu", 10)] == [1]
    assert [m.seq for m in broker.log()] == [1, 2, 3]


def test_duplicate_id_is_stored_once(broker: Broker) -> None:
    orders(broker)
    first = broker.publish("orders/a", b"x", id="order-1")
    again = broker.publish("orders/a", b"x", id="order-1")
    assert again.seq == first.seq and again.duplicate
    batch = broker.publish_batch([Outgoing("orders/a", b"y", "k"), Outgoing("orders/a", b"y", "k")])
    assert batch[0].seq == batch[1].seq and [r.duplicate for r in batch] == [False, True]
    assert len(broker.log()) == 2
    assert broker.stats()[0].depth == 2


def test_dedup_window_is_the_message_lifetime(node: Node, clock: FakeClock) -> None:
    orders(node)
    first = node.ingress.publish("orders/a", b"x", id="k", ttl=60)
    clock.advance(59)
    assert node.ingress.publish("orders/a", b"x", id="k").duplicate
    clock.advance(2)  # expired: the same id publishes a new message
    again = node.ingress.publish("orders/a", b"x", id="k")
    assert not again.duplicate and again.seq > first.seq


def test_bad_input_changes_nothing(broker: Broker) -> None:
    orders(broker)
    with pytest.raises(InvalidTopic):
        broker.publish_batch([Outgoing("orders/ok", b"1"), Outgoing("orders/bad topic", b"2")])
    with pytest.raises(PayloadTooLarge):
        broker.publish("orders/a", b"x" * (1024 * 1024 + 1))
    with pytest.raises(QueueNotFound):
        broker.fetch("nope")
    assert broker.log() == [] and broker.stats()[0].depth == 0


def test_expired_messages_are_never_delivered(node: Node, clock: FakeClock) -> None:
    orders(node)
    node.ingress.publish("orders/a", b"short", ttl=5)
    node.ingress.publish("orders/a", b"long")
    clock.advance(6)
    assert [d.message.payload for d in node.delivery.fetch("orders", 10)] == [b"long"]
    assert node.inspection.stats()[0].expired == 1


def test_redelivery_after_deadline_then_dead_letter(node: Node, clock: FakeClock) -> None:
    orders(node, max_redeliveries=1, dead_letter="orders-dlq", ack_timeout=10)
    node.ingress.publish("orders/a", b"poison")
    assert [d.attempt for d in node.delivery.fetch("orders")] == [1]
    assert node.delivery.fetch("orders") == []  # in flight
    clock.advance(11)
    assert [d.attempt for d in node.delivery.fetch("orders")] == [2]
    clock.advance(11)
    assert node.delivery.fetch("orders") == []
    (dead,) = node.delivery.fetch("orders-dlq")
    assert dead.message.payload == b"poison" and dead.seq == 1
    stats = {s.name: s for s in node.inspection.stats()}
    assert stats["orders"].dead_lettered == 1 and stats["orders-dlq"].in_flight == 1


def test_release_with_delay(node: Node, clock: FakeClock) -> None:
    orders(node)
    node.ingress.publish("orders/a", b"x")
    (d,) = node.delivery.fetch("orders")
    node.delivery.release("orders", [d.key], delay=30)
    assert node.delivery.fetch("orders") == []
    clock.advance(30)
    assert [x.attempt for x in node.delivery.fetch("orders")] == [2]
    with pytest.raises(NotInFlight):
        node.delivery.release("orders", [(999, 1)])


def test_delete_is_idempotent_and_refuses_undelivered(broker: Broker) -> None:
    orders(broker)
    broker.publish("orders/a", b"1")
    broker.publish("orders/a", b"2")
    (d,) = broker.fetch("orders", 1)
    with pytest.raises(NotInFlight):
        broker.delete("orders", [d.key, (2, 1)])
    assert broker.delete("orders", [d.key]) == [True]
    assert broker.delete("orders", [d.key]) == [False]
    assert broker.stats()[0].deleted == 1


def test_reopen_finds_everything(open_node: NodeFactory, clock: FakeClock) -> None:
    node = open_node()
    orders(node, max_redeliveries=1, dead_letter="dlq", ack_timeout=10)
    for i in range(5):
        node.ingress.publish("orders/a", str(i).encode(), id=f"m{i}")
    d1, _ = node.delivery.fetch("orders", 2)
    node.delivery.delete("orders", [d1.key])
    node.close()

    node = open_node()
    assert node.ingress.publish("orders/a", b"0", id="m0").duplicate  # dedup ids survive
    stats = node.inspection.stats()[1]
    assert (stats.depth, stats.deleted) == (4, 1)
    # What was in flight went with the node's consumers: it timed out at the restart.
    assert [(d.seq, d.attempt) for d in node.delivery.fetch("orders", 10)] == [
        (2, 2),
        (3, 1),
        (4, 1),
        (5, 1),
    ]
    node.close()

    node = open_node()  # the attempt counts survived: 2 had had its last attempt
    assert [(d.seq, d.attempt) for d in node.delivery.fetch("orders", 10)] == [
        (3, 2),
        (4, 2),
        (5, 2),
    ]
    assert [d.seq for d in node.delivery.fetch("dlq", 10)] == [2]
    assert node.ingress.publish("orders/a", b"new").seq == 6


def test_queue_admin(broker: Broker) -> None:
    assert broker.create_queue(QueueConfig.create("q", ["a"]))
    assert not broker.create_queue(QueueConfig.create("q", ["a"]))  # identical: no-op
    with pytest.raises(QueueExists):
        broker.create_queue(QueueConfig.create("q", ["b"]))
    assert broker.subscribe("q", "b/>") and not broker.subscribe("q", "b/>")
    broker.publish("b/x", b"1")
    assert broker.unsubscribe("q", "b/>")
    broker.publish("b/x", b"2")
    assert broker.stats()[0].depth == 1
    with pytest.raises(QueueNotEmpty):
        broker.delete_queue("q")
    assert broker.purge("q") == 1
    assert broker.delete_queue("q") == 0
    assert broker.queue_names() == []


def test_dead_letter_queue_cannot_be_deleted_first(broker: Broker) -> None:
    orders(broker, dead_letter="dlq")
    with pytest.raises(QueueNotEmpty, match="dead-letter queue of orders"):
        broker.delete_queue("dlq")


def test_compaction_and_gc_keep_the_store_bounded(
    open_node: NodeFactory, clock: FakeClock, data_dir: Path
) -> None:
    node = open_node(retention=0.0, compact_every=1000, gc_interval=0.0)
    orders(node)
    sizes = []
    for _round in range(12):
        node.ingress.publish_batch(
            [Outgoing("orders/a", b"x" * 256, id=f"{_round}-{i}") for i in range(5000)]
        )
        while taken := node.delivery.fetch("orders", 1000):
            node.delivery.delete("orders", [d.key for d in taken])
        clock.advance(1)
        node.maintenance.maintain()
        node.store._db.execute("CHECKPOINT")
        sizes.append((data_dir / DB_NAME).stat().st_size)
    assert node.inspection.log() == []  # everything consumed and past retention
    assert node.store.settled_rows() == 0
    assert max(sizes[6:]) <= max(sizes[:6]) * 1.1, sizes  # no growth once warm
    assert len(node.dedup) == 0
    node.close()
    node = open_node()
    assert node.ingress.publish("orders/a", b"x").seq == 60_001  # seqs never restart after GC
    assert node.inspection.stats()[0].deleted == 60_000


def test_second_process_is_refused(node: Node, data_dir: Path) -> None:
    with pytest.raises(DataDirLocked, match="in use by pid"):
        Node.open(data_dir)


def test_unusable_data_dir(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DataDirError, match="not a directory"):
        Node.open(f)
    with pytest.raises(DataDirError, match="no eomsg data"):
        Node.open(tmp_path / "missing", create=False)


def test_schema_from_the_future(open_node: NodeFactory) -> None:
    node = open_node()
    node.store.writer.run(
        lambda c: c.execute("INSERT INTO schema_migrations (version, name) VALUES (99, 'x')")
    ).result()
    node.close()
    with pytest.raises(SchemaTooNew):
        open_node()


def test_concurrent_publishers_and_consumers(broker: Broker) -> None:
    orders(broker)
    errors: list[BaseException] = []

    def produce(k: int) -> None:
        try:
            for i in range(200):
                broker.publish(f"orders/{k}", f"{k}-{i}".encode(), id=f"{k}-{i}")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    seen: list[bytes] = []
    while any(t.is_alive() for t in threads) or broker.stats()[0].depth:
        taken = broker.fetch("orders", 50)
        seen.extend(d.message.payload for d in taken)
        broker.delete("orders", [d.key for d in taken])
    for t in threads:
        t.join()
    assert not errors
    assert sorted(seen) == sorted(f"{k}-{i}".encode() for k in range(4) for i in range(200))


def test_storage_failure_acknowledges_nothing(open_node: NodeFactory) -> None:
    node = open_node()
    orders(node)
    node.ingress.publish("orders/a", b"kept")
    failpoints.configure("store.commit.before=error")
    try:
        with pytest.raises(StorageError):
            node.ingress.publish("orders/a", b"lost")
        with pytest.raises(StorageError):
            node.ingress.publish(
                "orders/a", b"refused", id="r"
            )  # the node stops trusting its state
    finally:
        failpoints.configure("")
    assert node.uncommitted_ids == {}  # a refused batch leaves nothing behind
    node.close()
    node = open_node()
    assert [m.payload for m in node.inspection.log()] == [b"kept"]


def test_a_restarted_node_collects_when_due_though_its_clock_stood_still(
    open_node: NodeFactory, clock: FakeClock
) -> None:
    """The last collection's time is kept to the microsecond: at some instants that
    reads back a hair past the clock, which must not put the next collection off."""
    clock.now = 1800000000.0000489
    assert int(clock.now * 1e6) / 1e6 > clock.now  # such an instant
    node = open_node(gc_interval=0.0, retention=0.0)
    orders(node)
    node.maintenance.maintain()  # a collection, at this instant
    node.close()
    node = open_node(gc_interval=0.0, retention=0.0)
    seq = node.ingress.publish("orders/a", b"x").seq
    (d,) = node.delivery.fetch("orders")
    node.delivery.delete("orders", [d.key])
    node.maintenance.maintain()
    assert node.inspection.log_horizon()[0] > seq


def test_saved_retention_drives_garbage_collection(
    open_node: NodeFactory, clock: FakeClock
) -> None:
    node = open_node(gc_interval=0.0)
    orders(node)
    assert node.admin.configure("retention", "1h") == "3600"
    node.close()
    node = open_node(gc_interval=0.0)  # the saved setting outlives the process
    assert node.settings.retention == 3600
    node.ingress.publish("orders/a", b"x", id="a")
    (d,) = node.delivery.fetch("orders")
    node.delivery.delete("orders", [d.key])
    clock.advance(1800)
    node.maintenance.maintain()
    assert len(node.inspection.log()) == 1  # consumed, but within retention
    clock.advance(1801)
    node.maintenance.maintain()
    assert node.inspection.log() == []
    assert not node.ingress.publish("orders/a", b"x", id="a").duplicate  # gone from the log: new


def test_row_tables_list_columns_in_table_order(node: Node) -> None:
    """The writer inserts Arrow batches by position, so the orders must agree."""
    from eomsg.store.schema import ROW_TABLES

    for name, schema in ROW_TABLES.items():
        columns, _ = node.inspection.query(f"SELECT * FROM {name} LIMIT 0")
        assert columns == [column for column, _ in schema], name


# -- flows (seed 002), in process: the node's side of the election ----------------------


def test_a_deposed_flow_hands_over_its_messages_in_order_and_cannot_delete(node: Node) -> None:
    node.admin.create_queue(QueueConfig("ex", ("ex/>",), max_active=1))
    for i in range(3):
        node.ingress.publish("ex/a", str(i).encode())
    heard: list[tuple[int, str, int]] = []
    low = node.elections.bind(
        "ex", priority=1, notify=lambda e: heard.append((e.flow, e.kind, e.epoch))
    )
    held = node.delivery.fetch("ex", 10, flow=low.flow)
    assert [d.epoch for d in held] == [low.epoch] * 3
    high = node.elections.bind(
        "ex", priority=2, notify=lambda e: heard.append((e.flow, e.kind, e.epoch))
    )
    assert heard == [
        (low.flow, "bound", low.epoch),
        (low.flow, "inactive", low.epoch),
        (high.flow, "bound", high.epoch),
    ]
    assert node.delivery.fetch("ex", 10, flow=low.flow) == []  # inactive: nothing
    with pytest.raises(StaleEpoch):
        node.delivery.delete("ex", [held[0].key], epoch=low.epoch)
    got = node.delivery.fetch("ex", 10, flow=high.flow)
    assert [(d.seq, d.attempt) for d in got] == [(d.seq, 2) for d in held]
    with pytest.raises(StaleEpoch):  # the message is another epoch's now
        node.delivery.delete("ex", [got[0].key])
    assert node.delivery.delete("ex", [d.key for d in got], epoch=high.epoch) == [True] * 3
    with pytest.raises(NotActive):
        node.delivery.fetch("ex", 10)
    assert [(f.flow, f.active) for f in node.elections.flows("ex")] == [
        (high.flow, True),
        (low.flow, False),
    ]
    assert node.elections.unbind("ex", low.flow) == 0
    with pytest.raises(FlowNotFound):
        node.elections.unbind("ex", low.flow)


def test_a_delivery_given_back_unseen_stays_uncounted_across_restarts(
    open_node: NodeFactory,
) -> None:
    """What a consumer took ahead and never handed out (its prefetch) does not count,
    after a restart too: a command-line consumer opening the store for each run must
    not push the messages it never showed toward the dead-letter queue."""
    node = open_node()
    orders(node, max_redeliveries=1, dead_letter="dlq")
    for i in range(3):
        node.ingress.publish("orders/a", str(i).encode())
    for _ in range(2):  # seq 1 handed out (attempt 1) and given back unseen, twice
        taken = node.delivery.fetch("orders", 3, holder=7)
        assert [(d.seq, d.attempt) for d in taken][:1] == [(1, 1)]
        node.delivery.return_unseen("orders", [d.key for d in taken], holder=7)
    (d1,) = node.delivery.fetch(
        "orders", 1, holder=7
    )  # attempt 1 a third time: in flight at the stop
    assert d1.key == (1, 1)
    node.close()

    node = open_node()  # seq 1 counts once (in flight at the stop); 2 and 3 never did
    assert [(d.seq, d.attempt) for d in node.delivery.fetch("orders", 3, holder=7)] == [
        (1, 2),
        (2, 1),
        (3, 1),
    ]
    node.delivery.return_unseen("orders", [(2, 1), (3, 1)], holder=7)
    node.close()

    node = open_node()  # seq 1 had its last attempt; 2 and 3 are still at their first
    assert [(d.seq, d.attempt) for d in node.delivery.fetch("orders", 3)] == [(2, 1), (3, 1)]
    assert [d.seq for d in node.delivery.fetch("dlq", 10)] == [1]
    node.close()


def test_epochs_never_repeat_across_restarts(open_node: NodeFactory) -> None:
    seen = []
    for _ in range(3):
        with open_node() as node:
            if "q" not in node.admin.queue_names():
                node.admin.create_queue(QueueConfig("q", max_active=1))
            flow = node.elections.bind("q")
            seen.append(flow.epoch)
            node.elections.unbind("q", flow.flow)
    assert seen == sorted(set(seen))


def test_deleting_a_queue_unbinds_its_flows(node: Node) -> None:
    node.admin.create_queue(QueueConfig("q", max_active=2))
    heard: list[str] = []
    node.elections.bind("q", notify=lambda e: heard.append(e.kind))
    node.admin.delete_queue("q")
    assert heard == ["bound", "unbound"]


def test_browse_shows_what_waits_without_taking_it(broker: Broker) -> None:
    orders(broker)
    for i in range(1, 6):
        broker.publish("orders/a", f"m{i}".encode())
    held = broker.fetch("orders", 2)
    broker.delete("orders", [held[0].key])
    assert [m.seq for m in broker.browse("orders")] == [2, 3, 4, 5]  # in flight included
    assert [(m.seq, m.payload) for m in broker.browse("orders", 4, 1)] == [(4, b"m4")]
    assert [m.seq for m in broker.browse("orders", from_seq=6)] == []
    # Nothing was taken or counted: the next fetch hands out 3, 4, 5 at their first attempt.
    assert [(d.seq, d.attempt) for d in broker.fetch("orders", 10)] == [(3, 1), (4, 1), (5, 1)]
    with pytest.raises(QueueNotFound):
        broker.browse("nosuch")


def test_requeue_moves_dead_letters_back_once_and_only_there(broker: Broker) -> None:
    orders(broker, max_redeliveries=0, dead_letter="orders-dlq")
    broker.create_queue(QueueConfig.create("audit", ["orders/>"]))
    for i in range(1, 4):
        broker.publish("orders/a", f"m{i}".encode(), id=f"id-{i}", headers={"k": "v"})
    for d in broker.fetch("orders", 3):  # released past the last attempt: dead-lettered
        broker.release("orders", [d.key])
    assert broker.stats()[2].depth == 3  # orders-dlq
    with pytest.raises(InvalidConfig, match="cannot be requeued into itself"):
        broker.requeue("orders-dlq", "orders-dlq")
    with pytest.raises(InvalidConfig, match="no queue dead-letter into 'audit'"):
        broker.requeue("audit")
    assert broker.requeue("orders-dlq", max_messages=2) == (2, "orders")
    assert broker.requeue("orders-dlq") == (1, "orders")
    assert broker.requeue("orders-dlq") == (0, "orders")
    got = broker.fetch("orders", 10)
    assert [(d.seq, d.attempt, d.message.payload, d.message.id) for d in got] == [
        (4, 1, b"m1", None),
        (5, 1, b"m2", None),
        (6, 1, b"m3", None),
    ]
    assert got[0].message.headers == {"k": "v", "eomsg-requeued-from": "1"}
    stats = {s.name: s for s in broker.stats()}
    assert (stats["orders-dlq"].depth, stats["orders-dlq"].deleted) == (0, 3)
    assert stats["audit"].depth == 3  # the first publish only: requeued copies go to orders


def test_requeued_messages_survive_a_restart(open_node: NodeFactory) -> None:
    node = open_node()
    orders(node, max_redeliveries=0, dead_letter="orders-dlq")
    node.ingress.publish("orders/a", b"m1")
    (d,) = node.delivery.fetch("orders", 1)
    node.delivery.release("orders", [d.key])
    assert node.ingress.requeue("orders-dlq") == (1, "orders")
    node.close()
    node = open_node()
    assert [(d.seq, d.message.payload) for d in node.delivery.fetch("orders", 10)] == [(2, b"m1")]
    assert node.inspection.stats()[1].depth == 0
    node.close()


def test_stats_count_the_bytes_each_queue_holds(broker: Broker) -> None:
    orders(broker)
    broker.create_queue(QueueConfig.create("eu", ["orders/eu"]))
    for size in (10, 20, 30):
        broker.publish("orders/eu", b"x" * size)
    broker.publish("orders/us", b"y" * 100)
    assert {s.name: s.bytes for s in broker.stats()} == {"eu": 60, "orders": 160}
    (d,) = broker.fetch("orders", 1)
    broker.delete("orders", [d.key])
    broker.purge("eu")
    assert {s.name: s.bytes for s in broker.stats()} == {"eu": 0, "orders": 150}


def test_a_release_after_a_message_was_given_back_twice_is_kept_across_a_restart(
    tmp_path: Path,
) -> None:
    """Found by the test below: delivery 1 times out in a consumer's buffer, delivery 2
    is given back unseen (attempt 1 again), then delivery 1's stale give-back un-counts
    that too (attempt 0); the next delivery reuses number 1 and is released for 5 s. A
    restart keeps it parked for those 5 s, as memory did — not ready at once, which the
    highest attempt ever made (2, given back) once made it."""
    clock = FakeClock()

    def opened() -> Node:
        return Node.open(tmp_path / "data", NodeSettings(tick=None), clock)

    node = opened()
    try:
        node.admin.create_queue(QueueConfig.create("q", ["t/>"], ack_timeout=10))
        node.ingress.publish("t/a", b"m")
        [first] = node.delivery.fetch("q", 1, holder=1)
        clock.advance(11)
        node.maintenance.maintain()  # delivery 1 timed out, in the consumer's buffer
        [second] = node.delivery.fetch("q", 1, holder=1)
        assert second.key == (1, 2)
        node.delivery.return_unseen("q", [second.key], holder=1)
        node.delivery.return_unseen("q", [first.key], holder=1)  # stale: un-counted too
        [third] = node.delivery.fetch("q", 1, holder=1)
        assert third.key == (1, 1)
        node.delivery.release("q", [third.key], 5, holder=1)
        node.close()
        node = opened()
        node.maintenance.maintain()
        assert node.delivery.fetch("q", 1, holder=1) == []  # parked: due in 5 s
        clock.advance(5)
        [again] = node.delivery.fetch("q", 1, holder=1)
        assert again.key == (1, 2)
    finally:
        node.close()


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.booleans(), st.sampled_from([3, 50_000]))
def test_attempts_after_a_restart_are_those_in_memory(
    rnd: random.Random, flows: bool, compact_every: int
) -> None:
    """Random deliveries, unseen and counted give-backs (stale ones too), deletes,
    timeouts, flows bound and unbound, compactions and restarts: after each restart every
    pending message has the attempt count it had in memory (in flight: ready again)."""
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"

        def opened() -> Node:
            return Node.open(data, NodeSettings(tick=None, compact_every=compact_every), clock)

        def attempts(node: Node) -> tuple[dict[int, tuple[int, str]], list[int]]:
            cursor = node.queues["q"].cursor
            return {
                s: (
                    e.attempt,
                    "flight"
                    if e.in_flight
                    else ("ready" if e.ready or e.due <= clock() else "parked"),
                )
                for s, e in cursor._delivered.items()
            }, cursor.pending()

        node = opened()
        try:
            node.admin.create_queue(QueueConfig.create("q", ["t/>"], ack_timeout=10))
            for i in range(6):
                node.ingress.publish("t/a", str(i).encode())
            held: dict[int, list[tuple[tuple[int, int], int]]] = {}
            bound: dict[int, int] = {}
            ops = ["fetch", "fetch", "unseen", "unseen", "stale", "release", "later", "delete",
                   "advance", "reopen"] + (["bind", "unbind"] if flows else [])  # fmt: skip
            for _ in range(40):
                op, h = rnd.choice(ops), rnd.choice([1, 2])
                mine = held.setdefault(h, [])
                if op == "fetch":
                    with contextlib.suppress(NotActive):
                        got = node.delivery.fetch(
                            "q", rnd.randint(1, 3), holder=h, flow=bound.get(h)
                        )
                        mine.extend((d.key, d.epoch) for d in got)
                elif op in ("unseen", "stale") and mine:
                    picked = rnd.sample(mine, rnd.randint(1, len(mine)))
                    for key, epoch in picked:
                        node.delivery.return_unseen("q", [key], epoch=epoch, holder=h)
                    if op == "unseen":  # a stale one is given back again later
                        held[h] = [x for x in mine if x not in picked]
                elif op in ("release", "later", "delete") and mine:
                    key, epoch = mine.pop(rnd.randrange(len(mine)))
                    with contextlib.suppress(EomsgError):
                        if op == "delete":
                            node.delivery.delete("q", [key], epoch=epoch, holder=h)
                        else:
                            node.delivery.release(
                                "q", [key], 0 if op == "release" else 5, epoch=epoch, holder=h
                            )
                elif op == "advance":
                    clock.advance(rnd.choice([3, 11]))
                    node.maintenance.maintain()
                elif op == "bind" and h not in bound:
                    bound[h] = node.elections.bind("q").flow
                elif op == "unbind" and h in bound:
                    seen = [k for k, _ in rnd.sample(mine, rnd.randint(0, len(mine)))]
                    node.elections.unbind("q", bound.pop(h), seen=seen)
                    held[h] = []
                elif op == "reopen":
                    before, pending = attempts(node)
                    node.close()
                    node = opened()
                    node.maintenance.maintain()
                    after, pending_after = attempts(node)
                    held, bound = {}, {}
                    assert pending_after == pending
                    for seq, (attempt, state) in before.items():
                        expected = (attempt, "ready") if state == "flight" else (attempt, state)
                        assert after.get(seq, (0, "ready")) == expected, (seq, before, after)
        finally:
            node.close()


def test_the_log_is_written_in_row_groups_of_the_stores_size(node: Node) -> None:
    """The store gives DuckDB its row group size at every open (an option of ATTACH,
    not kept in the file): a checkpoint then writes 16,384 rows a row group, not
    122,880 (which took up to 0.9 s and 125 MiB of memory at 10,000 messages a second)."""
    from eomsg.store.opening import CATALOG, ROW_GROUP_ROWS

    for start in range(0, 40_000, 10_000):
        node.ingress.publish_batch(
            [Outgoing("t/x", b"x", id=f"{start + i}") for i in range(10_000)]
        )
    node.store.writer.sync()
    cursor = node.store.reads.cursor()
    cursor.execute(f"CHECKPOINT {CATALOG}")
    sizes = cursor.execute(
        "SELECT row_group_id, max(start + count) FROM pragma_storage_info('messages') "
        "GROUP BY ALL ORDER BY 1"
    ).fetchall()
    rows = [n for _, n in sizes]  # (checkpoints between the batches leave some short)
    assert sum(rows) == 40_000 and max(rows) == ROW_GROUP_ROWS, rows


def test_a_store_asks_of_its_own_database_whether_it_has_tables(tmp_path: Path) -> None:
    """Whether a store has its tables and its schema version are asked of its own
    database alone: another attached one with the same tables counts for nothing (and
    asking of every database cost ≈ 5 ms a node's open)."""
    from eomsg.store.opening import has_meta
    from eomsg.store.schema import migrate, schema_version

    other = tmp_path / "other.duckdb"
    with Node.open(tmp_path / "data", NodeSettings(tick=None)):
        pass
    with duckdb.connect(str(other)) as conn:
        assert (has_meta(conn), schema_version(conn)) == (False, 0)
        conn.execute(f"ATTACH '{tmp_path / 'data' / 'eomsg.duckdb'}' AS store (READ_ONLY)")
        assert (has_meta(conn), schema_version(conn)) == (False, 0)
        migrate(conn)  # (its first migration makes node_meta)
        assert has_meta(conn) and schema_version(conn) > 0
