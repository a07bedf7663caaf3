"""The express inbox (seed 001): exactly-once effects without a transaction coordinator.

A message carries an identifier and an expiration time. The receiver applies it in its own
database transaction, and in that same transaction records the identifier in an inbox
table; only after that commit does it delete the message from the queue. So:

- a crash before the commit leaves neither the effects nor the record — the message is
  delivered again and applied then;
- a crash after the commit but before the delete leaves both — the message is delivered
  again, recognised by its identifier, and only deleted (re-acknowledged);
- an expired message is dropped unapplied (the seed's receiver rule), and its inbox record
  may be forgotten once it has expired, since the queue will never deliver it again.

The identifier is the message's publish ``id``; a message published without one is known
by ``QUEUE:SEQ``, which is stable across its redeliveries. SQL here speaks to the
*application's* database (DuckDB, SQLite or PostgreSQL), never to the node's store.
"""

from __future__ import annotations

import abc
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from eomsg.client.appdb import AppDB, DuckDBApp, PostgresApp, SQLiteApp, app_db, check_table
from eomsg.core.message import Delivered

DEFAULT_TABLE = "eomsg_inbox"
_CHUNK = 500  # keys per IN (...) lookup: under SQLite's variable limit


class Settleable(Protocol):
    """A received message: what the inbox reads, and how it settles it with the node."""

    @property
    def delivered(self) -> Delivered: ...

    def delete(self) -> Any: ...

    def release(self, delay: float = 0.0) -> Any: ...


def message_key(d: Delivered) -> str:
    """The identity the inbox dedups by: the publish id, else ``QUEUE:SEQ``."""
    return d.message.id if d.message.id is not None else f"{d.queue}:{d.message.seq}"


_Row = tuple[str, str, int, float | None, float]  # key, queue, seq, expires_at, applied_at


