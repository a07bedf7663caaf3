"""Application databases as participants of an eomsg transaction (seed 000).

DuckDB and SQLite are *commit-markable*: they cannot prepare, so the coordinator prepares
every other participant first, then writes its COMMIT decision as a marker row inside the
application's own transaction and commits that. The application's changes and the
decision become durable in one act; recovery reads the truth from the marker table.

PostgreSQL *prepares*: after the node, it votes with ``PREPARE TRANSACTION``; then the
coordinator records COMMIT in the same database's marker table, in a transaction of its
own (the decision log, durable before anyone is told), and only then runs ``COMMIT
PREPARED`` and tells the node. The application's part settles before the node's, so
whatever PostgreSQL holds prepared, the node holds prepared too, and ``eomsg recover``
finds it from the node's side.

The marker table (``eomsg_txns`` unless told otherwise) holds one row per transaction
that is decided and not yet forgotten: ``commit`` rows until every participant has
applied the outcome, ``abort`` rows written by a recovery to *fence* a coordinator that
might still try to commit (its marker insert then fails on the primary key, so its
application changes roll back with it).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import duckdb
import psycopg

from eomsg.client.appdb import AppDB, PostgresApp, app_db, check_table
from eomsg.errors import InvalidConfig
from eomsg.failpoints import failpoint

DEFAULT_MARKERS = "eomsg_txns"
FORGET_AFTER = 86400.0  # abort fences older than this can no longer matter


class MarkerTable:
    """The decision markers in one application database. Every method but
    :meth:`decide` runs its own short transaction."""

    def __init__(self, db: AppDB, table: str = DEFAULT_MARKERS) -> None:
        self.db = db
        self.table = check_table(table)
        self._q = db.param

    def create(self) -> None:
        self.db.conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {self.table} (
                    txid VARCHAR PRIMARY KEY,
                    outcome VARCHAR NOT NULL,
                    decided_at DOUBLE PRECISION NOT NULL)"""
        )

    def decide(self, txid: str, forget: Sequence[str]) -> None:
        """Record COMMIT for ``txid`` (and drop the markers in ``forget``, whose outcomes
        every participant has applied), and commit: the commit point of the transaction.
        In a commit-markable database this runs inside the open application
        transaction, whose changes commit with it; in one that prepares, the
        application's work is prepared already and this is a transaction of its own.
        Raises if the marker exists — a recovery fenced the transaction with ABORT —
        and then nothing commits."""
        conn, q = self.db.conn, self._q
        if self.db.prepares:
            self.db.begin()
        for i in range(0, len(forget), 500):
            part = list(forget[i : i + 500])
            marks = ", ".join([q] * len(part))
            conn.execute(f"DELETE FROM {self.table} WHERE txid IN ({marks})", part)
        conn.execute(f"INSERT INTO {self.table} VALUES ({q}, 'commit', {q})", [txid, time.time()])
        failpoint("resource.before_commit")
        self.db.commit()
        failpoint("resource.after_commit")

    def peek(self, txid: str) -> str | None:
        """The recorded outcome of ``txid`` (``commit``, ``abort``), None if none."""
        row = self.db.conn.execute(
            f"SELECT outcome FROM {self.table} WHERE txid = {self._q}", [txid]
        ).fetchone()
        return None if row is None else str(row[0])

    def outcome_or_fence(self, txid: str) -> bool:
        """True if ``txid`` is recorded COMMIT. Otherwise make sure it never will be:
        record ABORT (atomically: a commit racing with this either lands first, and is
        seen, or fails on the marker) and return False."""
        q = self._q
        self.db.begin()
        try:
            row = self.db.conn.execute(
                f"SELECT outcome FROM {self.table} WHERE txid = {q}", [txid]
            ).fetchone()
            if row is None:
                self.db.conn.execute(
                    f"INSERT INTO {self.table} VALUES ({q}, 'abort', {q})", [txid, time.time()]
                )
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise
        return row is not None and row[0] == "commit"

    def forget(self, txids: Sequence[str], *, fences_before: float | None = None) -> None:
        """Drop the markers of ``txids`` (their outcome is applied everywhere), and the
        ABORT fences older than ``fences_before``."""
        if not txids and fences_before is None:
            return
        conn, q = self.db.conn, self._q
        self.db.begin()
        try:
            for i in range(0, len(txids), 500):
                part = list(txids[i : i + 500])
                marks = ", ".join([q] * len(part))
                conn.execute(f"DELETE FROM {self.table} WHERE txid IN ({marks})", part)
            if fences_before is not None:
                conn.execute(
                    f"DELETE FROM {self.table} WHERE outcome = 'abort' AND decided_at < {q}",
                    [fences_before],
                )
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise


class Resource:
    """An application database (a DuckDB, SQLite or PostgreSQL connection) enlisted in
    eomsg transactions: the app's changes and the messages published and deleted in a
    transaction commit together, or not at all. Not thread-safe: one transaction at a
    time per connection, as the database itself allows."""

    def __init__(self, conn: Any, *, table: str = DEFAULT_MARKERS) -> None:
        self.conn = conn
        self.db = app_db(conn)
        self.markers = MarkerTable(self.db, table)
        self.markers.create()
        if self.db.kind == "sqlite":
            conn.commit()
        self.descriptor = self.db.descriptor(table)
        self.applied: list[str] = []  # committed everywhere: markers to drop (FORGET_BATCH)
        self.recovered = False  # in-doubt transactions of this database resolved


class DuckDBResource(Resource):
    """A DuckDB connection as a commit-markable transaction resource."""

    def __init__(self, conn: Any, *, table: str = DEFAULT_MARKERS) -> None:
        if not isinstance(conn, duckdb.DuckDBPyConnection):
            raise InvalidConfig(
                f"DuckDBResource needs a DuckDB connection, not {type(conn).__name__}"
            )
        super().__init__(conn, table=table)


class SQLiteResource(Resource):
    """A SQLite connection as a commit-markable transaction resource."""

    def __init__(self, conn: Any, *, table: str = DEFAULT_MARKERS) -> None:
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidConfig(
                f"SQLiteResource needs a sqlite3 connection, not {type(conn).__name__}"
            )
        super().__init__(conn, table=table)


class PostgresResource(Resource):
    """A psycopg 3 connection (``autocommit=True``) as a transaction resource that
    prepares: the server needs ``max_prepared_transactions`` above 0."""

    def __init__(self, conn: Any, *, table: str = DEFAULT_MARKERS) -> None:
        if not isinstance(conn, psycopg.Connection):
            raise InvalidConfig(
                f"PostgresResource needs a psycopg connection, not {type(conn).__name__}"
            )
        super().__init__(conn, table=table)
        assert isinstance(self.db, PostgresApp)
        if self.db.max_prepared() == 0:
            raise InvalidConfig(
                "PostgreSQL cannot prepare transactions: set max_prepared_transactions "
                "above 0 in postgresql.conf and restart the server"
            )
