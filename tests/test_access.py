"""Permissions (issue 20): principals with tokens of their own, grants on queues, topics
and the node, deny by default once any grant exists, every wire request checked against
them by a real node — the matrix of every request by every right — transactions settled
only by their own principal, denials typed and logged, and the audit log."""

from __future__ import annotations

import itertools
import json
import math
import signal
import socket
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import eomsg
from eomsg.core import access
from eomsg.core.access import OPERATION_DOING, OPERATION_NEEDS, Policy, make_grant
from eomsg.core.message import Outgoing
from eomsg.core.operations import OPERATIONS
from eomsg.core.queues import QueueConfig
from eomsg.core.replay import JobEvent, JobRecord, JobStatus, Selection
from eomsg.core.topics import Matcher
from eomsg.errors import (
    AuthenticationFailed,
    InvalidConfig,
    NotAllowed,
    TxnConflict,
    Unavailable,
)
from eomsg.wire import events as ev
from eomsg.wire.calls import encode_args
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, TRANSITIONS, Connection, Role
from tests.conftest import Cli, NodeFactory, NodeProcess

RIGHTS = ("publish", "consume", "inspect", "admin")
SEL = Selection(("t/>",), 1, 100, None, None)
JOB = JobRecord("j1", JobStatus.DONE, {"sink": "parquet:x"}, 1, 101, 100, "ab12", 1.5)


class Wire:
    """A principal's own TCP connection to the node, request by request."""

    def __init__(self, tcp: str, token: str) -> None:
        host, port = tcp.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.conn = Connection(Role.CLIENT)
        self.rids = itertools.count(1)
        self.sock.sendall(self.conn.send(ev.Hello(ev.PROTOCOL_VERSION, "matrix", token)))
        assert isinstance(self._next(), ev.Welcome)

    def _next(self) -> Event:
        while True:
            event = self.conn.next_event()
            if event is PEER_CLOSED:
                raise ConnectionError("the node hung up")
            if event is not NEED_DATA:
                assert isinstance(event, Event)
                if isinstance(event, ev.Ping):
                    self.sock.sendall(self.conn.send(ev.Pong(event.nonce, 0.0)))
                    continue
                return event
            self.conn.receive_data(self.sock.recv(65536))

    def ask(self, make: Callable[[int], Event]) -> Event:
        """Send the request ``make(rid)`` and return the node's first answer to it."""
        return self.answer(self.send(make))

    def send(self, make: Callable[[int], Event]) -> int:
        rid = next(self.rids)
        self.sock.sendall(self.conn.send(make(rid)))
        return rid

    def answer(self, rid: int, seen: list[Event] | None = None) -> Event:
        """The next event for ``rid`` (those for others go to ``seen``)."""
        while True:
            event = self._next()
            if getattr(event, "rid", None) == rid:
                return event
            if seen is not None:
                seen.append(event)

    def close(self) -> None:
        self.sock.close()


def call(op: str, **args: Any) -> Callable[[int], Event]:
    return lambda rid: ev.Call(rid, op, encode_args(OPERATIONS[op], args))


def out(topic: str) -> Outgoing:
    return Outgoing(topic, b"p", None, None, {})


