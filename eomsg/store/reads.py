"""Reads of the store: per-thread cursors of its database, which see only what DuckDB
committed, and how a failed read is told.

A read that must see every acknowledged write, not only what DuckDB holds, asks the
writer first (:meth:`Reads.sync`); one that must not block reads the writer's overlay
(:mod:`eomsg.store.messages`). Every function of the store's concern modules
(:mod:`~eomsg.store.recovery`, :mod:`~eomsg.store.messages`, …) reads through one
:class:`Reads`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from eomsg.errors import DataDirDamaged, InvalidQuery, StorageError, one_line
from eomsg.store import integrity, sandbox
from eomsg.store.opening import cursor
from eomsg.store.writer import Writer

T = TypeVar("T")


def read_error(data_dir: Path, e: duckdb.Error, doing: str) -> StorageError | DataDirDamaged:
    """A read of the store of ``data_dir`` that failed: DataDirDamaged when DuckDB found
    a damaged block (the node goes on with what it can read; salvage keeps the rest),
    else StorageError."""
    if integrity.is_damage(e):
        return integrity.damaged(data_dir, f"{doing} failed: {one_line(e)}")
    return StorageError(f"{doing} failed: {one_line(e)}")


class Reads:
    """The read side of one opened store: ``db`` its connection, ``writer`` its writer
    (what it holds and has not applied yet, and the hold a read short of memory
    takes)."""

    def __init__(self, db: duckdb.DuckDBPyConnection, data_dir: Path, writer: Writer) -> None:
        self._db = db
        self.data_dir = data_dir
        self.writer = writer
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._cursors_lock = threading.Lock()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor of the database, the caller's to close."""
        return cursor(self._db)

    def reader(self) -> duckdb.DuckDBPyConnection:
        """The calling thread's cursor, made on its first read and kept until
        :meth:`close`."""
        found: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if found is None:
            found = self.cursor()
            self._local.cursor = found
            with self._cursors_lock:
                self._cursors.append(found)
        return found

    def close(self) -> None:
        """Close every thread's cursor (the store is closing: no read runs any more)."""
        with self._cursors_lock:
            for each in self._cursors:
                each.close()
            self._cursors.clear()

    def sync(self) -> None:
        """Wait until DuckDB holds every acknowledged write (before a read that must see
        them all)."""
        self.writer.sync()

    def error(self, e: duckdb.Error, doing: str) -> StorageError | DataDirDamaged:
        """See :func:`read_error`."""
        return read_error(self.data_dir, e, doing)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read. A read DuckDB found no memory for — a large payload read
        while the writer commits or checkpoints another — runs once more with the
        writer held between its commits (:meth:`Writer.alone`)."""
        try:
            return self.reader().execute(sql, params).fetchall()
        except duckdb.OutOfMemoryException:
            pass
        except duckdb.Error as e:
            raise self.error(e, "reading the store") from e
        with self.writer.alone():
            try:
                return self.reader().execute(sql, params).fetchall()
            except duckdb.Error as e:
                raise self.error(e, "reading the store") from e

    def on_reader(self, read: Callable[[duckdb.DuckDBPyConnection], T], doing: str) -> T:
        """``read`` run on the calling thread's cursor, a failure told as
        :meth:`error` tells it (``doing``: what failed)."""
        try:
            return read(self.reader())
        except duckdb.Error as e:
            raise self.error(e, doing) from e

    def sandboxed(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one plain SELECT in a read-only transaction: column names, rows. Anything
        else — several statements, a write, a setting, a checkpoint, a file — is
        InvalidQuery, refused before it runs (see :mod:`eomsg.store.sandbox`)."""
        self.sync()  # every acknowledged write, not only what DuckDB holds
        own = self.cursor()
        try:
            sandbox.check(own, sql)
            own.execute("BEGIN TRANSACTION READ ONLY")
            result = own.execute(sql)
            columns = [d[0] for d in result.description or []]
            return columns, result.fetchall()
        except (duckdb.InvalidInputException, duckdb.PermissionException) as e:
            raise InvalidQuery(f"inspect sql is read-only: {one_line(e)}") from e
        except duckdb.Error as e:
            if integrity.is_damage(e):
                raise self.error(e, "the query") from e
            raise InvalidQuery(f"query failed: {one_line(e)}") from e
        finally:
            own.close()
