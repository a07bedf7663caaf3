"""Transactions (seed 000): the state tables, the node as a participant, and the
coordinator over DuckDB, SQLite and PostgreSQL resources, embedded and through a real
node."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

import eomsg
from eomsg.client import transaction
from eomsg.client.appdb import PostgresApp, app_db
from eomsg.client.broker import Broker
from eomsg.client.recovery import APP_ONLY_GRACE, execute, plan
from eomsg.client.resources import MarkerTable, Resource
from eomsg.client.transaction import recover_resource
from eomsg.core.message import Outgoing
from eomsg.core.txn import COORDINATOR, PARTICIPANT, TxnMove, TxnState, Verdict, move, verdict
from eomsg.embedded import LocalClient
from eomsg.errors import (
    HeldByTransaction,
    HeuristicOutcome,
    InDoubt,
    InvalidInput,
    NotInFlight,
    QueueNotFound,
    StaleDelivery,
    TxnAborted,
    TxnConflict,
    TxnNotFound,
    UsageError,
)
from eomsg.node.node import Node
from tests.conftest import APP_KINDS, NodeProcess, connect_app

# -- the state tables -------------------------------------------------------------------


def test_every_missing_move_is_refused_with_role_and_state() -> None:
    for role, table in (("participant", PARTICIPANT), ("coordinator", COORDINATOR)):
        for state in TxnState:
            for how in TxnMove:
                if (state, how) in table:
                    assert move(role, state, how) is table[(state, how)]
                    continue
                with pytest.raises((TxnConflict, HeuristicOutcome)) as e:
                    move(role, state, how, "t1")
                assert role in str(e.value) and "t1" in str(e.value)
                if state is not TxnState.HEURISTIC:
                    assert state.value in str(e.value)


def test_verdict_is_presumed_abort() -> None:
    assert verdict(True, readable=True, age=0, abort_older_than=None) is Verdict.COMMIT
    assert verdict(False, readable=True, age=1e9, abort_older_than=None) is Verdict.ABORT
    assert verdict(None, readable=False, age=10, abort_older_than=None) is Verdict.WAIT
    assert verdict(None, readable=False, age=10, abort_older_than=60) is Verdict.WAIT
    assert verdict(None, readable=False, age=60, abort_older_than=60) is Verdict.FORCE_ABORT


# -- the node as a participant ----------------------------------------------------------


def _queues(node: Node | Broker) -> None:
    admin = node.admin if isinstance(node, Node) else node
    admin.create_queue(eomsg.QueueConfig("a", subscriptions=("a",)))
    admin.create_queue(eomsg.QueueConfig("b", subscriptions=("b",)))


def test_prepared_work_is_invisible_and_held_until_commit(broker: Broker) -> None:
    _queues(broker)
    broker.publish("a", b"1")
    (d,) = broker.fetch("a", 1)
    broker.prepare_txn(
        "t1",
        coordinator="x",
        messages=[Outgoing("b", b"out")],
        deletes=[("a", d.message.seq, 0, d.attempt)],
    )
    broker.prepare_txn("t1", coordinator="x")  # idempotent
    assert broker.fetch("b") == []
    with pytest.raises(HeldByTransaction):
        broker.delete("a", [d.key])
    with pytest.raises(HeldByTransaction):
        broker.release("a", [d.key])
    (info,) = broker.txns()
    assert (info.txid, info.publishes, info.deletes, info.connected) == ("t1", 1, 1, True)
    (result,) = broker.commit_txn("t1")
    assert broker.commit_txn("t1") == []  # idempotent
    assert [m.message.payload for m in broker.fetch("b")] == [b"out"]
    assert broker.fetch("b")[0:0] == [] and result.queues == 1
    stats = {s.name: s for s in broker.stats()}
    assert (stats["a"].depth, stats["a"].deleted) == (0, 1)
    with pytest.raises(TxnConflict, match="cannot abort transaction t1: it is committed"):
        broker.abort_txn("t1")


def test_held_messages_survive_timeouts_and_restarts_then_abort_gives_them_back(
    open_node: Callable[..., Node], clock: Any
) -> None:
    node = open_node()
    _queues(node)
    node.ingress.publish("a", b"1")
    (d,) = node.delivery.fetch("a", 1)
    node.participant.prepare_txn(
        "t1", coordinator="x", deletes=[("a", d.message.seq, 0, d.attempt)]
    )
    clock.advance(3600)  # far past the ack timeout: a held message does not time out
    assert node.delivery.fetch("a", 10) == []
    node.close()
    node = open_node()
    (info,) = node.participant.txns()
    assert not info.connected  # its coordinator is gone with the restart: in doubt
    clock.advance(3600)
    assert node.delivery.fetch("a", 10) == []
    assert node.participant.abort_txn("t1") is True
    assert node.participant.abort_txn("t1") is False  # idempotent
    (again,) = node.delivery.fetch("a", 10)
    assert (again.message.seq, again.attempt) == (d.message.seq, 2)
    with pytest.raises(TxnConflict, match="it is aborted"):
        node.participant.commit_txn("t1")
    node.close()
    node = open_node()
    assert node.participant.txns() == []
    with pytest.raises(TxnConflict):
        node.participant.commit_txn("t1")  # the outcome is remembered across restarts


def test_prepare_is_atomic_and_checks_everything_first(broker: Broker) -> None:
    _queues(broker)
    broker.publish_batch([Outgoing("a", b"1"), Outgoing("a", b"2")])
    d1, d2 = broker.fetch("a", 2)
    good = ("a", d1.message.seq, 0, d1.attempt)
    for bad, error in [
        ([good, ("a", 99, 0, 1)], NotInFlight),
        ([good, ("nope", 1, 0, 1)], QueueNotFound),
        ([good, ("a", d2.message.seq, 0, 2)], StaleDelivery),
        ([good, good], NotInFlight),
    ]:
        with pytest.raises(error):
            broker.prepare_txn("t", coordinator="x", deletes=bad)
        assert broker.txns() == []
    with pytest.raises(InvalidInput):
        broker.prepare_txn("t", coordinator="x", messages=[Outgoing("bad/>", b"")])
    with pytest.raises(InvalidInput):
        broker.prepare_txn("", coordinator="x")
    broker.delete("a", [d1.key, d2.key])  # nothing was held


def test_force_abort_is_reported_to_a_coordinator_that_commits(broker: Broker) -> None:
    _queues(broker)
    broker.prepare_txn("t1", coordinator="x", messages=[Outgoing("b", b"1")])
    broker.abort_txn("t1", force=True)
    with pytest.raises(HeuristicOutcome, match="a person aborted it"):
        broker.commit_txn("t1")
    with pytest.raises(TxnNotFound):
        broker.commit_txn("never")
    assert broker.abort_txn("never") is False  # presumed abort


def test_transact_publishes_and_deletes_in_one_step(broker: Broker) -> None:
    _queues(broker)
    broker.publish("a", b"1")
    (d,) = broker.fetch("a", 1)
    with pytest.raises(NotInFlight):
        broker.transact([Outgoing("b", b"x")], [("a", d.message.seq + 1, 0, 1)])
    assert broker.fetch("b") == []
    broker.transact([Outgoing("b", b"x")], [("a", d.message.seq, 0, d.attempt)])
    assert [m.message.payload for m in broker.fetch("b")] == [b"x"]
    assert {s.name: s.depth for s in broker.stats()}["a"] == 0


# -- the coordinator, against every kind of participant and resource ------------------


@pytest.fixture(params=["embedded", "served"])
def participant(
    request: pytest.FixtureRequest,
    open_node: Callable[..., Node],
    serve: Callable[..., NodeProcess],
) -> Iterator[Any]:
    if request.param == "embedded":
        with LocalClient(open_node()) as local:
            _queues(local)
            yield local
        return
    node_process = serve()
    with eomsg.connect(node_process.data_dir) as client:
        _queues(client)
        yield client


@pytest.fixture(params=APP_KINDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    conn = connect_app(request.param, tmp_path, request)
    conn.execute("CREATE TABLE stock (item VARCHAR PRIMARY KEY, n INTEGER)")
    conn.execute("INSERT INTO stock VALUES ('apple', 10)")
    yield conn
    conn.close()


def _resource(conn: Any) -> Resource:
    if isinstance(conn, sqlite3.Connection):
        return eomsg.SQLiteResource(conn)
    if isinstance(conn, psycopg.Connection):
        return eomsg.PostgresResource(conn)
    return eomsg.DuckDBResource(conn)


def _stock(conn: Any) -> int:
    return int(conn.execute("SELECT n FROM stock WHERE item = 'apple'").fetchone()[0])


def test_commit_applies_app_change_publish_and_delete_together(
    participant: Any, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    participant.publish("a", b"order")
    resource = _resource(app)
    with eomsg.Transaction(participant, [resource]) as tx:
        msg = tx.receive("a", timeout=5)
        assert msg is not None
        tx.resource(app).execute("UPDATE stock SET n = n - 1 WHERE item = 'apple'")
        tx.publish("b", b"shipped", headers={"src": str(msg.message.seq)})
        tx.delete(msg)
    assert tx.completed and tx.state is TxnState.COMMITTED
    assert [r.queues for r in tx.results] == [1]
    assert _stock(app) == 9
    assert [d.message.payload for d in participant.fetch("b", 10)] == [b"shipped"]
    assert participant.fetch("a", 10) == [] and participant.txns() == []
    # Markers of completed transactions go, FORGET_BATCH at a time, with a later commit.
    monkeypatch.setattr(transaction, "FORGET_BATCH", 2)
    with eomsg.Transaction(participant, [resource]) as tx2:
        tx2.publish("b", b"more")
    markers = app.execute("SELECT txid FROM eomsg_txns").fetchall()
    assert sorted(markers) == sorted([(tx.txid,), (tx2.txid,)])
    with eomsg.Transaction(participant, [resource]) as tx3:
        tx3.publish("b", b"more")
    assert app.execute("SELECT txid FROM eomsg_txns").fetchall() == [(tx3.txid,)]


def test_an_exception_rolls_everything_back(participant: Any, app: Any) -> None:
    participant.publish("a", b"order")
    with pytest.raises(RuntimeError), eomsg.Transaction(participant, [_resource(app)]) as tx:
        msg = tx.receive("a", timeout=5)
        tx.resource(app).execute("UPDATE stock SET n = 0")
        tx.publish("b", b"shipped")
        tx.delete(msg)
        raise RuntimeError("the application changed its mind")
    assert tx.state is TxnState.ABORTED
    assert _stock(app) == 10
    assert participant.fetch("b", 10) == []
    (again,) = participant.fetch("a", 10)  # released at once, not after its timeout
    assert again.attempt == 2
    with pytest.raises(UsageError, match="is aborted; start a new one"):
        tx.publish("b", b"late")


def test_a_failed_prepare_aborts_and_keeps_its_error(participant: Any, app: Any) -> None:
    participant.publish("a", b"order")
    (d,) = participant.fetch("a", 1)
    participant.delete("a", [d.key])
    resource = _resource(app)
    with (
        pytest.raises(TxnAborted, match="could not prepare") as e,
        eomsg.Transaction(participant, [resource]) as tx,
    ):
        tx.resource(app).execute("UPDATE stock SET n = 0")
        tx.delete(d)  # deleted already: the node votes no
    assert isinstance(e.value.__cause__, NotInFlight)
    assert _stock(app) == 10 and participant.txns() == []
    with pytest.raises(InvalidInput), eomsg.Transaction(participant, [resource]) as tx:
        tx.publish("bad/>", b"")  # bad input keeps its own type


def test_a_fenced_coordinator_cannot_commit(participant: Any, tmp_path: Path) -> None:
    """A recovery that found no marker fences the transaction with ABORT: the late
    coordinator's commit then fails on the marker, its app changes roll back with it,
    and the node's part is aborted. (DuckDB: SQLite's write lock makes the recovery
    wait for the coordinator instead.)"""
    app = duckdb.connect(str(tmp_path / "app.duckdb"))
    app.execute("CREATE TABLE stock (item VARCHAR PRIMARY KEY, n INTEGER)")
    app.execute("INSERT INTO stock VALUES ('apple', 10)")
    resource = eomsg.DuckDBResource(app)
    tx = eomsg.Transaction(participant, [resource])
    tx.__enter__()
    tx.resource(app).execute("UPDATE stock SET n = 0")
    tx.publish("b", b"x")
    fenced = False

    def recovery_runs_now(txid: str, forget: Any) -> None:
        nonlocal fenced
        other = MarkerTable(app_db(app.cursor()), resource.markers.table)
        fenced = other.outcome_or_fence(txid) is False
        real_decide(txid, forget)

    real_decide = resource.markers.decide
    resource.markers.decide = recovery_runs_now  # type: ignore[method-assign]
    with pytest.raises(TxnAborted, match="application database could not commit"):
        tx.commit()
    assert fenced
    assert _stock(app) == 10
    assert participant.txns() == [] and participant.fetch("b", 10) == []


def test_recovery_commits_what_the_marker_says(open_node: Callable[..., Node], app: Any) -> None:
    node = open_node()
    _queues(node)
    resource = _resource(app)
    app_db = resource.db
    node.participant.prepare_txn(
        "decided", coordinator=resource.descriptor, messages=[Outgoing("b", b"1")]
    )
    node.participant.prepare_txn(
        "undecided", coordinator=resource.descriptor, messages=[Outgoing("b", b"2")]
    )
    if not app_db.prepares:  # else the decision is a transaction of its own
        app_db.begin()
    resource.markers.decide("decided", [])
    node.close()
    node = open_node()
    steps = plan(eomsg.LocalClient(node), now=0, coordinator=resource.descriptor)
    assert {s.txn.txid: s.verdict for s in steps} == {
        "decided": Verdict.COMMIT,
        "undecided": Verdict.ABORT,
    }
    done = recover_resource(eomsg.LocalClient(node), resource)
    assert all(s.done for s in done) and node.participant.txns() == []
    assert [d.message.payload for d in node.delivery.fetch("b")] == [b"1"]
    assert resource.markers.peek("undecided") == "abort"  # fenced
    assert resource.markers.peek("decided") is None  # forgotten


def test_bad_resources_are_refused(participant: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="needs a DuckDB connection"):
        eomsg.DuckDBResource(sqlite3.connect(":memory:"))
    a = eomsg.DuckDBResource(duckdb.connect())
    b = eomsg.DuckDBResource(duckdb.connect())
    with pytest.raises(InvalidInput, match="one application database"):
        eomsg.Transaction(participant, [a, b])
    with (
        pytest.raises(UsageError, match="not a resource of this transaction"),
        eomsg.Transaction(participant, [a]) as tx,
    ):
        tx.resource(b.conn)


# -- PostgreSQL: a resource that prepares -----------------------------------------------


@pytest.fixture
def pg(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute("CREATE TABLE stock (item VARCHAR PRIMARY KEY, n INTEGER)")
    conn.execute("INSERT INTO stock VALUES ('apple', 10), ('pear', 10)")
    yield conn
    conn.close()


def _prepared(conn: Any) -> list[str]:
    return [t for t, _ in app_db(conn).prepared()]


def _prepare_in_pg(resource: Resource, txid: str, item: str) -> None:
    """Work prepared in PostgreSQL, as a coordinator leaves it between its steps."""
    resource.db.begin()
    resource.conn.execute("UPDATE stock SET n = n - 1 WHERE item = %s", [item])
    resource.db.prepare(txid)


def _with_an_order(node: Node) -> Node:
    """``node`` with queues ``a`` and ``b``, and one message waiting in ``a``."""
    _queues(node)
    node.ingress.publish("a", b"order")
    return node


def _break(conn: Any, dsn: str) -> None:
    """End ``conn``'s session from the server's side, as a network failure would."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])