# Every request a client can make, the rights that allow it and what it concerns — the
# specification restated, not read from eomsg.core.access: "queue" is the case's queue
# Q, "topic" a topic of Q's subscription, "node" the node alone, None nothing (it needs
# no right). Each builds the request for queue Q and a fresh number N.
Build = Callable[[str, int], Callable[[int], Event]]
MATRIX: dict[str, tuple[frozenset[str], str | None, Build]] = {
    # frames
    "frame Publish": (
        frozenset({"publish"}),
        "topic",
        lambda q, n: lambda rid: ev.Publish(rid, (out(f"t/{q}/x"),)),
    ),
    "frame Fetch": (frozenset({"consume"}), "queue", lambda q, n: lambda rid: ev.Fetch(rid, q, 1)),
    "frame Subscribe": (
        frozenset({"consume"}),
        "queue",
        lambda q, n: lambda rid: ev.Subscribe(rid, q, 1),
    ),
    "frame Delete": (
        frozenset({"consume"}),
        "queue",
        lambda q, n: lambda rid: ev.Delete(rid, q, ((1, 1),)),
    ),
    "frame Release": (
        frozenset({"consume"}),
        "queue",
        lambda q, n: lambda rid: ev.Release(rid, q, ((1, 1),)),
    ),
    # queues
    "create_queue": (
        frozenset({"admin"}),
        "queue",
        lambda q, n: call("create_queue", config=QueueConfig(q, (f"t/{q}/>",))),
    ),
    "delete_queue": (frozenset({"admin"}), "queue", lambda q, n: call("delete_queue", name=q)),
    "subscribe": (
        frozenset({"admin"}),
        "queue",
        lambda q, n: call("subscribe", name=q, pattern=f"t/{q}/y"),
    ),
    "unsubscribe": (
        frozenset({"admin"}),
        "queue",
        lambda q, n: call("unsubscribe", name=q, pattern=f"t/{q}/y"),
    ),
    "limit_queue": (
        frozenset({"admin"}),
        "queue",
        lambda q, n: call("limit_queue", name=q, max_messages=100),
    ),
    "purge": (frozenset({"admin"}), "queue", lambda q, n: call("purge", name=q)),
    "requeue": (frozenset({"admin"}), "queue", lambda q, n: call("requeue", name=q)),
    "browse": (frozenset({"inspect"}), "queue", lambda q, n: call("browse", name=q)),
    "queue_config": (
        frozenset({"inspect", "consume", "admin"}),
        "queue",
        lambda q, n: call("queue_config", name=q),
    ),
    "locate_queue": (
        frozenset({"inspect", "consume"}),
        "queue",
        lambda q, n: call("locate_queue", name=q),
    ),
    "queue_names": (frozenset({"inspect"}), "node", lambda q, n: call("queue_names")),
    "stats": (frozenset({"inspect"}), "node", lambda q, n: call("stats")),
    "memory": (frozenset({"inspect"}), "node", lambda q, n: call("memory")),
    "node_info": (frozenset({"inspect"}), "node", lambda q, n: call("node_info")),
    # flows
    "flows of a queue": (frozenset({"inspect"}), "queue", lambda q, n: call("flows", queue=q)),
    "flows": (frozenset({"inspect"}), "node", lambda q, n: call("flows")),
    "unbind": (frozenset({"admin"}), "queue", lambda q, n: call("unbind", queue=q, flow=99999)),
    # links
    "add_link": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("add_link", peer=f"peer{n}", token="t0ken"),
    ),
    "set_link_egress": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("set_link_egress", peer="nolink", egress="memory"),
    ),
    "set_link_topics": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("set_link_topics", peer="nolink", topics=None),
    ),
    "remove_link": (frozenset({"admin"}), "node", lambda q, n: call("remove_link", peer="nolink")),
    "link_info": (frozenset({"inspect"}), "node", lambda q, n: call("link_info")),
    # the log, settings, replay
    "log": (frozenset({"inspect"}), "node", lambda q, n: call("log")),
    "configure": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("configure", name="retention", value="7d"),
    ),
    "saved_settings": (frozenset({"inspect"}), "node", lambda q, n: call("saved_settings")),
    "query": (frozenset({"inspect"}), "node", lambda q, n: call("query", sql="SELECT 1")),
    "log_bounds": (frozenset({"inspect"}), "node", lambda q, n: call("log_bounds", sel=SEL)),
    "log_horizon": (frozenset({"inspect"}), "node", lambda q, n: call("log_horizon")),
    "read_log": (
        frozenset({"inspect"}),
        "node",
        lambda q, n: call("read_log", sel=SEL, lo=1, hi=2),
    ),
    "replay_jobs": (frozenset({"inspect"}), "node", lambda q, n: call("replay_jobs")),
    "record_replay": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("record_replay", record=JOB, event=JobEvent.FINISH),
    ),
    # transactions
    "prepare_txn publishing": (
        frozenset({"publish"}),
        "topic",
        lambda q, n: call("prepare_txn", txid=f"p{n}", coordinator="c", messages=[out(f"t/{q}/x")]),
    ),
    "prepare_txn deleting": (
        frozenset({"consume"}),
        "queue",
        lambda q, n: call("prepare_txn", txid=f"d{n}", coordinator="c", deletes=[(q, 1, 0, 1)]),
    ),
    "transact publishing": (
        frozenset({"publish"}),
        "topic",
        lambda q, n: call("transact", messages=[out(f"t/{q}/x")]),
    ),
    "transact deleting": (
        frozenset({"consume"}),
        "queue",
        lambda q, n: call("transact", deletes=[(q, 1, 0, 1)]),
    ),
    "commit_txn": (frozenset(), None, lambda q, n: call("commit_txn", txid="unknown")),
    "abort_txn": (frozenset(), None, lambda q, n: call("abort_txn", txid="unknown")),
    "abort_txn forced": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("abort_txn", txid="unknown", force=True),
    ),
    "txns": (frozenset(), None, lambda q, n: call("txns")),  # filtered: below
    # principals, grants, audit
    "add_principal": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("add_principal", name=f"x{n}"),
    ),
    "remove_principal": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("remove_principal", name="nobody"),
    ),
    "principals": (frozenset({"inspect"}), "node", lambda q, n: call("principals")),
    "grant": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("grant", principal="x", right="inspect", kind="queue", name=q),
    ),
    "revoke": (
        frozenset({"admin"}),
        "node",
        lambda q, n: call("revoke", principal="x", right="inspect", kind="queue", name=q),
    ),
    "grants": (frozenset({"inspect"}), "node", lambda q, n: call("grants")),
    "audit": (frozenset({"inspect"}), "node", lambda q, n: call("audit")),
}


