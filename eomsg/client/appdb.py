"""The application's own database, as eomsg's client side speaks to it: a DuckDB, SQLite
or PostgreSQL (psycopg 3) connection that the application owns, and in whose
transactions eomsg writes its records (inbox rows, transaction markers) so that they
commit or vanish with the application's changes. The node's store is never reached from
here.

DuckDB and SQLite can only commit; PostgreSQL can also *prepare* (``PREPARE
TRANSACTION``): it votes in two-phase commit like the node does, and its prepared work
outlives a crash of the application until the outcome settles it."""

from __future__ import annotations

import abc
import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
from psycopg import pq, sql

from eomsg.errors import InvalidConfig, UsageError


def check_table(table: str) -> str:
    """A table name eomsg may interpolate into SQL: letters, digits and '_'."""
    if not table or not table.replace("_", "").isalnum() or not table[0].isalpha():
        raise InvalidConfig(f"table {table!r}: use letters, digits and '_', starting with a letter")
    return table


# A prepared PostgreSQL transaction of eomsg is named after its transaction id.
GID_PREFIX = "eomsg:"


class AppDB(abc.ABC):
    """One application connection: transaction control, and where its data lives."""

    kind: str  # the scheme of its descriptor: "duckdb", "sqlite" or "postgresql"
    param = "?"  # how its SQL marks a parameter
    prepares = False  # whether it votes in two-phase commit (else it is commit-markable)

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
        """The database file, None for an in-memory database or a server's."""

    def descriptor(self, table: str) -> str:
        """``KIND:PATH#TABLE``: where a process that opens this database finds ``table``."""
        path = self.path()
        return f"{self.kind}:{path if path is not None else ':memory:'}#{table}"

    def prepare(self, txid: str) -> None:
        """Vote yes in two-phase commit for the open transaction, as ``txid``."""
        raise UsageError(f"a {self.kind} database cannot prepare a transaction")

    def prepared(self) -> list[tuple[str, float]]:
        """The eomsg transactions this database holds prepared: ``(txid, prepared_at)``.
        None in a database that cannot prepare."""
        return []

    def finish_prepared(self, txid: str, commit: bool) -> bool:
        """Commit (or roll back) the work of ``txid`` this database holds prepared;
        False if it holds none (never prepared, or settled already). Idempotent."""
        return False

    def broken(self) -> bool:
        """Whether the connection was lost (so the last commit's outcome is unknown)."""
        return False

    def reopen(self) -> AppDB:
        """A new connection to the same database, as the same user."""
        raise UsageError(f"eomsg does not reopen a {self.kind} connection")


class DuckDBApp(AppDB):
    kind = "duckdb"

    def insert(self, table: str, rows: pa.Table) -> None:
        """Insert ``rows`` into the columns of ``table`` named as theirs, in one statement:
        DuckDB's executemany runs row by row, and an Arrow scan beats list parameters."""
        self._insert(table, rows, "")

    def insert_new(self, table: str, rows: pa.Table, key: str) -> set[Any]:
        """Insert those of ``rows`` whose ``key`` (``table``'s primary key) has no row
        yet, in one statement; return their keys."""
        return {r[0] for r in self._insert(table, rows, f"ON CONFLICT DO NOTHING RETURNING {key}")}

    def _insert(self, table: str, rows: pa.Table, tail: str) -> list[Any]:
        self.conn.register("_eomsg_rows", rows)
        try:
            columns = ", ".join(rows.column_names)
            result: list[Any] = self.conn.execute(
                f"INSERT INTO {table} ({columns}) SELECT * FROM _eomsg_rows {tail}"
            ).fetchall()
            return result
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


