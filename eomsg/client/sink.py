"""A table of the application's database that a queue's messages land in exactly once:
what ``eomsg consume --into duckdb:PATH:TABLE`` writes to (seed 001, express).

Each batch of messages is inserted in one transaction of the application's database,
together with their :class:`~eomsg.client.inbox.Inbox` records; only then are they
deleted from the queue. However often the consumer is killed — before, during or after
that commit — every message ends up in the table once: a redelivered message is
recognised by its inbox record and only deleted again.

The table is created when missing::

    seq BIGINT, id VARCHAR, topic VARCHAR, payload BLOB, headers VARCHAR (JSON),
    published_at TIMESTAMP (UTC; REAL seconds in SQLite), queue VARCHAR

An existing table must have at least these columns (others keep their defaults).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from eomsg.client.appdb import DuckDBApp, app_db, check_table, open_app
from eomsg.client.inbox import Inbox, Settleable
from eomsg.core.message import Delivered
from eomsg.errors import InvalidConfig, one_line

COLUMNS = ("seq", "id", "topic", "payload", "headers", "published_at", "queue")

_DUCKDB_TABLE = """CREATE TABLE IF NOT EXISTS {table} (
    seq BIGINT NOT NULL, id VARCHAR, topic VARCHAR NOT NULL, payload BLOB NOT NULL,
    headers VARCHAR NOT NULL, published_at TIMESTAMP NOT NULL, queue VARCHAR NOT NULL)"""
_SQLITE_TABLE = """CREATE TABLE IF NOT EXISTS {table} (
    seq INTEGER NOT NULL, id TEXT, topic TEXT NOT NULL, payload BLOB NOT NULL,
    headers TEXT NOT NULL, published_at REAL NOT NULL, queue TEXT NOT NULL)"""


@dataclass(frozen=True, slots=True)
class Written:
    """What one batch did: inserted, already there (redelivered), or expired (dropped)."""

    inserted: int
    duplicates: int
    expired: int

    def __add__(self, other: Written) -> Written:
        return Written(
            self.inserted + other.inserted,
            self.duplicates + other.duplicates,
            self.expired + other.expired,
        )


class TableSink:
    """Messages into ``table`` of ``conn`` (DuckDB or SQLite), exactly once, in
    batches. Not thread-safe: one sink per connection."""

    def __init__(self, conn: Any, table: str) -> None:
        self.conn = conn
        self.table = check_table(table)
        self._db = app_db(conn)
        duck = isinstance(self._db, DuckDBApp)
        template = _DUCKDB_TABLE if duck else _SQLITE_TABLE
        conn.execute(template.format(table=self.table))
        missing = set(COLUMNS) - self._columns()
        if missing:
            raise InvalidConfig(
                f"table {self.table} exists without the columns {', '.join(sorted(missing))}"
            )
        if not duck:
            conn.commit()
        self.inbox = Inbox(conn)

    def _columns(self) -> set[str]:
        cursor = self.conn.execute(f"SELECT * FROM {self.table} LIMIT 0")
        return {d[0].lower() for d in cursor.description}

    def write(self, messages: Sequence[Settleable]) -> Written:
        """Insert ``messages`` not inserted before, atomically with their inbox records,
        then delete them all from their queue (see :meth:`Inbox.batch`)."""
        with self.inbox.batch(messages) as batch:
            if batch.fresh:
                self._insert([m.delivered for m in batch.fresh])
        return Written(len(batch.fresh), len(batch.duplicates), len(batch.expired))

    def _insert(self, delivered: list[Delivered]) -> None:
        columns = ", ".join(COLUMNS)
        if isinstance(self._db, DuckDBApp):
            ms = [d.message for d in delivered]
            arrays = [
                pa.array([m.seq for m in ms], pa.int64()),
                pa.array([m.id for m in ms], pa.string()),
                pa.array([m.topic for m in ms], pa.string()),
                pa.array([m.payload for m in ms], pa.binary()),
                pa.array([json.dumps(m.headers) for m in ms], pa.string()),
                pa.array([round(m.published_at * 1e6) for m in ms], pa.timestamp("us")),
                pa.array([d.queue for d in delivered], pa.string()),
            ]
            self._db.insert(self.table, pa.Table.from_arrays(arrays, names=list(COLUMNS)))
            return
        self.conn.executemany(
            f"INSERT INTO {self.table} ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    d.message.seq,
                    d.message.id,
                    d.message.topic,
                    d.message.payload,
                    json.dumps(d.message.headers),
                    d.message.published_at,
                    d.queue,
                )
                for d in delivered
            ],
        )


def open_sink(target: str) -> TableSink:
    """The sink a ``duckdb:PATH:TABLE`` or ``sqlite:PATH:TABLE`` target names, on a
    connection of its own (close ``.conn`` when done). InvalidConfig if malformed."""
    kind, _, rest = target.partition(":")
    path, _, table = rest.rpartition(":")
    if kind not in ("duckdb", "sqlite") or not path or not table:
        raise InvalidConfig(f"--into {target!r}: expected duckdb:PATH:TABLE or sqlite:PATH:TABLE")
    check_table(table)  # before the file is touched: bad input changes nothing
    try:
        conn = open_app(kind, path)
    except (duckdb.Error, sqlite3.Error) as e:
        why = one_line(e)
        raise InvalidConfig(f"--into {target!r}: cannot open the database: {why}") from e
    try:
        return TableSink(conn, table)
    except (duckdb.Error, sqlite3.Error) as e:
        conn.close()
        raise InvalidConfig(f"--into {target!r}: cannot use the database: {one_line(e)}") from e
    except BaseException:
        conn.close()
        raise