# The frames a client sends that need no right: the handshake, keep-alives, and what only
# touches the connection's own subscriptions.
FREE_FRAMES = {"Hello", "LinkHello", "Goodbye", "Ping", "Pong", "Cancel", "FlowAck"}
# What only a link carries, once both nodes proved they hold its token (server/link.py).
LINK_FRAMES = {
    "LinkProof",
    "Transfer",
    "Oversize",
    "Taken",
    "Interest",
    "Channel",
    "ChannelClose",
    "ChannelPause",
}


def test_the_matrix_names_every_request_and_every_operation_has_its_needs() -> None:
    named = {name.split()[0] for name in MATRIX if not name.startswith("frame")}
    assert named == set(OPERATIONS)
    assert set(OPERATION_NEEDS) == set(OPERATIONS)
    assert set(OPERATION_DOING) == set(OPERATIONS)  # a denial says what, in a user's words
    # Every frame a client may send the node is in the matrix or known to need nothing:
    # a new kind of request cannot go unchecked unnoticed.
    sent = {e.__name__ for (role, _, e) in TRANSITIONS if role is Role.CLIENT}
    framed = {name.split()[1] for name in MATRIX if name.startswith("frame")}
    assert sent == framed | FREE_FRAMES | LINK_FRAMES | {"Call"}


@pytest.fixture
def node(serve: Callable[..., NodeProcess]) -> Iterator[NodeProcess]:
    started = serve()
    yield started
    started.stop()


def owner(node: NodeProcess) -> eomsg.Client:
    return eomsg.connect(node.tcp, token=node.token)


def test_every_request_is_allowed_exactly_when_granted(node: NodeProcess) -> None:
    """For each request and each right — on the node, on what the request concerns, on
    something else — the principal holding that one grant is answered NotAllowed
    exactly when the right does not reach the request, and otherwise gets past the
    check (the node's answer may still be an error of the request's own)."""
    admin = owner(node)
    token = admin.add_principal("p")
    admin.add_principal("x")
    admin.grant("x", "inspect", "queue", "elsewhere")  # a grant exists: deny by default
    wire = Wire(node.tcp, token)
    n = itertools.count()
    wrong: list[str] = []
    try:
        for request, (rights, concerns, build) in MATRIX.items():
            q = f"q{next(n)}"
            admin.create_queue(QueueConfig(q, (f"t/{q}/>",)))
            for right, on in itertools.product(RIGHTS, ("node", "own", "other")):
                if on == "node":
                    kind, name = "node", ""
                elif right == "publish":
                    kind, name = "topic", f"t/{q}/>" if on == "own" else "u/>"
                else:
                    kind, name = "queue", q if on == "own" else "elsewhere"
                admin.grant("p", right, kind, name)
                if concerns is None:
                    allowed = True
                elif right not in rights or on == "other":
                    allowed = False
                else:
                    allowed = on == "node" or concerns == kind
                try:
                    answer = wire.ask(build(q, next(n)))
                except TimeoutError:
                    pytest.fail(f"{request} with {right} on {kind} {name}: no answer")
                denied = isinstance(answer, ev.Error) and answer.code == NotAllowed.code
                if denied == allowed:
                    wrong.append(f"{request} with {right} on {kind} {name}: {answer}")
                admin.revoke("p", right, kind, name)
                if q not in admin.queue_names():  # deleted by the request: again
                    admin.create_queue(QueueConfig(q, (f"t/{q}/>",)))
    finally:
        wire.close()
        admin.close()
    assert not wrong, "\n".join(wrong)


