"""The clients of a fault-injection run, each a process of its own so that it can be
killed and paused like a real one: a producer and a consumer, each recording what it
does and sees in its own history file (:mod:`eomsg.chaos.history`).

``python -m eomsg.chaos.workers produce NODE HISTORY NAME COUNT [--once]`` publishes the
messages ``NAME-0`` … ``NAME-(COUNT-1)`` in order, each with its name as its publish id;
an attempt's line is written *before* the call (outcome unknown), so a producer killed
mid-call leaves that attempt known, and again once answered. Started again on the same
history, it goes on after the last message acknowledged, and — unless ``--once`` —
retries the one whose outcome it did not learn, with the same id.

``python -m eomsg.chaos.workers consume NODE HISTORY NAME QUEUE APP`` consumes ``QUEUE``
into the application database ``APP`` — ``sqlite:PATH``, ``duckdb:PATH`` or
``postgresql:CONNINFO`` — through an :class:`~eomsg.client.inbox.Inbox`, each
message appended to its table ``applied`` in the transaction that records it in the
inbox, then deleted; it records each change of activity, delivery and delete. The
consumers of one queue share its database, as an application's do: the inbox is what
keeps one that takes over from applying again what another applied. With ``--txn`` it
applies and deletes each batch in one two-phase transaction instead (the deletes are
part of it), recording what it was told of each commit; the rows it appends name their
transaction. SIGTERM stops it; a node that goes away is connected to again (and, with
``--txn``, the transactions it left in doubt are recovered then)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eomsg.chaos.history import (
    Activity,
    Outcome,
    Published,
    Received,
    Recorder,
    Settled,
    Transacted,
    read,
)
from eomsg.errors import EomsgError, StaleDelivery

RETRY_EVERY = 0.05  # seconds between attempts while the node is down
# The table each consumer appends to, numbered in the order the database applied them.
APPLIED = {
    "sqlite": ["""CREATE TABLE IF NOT EXISTS applied (
        n INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, id TEXT NOT NULL, txid TEXT)"""],
    "duckdb": ["CREATE SEQUENCE IF NOT EXISTS applied_n", """CREATE TABLE IF NOT EXISTS applied (
        n BIGINT PRIMARY KEY DEFAULT nextval('applied_n'), queue TEXT NOT NULL,
        id TEXT NOT NULL, txid TEXT)"""],
    "postgresql": ["""CREATE TABLE IF NOT EXISTS applied (
        n BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL, txid TEXT)"""],
}  # fmt: skip
CREATING = 0x656F6D7367  # the PostgreSQL advisory lock held while making ``applied``
RESOURCES = {  # eomsg's transaction resource for each kind
    "sqlite": "SQLiteResource", "duckdb": "DuckDBResource", "postgresql": "PostgresResource"
}  # fmt: skip


def open_database(app: str) -> tuple[Any, str]:
    """A connection to the application database ``app`` (``KIND:WHERE``) and its kind,
    its ``applied`` table made if missing."""
    from eomsg.client.appdb import open_app

    kind, _, where = app.partition(":")
    conn = open_app(kind, where)
    if kind == "sqlite":
        conn.execute("PRAGMA journal_mode=WAL")
    if kind == "postgresql":  # CREATE … IF NOT EXISTS races another worker's: take turns
        conn.execute("SELECT pg_advisory_lock(%s)", [CREATING])
    try:
        for statement in APPLIED[kind]:
            conn.execute(statement)
    finally:
        if kind == "postgresql":
            conn.execute("SELECT pg_advisory_unlock(%s)", [CREATING])
    return conn, kind


def _append(conn: Any, kind: str, rows: Sequence[tuple[str | None, ...]]) -> None:
    """Append ``rows`` — (queue, id) or (queue, id, txid) — to ``applied``."""
    columns = "queue, id" if len(rows[0]) == 2 else "queue, id, txid"
    marks = ", ".join(["%s" if kind == "postgresql" else "?"] * len(rows[0]))
    statement = f"INSERT INTO applied ({columns}) VALUES ({marks})"
    if kind == "postgresql":
        with conn.cursor() as cursor:
            cursor.executemany(statement, rows)
    else:
        conn.executemany(statement, rows)


def _outcome(error: BaseException | None) -> Outcome:
    """A refusal changed nothing; anything else (a lost connection) is not known."""
    if error is None:
        return Outcome.OK
    return Outcome.FAILED if isinstance(error, StaleDelivery) else Outcome.UNKNOWN


def produce(
    node: str,
    history: Path,
    name: str,
    count: int,
    *,
    origin: str,
    topic: str,
    expect: tuple[str, ...],
    retry: bool = True,
    rate: float | None = None,
) -> None:
    """Publish ``name-i`` for i below ``count`` in order to ``topic`` on ``node``
    (``origin`` in the history), which the queues ``expect`` are subscribed to; at most
    ``rate`` a second, so that a run's faults find it publishing."""
    import eomsg

    done, unsure = _progress(history)
    i = 0 if not done else max(_index(i) for i in done) + 1
    if unsure is not None and not retry:
        i = max(i, _index(unsure) + 1)
    client = None
    step = 0.0 if rate is None else 1.0 / rate
    due = time.monotonic()
    with Recorder(history) as record:
        while i < count:
            due = max(due + step, time.monotonic())  # a stall is not made up for later
            time.sleep(max(0.0, due - time.monotonic()))
            msg_id = f"{name}-{i}"
            invoked = time.monotonic()
            record(Published(msg_id, origin, expect, Outcome.UNKNOWN, invoked, invoked))
            try:
                if client is None:
                    client = eomsg.connect(node, timeout=2.0)
                client.publish(topic, msg_id.encode(), id=msg_id)
            except (EomsgError, OSError):
                if client is not None:
                    client.close()
                    client = None
                time.sleep(RETRY_EVERY)  # the node is down: the outcome is unknown
                i += 0 if retry else 1
                continue
            record(Published(msg_id, origin, expect, Outcome.OK, invoked, time.monotonic()))
            i += 1
    if client is not None:
        client.close()


