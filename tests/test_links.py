"""Linked nodes, in process (node/links.py): interest reaches the nodes that route to it,
a message published anywhere lands once in each subscribed queue of every node, in
per-origin order, whatever the links do to the frames — drops, repeats, reorders, cuts
— and across restarts of any node. The frames travel through a test network here; the
server carries them over TCP in tests/test_network.py."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import duckdb
import pytest

from eomsg.core.message import Carried, Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import InvalidConfig, InvalidPattern, LinkNotFound
from eomsg.store import journal
from eomsg.store.files import DB_NAME
from eomsg.store.journal import Journal
from eomsg.store.writer import RowBatch, applied_lsn
from tests.conftest import pending_rows
from tests.linknet import MakeNet


def test_a_chain_carries_a_message_to_the_interested_node_once(net: MakeNet) -> None:
    n = net("abc")
    n.link("a", "b")
    n.link("b", "c")
    n.nodes["c"].admin.create_queue(QueueConfig("audit", subscriptions=("orders/>",)))
    n.run()
    assert n.nodes["a"].links.link_info()[0].reaches == ("b", "c")
    result = n.nodes["a"].ingress.publish("orders/eu/new", b"1")
    assert result.queues == 1  # the link toward c
    n.run()
    assert n.drain("c", "audit") == [("a", "1")]
    assert [i.pending for i in n.nodes["a"].links.link_info()] == [0]
    assert n.nodes["b"].admin.queue_names() == []  # b only forwarded


@pytest.mark.parametrize("egress", ["store", "memory"])
@pytest.mark.parametrize("seed", range(4))
def test_every_message_lands_once_in_order_through_faults_cuts_and_restarts(
    net: MakeNet, seed: int, egress: str
) -> None:
    """With egress in memory too: what a node holds is written when its hold ends or
    the node stops, so nothing is lost or doubled."""
    rng = random.Random(seed)
    n = net("abcd", seed=seed, faults=0.1, egress=egress)
    for a, b in (("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")):  # a ring
        n.link(a, b)
    for node in "bcd":
        n.nodes[node].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    sent: dict[str, list[str]] = {name: [] for name in n.nodes}
    for i in range(300):
        origin = rng.choice("abcd")
        payload = f"{origin}-{i}"
        n.nodes[origin].ingress.publish(f"t/{origin}", payload.encode())
        sent[origin].append(payload)
        n.step()
        r = rng.random()
        if r < 0.03:
            a, b = rng.choice(sorted(n.links))
            n.cut(a, b)
        elif r < 0.06:
            n.heal()
        elif r < 0.08:
            n.restart(rng.choice("abcd"))
    n.heal()
    n.run()
    for node in "bcd":
        got = n.drain(node, "q")
        for origin, payloads in sent.items():
            mine = [p for o, p in got if o == origin]
            assert mine == payloads, (node, origin)  # each once, in the order published
        assert len(got) == sum(map(len, sent.values()))


def test_what_a_peer_took_is_one_number_compacted_and_kept_across_a_restart(
    net: MakeNet,
) -> None:
    """Acknowledgements are cumulative, so what a peer took is a prefix of what its link
    owes: the ingress node keeps one number per link, not a settlement row per message,
    written with the next write; compaction drops the routes' rows it covers, and a
    restart before that owes none of them again (and counts them for the next
    compaction)."""
    n = net("ab", compact_every=30)
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    seqs = [n.nodes["a"].ingress.publish("t/x", str(i).encode()).seq for i in range(25)]
    n.run()
    a = n.nodes["a"]

    def route_rows() -> list[int]:
        a.store.writer.run(lambda conn: None).result()  # after every write queued
        runs = a.store.load_route_runs().values()
        return [seq for route in runs for lo, hi in route for seq in range(lo, hi + 1)]

    assert route_rows() == seqs  # not compacted yet
    assert a.store.settled_rows() == 0
    assert a.store.meta("link/b/taken") is None  # not worth a disk flush of its own:
    a.maintenance.maintain()  # written with the next write, or at the next tick
    route_rows()
    assert a.store.meta("link/b/taken") == str(seqs[-1])
    n.restart("a")
    n.heal()
    a = n.nodes["a"]
    assert a.links.link_info()[0].pending == 0  # owed again: nothing
    n.nodes["a"].ingress.publish("t/x", b"25")
    n.run()
    a.maintenance.maintain()  # 26 taken since the last compaction: not yet
    assert route_rows() == [*seqs, seqs[-1] + 1]
    for i in range(26, 30):
        n.nodes["a"].ingress.publish("t/x", str(i).encode())
    n.run()
    a.maintenance.maintain()  # 30 taken since (25 of them before the restart): compacted
    assert route_rows() == []
    assert [p for _, p in n.drain("b", "q")] == [str(i) for i in range(30)]  # once each
    a.admin.configure("retention", "0")
    a.admin.configure("gc-interval", "0")
    last = n.nodes["a"].ingress.publish("t/x", b"30").seq
    n.run()
    a.maintenance.maintain()  # written before the log is collected: the peer holds what goes
    assert a.inspection.log_horizon()[0] > last
    assert a.store.meta("link/b/taken") == str(last)


def test_a_route_is_stored_as_runs_of_seqs_and_owed_again_after_a_restart(
    net: MakeNet,
) -> None:
    """A batch's messages going one way over a link are one row (a run of seqs), not one
    each: the link's destination, stored in their commit. A restart owes exactly what
    the runs hold past what the peer took, and compaction drops the runs it covers."""
    n = net("ab", compact_every=1)
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("far", subscriptions=("t/>",)))
    n.nodes["a"].admin.create_queue(QueueConfig("near", subscriptions=("l/>",)))
    n.run()
    n.cut("a", "b")
    a = n.nodes["a"]
    topics = ["t/1", "t/2", "t/3", "l/4", "t/5", "t/6"]
    seqs = [r.seq for r in a.ingress.publish_batch([Outgoing(t, t.encode()) for t in topics])]
    seqs += [a.ingress.publish("t/7", b"t/7").seq]  # a batch of its own: a run of its own
    a.store.writer.sync()  # in DuckDB, not only in the journal
    ((route, runs),) = a.store.load_route_runs().items()
    assert route < 0
    assert runs == [(seqs[0], seqs[2]), (seqs[4], seqs[5]), (seqs[6], seqs[6])]
    assert [(r.queue_id, r.seq) for r in pending_rows(a.store)] == [(1, seqs[3])]
    n.restart("a")
    a = n.nodes["a"]
    assert a.links.link_info()[0].pending == 6
    n.heal()
    n.run()
    assert [p for _, p in n.drain("b", "far")] == [t for t in topics if t[0] == "t"] + ["t/7"]
    a.maintenance.maintain()  # taken: every run ends at or before what b took
    a.store.writer.sync()
    assert a.store.load_route_runs() == {}
    n.restart("a")
    assert n.nodes["a"].links.link_info()[0].pending == 0


def back_to_schema_6(data_dir: Path) -> None:
    """Undo migrations 7 (what the links owe as a destination row per message again)
    and 8 (delivery runs: none here)."""
    with duckdb.connect(str(data_dir / DB_NAME)) as db:
        db.execute(
            """INSERT INTO destinations
               SELECT unnest(range(lo, hi + 1)), route_id FROM route_runs"""
        )
        db.execute("DROP TABLE route_runs")
        db.execute("DROP TABLE delivery_runs")
        db.execute("DELETE FROM schema_migrations WHERE version >= 7")


def test_what_links_owe_in_a_store_from_before_route_runs_is_owed_still(net: MakeNet) -> None:
    """A data directory of schema 6 kept a destination row per message for a link's
    route: opened, they become runs, owed as before — those its journal still held (a
    node of that version killed before its rows reached DuckDB) too — but for a row
    settled the way an older node settled it (a ``settled`` row), not owed again."""
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("far", subscriptions=("t/>",)))
    n.nodes["a"].admin.create_queue(QueueConfig("near", subscriptions=("t/>",)))
    n.run()
    n.cut("a", "b")
    a = n.nodes["a"]
    seqs = [r.seq for r in a.ingress.publish_batch([Outgoing("t/x", b"%d" % i) for i in range(5)])]
    a.store.writer.sync()
    ((route, _),) = a.store.load_route_runs().items()
    now_us = int(n.now * 1_000_000)

    def old_store(data_dir: Path) -> None:
        back_to_schema_6(data_dir)
        with duckdb.connect(str(data_dir / DB_NAME)) as db:
            db.execute(
                """INSERT INTO settled SELECT queue_id, seq, 0, now()::TIMESTAMP
                   FROM destinations WHERE queue_id < 0 AND seq = ?""",
                [seqs[0]],
            )
            applied = applied_lsn(db)
        directory = data_dir / journal.DIR_NAME  # journaled, not in DuckDB:
        j = Journal.start(directory, applied, found=journal.scan(directory, applied, legacy=True))
        batch = RowBatch()
        for seq in (seqs[-1] + 1, seqs[-1] + 2):
            batch.add("messages", seq, "t/x", None, now_us, None, None, b"j%d" % seq)
            batch.add("destinations", seq, route)
        j.append(batch.encode())
        j.close(applied=0)

    n.restart("a", while_down=old_store)
    a = n.nodes["a"]
    assert a.links.link_info()[0].pending == 6
    assert [r.seq for r in pending_rows(a.store) if r.queue_id > 0] == seqs  # near's
    assert [r for r in pending_rows(a.store) if r.queue_id < 0] == []
    assert all(queue_id > 0 for queue_id in a.store.pending_bytes())
    n.heal()
    n.run()
    late = [f"j{seqs[-1] + 1}", f"j{seqs[-1] + 2}"]
    assert [p for _, p in n.drain("b", "far")] == ["1", "2", "3", "4", *late]
    assert [p for _, p in n.drain("a", "near")] == ["0", "1", "2", "3", "4"]


def test_frames_for_the_event_loop_are_made_only_of_messages_in_memory(net: MakeNet) -> None:
    """The server asks for a link's frames on its event loop first, where nothing may
    block: if a message must be read from DuckDB, it gets None and nothing is taken
    (then it asks again on a thread)."""
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    a = n.nodes["a"]
    for i in range(3):
        a.ingress.publish("t/x", str(i).encode())
    a.store.writer.run(lambda conn: None).result()  # in DuckDB, out of the overlay
    a.store.writer.recent.forget_below(2**62)  # and no longer kept in memory
    assert a.transfer.link_frames("b", memory_only=True) is None
    ((_, batch),) = a.transfer.link_frames("b")
    assert batch.payloads == (b"0", b"1", b"2")  # none was taken before


def test_a_queue_deleted_withdraws_its_interest(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    assert n.nodes["a"].ingress.publish("t/1", b"x").queues == 1
    n.run()
    n.nodes["b"].admin.purge("q")
    n.nodes["b"].admin.delete_queue("q")
    n.run()
    assert n.nodes["a"].ingress.publish("t/2", b"y").queues == 0


def test_publish_ids_dedup_across_the_network(net: MakeNet) -> None:
    n = net("abc")
    n.link("a", "b")
    n.link("b", "c")
    n.nodes["c"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    n.nodes["a"].ingress.publish("t/x", b"once", id="order-1")
    n.nodes["b"].ingress.publish("t/x", b"once", id="order-1")  # a retry sent to another node
    n.run()
    assert [p for _, p in n.drain("c", "q")] == ["once"]


def test_links_are_checked(net: MakeNet) -> None:
    n = net("a")
    a = n.nodes["a"]
    with pytest.raises(InvalidConfig, match="own name"):
        a.links.add_link("a", None, None)
    with pytest.raises(InvalidConfig, match="node name 'x y'"):
        a.links.add_link("x y", None, None)
    with pytest.raises(InvalidConfig, match="needs a token"):
        a.links.add_link("b", "tcp://127.0.0.1:1", None)
    with pytest.raises(InvalidConfig, match="needs a tls:// address"):
        a.links.add_link("b", "tcp://127.0.0.1:1", "t", "-----BEGIN CERTIFICATE-----")
    with pytest.raises(InvalidConfig, match="for the side that dials"):
        a.links.add_link("b", None, "t", "-----BEGIN CERTIFICATE-----")
    assert a.links.add_link("b", "tcp://127.0.0.1:1", "t")
    assert not a.links.add_link("b", "tcp://127.0.0.1:1", "t")
    with pytest.raises(InvalidConfig, match="other settings"):
        a.links.add_link("b", "tcp://127.0.0.1:2", "t")
    with pytest.raises(InvalidConfig, match="other settings"):
        a.links.add_link("b", "tcp://127.0.0.1:1", "u")
    with pytest.raises(LinkNotFound, match="no link to 'c'"):
        a.links.remove_link("c")
    assert a.links.remove_link("b") == 0
    assert a.links.link_info() == []


def test_a_receiver_that_lost_its_state_gets_what_follows(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    n.nodes["a"].ingress.publish("t/1", b"1")
    n.run()
    n.cut("a", "b")
    n.nodes["b"].links.remove_link("a")  # b forgets how far it had taken a's messages
    n.nodes["b"].links.add_link("a", None, None)
    n.connect("a", "b")
    n.run()
    n.nodes["a"].ingress.publish("t/2", b"2")
    n.run()
    assert n.drain("b", "q") == [("a", "1"), ("a", "2")]


def test_a_message_the_receiver_cannot_take_is_refused_not_a_wedge(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.nodes["b"].admin.configure("max-payload", "1KiB")
    n.run()
    n.nodes["a"].ingress.publish("t/big", b"x" * 4096)
    n.nodes["a"].ingress.publish("t/small", b"after")
    n.run()
    assert n.drain("b", "q") == [("a", "after")]
    (info,) = n.nodes["b"].links.link_info()
    assert info.refused == 1


def test_an_acknowledgement_of_what_was_never_sent_settles_nothing(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    for i in range(5):
        n.nodes["a"].ingress.publish("t/x", str(i).encode())  # owed, not sent yet
    n.nodes["a"].transfer.link_taken("b", 10**12, False)  # a lying (or confused) peer
    assert n.nodes["a"].links.link_info()[0].pending == 5
    n.run()
    assert [p for _, p in n.drain("b", "q")] == ["0", "1", "2", "3", "4"]


def test_a_message_for_a_node_out_of_reach_is_counted_not_a_wedge(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    nowhere = Carried(1, "t/x", b"p", None, None, {}, ("b", "zz"), "a", "1")
    assert n.nodes["b"].intake.accept_transfer("a", 0, [nowhere]).result() == (1, False)
    (info,) = n.nodes["b"].links.link_info()
    assert info.unroutable == 1
    assert [p for _, p in n.drain("b", "q")] == ["p"]


def test_a_link_carries_only_the_topics_it_is_set_to(net: MakeNet) -> None:
    """Either way: a publish of another topic is not routed to the link, a message of
    another topic the peer sends is passed over, and one to carry on over a link that
    does not carry its topic stops there — each counted as withheld where it stopped."""
    n = net("abc")
    n.link("a", "b")
    n.link("b", "c")
    for name in "bc":
        n.nodes[name].admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    a, b = n.nodes["a"], n.nodes["b"]
    assert a.links.set_link_topics("b", ["t/ok/>", "t/more/*"])
    assert not a.links.set_link_topics("b", ["t/more/*", "t/ok/>"])  # the same set
    assert b.links.set_link_topics("c", ["t/ok/>"])
    for topic in ("t/ok/1", "t/no/1", "t/more/x"):
        assert a.ingress.publish(topic, topic.encode()).queues == (0 if topic == "t/no/1" else 1)
    n.run()
    assert [p for _, p in n.drain("b", "q")] == ["t/ok/1", "t/more/x"]
    assert [p for _, p in n.drain("c", "q")] == ["t/ok/1"]  # t/more/x stopped at b
    assert {i.peer: i.withheld for i in b.links.link_info()} == {"a": 0, "c": 1}
    assert b.links.set_link_topics("a", ["t/ok/>"])  # b's side now refuses t/more too
    a.links.set_link_topics("b", None)
    a.ingress.publish("t/more/y", b"refused at b")
    n.run()
    assert n.drain("b", "q") == [] and {i.peer: i.withheld for i in b.links.link_info()}["a"] == 1
    assert a.links.link_info()[0].pending == 0  # passed over, not left owed
    with pytest.raises(InvalidPattern):
        a.links.set_link_topics("b", ["t/>/x"])
    assert b.links.link_info()[0].topics == ("t/ok/>",)


def test_a_node_whose_queues_are_over_their_memory_holds_its_links_back(net: MakeNet) -> None:
    """Messages coming over a link count against the queues' share of memory as a
    producer's do: past it the node takes none (the peer keeps them), and once a
    consumer takes the queue back under it every one arrives, once, in order."""
    n = net("ab")
    n.link("a", "b")
    b = n.nodes["b"]
    b.admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    b.settings = dataclasses.replace(b.settings, queue_memory=600)  # 8 B a message waiting
    for wave in range(6):  # (what is journaled and not yet in DuckDB counts too: synced)
        for i in range(50 * wave, 50 * wave + 50):
            n.nodes["a"].ingress.publish("t/x", str(i).encode())
        n.rounds(1)
        b.store.writer.sync()
    (stats,) = b.inspection.stats()
    assert 0 < stats.depth < 300 and n.nodes["a"].links.link_info()[0].pending > 0
    got: list[str] = []
    for _ in range(50):
        while taken := b.delivery.fetch("q", 50):
            b.delivery.delete("q", [d.key for d in taken])
            got += [d.message.payload.decode() for d in taken]
        if len(got) == 300:
            break
        b.store.writer.sync()
        n.rounds(1)
    assert got == [str(i) for i in range(300)]
    n.run()  # quiet now: nothing owed


# Two messages of one payload byte each, counted either way.
LIMITS = {"max-messages": {"max_messages": 2}, "max-bytes": {"max_bytes": 2}}


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("egress", ["store", "memory"])
def test_a_full_queue_that_refuses_holds_the_link_until_it_has_room(
    net: MakeNet, egress: str, limit: str
) -> None:
    """Limits meet links: messages for a queue that refuses past its max-messages (or
    max-bytes) stay owed by the sending node (nothing lost, nothing taken twice), and
    flow once its consumer made room — in order, each once."""
    n = net("ac", egress=egress)
    n.link("a", "c")
    n.nodes["c"].admin.create_queue(QueueConfig.create("audit", ("orders/>",), **LIMITS[limit]))
    n.run()
    for i in range(5):
        n.nodes["a"].ingress.publish("orders/eu/new", str(i).encode())
    n.rounds(3)
    assert [s.depth for s in n.nodes["c"].inspection.stats()] == [2]
    assert n.nodes["c"].inspection.stats()[0].overflowed > 0
    # (a queue with a limit is never held in memory: its frames are stored, taken)
    assert [i.pending for i in n.nodes["a"].links.link_info()] == [3]
    got = n.drain("c", "audit")
    while len(got) < 5:
        n.rounds(2)
        got += n.drain("c", "audit")
    assert got == [("a", str(i)) for i in range(5)]
    n.run()
    assert [i.pending for i in n.nodes["a"].links.link_info()] == [0]


def test_a_message_that_can_never_fit_a_queue_does_not_hold_up_the_link(net: MakeNet) -> None:
    """A message larger than a refusing queue's max-bytes would wait at the peer for
    ever, and everything behind it on the link too (found in review): that queue is
    left out of its route, said in the log; its other queues get it, and the link goes
    on."""
    n = net("ac")
    n.link("a", "c")
    c = n.nodes["c"]
    c.admin.create_queue(QueueConfig.create("audit", ("orders/>",), max_bytes=5))
    c.admin.create_queue(QueueConfig.create("other", ("orders/>",)))
    n.run()
    n.nodes["a"].ingress.publish("orders/x", b"0123456789")
    for i in range(3):
        n.nodes["a"].ingress.publish("orders/x", b"%d" % i)
    n.run()
    assert n.drain("c", "audit") == [("a", "0"), ("a", "1"), ("a", "2")]
    assert n.drain("c", "other") == [("a", "0123456789"), ("a", "0"), ("a", "1"), ("a", "2")]
    assert [i.pending for i in n.nodes["a"].links.link_info()] == [0]
    assert {s.name: s.overflowed for s in c.inspection.stats()}["audit"] >= 1


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("egress", ["store", "memory"])
def test_a_full_queue_that_dead_letters_its_oldest_takes_the_whole_link(
    net: MakeNet, egress: str, limit: str
) -> None:
    """Limits meet links: a queue that dead-letters its oldest takes every message the
    link brings — the newest stay, the oldest go to its dead-letter queue — each once."""
    n = net("ac", egress=egress)
    n.link("a", "c")
    c = n.nodes["c"]
    c.admin.create_queue(
        QueueConfig.create(
            "audit", ("orders/>",), overflow="dead-letter-oldest", dead_letter="old",
            **LIMITS[limit],
        )
    )  # fmt: skip
    n.run()
    n.nodes["a"].ingress.publish_batch([Outgoing("orders/x", b"%d" % i) for i in range(3)])
    n.run()
    for i in range(3, 6):
        n.nodes["a"].ingress.publish("orders/x", b"%d" % i)
        n.run()
    assert n.drain("c", "audit") == [("a", "4"), ("a", "5")]
    assert n.drain("c", "old") == [("a", str(i)) for i in range(4)]
    assert {s.name: s.overflowed for s in c.inspection.stats()} == {"audit": 4, "old": 0}
    assert [i.pending for i in n.nodes["a"].links.link_info()] == [0]
