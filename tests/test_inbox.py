"""The express inbox (seed 001) on each application database it supports: applied once,
duplicates only re-acknowledged, expired messages dropped, failures rolled back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import eomsg
from eomsg.client.inbox import Inbox, message_key
from eomsg.core.message import Delivered, Message
from eomsg.core.queues import QueueConfig
from eomsg.errors import InvalidConfig, UsageError
from tests.conftest import APP_KINDS, NodeProcess, connect_app, q

NOW = 1_000_000.0


class Fake:
    """A received message that records how it was settled."""

    def __init__(self, seq: int, msg_id: str | None = None, expires: float | None = None) -> None:
        message = Message(seq, "t", f"p{seq}".encode(), msg_id, NOW - 1, expires, {})
        self.delivered = Delivered("q", message, 1, NOW + 30, 0)
        self.settled: list[str] = []

    def delete(self) -> None:
        self.settled.append("deleted")

    def release(self, delay: float = 0.0) -> None:
        self.settled.append("released")


@pytest.fixture(params=APP_KINDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The application's own database, of each kind the inbox supports."""
    conn = connect_app(request.param, tmp_path, request)
    conn.execute("CREATE TABLE orders (seq BIGINT, body VARCHAR)")
    yield conn
    conn.close()


def rows(app: Any) -> list[tuple[Any, ...]]:
    return sorted(app.execute("SELECT seq, body FROM orders").fetchall())


def apply(app: Any, inbox: Inbox, messages: list[Fake]) -> list[int]:
    with inbox.batch(messages) as batch:
        for m in batch.fresh:
            d = m.delivered
            app.execute(
                q(app, "INSERT INTO orders VALUES (?, ?)"), [d.seq, d.message.payload.decode()]
            )
        return [m.delivered.seq for m in batch.fresh]


def test_each_message_is_applied_once(app: Any) -> None:
    inbox = Inbox(app, clock=lambda: NOW)
    first = [Fake(1, "a"), Fake(2, "b"), Fake(3)]
    assert apply(app, inbox, first) == [1, 2, 3]
    again = [Fake(1, "a"), Fake(3), Fake(4, "c"), Fake(4, "c")]  # redeliveries, twice in one
    assert apply(app, inbox, again) == [4]
    assert rows(app) == [(1, "p1"), (2, "p2"), (3, "p3"), (4, "p4")]
    assert all(m.settled == ["deleted"] for m in first + again)  # duplicates re-acknowledged


def test_expired_messages_are_dropped_unapplied(app: Any) -> None:
    inbox = Inbox(app, clock=lambda: NOW)
    late, fine = Fake(1, "a", expires=NOW - 1), Fake(2, "b", expires=NOW + 60)
    assert apply(app, inbox, [late, fine]) == [2]
    assert rows(app) == [(2, "p2")] and late.settled == ["deleted"]
    inbox._clock = lambda: NOW + 61
    assert inbox.forget_expired() == 1  # b can never come back now


def test_a_failure_rolls_back_effects_and_record(app: Any) -> None:
    inbox = Inbox(app, clock=lambda: NOW)
    messages = [Fake(1, "a"), Fake(2, "b")]
    with pytest.raises(RuntimeError), inbox.batch(messages) as batch:
        app.execute("INSERT INTO orders VALUES (1, 'half')")
        assert len(batch.fresh) == 2
        raise RuntimeError("the application failed")
    assert rows(app) == [] and all(m.settled == ["released"] for m in messages)
    assert apply(app, inbox, messages) == [1, 2]  # redelivered: applied now


def test_process_one_message(app: Any) -> None:
    inbox = Inbox(app, clock=lambda: NOW)
    for expected in (True, False):
        with inbox.process(Fake(7, "x")) as fresh:
            assert fresh is expected
            if fresh:
                app.execute("INSERT INTO orders VALUES (7, 'x')")
    assert rows(app) == [(7, "x")]


def test_bad_inbox_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="DuckDB, SQLite or PostgreSQL"):
        Inbox(object())
    with pytest.raises(InvalidConfig, match="letters, digits"):
        Inbox(duckdb.connect(), table="inbox; DROP TABLE x")
    conn = sqlite3.connect(tmp_path / "s.sqlite")
    inbox = Inbox(conn)
    conn.execute("CREATE TABLE t (x INT)")
    conn.execute("INSERT INTO t VALUES (1)")  # opens a transaction
    with pytest.raises(UsageError, match="commit it first"), inbox.batch([Fake(1)]):
        pass


def test_message_key_is_the_id_or_queue_and_seq() -> None:
    assert message_key(Fake(3, "abc").delivered) == "abc"
    assert message_key(Fake(3).delivered) == "q:3"


class LostAck:
    """A received message whose delete never reaches the node."""

    def __init__(self, received: eomsg.Received) -> None:
        self.delivered = received.delivered
        self.release = received.release

    def delete(self) -> None:
        pass


def test_through_a_node_with_a_lost_acknowledgement(
    serve: Any, data_dir: Path, tmp_path: Path
) -> None:
    """Applied and committed, but the delete never reached the node (the consumer went
    away first): the redelivery is recognised and only deleted."""
    node: NodeProcess = serve()
    app = duckdb.connect(str(tmp_path / "app.duckdb"))
    app.execute("CREATE TABLE orders (seq BIGINT, body VARCHAR)")
    with eomsg.connect(data_dir) as client:
        client.create_queue(QueueConfig("q", ("t/>",)))
        for i in range(100):
            client.publish("t/x", f"m{i}".encode(), id=f"m{i}")
        inbox = Inbox(app)
        with client.consumer("q", prefetch=100, until_empty=True) as consumer:
            got = [LostAck(m) for _, m in zip(range(100), consumer, strict=False)]
            with inbox.batch(got) as batch:
                for m in batch.fresh:
                    d = m.delivered
                    app.execute("INSERT INTO orders VALUES (?, ?)", [d.seq, d.message.payload])
        with client.consumer("q", prefetch=100, until_empty=True) as consumer:
            again = list(consumer)  # given back when the first consumer unbound
            with inbox.batch(again) as batch:
                assert batch.fresh == [] and len(batch.duplicates) == 100
        assert client.stats()[0].depth == 0
    assert app.execute("SELECT count(*), count(DISTINCT seq) FROM orders").fetchone() == (100, 100)
    node.stop()