def _index(msg_id: str) -> int:
    return int(msg_id.rsplit("-", 1)[1])


def _progress(history: Path) -> tuple[set[str], str | None]:
    """What an earlier run of this producer had acknowledged, and the attempt it was in
    when it stopped (if unanswered)."""
    if not history.exists():
        return set(), None
    done: set[str] = set()
    last: str | None = None
    for e in read(history):
        if isinstance(e, Published):
            if e.outcome is Outcome.OK:
                done.add(e.id)
            last = e.id
    return done, None if last in done else last


class _Stop(BaseException):
    """SIGTERM: leave at once, whatever the consumer is waiting for."""


def _stop(*_: object) -> None:
    raise _Stop


def consume(
    node: str,
    history: Path,
    name: str,
    queue: str,
    app: str,
    *,
    transactional: bool = False,
    via: str | None = None,
) -> None:
    """Consume ``queue`` into ``app`` until SIGTERM (see the module's docstring) —
    ``via`` ``node``: the queue is on that node of the network, reached through this
    one."""
    import eomsg

    signal.signal(signal.SIGTERM, _stop)
    conn, kind = open_database(app)
    try:
        with Recorder(history) as record:
            while True:
                try:
                    with eomsg.connect(node, timeout=2.0, via=via) as client:
                        apply = (
                            _Transactions(client, conn, kind, record, name)
                            if transactional
                            else _Express(conn, kind, record, name)
                        )
                        _consume(client, record, name, queue, apply)
                except (EomsgError, OSError):
                    time.sleep(RETRY_EVERY)  # the node is down, or cut this client off
    except _Stop:
        pass
    finally:
        conn.close()


def _consume(
    client: Any, record: Callable[..., None], name: str, queue: str, apply: Callable[..., None]
) -> None:
    def noted(event: Any) -> None:
        record(Activity(name, queue, event.epoch, event.active, time.monotonic()))

    with client.consumer(queue, prefetch=32, on_active=noted, on_inactive=noted) as consumer:
        for batch in consumer.batches(32):
            if not isinstance(batch, list):
                continue
            at = time.monotonic()
            record(*(Received(name, queue, r.id, r.seq, r.attempt, r.epoch, at) for r in batch))
            apply(batch)


class _Express:
    """Apply a batch through the inbox, then delete it (seed 001)."""

    def __init__(self, conn: Any, kind: str, record: Callable[..., None], name: str) -> None:
        import eomsg

        self.conn, self.kind, self.record, self.name = conn, kind, record, name
        self.inbox = eomsg.Inbox(conn)

    def __call__(self, batch: list[Any]) -> None:
        settling = [_Recorded(r, self.record, self.name) for r in batch]
        with self.inbox.batch(settling) as b:
            if b.fresh:
                rows = [(m.delivered.queue, m.delivered.message.id) for m in b.fresh]
                _append(self.conn, self.kind, rows)


