"""Queue limits by payload bytes (issue 36: "`--max-messages` / `--max-bytes` with an
overflow policy"): a queue's max-bytes is held against the payload bytes it holds, in
flight included, and what is on its way in, the same way as its max-messages — a refused
publish stores nothing, dead-letter-oldest keeps the newest that fit — through the
command line and a real node killed mid-way, transactions, requeues, dead-letter queues
and a limit set on a queue that holds messages already; and a model of it all under
random sizes, consumers and restarts, with the node's count of the bytes checked against
what the store holds."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import eomsg
from eomsg.core.cursor import Cursor, Outcome, Settlement
from eomsg.core.limits import parse_size
from eomsg.core.message import Delivered, Outgoing
from eomsg.core.queues import DEAD_LETTER_OLDEST, MAX_BYTES_LIMIT, QueueConfig
from eomsg.errors import InvalidConfig, QueueFull
from eomsg.node.node import Node, NodeSettings
from tests.conftest import Cli, NodeProcess
from tests.test_metrics import METRICS, samples, scrape
from tests.test_queue_limits import drain_all, everything, payloads, queue, settle_held


def held_as_stored(node: Node) -> None:
    """The node's count of the payload bytes each queue with a max-bytes holds is what
    its store says it holds (and nothing is counted for a queue without one)."""
    stored = {
        s.name: s.bytes for s in node.inspection.stats()
    }  # syncs the writer: nothing incoming
    for name, q in node.queues.items():
        if q.config.max_bytes is None:
            assert not q.cursor.sized and q.held_bytes == 0
        else:
            assert (q.held_bytes, q.incoming_bytes) == (stored[name], 0), name


def test_the_cursor_makes_room_by_bytes_from_the_oldest_waiting() -> None:
    cursor = Cursor(ack_timeout=30.0)
    cursor.track_sizes({})
    cursor.extend([1, 2, 3, 4], [None] * 4, [5, 1, 1, 7])
    assert cursor.bytes == 14
    (held,) = cursor.take(0.0, 1).deliveries  # 1, in flight: never moved
    assert (held.seq, cursor.in_flight_bytes()) == (1, 5)
    room, _ = cursor.make_room(0, 2)
    assert room == [Settlement(2, Outcome.DEAD_LETTERED), Settlement(3, Outcome.DEAD_LETTERED)]
    assert cursor.bytes == 12
    cursor.make_room(0, 100)  # only 4 waits: it goes, 1 stays
    assert (cursor.pending(), cursor.bytes) == ([1], 5)
    cursor.track_sizes(None)
    assert (cursor.sized, cursor.bytes, cursor.make_room(0, 100)) == (False, 0, ([], {}))


def test_a_max_bytes_is_validated_like_the_rest_of_a_queue() -> None:
    with pytest.raises(InvalidConfig, match="--max-bytes must be between 1 byte and 1 PiB"):
        QueueConfig.create("q", max_bytes=0)
    with pytest.raises(InvalidConfig, match="--max-bytes must be between"):
        QueueConfig.create("q", max_bytes="10")  # type: ignore[arg-type]
    config = QueueConfig.create("q", ("t/>",), max_bytes=2**30)
    assert QueueConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


def test_sizes_are_read_as_written_up_to_a_petabyte() -> None:
    assert parse_size("1PiB", high=MAX_BYTES_LIMIT) == 2**50
    assert parse_size("2PB", high=2 * 10**15) == 2 * 10**15
    with pytest.raises(InvalidConfig, match="is not understood"):
        parse_size("9" * 5000)  # not a traceback from int()


def test_a_dead_letter_queue_holds_a_message_once(open_node: Callable[..., Node]) -> None:
    """A message dead-lettered into a queue that holds it already (subscribed to its
    topic too, or dead-lettered from another queue) is not counted there twice (found
    in review: its depth and bytes stayed one message high once it was consumed)."""
    node = open_node()
    node.admin.create_queue(QueueConfig.create("dlq", ("t/>",), max_bytes=1000))
    for name in ("a", "b"):
        node.admin.create_queue(
            QueueConfig.create(name, ("t/>",), max_redeliveries=0, dead_letter="dlq")
        )
    node.ingress.publish("t/x", b"x" * 100)
    for name in ("a", "b"):
        (d,) = node.delivery.fetch(name, 1)
        node.delivery.release(name, [d.key])  # its last attempt: dead-lettered
    stats = {s.name: (s.depth, s.dead_lettered) for s in node.inspection.stats()}
    assert stats == {"a": (0, 1), "b": (0, 1), "dlq": (1, 0)}
    held_as_stored(node)
    assert drain_all(node, "dlq") == [b"x" * 100]
    assert {s.name: s.depth for s in node.inspection.stats()}["dlq"] == 0
    held_as_stored(node)
    node.close()
    assert {s.name: s.depth for s in open_node().inspection.stats()}["dlq"] == 0


def test_a_publish_past_max_bytes_is_refused_whole(open_node: Callable[..., Node]) -> None:
    node = open_node()
    node.admin.create_queue(QueueConfig.create("r", ("t/>",), max_bytes=10))
    node.ingress.publish("t/x", b"12345")
    with pytest.raises(QueueFull, match=r"holds 5 payload bytes of its 10 \(max-bytes\)"):
        node.ingress.publish_batch([Outgoing("t/x", b"123"), Outgoing("t/x", b"456", "i")])
    with pytest.raises(QueueFull, match="a publish of 11 can never fit"):
        node.ingress.publish("t/x", b"x" * 11)
    assert everything(node) == {"r": [b"12345"]}
    node.ingress.publish("t/x", b"67890", id="i")  # exactly full: taken
    assert node.ingress.publish("t/x", b"67890", id="i").duplicate  # a retry counts nowhere
    assert node.ingress.publish("t/x", b"", id="empty").seq  # an empty payload fits a full queue
    held_as_stored(node)


def test_dead_letter_oldest_by_bytes_keeps_the_newest_that_fit(
    open_node: Callable[..., Node],
) -> None:
    node = open_node()
    node.admin.create_queue(
        QueueConfig.create(
            "d", ("t/>",), max_bytes=10, overflow=DEAD_LETTER_OLDEST, dead_letter="old"
        )
    )
    node.ingress.publish_batch([Outgoing("t/x", p) for p in (b"aaaa", b"bbbb", b"cc")])
    (held,) = node.delivery.fetch("d", 1)  # aaaa, in flight: it stays
    node.ingress.publish("t/x", b"ddddd")  # bbbb and cc make room (4 + 5, with 2 more: 11)
    assert everything(node) == {"d": [b"aaaa", b"ddddd"], "old": [b"bbbb", b"cc"]}
    # A batch larger than what can be freed: its oldest go straight to the dead letters.
    node.ingress.publish_batch([Outgoing("t/x", p) for p in (b"eee", b"ff", b"gggg")])
    assert everything(node) == {
        "d": [b"aaaa", b"ff", b"gggg"],
        "old": [b"bbbb", b"cc", b"ddddd", b"eee"],
    }
    assert {s.name: s.overflowed for s in node.inspection.stats()} == {"d": 4, "old": 0}
    node.ingress.publish("t/x", b"x" * 11)  # never fits: dead-lettered itself, nothing else moves
    assert everything(node)["d"] == [b"aaaa", b"ff", b"gggg"]
    assert node.delivery.delete("d", [held.key]) == [True]
    held_as_stored(node)


def test_a_limit_set_on_a_queue_counts_what_it_holds_and_lifting_it_forgets(
    open_node: Callable[..., Node],
) -> None:
    node = open_node()
    node.admin.create_queue(QueueConfig.create("q", ("t/>",)))
    node.ingress.publish_batch([Outgoing("t/x", b"1234") for _ in range(3)])
    node.admin.limit_queue("q", max_bytes=10)
    held_as_stored(node)
    with pytest.raises(QueueFull, match="holds 12 payload bytes of its 10"):
        node.ingress.publish("t/x", b"1")
    taken = node.delivery.fetch("q", 2)
    node.delivery.delete("q", [d.key for d in taken])
    node.ingress.publish("t/x", b"123456")  # 4 + 6
    held_as_stored(node)
    node.admin.limit_queue("q", max_messages=2)  # the max-bytes lifted: sizes forgotten
    held_as_stored(node)
    node.admin.limit_queue("q", max_messages=2, max_bytes=10)
    held_as_stored(node)
    node.close()
    node = open_node()  # the sizes come back from the log
    held_as_stored(node)
    with pytest.raises(QueueFull, match="holds 2 messages of its 2"):
        node.ingress.publish("t/x", b"")


def test_max_bytes_meets_transactions_requeues_and_dead_letter_queues(
    open_node: Callable[..., Node],
) -> None:
    """A transaction's prepare votes no, and a requeue moves nothing, into a queue with
    no room for their bytes; what is dead-lettered into a dead-letter queue with a
    max-bytes is counted there, past its limit if need be."""
    node = open_node()
    node.admin.create_queue(QueueConfig.create("old", (), max_bytes=4))
    node.admin.create_queue(
        QueueConfig.create("r", ("t/>",), max_bytes=6, dead_letter="old", max_redeliveries=0)
    )
    node.ingress.publish("t/x", b"12345")
    with pytest.raises(QueueFull):
        node.participant.prepare_txn("tx", coordinator="test", messages=[Outgoing("t/x", b"67")])
    (d,) = node.delivery.fetch("r", 1)
    node.delivery.release("r", [d.key])  # past its redeliveries: into old (5 bytes, past its 4)
    node.ingress.publish("t/x", b"6789")
    assert everything(node) == {"old": [b"12345"], "r": [b"6789"]}
    held_as_stored(node)
    node.admin.create_queue(QueueConfig.create("s", ()))
    with pytest.raises(QueueFull, match="queue 'r' is full"):
        node.ingress.requeue("old", to="r")
    assert everything(node) == {"old": [b"12345"], "r": [b"6789"], "s": []}
    node.ingress.requeue("old", to="s")
    assert everything(node) == {"old": [], "r": [b"6789"], "s": [b"12345"]}
    held_as_stored(node)


class BytesMachine(RuleBasedStateMachine):
    """``r`` refuses past 12 payload bytes, ``d`` dead-letters its oldest into ``old``
    past 12, ``m`` has both limits (3 messages, 12 bytes) and refuses; ``t`` has its
    max-bytes set and lifted as the run goes. Under batches of random sizes (ids
    retried), consumers holding, deleting and giving back, and restarts: none passes its
    limit, a refused publish stores nothing, each acknowledged message is consumed from
    ``r`` once and from ``d`` or ``old`` once, and the node's count of each queue's
    bytes is what its store holds."""

    LIMIT = 12

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="bytes-"))
        self.node = self._open()
        create = self.node.admin.create_queue
        create(QueueConfig.create("r", ("t/>",), max_bytes=self.LIMIT))
        create(
            QueueConfig.create(
                "d", ("t/>",), max_bytes=self.LIMIT, overflow=DEAD_LETTER_OLDEST,
                dead_letter="old",
            )
        )  # fmt: skip
        create(QueueConfig.create("m", ("t/>",), max_messages=3, max_bytes=self.LIMIT))
        create(QueueConfig.create("t", ("t/>",)))
        self.acked: list[bytes] = []
        self.consumed: dict[str, list[bytes]] = {q: [] for q in ("r", "d", "old", "m", "t")}
        self.held: dict[str, list[Delivered]] = {q: [] for q in self.consumed}
        self.n = 0

    def _open(self) -> Node:
        return Node.open(self.dir, NodeSettings(tick=None))

    @rule(sizes=st.lists(st.integers(0, 7), min_size=1, max_size=4), with_ids=st.booleans())
    def publish(self, sizes: list[int], with_ids: bool) -> None:
        batch = []
        for size in sizes:
            self.n += 1
            body = (b"%d." % self.n).ljust(size, b"x")
            batch.append(Outgoing("t/x", body, f"id-{self.n}" if with_ids else None))
        before = {s.name: (s.depth, s.bytes) for s in self.node.inspection.stats()}
        try:
            results = self.node.ingress.publish_batch(batch)
        except QueueFull:
            assert {s.name: (s.depth, s.bytes) for s in self.node.inspection.stats()} == before
            return
        assert not any(r.duplicate for r in results)
        self.acked += [m.payload for m in batch]
        if with_ids:
            assert all(r.duplicate for r in self.node.ingress.publish_batch(batch))

    @rule(queue=st.sampled_from(["r", "d", "old", "m", "t"]), k=st.integers(1, 3))
    def fetch(self, queue: str, k: int) -> None:
        self.held[queue] += self.node.delivery.fetch(queue, k)

    @rule(queue=st.sampled_from(["r", "d", "old", "m", "t"]), give_back=st.booleans())
    def settle(self, queue: str, give_back: bool) -> None:
        held, self.held[queue] = self.held[queue], []
        self.consumed[queue] += settle_held(self.node, queue, held, give_back)

    @rule(limit=st.sampled_from([None, 5, 20]))
    def limit_t(self, limit: int | None) -> None:
        self.node.admin.limit_queue("t", max_bytes=limit)

    @rule()
    def restart(self) -> None:
        self.node.close()
        self.node = self._open()
        self.held = {q: [] for q in self.held}

    @invariant()
    def within_limits(self) -> None:
        stats = {s.name: s for s in self.node.inspection.stats()}
        assert all(stats[q].bytes <= self.LIMIT for q in "rdm")
        assert stats["m"].depth <= 3
        held_as_stored(self.node)

    def teardown(self) -> None:
        for name in self.consumed:
            self.settle(name, give_back=True)
            self.consumed[name] += drain_all(self.node, name)
        self.node.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        assert sorted(self.consumed["t"]) == sorted(self.acked)
        assert set(self.consumed["r"]) <= set(self.acked)
        assert len(set(self.consumed["r"])) == len(self.consumed["r"])
        assert sorted(self.consumed["d"] + self.consumed["old"]) == sorted(self.acked)


TestBytesAgainstTheirRules = pytest.mark.slow(BytesMachine.TestCase)
TestBytesAgainstTheirRules.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None
)


FULL = (
    "Error: queue 'uploads' is full: it holds 8 payload bytes of its 10 (max-bytes) and "
    "refuses more; nothing of this publish was stored (retry it once consumers made room)\n"
)


def test_max_bytes_through_the_command_line_and_a_node_killed(
    cli: Cli, serve: Callable[..., NodeProcess], data_dir: Path
) -> None:
    cli("queue", "create", "uploads", "-s", "up/>", "--max-bytes", "10B")
    refused = cli("queue", "create", "x", "--max-bytes", "10 parsecs", code=3)
    assert refused.stderr.decode().startswith("Error: size '10 parsecs' is not understood")
    limit = cli("queue", "list", "--json")
    assert [q["max_bytes"] for q in json.loads(limit.stdout)] == [10]
    node = serve(*METRICS)
    cli("publish", "up/a", "12345678", "--id", "u-1")
    refused = cli("publish", "up/a", "abc", "--id", "u-2", code=14)
    assert refused.stderr.decode() == FULL
    q = queue(cli, "uploads")
    assert (q["depth"], q["bytes"], q["max_bytes"], q["overflowed"]) == (1, 8, 10, 1)
    shown = cli("inspect", "queues").stdout.decode()
    assert "8 B/10 B" in shown
    got = samples(scrape(node.metrics or "", node.token)[1])
    assert got["eomsg_queue_max_bytes", (("queue", "uploads"),)] == 10
    node.kill()  # the count of bytes is rebuilt from the log
    serve()
    assert cli("publish", "up/a", "abc", "--id", "u-2", code=14).stderr.decode() == FULL
    assert payloads(cli, "uploads") == ["12345678"]
    cli("publish", "up/a", "abc", "--id", "u-2")
    assert json.loads(cli("publish", "up/a", "abc", "--id", "u-2", "--json").stdout)["duplicate"]
    said = cli("queue", "limit", "uploads", "--max-bytes", "1KiB", "--max-messages", "5")
    assert said.stdout == b"queue uploads: 5 messages, 1.0 KiB, refuse\n"
    with eomsg.connect(data_dir) as client:
        assert client.limit_queue("uploads", None).max_bytes is None
    assert payloads(cli, "uploads") == ["abc"]