class _Records(abc.ABC):
    """The inbox table in one kind of application database; each kind writes its
    records its own fastest way."""

    def __init__(self, db: AppDB, table: str) -> None:
        self.db = db
        self.conn = db.conn
        self.table = check_table(table)

    def create(self) -> None:
        self.conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {self.table} (
                    msg_key VARCHAR PRIMARY KEY,
                    queue VARCHAR NOT NULL,
                    seq BIGINT NOT NULL,
                    expires_at DOUBLE PRECISION,
                    applied_at DOUBLE PRECISION NOT NULL)"""
        )

    @abc.abstractmethod
    def claim(self, rows: list[_Row]) -> set[str]:
        """Insert the records of ``rows`` (distinct keys) that have none yet, in the open
        transaction; return the keys inserted — the messages to apply now."""

    def forget_expired(self, now: float) -> int:
        """Drop the records expired before ``now``, in a transaction of their own."""
        self.db.begin()
        try:
            rows = self.conn.execute(
                f"DELETE FROM {self.table} WHERE expires_at < {self.db.param} RETURNING 1",
                [now],
            ).fetchall()
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise
        return len(rows)


_ROW_NAMES = ["msg_key", "queue", "seq", "expires_at", "applied_at"]
_ROW_TYPES = [pa.string(), pa.string(), pa.int64(), pa.float64(), pa.float64()]


class _DuckDB(_Records):
    def claim(self, rows: list[_Row]) -> set[str]:
        # One statement: the primary key finds the keys recorded before, in the insert.
        assert isinstance(self.db, DuckDBApp)
        columns = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [pa.array(c, t) for c, t in zip(columns, _ROW_TYPES, strict=True)], names=_ROW_NAMES
        )
        return self.db.insert_new(self.table, table, "msg_key")


class _LookUpThenRecord(_Records):
    """Claims in two statements: which keys are recorded, then the others' records."""

    def claim(self, rows: list[_Row]) -> set[str]:
        known = self.known([r[0] for r in rows])
        fresh = [r for r in rows if r[0] not in known]
        if fresh:
            self.record(fresh)
        return {r[0] for r in fresh}

    @abc.abstractmethod
    def known(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` have a record."""

    @abc.abstractmethod
    def record(self, rows: list[_Row]) -> None:
        """Insert inbox rows, in one go."""


class _SQLite(_LookUpThenRecord):
    def known(self, keys: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(keys), _CHUNK):  # under SQLite's limit on parameters
            part = keys[i : i + _CHUNK]
            marks = ", ".join("?" * len(part))
            rows = self.conn.execute(
                f"SELECT msg_key FROM {self.table} WHERE msg_key IN ({marks})", list(part)
            ).fetchall()
            found.update(r[0] for r in rows)
        return found

    def record(self, rows: list[_Row]) -> None:
        self.conn.executemany(f"INSERT INTO {self.table} VALUES (?, ?, ?, ?, ?)", rows)


class _Postgres(_LookUpThenRecord):
    def known(self, keys: Sequence[str]) -> set[str]:
        rows = self.conn.execute(
            f"SELECT msg_key FROM {self.table} WHERE msg_key = ANY(%s)", [list(keys)]
        ).fetchall()
        return {r[0] for r in rows}

    def record(self, rows: list[_Row]) -> None:
        # COPY: one round trip for the batch, the server's fastest way in.
        cursor = self.conn.cursor()
        with cursor.copy(f"COPY {self.table} ({', '.join(_ROW_NAMES)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def _records(conn: Any, table: str) -> _Records:
    db = app_db(conn)
    if isinstance(db, DuckDBApp):
        return _DuckDB(db, table)
    if isinstance(db, SQLiteApp):
        return _SQLite(db, table)
    assert isinstance(db, PostgresApp)
    return _Postgres(db, table)


@dataclass
class Batch:
    """Messages being applied in one transaction of the application's database: apply
    those in :attr:`fresh`; the others were applied before (:attr:`duplicates`) or have
    expired (:attr:`expired`) and are only deleted."""

    fresh: list[Settleable] = field(default_factory=list)
    duplicates: list[Settleable] = field(default_factory=list)
    expired: list[Settleable] = field(default_factory=list)


class Inbox:
    """Exactly-once application of messages into ``conn`` (a DuckDB, SQLite or
    PostgreSQL connection), through an inbox table it creates if missing. Not thread-safe: one
    inbox per connection, used by one thread."""

    def __init__(
        self, conn: Any, *, table: str = DEFAULT_TABLE, clock: Callable[[], float] = time.time
    ) -> None:
        self._db = _records(conn, table)
        self._clock = clock
        self._db.create()
        if isinstance(conn, sqlite3.Connection):
            conn.commit()

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to release: the connection stays the application's."""

    @contextmanager
    def batch(self, messages: Sequence[Settleable]) -> Iterator[Batch]:
        """Open a transaction, sort ``messages`` into fresh, duplicate and expired, and
        let the caller apply the fresh ones. On a clean exit the inbox records commit
        with the caller's changes, atomically, and then every message is deleted from
        its queue. On an exception everything rolls back and the messages are released
        for redelivery."""
        now = self._clock()
        sorted_ = Batch()
        keys: list[str] = []
        for m in messages:
            d = m.delivered
            if d.message.expires_at is not None and d.message.expires_at <= now:
                sorted_.expired.append(m)
            else:
                keys.append(message_key(d))
                sorted_.fresh.append(m)
        self._db.db.begin()
        try:
            rows: dict[str, _Row] = {}  # the first of each key: later ones are duplicates
            for m, key in zip(sorted_.fresh, keys, strict=True):
                if key not in rows:
                    d = m.delivered
                    rows[key] = (key, d.queue, d.message.seq, d.message.expires_at, now)
            claimed = self._db.claim(list(rows.values())) if rows else set()
            fresh = []
            for m, key in zip(sorted_.fresh, keys, strict=True):
                if key in claimed:
                    claimed.discard(key)
                    fresh.append(m)
                else:
                    sorted_.duplicates.append(m)
            sorted_.fresh = fresh
            yield sorted_
            self._db.db.commit()
        except BaseException:
            self._db.db.rollback()
            for m in messages:
                m.release()
            raise
        for m in messages:  # after the commit: a crash here means a redelivery, recognised
            m.delete()

    @contextmanager
    def process(self, message: Settleable) -> Iterator[bool]:
        """:meth:`batch` for one message: yields True if it is to be applied now, False
        if it was applied before or has expired (then do nothing: it is only deleted)."""
        with self.batch([message]) as b:
            yield bool(b.fresh)

    def forget_expired(self) -> int:
        """Drop inbox records of messages past their expiration: the queue will never
        deliver them again, so they can no longer be duplicates. Returns how many."""
        return self._db.forget_expired(self._clock())
