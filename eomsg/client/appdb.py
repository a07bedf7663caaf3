"""The application's own database, as eomsg's client side speaks to it: a DuckDB or
SQLite connection that the application owns, and in whose transactions eomsg writes its
records (inbox rows, transaction markers) so that they commit or vanish with the
application's changes. The node's store is never reached from here."""

from __future__ import annotations

import abc
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from eomsg.errors import InvalidConfig, UsageError


def check_table(table: str) -> str:
    """A table name eomsg may interpolate into SQL: letters, digits and '_'."""
    if not table or not table.replace("_", "").isalnum() or not table[0].isalpha():
        raise InvalidConfig(f"table {table!r}: use letters, digits and '_', starting with a letter")
    return table


class AppDB(abc.ABC):
    """One application connection: transaction control, and where its data lives."""

    kind: str  # the scheme of its descriptor: "duckdb" or "sqlite"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def begin(self) -> None:
        self.conn.execute("BEGIN TRANSACTION")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        self.conn.execute("ROLLBACK")

    @abc.abstractmethod
    def path(self) -> Path | None:
        """The database file, None for an in-memory database."""

    def descriptor(self, table: str) -> str:
        """``KIND:PATH#TABLE``: where a process that opens this database finds ``table``."""
        path = self.path()
        return f"{self.kind}:{path if path is not None else ':memory:'}#{table}"


class DuckDBApp(AppDB):
    kind = "duckdb"

    def insert(self, table: str, rows: pa.Table) -> None:
        """Insert ``rows`` into the columns of ``table`` named as theirs, in one statement:
        DuckDB's executemany runs row by row, and an Arrow scan beats list parameters."""
        self.conn.register("_eomsg_rows", rows)
        try:
            columns = ", ".join(rows.column_names)
            self.conn.execute(f"INSERT INTO {table} ({columns}) SELECT * FROM _eomsg_rows")
        finally:
            self.conn.unregister("_eomsg_rows")

    def path(self) -> Path | None:
        row = self.conn.execute(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchone()
        return Path(row[0]).resolve() if row and row[0] else None


class SQLiteApp(AppDB):
    kind = "sqlite"

    def begin(self) -> None:
        if self.conn.in_transaction:
            raise UsageError("the SQLite connection has a transaction open; commit it first")
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def path(self) -> Path | None:
        for _, name, file in self.conn.execute("PRAGMA database_list").fetchall():
            if name == "main":
                return Path(file).resolve() if file else None
        return None


def app_db(conn: Any) -> AppDB:
    """The AppDB for a DuckDB or SQLite connection (InvalidConfig for anything else)."""
    if isinstance(conn, duckdb.DuckDBPyConnection):
        return DuckDBApp(conn)
    if isinstance(conn, sqlite3.Connection):
        return SQLiteApp(conn)
    raise InvalidConfig(f"expected a DuckDB or SQLite connection, not {type(conn).__name__}")


def open_descriptor(descriptor: str) -> tuple[AppDB, str]:
    """Open the database a ``KIND:PATH#TABLE`` descriptor names, for recovery: the new
    connection (close ``.conn`` when done) and the table. Raises InvalidConfig for a
    descriptor it cannot open (an in-memory database; an unknown kind), and the
    database's own error when the file is locked by its application."""
    kind, _, rest = descriptor.partition(":")
    path, _, table = rest.rpartition("#")
    check_table(table)
    if not path or path == ":memory:":
        raise InvalidConfig(f"{descriptor}: an in-memory database cannot be reopened")
    return app_db(open_app(kind, path)), table


def open_app(kind: str, path: str) -> Any:
    """A new connection to the ``kind`` ("duckdb" or "sqlite") database at ``path``;
    SQLite in autocommit mode, so that :class:`SQLiteApp` controls its transactions.
    InvalidConfig for another kind; the database's own error if it cannot open."""
    if kind == "duckdb":
        return duckdb.connect(path)
    if kind == "sqlite":
        return sqlite3.connect(path, isolation_level=None, timeout=10.0)
    raise InvalidConfig(f"unknown kind of database {kind!r} (use duckdb or sqlite)")