def test_tokens_name_principals_and_the_owner_is_never_limited(
    node: NodeProcess, tmp_path: Path
) -> None:
    with owner(node) as admin:
        alice = admin.add_principal("alice")
        admin.create_queue(QueueConfig("q", ("t/>",)))
    # No grant exists at all, and still a principal may do nothing it was not granted:
    # not even grant itself a right.
    with eomsg.connect(node.tcp, token=alice) as c:
        with pytest.raises(NotAllowed, match="alice may not grant rights: it needs admin on node"):
            c.grant("alice", "admin", "node")
        with pytest.raises(NotAllowed):
            c.create_queue(QueueConfig("free", ("f/>",)))
    with owner(node) as admin:
        assert admin.grant("alice", "publish", "topic", "t/>")
        assert not admin.grant("alice", "publish", "topic", "t/>")  # idempotent
    with eomsg.connect(node.tcp, token=alice) as c:
        c.publish("t/x", b"1")
        with pytest.raises(
            NotAllowed, match="alice may not publish: it needs publish on topic u/x"
        ):
            c.publish("u/x", b"2")
        with pytest.raises(NotAllowed, match="needs admin on queue q2"):
            c.create_queue(QueueConfig("q2"))
        with pytest.raises(NotAllowed, match="consume on queue q"):
            c.fetch("q", 1)
    # The owner: the node's token over TCP, or its Unix socket without a token.
    with owner(node) as admin:
        admin.create_queue(QueueConfig("q2"))
    with eomsg.connect(node.data_dir) as local:
        assert local.fetch("q", 1)[0].message.payload == b"1"
    # A principal's token on the Unix socket is that principal.
    unix = f"unix://{node.data_dir / 'eomsg.sock'}"
    with eomsg.connect(unix, token=alice) as c, pytest.raises(NotAllowed):
        c.stats()
    # Wrong, removed: refused at the hello.
    with pytest.raises(AuthenticationFailed):
        eomsg.connect(node.tcp, token="not-a-token")
    with owner(node) as admin:
        assert admin.remove_principal("alice") == 1
    with pytest.raises(AuthenticationFailed):
        eomsg.connect(node.tcp, token=alice)
    # Never the token itself, only its digest, is kept.
    kept = (node.data_dir / "principals.json").read_text()
    assert alice not in kept
    assert alice not in (node.data_dir / "eomsg.duckdb").read_bytes().decode("latin-1")


def test_a_transaction_is_settled_by_its_own_principal_even_after_a_crash(
    serve: Callable[..., NodeProcess],
) -> None:
    node = serve()
    with owner(node) as admin:
        admin.create_queue(QueueConfig("q", ("t/>",)))
        alice, bob, ops = (admin.add_principal(n) for n in ("alice", "bob", "ops"))
        for who in ("alice", "bob"):
            admin.grant(who, "publish", "topic", "t/>")
        admin.grant("ops", "admin", "node")
    with eomsg.connect(node.tcp, token=alice) as a:
        a.prepare_txn("t1", coordinator="app", messages=[out("t/1")])
        a.prepare_txn("t2", coordinator="app", messages=[out("t/2")])
    node.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    node.proc.wait()  # type: ignore[union-attr]
    node = serve()
    with eomsg.connect(node.tcp, token=bob) as b:
        assert b.txns() == []  # another's are not even listed
        with pytest.raises(NotAllowed, match="bob may not settle transaction 't1': alice"):
            b.commit_txn("t1")
        with pytest.raises(NotAllowed):
            b.abort_txn("t1")
        with pytest.raises(TxnConflict, match="prepared already, by another principal"):
            b.prepare_txn("t1", coordinator="mine", messages=[out("t/evil")])
    with eomsg.connect(node.tcp, token=alice) as a:
        assert [t.txid for t in a.txns()] == ["t1", "t2"]
        assert [r.seq for r in a.commit_txn("t1")] == [1]
    with eomsg.connect(node.tcp, token=ops) as o:
        assert o.abort_txn("t2")
    with owner(node) as admin:
        assert [t.txid for t in admin.txns()] == []
        settled = [(e.principal, e.action, e.target, e.detail) for e in admin.audit(limit=1)]
        assert settled == [("ops", "abort-txn", "t2", "prepared by alice")]
    node.stop()


