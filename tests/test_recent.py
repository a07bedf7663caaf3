"""The latest messages kept in memory after DuckDB holds them (eomsg.store.recent): bounded
in bytes with the oldest dropped first, served as DuckDB serves them, read ahead of a
dense read, and dropped with what the collector drops."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.node.node import Node
from eomsg.store.recent import AHEAD_BYTES, AHEAD_ROWS, ROW_COST, Recent
from tests.conftest import NodeFactory


def row(seq: int, size: int) -> tuple[int, str, None, int, None, None, bytes]:
    return (seq, "t/x", None, 0, None, None, bytes(size))


@given(st.lists(st.integers(0, 5000), max_size=60), st.integers(0, 40_000))
def test_the_rows_kept_stay_within_the_limit_newest_first(sizes: list[int], limit: int) -> None:
    recent = Recent(limit)
    for seq, size in enumerate(sizes):
        recent.add([row(seq, size)])
    assert recent.size <= limit
    assert recent.size == sum(sizes[s] + ROW_COST for s in range(len(sizes)) if recent.get(s))
    kept = [s for s in range(len(sizes)) if recent.get(s) is not None]
    assert kept == list(range(len(sizes) - len(kept), len(sizes)))  # a suffix: the newest
    if sizes and sizes[-1] + ROW_COST <= limit:
        assert recent.get(len(sizes) - 1) == row(len(sizes) - 1, sizes[-1])


def test_a_row_added_twice_is_kept_once() -> None:
    recent = Recent(10_000)
    recent.add([row(1, 10), row(2, 10)])
    recent.add([row(2, 10)])  # a read ahead may read what the applier just added
    assert len(recent) == 2
    assert recent.get(2) == row(2, 10)


def test_a_batch_past_the_limit_alone_is_not_kept() -> None:
    recent = Recent(1000)
    recent.add([row(1, 10)])
    recent.add([row(2, 600), row(3, 600)])
    assert len(recent) == 0
    assert recent.size == 0


def test_forget_below_drops_what_the_collector_dropped() -> None:
    recent = Recent(1 << 20)
    for s in range(10):
        recent.add([row(s, 100)])
    recent.forget_below(7)
    assert [s for s in range(10) if recent.get(s)] == [7, 8, 9]
    assert recent.size == 3 * (100 + ROW_COST)
    recent.add([row(s, 100) for s in range(20, 30)])
    assert len(recent) == 13


def publish(node: Node, n: int) -> list[int]:
    node.admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    results = node.ingress.publish_batch([Outgoing("t/x", b"%d" % i) for i in range(n)])
    node.store.writer.run(lambda conn: None).result()  # every message in DuckDB
    return [r.seq for r in results]


def test_applied_messages_are_read_from_memory_as_duckdb_holds_them(node: Node) -> None:
    seqs = publish(node, 50)
    writer = node.store.writer
    assert not writer.overlay
    kept = [writer.recent.get(s) for s in seqs]
    writer.recent.forget_below(2**62)
    assert kept == node.store.fetch_rows(seqs)  # now from DuckDB


def test_a_dense_read_from_duckdb_reads_ahead(node: Node) -> None:
    seqs = publish(node, AHEAD_ROWS + 100)
    writer = node.store.writer
    writer.recent.forget_below(2**62)
    first = node.store.fetch_rows(seqs[:10])
    assert [r[0] for r in first if r] == seqs[:10]
    ahead = [s for s in seqs if writer.recent.get(s) is not None]
    assert ahead == seqs[10 : 10 + AHEAD_ROWS]  # AHEAD_ROWS past what was asked
    rest = [writer.recent.get(s) for s in seqs[10:40]]
    writer.recent.forget_below(2**62)
    assert rest == node.store.fetch_rows(seqs[10:40])


def test_a_queue_of_large_payloads_reads_no_further_than_it_asks(node: Node) -> None:
    node.admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    big = bytes(AHEAD_BYTES // 8)  # 8 of them fill AHEAD_BYTES: fewer than a take of 10
    seqs = [r.seq for r in node.ingress.publish_batch([Outgoing("t/x", big)] * 30)]
    node.store.writer.run(lambda conn: None).result()
    node.store.writer.recent.forget_below(2**62)
    assert all(node.store.fetch_rows(seqs[:10]))
    assert len(node.store.writer.recent) == 0
    node.store.fetch_rows(seqs[10:12])  # 8 of these are more than the 2 asked: read
    assert [s for s in seqs if node.store.writer.recent.get(s)] == seqs[12:19]


def test_messages_read_ahead_are_served_whole(node: Node) -> None:
    seqs = publish(node, 300)
    node.store.writer.recent.forget_below(2**62)
    node.store.fetch(seqs[:1])  # reads the rest ahead
    assert [m.payload for m in node.store.fetch(seqs).values()] == [b"%d" % i for i in range(300)]


def test_the_latest_messages_take_their_share_of_the_memory_limit(open_node: NodeFactory) -> None:
    node = open_node(memory_limit=256 << 20)
    assert node.store.writer.recent.limit == (256 << 20) // 32
    publish(node, 100)
    use = node.inspection.memory()
    assert use.recent == node.store.writer.recent.size == 100 * (2 + ROW_COST) - 10
    assert use.recent_limit == (256 << 20) // 32