def _stocks(conn: Any) -> dict[str, int]:
    return dict(conn.execute("SELECT item, n FROM stock").fetchall())


def test_postgres_needs_autocommit_and_names_its_prepared_work(pg_dsn: str) -> None:
    with (
        psycopg.connect(pg_dsn) as conn,
        pytest.raises(InvalidInput, match=r"autocommit mode \(psycopg.connect"),
    ):
        eomsg.PostgresResource(conn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        resource = eomsg.PostgresResource(conn)
        assert resource.descriptor.startswith("postgresql:") and "dbname=" in resource.descriptor
        assert resource.descriptor.endswith("#eomsg_txns")
        conn.execute("BEGIN")
        with pytest.raises(UsageError, match="transaction open; commit it first"):
            resource.db.begin()


def test_postgres_prepared_work_follows_the_marker_after_a_crash(
    open_node: Callable[..., Node], pg: Any
) -> None:
    """The coordinator died with both parts prepared: the one with a COMMIT marker
    commits in PostgreSQL and on the node, the other rolls back in both."""
    node = open_node()
    _queues(node)
    resource = eomsg.PostgresResource(pg)
    for txid, item in (("decided", "apple"), ("undecided", "pear")):
        node.participant.prepare_txn(
            txid, coordinator=resource.descriptor, messages=[Outgoing("b", b"x")]
        )
        _prepare_in_pg(resource, txid, item)
    resource.markers.decide("decided", [])
    assert sorted(_prepared(pg)) == ["decided", "undecided"]
    assert _stocks(pg) == {"apple": 10, "pear": 10}  # prepared: not visible yet
    node.close()
    node = open_node()  # the coordinator's process is gone: both are in doubt
    done = recover_resource(eomsg.LocalClient(node), eomsg.PostgresResource(pg))
    assert {s.txn.txid: (s.verdict, s.done) for s in done} == {
        "decided": (Verdict.COMMIT, True),
        "undecided": (Verdict.ABORT, True),
    }
    assert _stocks(pg) == {"apple": 9, "pear": 10}
    assert _prepared(pg) == [] and node.participant.txns() == []
    assert [d.message.payload for d in node.delivery.fetch("b")] == [b"x"]


def test_postgres_work_prepared_there_alone_is_settled(
    open_node: Callable[..., Node], pg: Any
) -> None:
    """PostgreSQL holds prepared work the node does not (its part finished, or never
    prepared): committed if COMMIT is recorded; else rolled back, but only once it is
    older than the grace a live coordinator of another node might need."""
    node = open_node()
    resource = eomsg.PostgresResource(pg)
    _prepare_in_pg(resource, "committed", "apple")
    resource.markers.decide("committed", [])
    _prepare_in_pg(resource, "lost", "pear")
    (at,) = [at for t, at in app_db(pg).prepared() if t == "lost"]
    young = plan(eomsg.LocalClient(node), now=at + 1, apps=[resource.descriptor])
    assert [(s.txn.txid, s.verdict, s.node) for s in young] == [
        ("committed", Verdict.COMMIT, False)
    ]
    old = plan(eomsg.LocalClient(node), now=at + APP_ONLY_GRACE, apps=[resource.descriptor])
    assert {s.txn.txid: s.verdict for s in old} == {
        "committed": Verdict.COMMIT,
        "lost": Verdict.ABORT,
    }
    done = execute(eomsg.LocalClient(node), old)
    assert all(s.done for s in done)
    assert _stocks(pg) == {"apple": 9, "pear": 10} and _prepared(pg) == []
    assert resource.markers.peek("lost") == "abort"  # fenced: it can never commit now


@pytest.mark.parametrize("when", ["before", "after"])
def test_postgres_connection_lost_while_deciding_is_settled_on_a_new_one(
    when: str, open_node: Callable[..., Node], pg: Any, pg_dsn: str
) -> None:
    """The connection breaks while the COMMIT marker is being written (before the
    commit reached the server, or after, the reply lost): the coordinator reads the
    outcome again on a new connection and finishes both parts by it."""
    node = _with_an_order(open_node())
    resource = eomsg.PostgresResource(pg)
    real_decide = resource.markers.decide

    def connection_lost(txid: str, forget: Any) -> None:
        if when == "after":
            real_decide(txid, forget)
        _break(pg, pg_dsn)
        pg.execute("SELECT 1")  # the client learns the connection is gone

    resource.markers.decide = connection_lost  # type: ignore[method-assign]
    tx = eomsg.Transaction(eomsg.LocalClient(node), [resource])
    with tx:
        msg = tx.receive("a")
        tx.resource(pg).execute("UPDATE stock SET n = 0 WHERE item = 'apple'")
        tx.publish("b", b"shipped")
        tx.delete(msg)
        if when == "before":
            with pytest.raises(TxnAborted, match="application database failed"):
                tx.commit()
    assert node.participant.txns() == []
    with psycopg.connect(pg_dsn, autocommit=True) as again:
        assert _prepared(again) == []
        if when == "before":
            assert _stocks(again)["apple"] == 10
            assert [d.message.payload for d in node.delivery.fetch("a")] == [b"order"]
            assert node.delivery.fetch("b") == []
        else:
            assert tx.completed and [r.queues for r in tx.results] == [1]
            assert _stocks(again)["apple"] == 0
            assert node.delivery.fetch("a") == [] and [
                d.message.payload for d in node.delivery.fetch("b")
            ] == [b"shipped"]


def test_postgres_unreachable_after_a_lost_connection_is_in_doubt_then_recovered(
    open_node: Callable[..., Node], pg: Any, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks while deciding and the server cannot be reached again:
    nobody knows the outcome, so the coordinator says InDoubt and leaves both parts
    prepared; once its session is gone, recovery reads the marker (none here) and rolls
    both back."""
    node = _with_an_order(open_node())
    resource = eomsg.PostgresResource(pg)
    real_decide = resource.markers.decide

    def connection_lost(txid: str, forget: Any) -> None:
        _break(pg, pg_dsn)
        real_decide(txid, forget)

    def unreachable(self: Any) -> Any:
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(resource.markers, "decide", connection_lost)
    monkeypatch.setattr(PostgresApp, "reopen", unreachable)
    with (
        pytest.raises(InDoubt, match=r"is in doubt: .*could not be read again"),
        eomsg.Transaction(eomsg.LocalClient(node), [resource]) as tx,
    ):
        msg = tx.receive("a")
        tx.resource(pg).execute("UPDATE stock SET n = 0")
        tx.publish("b", b"shipped")
        tx.delete(msg)
    (held,) = node.participant.txns()
    assert held.txid == tx.txid and held.connected  # this process may still decide
    node.close()
    node = open_node()
    with psycopg.connect(pg_dsn, autocommit=True) as again:
        assert _prepared(again) == [tx.txid]
        done = recover_resource(eomsg.LocalClient(node), eomsg.PostgresResource(again))
        assert [(s.verdict, s.done) for s in done] == [(Verdict.ABORT, True)]
        assert _stocks(again) == {"apple": 10, "pear": 10} and _prepared(again) == []
    assert node.delivery.fetch("b") == [] and [
        d.message.payload for d in node.delivery.fetch("a")
    ] == [b"order"]


def test_postgres_fenced_coordinator_cannot_commit(open_node: Callable[..., Node], pg: Any) -> None:
    """A recovery fenced the transaction with ABORT while it was prepared: the
    coordinator's COMMIT marker fails on the key, and both parts roll back; the
    connection stays usable for the next transaction."""
    node = open_node()
    _queues(node)
    resource = eomsg.PostgresResource(pg)
    real_decide = resource.markers.decide

    def recovery_runs_now(txid: str, forget: Any) -> None:
        other = MarkerTable(resource.db.reopen(), resource.markers.table)
        assert other.outcome_or_fence(txid) is False
        other.db.conn.close()
        real_decide(txid, forget)

    resource.markers.decide = recovery_runs_now  # type: ignore[method-assign]
    with (
        pytest.raises(TxnAborted, match="application database failed"),
        eomsg.Transaction(eomsg.LocalClient(node), [resource]) as tx,
    ):
        tx.resource(pg).execute("UPDATE stock SET n = 0")
        tx.publish("b", b"x")
    assert _stocks(pg) == {"apple": 10, "pear": 10} and _prepared(pg) == []
    assert node.participant.txns() == [] and node.delivery.fetch("b") == []
    resource.markers.decide = real_decide  # type: ignore[method-assign]
    with eomsg.Transaction(eomsg.LocalClient(node), [resource]) as tx:
        tx.resource(pg).execute("UPDATE stock SET n = 1 WHERE item = 'pear'")
        tx.publish("b", b"y")
    assert _stocks(pg)["pear"] == 1 and [d.message.payload for d in node.delivery.fetch("b")] == [
        b"y"
    ]


def test_a_transaction_not_decided_within_its_timeout_rolls_back(
    participant: Any, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too slow before the prepare, or between the prepares and the decision: rolled
    back everywhere, its messages given back; a timeout must be positive."""
    with pytest.raises(InvalidInput, match="timeout must be above 0"):
        eomsg.Transaction(participant, timeout=0)
    participant.publish("a", b"order")
    resource = _resource(app)
    with (
        pytest.raises(TxnAborted, match=r"not decided within its timeout \(0.05s\)"),
        eomsg.Transaction(participant, [resource], timeout=0.05) as tx,
    ):
        msg = tx.receive("a", timeout=5)
        tx.resource(app).execute("UPDATE stock SET n = 0")
        tx.delete(msg)
        time.sleep(0.1)
    real_prepare = participant.prepare_txn

    def slow_prepare(*args: Any, **kwargs: Any) -> None:
        real_prepare(*args, **kwargs)
        time.sleep(0.1)  # the node voted yes, too late

    monkeypatch.setattr(participant, "prepare_txn", slow_prepare)
    (again,) = participant.fetch("a", 1, 5)
    with (
        pytest.raises(TxnAborted, match=r"not decided within its timeout \(0.05s\)"),
        eomsg.Transaction(participant, [resource], timeout=0.05) as tx,
    ):
        tx.resource(app).execute("UPDATE stock SET n = 0")
        tx.publish("b", b"late")
        tx.delete(again)
    assert _stock(app) == 10 and participant.txns() == [] and participant.fetch("b", 10) == []
    assert [d.attempt for d in participant.fetch("a", 10)] == [3]  # given back each time