def test_a_principal_runs_transactions_with_publish_and_consume_alone(
    node: NodeProcess, tmp_path: Path
) -> None:
    """The coordinator recovers its database's in-doubt transactions before its first
    one (it lists them): its own rights are enough."""
    with owner(node) as admin:
        admin.create_queue(QueueConfig("in", ("in/>",)))
        admin.create_queue(QueueConfig("out", ("out/>",)))
        admin.publish("in/1", b"order")
        token = admin.add_principal("worker")
        admin.grant("worker", "consume", "queue", "in")
        admin.grant("worker", "publish", "topic", "out/>")
    app = sqlite3.connect(tmp_path / "app.sqlite", isolation_level=None)
    app.execute("CREATE TABLE done (what TEXT)")
    with eomsg.connect(node.tcp, token=token) as w:
        (got,) = w.fetch("in", 1)
        resource = eomsg.SQLiteResource(app)
        with w.transaction(resources=[resource]) as tx:
            tx.resource(app).execute("INSERT INTO done VALUES ('order')")
            tx.publish("out/1", b"shipped")
            tx.delete(got)
    with owner(node) as admin:
        depths = {s.name: s.depth for s in admin.stats()}
    assert depths == {"in": 0, "out": 1}
    assert app.execute("SELECT what FROM done").fetchall() == [("order",)]


def test_rights_reach_what_a_request_leads_to(node: NodeProcess) -> None:
    """A requeue into the queue the node picks, and the dead-letter queue a create
    makes, need admin on those queues too."""
    with owner(node) as admin:
        admin.create_queue(QueueConfig.create("orders", ("o/>",), dead_letter="dlq"))
        mal = admin.add_principal("mal")
        for queue in ("dlq", "mine"):
            admin.grant("mal", "admin", "queue", queue)
        admin.grant("mal", "publish", "topic", "m/>")
    with eomsg.connect(node.tcp, token=mal) as m:
        m.subscribe("dlq", "m/>")
        m.publish("m/evil", b"injected")
        with pytest.raises(NotAllowed, match="mal may not requeue into queue orders"):
            m.requeue("dlq")
        with pytest.raises(NotAllowed, match="needs admin on queue mine-dlq"):
            m.create_queue(QueueConfig.create("mine", ("m/x",), dead_letter="mine-dlq"))
    with owner(node) as admin:
        assert {s.name: s.depth for s in admin.stats()} == {"orders": 0, "dlq": 1}
        admin.grant("mal", "admin", "queue", "orders")
    with eomsg.connect(node.tcp, token=mal) as m:
        assert m.requeue("dlq") == (1, "orders")


def test_a_revoked_right_ends_a_subscription_and_a_waiting_fetch(node: NodeProcess) -> None:
    with owner(node) as admin:
        admin.create_queue(QueueConfig("q", ("t/>",)))
        token = admin.add_principal("sub")
        admin.grant("sub", "consume", "queue", "q")
        wire = Wire(node.tcp, token)
        subscribed = wire.send(lambda rid: ev.Subscribe(rid, "q", 10))
        assert isinstance(wire.answer(subscribed), ev.Result)
        admin.publish("t/1", b"before")
        seen: list[Event] = []
        while not any(isinstance(e, ev.Deliver) and e.deliveries for e in seen):
            seen.append(wire._next())
        waiting = wire.send(lambda rid: ev.Fetch(rid, "q", 1, wait=60.0))
        admin.revoke("sub", "consume", "queue", "q")
        admin.grant("sub", "inspect", "queue", "q")  # a grant is left: deny by default
        admin.publish("t/2", b"after")
        for rid in (subscribed, waiting):
            while not isinstance(ended := wire.answer(rid, seen), ev.Error):
                seen.append(ended)  # deliveries (none new, below) until the refusal
            assert ended.code == NotAllowed.code
        got = [d.message.payload for e in seen if isinstance(e, ev.Deliver) for d in e.deliveries]
        assert got == [b"before"]
        wire.close()
        # What it held went back when its subscription ended.
        assert [d.message.payload for d in admin.fetch("q", 10)] == [b"before", b"after"]