class _Transactions:
    """Apply and delete a batch in one transaction (seed 000), recording its outcome."""

    def __init__(
        self, client: Any, conn: Any, kind: str, record: Callable[..., None], name: str
    ) -> None:
        import eomsg

        self.client, self.conn, self.kind, self.record = client, conn, kind, record
        self.name = name
        # new on each connection to the node: what it left in doubt is recovered first
        self.resource = getattr(eomsg, RESOURCES[kind])(conn)

    def __call__(self, batch: list[Any]) -> None:
        from eomsg.errors import TxnAborted

        tx = self.client.transaction(resources=[self.resource])
        invoked = time.monotonic()
        # written first, so that one killed mid-commit is still known (and checked)
        self.record(Transacted(self.name, tx.txid, Outcome.UNKNOWN, invoked, invoked))
        outcome = Outcome.UNKNOWN
        try:
            with tx:
                rows = [(r.queue, r.id, tx.txid) for r in batch]
                _append(tx.resource(self.conn), self.kind, rows)
                for r in batch:
                    tx.delete(r)
            outcome = Outcome.OK
        except TxnAborted:
            outcome = Outcome.FAILED
            for r in batch:  # delivered again at once, not after the ack timeout
                with contextlib.suppress(EomsgError):
                    r.release()
        finally:
            done = time.monotonic()
            self.record(
                Transacted(self.name, tx.txid, outcome, invoked, done),
                # its deletes, settled as it was: fenced by attempt and epoch like any
                *(
                    Settled(self.name, r.queue, r.seq, r.attempt, r.epoch, outcome, invoked, done)
                    for r in batch
                ),
            )


def applied(app: str) -> list[tuple[str, str, str | None]]:
    """What the database ``app`` applied, in the order it did: (queue, id, txid)."""
    conn, _ = open_database(app)
    try:
        rows: list[tuple[str, str, str | None]] = conn.execute(
            "SELECT queue, id, txid FROM applied ORDER BY n"
        ).fetchall()
        return rows
    finally:
        conn.close()


class _Recorded:
    """A received message whose delete is recorded, with the node's answer."""

    def __init__(self, received: Any, record: Callable[..., None], consumer: str) -> None:
        self._received = received
        self._record = record
        self._consumer = consumer
        self.delivered = received.delivered

    def delete(self) -> Any:
        d = self.delivered
        invoked = time.monotonic()
        future = self._received.delete()

        def answered(f: Any) -> None:
            done, outcome = time.monotonic(), _outcome(f.exception())
            key = (d.seq, d.attempt, d.epoch)
            self._record(Settled(self._consumer, d.queue, *key, outcome, invoked, done))

        future.add_done_callback(answered)
        return future

    def release(self, delay: float = 0.0) -> Any:
        return self._received.release(delay)


PARENT = "EOMSG_CHAOS_PARENT"  # the run's pid, as the run sets it for its workers


def _die_with_parent() -> None:
    """End this worker when the run that started it is gone (killed without cleaning
    up): a consumer would otherwise reconnect for ever. The run names itself in the
    environment, since it may be gone before this process looks at its parent."""
    parent = int(os.environ.get(PARENT, os.getppid()))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="chaos-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eomsg.chaos.workers")
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("produce")
    p.add_argument("node")
    p.add_argument("history", type=Path)
    p.add_argument("name")
    p.add_argument("count", type=int)
    p.add_argument("--origin", default="node", help="the node it publishes on")
    p.add_argument("--topic", default="chaos/m")
    p.add_argument("--expect", action="append", default=[], help="a queue the topic reaches")
    p.add_argument("--once", action="store_true", help="do not retry an unknown outcome")
    p.add_argument("--rate", type=float, help="messages a second, at most")
    c = roles.add_parser("consume")
    c.add_argument("node")
    c.add_argument("history", type=Path)
    c.add_argument("name")
    c.add_argument("queue")
    c.add_argument("app", help="the database: sqlite:PATH, duckdb:PATH or postgresql:CONNINFO")
    c.add_argument("--txn", action="store_true", help="apply and delete in transactions")
    c.add_argument("--via", help="the node that holds the queue, reached through this one")
    args = parser.parse_args(argv)
    _die_with_parent()
    if args.role == "produce":
        produce(
            args.node, args.history, args.name, args.count, origin=args.origin,
            topic=args.topic, expect=tuple(args.expect), retry=not args.once, rate=args.rate,
        )  # fmt: skip
    else:
        consume(
            args.node, args.history, args.name, args.queue, args.app, transactional=args.txn,
            via=args.via,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