class PostgresApp(AppDB):
    """A psycopg 3 connection in autocommit mode, so that eomsg alone says where its
    transactions begin and end (BEGIN, PREPARE TRANSACTION, COMMIT PREPARED)."""

    kind = "postgresql"
    param = "%s"
    prepares = True

    def __init__(self, conn: Any) -> None:
        if not conn.autocommit:
            raise InvalidConfig(
                "eomsg needs the PostgreSQL connection in autocommit mode "
                "(psycopg.connect(..., autocommit=True)): it runs its own transactions"
            )
        super().__init__(conn)

    def begin(self) -> None:
        """BEGIN, with the commit made durable before it returns whatever the session's
        ``synchronous_commit``: eomsg deletes messages once their effects commit."""
        if self.conn.info.transaction_status != pq.TransactionStatus.IDLE:
            raise UsageError("the PostgreSQL connection has a transaction open; commit it first")
        self.conn.execute("BEGIN; SET LOCAL synchronous_commit TO on")

    def rollback(self) -> None:
        if self.conn.info.transaction_status != pq.TransactionStatus.IDLE:
            self.conn.execute("ROLLBACK")

    def path(self) -> Path | None:
        return None

    def descriptor(self, table: str) -> str:
        """``postgresql:CONNINFO#TABLE``, the connection string without its password
        (recovery takes that from PGPASSWORD or ~/.pgpass, as libpq does)."""
        return f"{self.kind}:{self.conn.info.dsn}#{table}"

    def broken(self) -> bool:
        return bool(self.conn.broken or self.conn.closed)

    def reopen(self) -> PostgresApp:
        info = self.conn.info
        params = info.get_parameters()
        if info.password:
            params["password"] = info.password
        return PostgresApp(psycopg.connect(**params, autocommit=True, connect_timeout=10))

    def max_prepared(self) -> int:
        row = self.conn.execute("SHOW max_prepared_transactions").fetchone()
        return int(row[0])

    def prepare(self, txid: str) -> None:
        """Vote yes: ``PREPARE TRANSACTION`` the open transaction, durably. The
        connection is free for other transactions from then on."""
        self.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(GID_PREFIX + txid))

    def prepared(self) -> list[tuple[str, float]]:
        rows = self.conn.execute(
            "SELECT gid, extract(epoch FROM prepared)::float8 FROM pg_prepared_xacts "
            "WHERE database = current_database() AND starts_with(gid, %s) ORDER BY prepared",
            [GID_PREFIX],
        ).fetchall()
        return [(str(gid)[len(GID_PREFIX) :], float(at)) for gid, at in rows]

    def finish_prepared(self, txid: str, commit: bool) -> bool:
        how = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
        try:
            self.conn.execute(sql.SQL(how).format(GID_PREFIX + txid))
        except psycopg.errors.UndefinedObject:  # no such prepared transaction
            return False
        return True


def app_db(conn: Any) -> AppDB:
    """The AppDB for a DuckDB, SQLite or psycopg connection (InvalidConfig otherwise)."""
    if isinstance(conn, duckdb.DuckDBPyConnection):
        return DuckDBApp(conn)
    if isinstance(conn, sqlite3.Connection):
        return SQLiteApp(conn)
    if isinstance(conn, psycopg.Connection):
        return PostgresApp(conn)
    raise InvalidConfig(
        f"expected a DuckDB, SQLite or PostgreSQL (psycopg) connection, not {type(conn).__name__}"
    )


def open_descriptor(descriptor: str) -> tuple[AppDB, str]:
    """Open the database a ``KIND:WHERE#TABLE`` descriptor names, for recovery: the new
    connection (close ``.conn`` when done) and the table. Raises InvalidConfig for a
    descriptor it cannot open (an in-memory database; an unknown kind), and the
    database's own error when the file is locked by its application or the server is
    down."""
    kind, _, rest = descriptor.partition(":")
    where, _, table = rest.rpartition("#")
    check_table(table)
    if not where or where == ":memory:":
        raise InvalidConfig(f"{descriptor}: an in-memory database cannot be reopened")
    return app_db(open_app(kind, where)), table


def open_app(kind: str, where: str) -> Any:
    """A new connection to the ``kind`` database at ``where`` (a file for "duckdb" and
    "sqlite", a connection string for "postgresql"), in autocommit mode where that is a
    choice, so that its AppDB controls the transactions. InvalidConfig for another kind;
    the database's own error if it cannot open."""
    if kind == "duckdb":
        return duckdb.connect(where)
    if kind == "sqlite":
        return sqlite3.connect(where, isolation_level=None, timeout=10.0)
    if kind == "postgresql":
        return psycopg.connect(where, autocommit=True, connect_timeout=10)
    raise InvalidConfig(f"unknown kind of database {kind!r} (use duckdb, sqlite or postgresql)")