def test_a_removed_principal_is_cut_off(node: NodeProcess) -> None:
    with owner(node) as admin:
        token = admin.add_principal("gone")
        admin.grant("gone", "inspect", "node")
        with eomsg.connect(node.tcp, token=token) as c:
            assert c.stats() == []
            admin.remove_principal("gone")
            with pytest.raises(NotAllowed, match="principal gone was removed"):
                c.stats()
            # … and the connection closed (seen at once, or by a request racing it).
            with pytest.raises((AuthenticationFailed, Unavailable), match="gone was removed"):
                c.stats()


def test_a_denial_is_logged_and_changes_nothing(node: NodeProcess) -> None:
    with owner(node) as admin:
        admin.create_queue(QueueConfig("q", ("t/>",)))
        carol = admin.add_principal("carol")
        admin.grant("carol", "inspect", "node")
    with eomsg.connect(node.tcp, token=carol) as c:
        with pytest.raises(NotAllowed):
            c.purge("q")
        with pytest.raises(NotAllowed):
            c.publish("t/x", b"no")
        assert [s.depth for s in c.stats()] == [0]
    _, _, err = node.stop()
    assert "denied" in err and "carol may not purge queue q" in err


def test_the_audit_log_says_who_changed_what_and_survives_a_restart(
    serve: Callable[..., NodeProcess], cli: Cli
) -> None:
    node = serve()
    with owner(node) as admin:
        dana = admin.add_principal("dana")
        admin.grant("dana", "admin", "queue", "*")
    with eomsg.connect(node.tcp, token=dana) as d:
        d.create_queue(QueueConfig("orders", ("o/>",)))
        d.purge("orders")
        d.unsubscribe("orders", "o/>")
        d.delete_queue("orders")
    node.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    node.proc.wait()  # type: ignore[union-attr]
    node = serve()
    with owner(node) as admin:
        entries = admin.audit()
    assert [(e.principal, e.action, e.target) for e in entries] == [
        ("dana", "delete-queue", "orders"),
        ("dana", "unsubscribe", "orders"),
        ("dana", "purge", "orders"),
        ("dana", "create-queue", "orders"),
        ("owner", "grant", "dana"),
        ("owner", "add-principal", "dana"),
    ]
    assert entries[4].detail == "admin on queue *"
    node.stop()
    shown = cli("inspect", "audit", "--limit", "2", "--json")
    assert [e["action"] for e in json.loads(shown.stdout)] == ["delete-queue", "unsubscribe"]


def test_the_audit_log_pages_back_only_from_a_time(open_node: NodeFactory) -> None:
    node = open_node()
    node.admin.create_queue(QueueConfig("q"))
    assert [e.action for e in node.access.audit(before=node.clock() + 1)] == ["create-queue"]
    for bad in (math.inf, -math.inf, math.nan, -1.0):
        with pytest.raises(InvalidConfig, match="before must be a time"):
            node.access.audit(before=bad)


def test_paging_back_through_the_audit_log_skips_and_repeats_no_record(
    open_node: NodeFactory,
) -> None:
    """Records that share a time (the test's clock does not move) are never split
    between pages: paging back by a page's last time skips and repeats none."""
    node = open_node()
    for name in ("a", "b", "c"):
        node.admin.create_queue(QueueConfig(name))
    node.close()
    node = open_node()
    node.admin.purge("a")
    node.admin.delete_queue("b")
    seen, before = [], None
    while page := node.access.audit(limit=2, before=before):
        seen += [(e.action, e.target) for e in page]
        before = page[-1].at
    assert seen == [("delete-queue", "b"), ("purge", "a"), ("create-queue", "c"),
                    ("create-queue", "b"), ("create-queue", "a")]  # fmt: skip


def test_user_grant_and_revoke_commands(cli: Cli, tmp_path: Path) -> None:
    token_file = tmp_path / "erin.token"
    done = cli("user", "add", "erin", "--token-file", str(token_file))
    assert (done.returncode, done.stdout) == (
        0,
        f"added erin; its token is in {token_file}\n".encode(),
    )
    assert token_file.stat().st_mode & 0o777 == 0o600
    again = cli("user", "add", "erin", code=5)
    assert again.stderr == (
        b"Error: principal 'erin' exists; `eomsg user remove erin` first to give it a new token\n"
    )
    assert (
        cli("grant", "erin", "publish", "--topic", "a/>").stdout
        == b"granted erin publish on topic a/>\n"
    )
    assert cli("grant", "erin", "publish", "--topic", "a/>").stdout == (
        b"held already: erin publish on topic a/>\n"
    )
    bad = cli("grant", "erin", "publish", "--queue", "q", code=3)
    assert bad.stderr == b"Error: publish is granted on a topic pattern or the node, not a queue\n"
    neither = cli("grant", "erin", "admin", code=2)
    assert neither.stderr == b"Error: say what the right is on: one of --queue, --topic or --node\n"
    cli("grant", "nobody", "admin", "--node", code=4)
    # Bad input: a typed one-line error, and nothing changed (the grants below).
    for args, said in [
        (("user", "add", "Bad Name"), b"Error: principal name 'Bad Name' is not valid: use "
         b"1-64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit\n"),
        (("grant", "erin", "fly", "--node"),
         b"Error: unknown right 'fly'; rights: publish, consume, inspect, admin\n"),
        (("grant", "erin", "consume", "--topic", "a/>"),
         b"Error: consume is granted on a queue or the node, not a topic\n"),
        (("grant", "erin", "publish", "--topic", "a/*x"), None),
    ]:  # fmt: skip
        done = cli(*args, code=3)
        assert said is None or done.stderr == said, done.stderr
    listed = json.loads(cli("user", "list", "--json").stdout)
    assert [(p["name"], p["grants"]) for p in listed] == [("erin", 1)]
    assert json.loads(cli("inspect", "grants", "--json").stdout) == [
        {"principal": "erin", "right": "publish", "kind": "topic", "name": "a/>"}
    ]
    assert cli("revoke", "erin", "publish", "--topic", "a/>").stdout == (
        b"revoked erin publish on topic a/>\n"
    )
    assert cli("user", "remove", "erin").stdout == b"removed erin\n"
    cli("user", "remove", "erin", code=4)


# -- the rules alone -------------------------------------------------------------------

LEVELS = st.sampled_from(["a", "b", "c"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
PATTERNS = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, ">"])])
)


@given(pattern=PATTERNS, topic=TOPICS)
def test_a_topic_grant_covers_exactly_what_a_subscription_of_it_routes(
    pattern: str, topic: str
) -> None:
    grant = make_grant("p", "publish", "topic", pattern)
    matcher: Matcher[str] = Matcher()
    matcher.add(pattern, "q")
    need = access.publishing([topic])[0]
    assert Policy(frozenset({grant})).allows("p", need) == ("q" in matcher.match(topic))


@given(grants=st.lists(st.tuples(st.sampled_from(RIGHTS), st.sampled_from(["q", "*", ""]))))
def test_the_owner_always_may_a_principal_only_what_it_holds_a_link_principal_too(
    grants: list[tuple[str, str]],
) -> None:
    made = set()
    for right, name in grants:
        kind = "node" if not name else ("topic" if right == "publish" else "queue")
        made.add(make_grant("p", right, kind, "t/>" if kind == "topic" else name))
    policy = Policy(frozenset(made))
    need = access.consuming("q")[0]
    assert policy.allows("owner", need)
    assert not policy.allows("someone", need)
    assert policy.allows("p", need) == any(
        g.right.value == "consume" and g.target.name in ("", "q", "*") for g in made
    )
    assert not policy.allows("@b", need)  # what a link gives it are grants (link_grants)
    assert Policy(frozenset(made) | access.link_grants("b")).allows("@b", need)
