"""The single writer: one thread owns the read-write DuckDB connection and group-commits.

Callers hand it work and wait on a future; the thread takes everything that queued up
while the previous commit ran and puts it into the next transaction. One commit costs
about a millisecond whatever it holds, so under load the per-message cost of durability
falls with the batch size — that is the whole point of group commit.

Two kinds of work:

* :class:`RowBatch` — rows appended to the insert-only tables. Consecutive batches merge
  into one Arrow table per table and one Arrow insert each (never ``executemany``,
  which runs row by row).
* a job, ``fn(conn) -> T`` — anything else (queue changes, compaction, GC); it runs alone
  in its own transaction, in arrival order.

A future resolves only after ``COMMIT`` has returned, and DuckDB fdatasyncs its WAL on
commit: an acknowledgement built on it is durable. After each commit the thread runs the
store's ``committed`` hook (its watermark, the WAL's mode, the free disk), then the
batches' after-commit callbacks in submission order, so in-memory indexes see commits in
the order the log holds them; when the hook asked for one, the store's ``checkpoint``
runs last, between commits (DuckDB's own, inside a COMMIT, is turned off).

When a commit fails, its futures learn exactly what is known (:func:`classify`):
nothing of it was stored (:class:`~eomsg.errors.WriteFailed`: DuckDB rolled it back),
it was stored (DuckDB says "COMMIT succeeded and is durable" before failing at its
automatic checkpoint: the futures succeed), or it cannot be known
(:class:`~eomsg.errors.WriteUnknown`). Either way the writer then refuses further work
and tells ``failed``: the in-memory state may be ahead of the disk, and only reopening
the store (which rebuilds it from disk) makes them agree again.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from eomsg.errors import NodeClosed, StorageError, WriteFailed, WriteUnknown, one_line
from eomsg.failpoints import failpoint
from eomsg.store.schema import ROW_TABLES

T = TypeVar("T")


class RowBatch:
    """Rows for the insert-only tables, plus after-commit callbacks.

    Rows are kept as tuples in the table's column order and transposed once, in C, when
    the batch is written: appending a tuple is the cheapest thing Python can do per row.
    """

    __slots__ = ("callbacks", "rows", "tables")

    def __init__(self) -> None:
        self.tables: dict[str, list[tuple[Any, ...]]] = {}
        self.callbacks: list[Callable[[], None]] = []

    @property
    def empty(self) -> bool:
        return not self.tables

    def rows_of(self, name: str) -> list[tuple[Any, ...]]:
        """The row list of table ``name`` (append tuples in column order)."""
        rows = self.tables.get(name)
        if rows is None:
            rows = self.tables[name] = []
        return rows

    def add(self, name: str, *row: Any) -> None:
        self.rows_of(name).append(row)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the writer thread once these rows are committed."""
        self.callbacks.append(callback)

    def merge(self, other: RowBatch) -> None:
        for name, rows in other.tables.items():
            self.rows_of(name).extend(rows)

    def arrow(self, name: str) -> pa.Table:
        schema = ROW_TABLES[name]
        columns = zip(*self.tables[name], strict=True)
        return pa.Table.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
            schema=schema,
        )


SMALL_INSERT = 8  # rows up to which a table's insert uses parameters, not Arrow


@functools.cache
def _values_sql(name: str, count: int) -> str:
    """``INSERT INTO name VALUES (…), …`` for ``count`` rows; timestamps arrive as
    microseconds, as they do in the Arrow path."""
    row = ", ".join(
        "make_timestamp(?)" if pa.types.is_timestamp(f.type) else "?" for f in ROW_TABLES[name]
    )
    return f"INSERT INTO {name} VALUES " + ", ".join([f"({row})"] * count)


_FATAL = (duckdb.IOException, duckdb.FatalException, duckdb.InternalException)
_Job = Callable[[duckdb.DuckDBPyConnection], Any]
_STOP = object()
_DURABLE = "COMMIT succeeded and is durable"  # DuckDB's words, when its checkpoint fails
log = logging.getLogger("eomsg.store")


class Commit(enum.Enum):
    """What a failed COMMIT left behind."""

    DURABLE = "durable"  # committed; the database failed after (its checkpoint)
    ROLLED_BACK = "rolled back"  # nothing of it was stored
    UNKNOWN = "unknown"  # it cannot be known


def classify(error: BaseException) -> Commit:
    """What a COMMIT that raised ``error`` left behind. DuckDB rolls a failed commit back
    (TransactionException, "Failed to commit": its WAL is cut back to before it); it says
    when a commit was durable and only its automatic checkpoint failed; anything else —
    an I/O or fatal error mid-commit — may or may not have reached the disk."""
    if isinstance(error, duckdb.FatalException) and _DURABLE in str(error):
        return Commit.DURABLE
    if isinstance(error, duckdb.TransactionException):
        return Commit.ROLLED_BACK
    return Commit.UNKNOWN


def _why(error: BaseException) -> str:
    text = one_line(error)
    if "No space left on device" in text:
        return f"the disk holding the data directory is full ({text})"
    return text


class Writer:
    """The group-committing writer thread. See the module docstring."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        last_seq: int = 0,
        committed: Callable[[int], bool] = lambda last_seq: False,
        checkpoint: Callable[[duckdb.DuckDBPyConnection, int], None] = lambda conn, last: None,
        failed: Callable[[BaseException], None] = lambda cause: None,
    ) -> None:
        self._conn = conn
        self.last_seq = last_seq  # the highest message seq committed
        # After each commit, on this thread, with last_seq: True asks for a checkpoint.
        self._committed = committed
        self._checkpoint = checkpoint  # runs one, on this thread's connection
        self._on_failed = failed  # once, when the writer stops taking work
        self._hook_trouble = ""  # the last error of the hook, said once
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eomsg-writer", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """True once a commit failed; the writer then refuses all work."""
        return self._failed is not None

    @property
    def failure(self) -> BaseException | None:
        """Why the writer stopped taking work, if it did."""
        return self._failed

    def write(self, batch: RowBatch) -> Future[None]:
        """Queue rows for the next group commit."""
        return self._submit(batch)

    def run(self, job: Callable[[duckdb.DuckDBPyConnection], T]) -> Future[T]:
        """Queue ``job`` to run alone in its own transaction."""
        return self._submit(job)

    def close(self) -> None:
        """Finish the queued work, then stop the thread. Idempotent."""
        if not self._closed:
            self._closed = True
            self._queue.put((_STOP, None))
            self._thread.join()

    def _submit(self, work: Any) -> Future[Any]:
        if self._failed is not None:
            raise StorageError(
                f"the store failed and takes no writes until it is reopened: {_why(self._failed)}"
            )
        if self._closed:
            raise NodeClosed("the node is closed")
        future: Future[Any] = Future()
        self._queue.put((work, future))
        return future

    def _run(self) -> None:
        pending: list[tuple[Any, Future[Any]]] = []
        while True:
            if not pending:
                pending.append(self._queue.get())
            while True:  # drain what queued during the last commit
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            group: list[tuple[RowBatch, Future[Any]]] = []
            while pending and isinstance(pending[0][0], RowBatch):
                group.append(pending.pop(0))
            if group:
                self._commit_rows(group)
                continue
            work, future = pending.pop(0)
            if work is _STOP:
                for _, f in pending:
                    f.set_exception(NodeClosed("the node closed before this write ran"))
                return
            self._commit_job(work, future)

    def _commit_rows(self, group: list[tuple[RowBatch, Future[Any]]]) -> None:
        batch = group[0][0] if len(group) == 1 else RowBatch()
        if len(group) > 1:
            for b, _ in group:
                batch.merge(b)
        futures = [f for _, f in group]
        if self._failed is not None:
            return self._refuse(futures)
        conn = self._conn
        try:
            conn.execute("BEGIN TRANSACTION")
            for name, rows in batch.tables.items():
                # Positional: ROW_TABLES lists the columns in table order (a test checks
                # it). A relation, not a replacement scan: the node runs with file access
                # off, which turns replacement scans off too. A few rows go faster as
                # parameters: building Arrow arrays costs more than it saves for them.
                if len(rows) <= SMALL_INSERT:
                    conn.execute(_values_sql(name, len(rows)), [v for r in rows for v in r])
                else:
                    conn.from_arrow(batch.arrow(name)).insert_into(name)
            failpoint("store.commit.before")
        except Exception as e:
            self._rollback()
            return self._broke(futures, e, Commit.ROLLED_BACK)
        committed, durable_but = self._finish(futures)
        if not committed:
            return None
        failpoint("store.commit.after")
        messages = batch.tables.get("messages")
        if messages:
            self.last_seq = max(self.last_seq, messages[-1][0])
        self._acknowledge(durable_but, lambda: self._after_commit([b for b, _ in group], futures))
        return None

    def _commit_job(self, job: _Job, future: Future[Any]) -> None:
        if self._failed is not None:
            return self._refuse([future])
        conn = self._conn
        try:
            conn.execute("BEGIN TRANSACTION")
            result = job(conn)
            failpoint("store.job.before_commit")
        except Exception as e:
            self._rollback()
            if isinstance(e, _FATAL):  # the database itself failed: stop trusting it
                return self._broke([future], e, Commit.ROLLED_BACK)
            future.set_exception(e)  # the job's own error, rolled back cleanly
            return None
        committed, durable_but = self._finish([future])
        if committed:
            self._acknowledge(durable_but, lambda: future.set_result(result))
        return None

    def _finish(self, futures: list[Future[Any]]) -> tuple[bool, BaseException | None]:
        """COMMIT: whether it committed, and the error DuckDB raised after committing
        (its checkpoint failed: the store must be reopened). A commit that did not, or
        may not have, is rolled back and its futures told (:meth:`_broke`)."""
        try:
            self._conn.execute("COMMIT")
        except Exception as e:
            outcome = classify(e)
            if outcome is not Commit.DURABLE:
                self._rollback()
                self._broke(futures, e, outcome)
                return False, None
            return True, e
        return True, None

    def _acknowledge(self, durable_but: BaseException | None, resolve: Callable[[], None]) -> None:
        """After a commit: the store's hook (before anyone hears of the commit), the
        acknowledgements, then — the commit standing — stopping if the database failed
        after it, and the checkpoint the hook asked for."""
        due = self._note()
        resolve()
        if durable_but is not None:
            self._stop(durable_but)
        if due:
            self._checkpoint_now()

    def _note(self) -> bool:
        """The store's after-commit hook (before the commit is acknowledged: the mark it
        writes is then never behind an acknowledged write); True if it asks for a
        checkpoint. Its own trouble (a file it cannot stat or write) is said once and
        otherwise ignored: it only weakens the checks it feeds."""
        try:
            due = self._committed(self.last_seq)
        except Exception as e:
            self._trouble(e)
            return False
        self._hook_trouble = ""
        return due

    def _checkpoint_now(self) -> None:
        """The store's checkpoint, here between commits, so that the WAL stays bounded."""
        if self._failed is not None:
            return
        try:
            self._checkpoint(self._conn, self.last_seq)
        except duckdb.FatalException as e:  # DuckDB invalidated the database
            self._stop(e)
        except Exception as e:
            self._trouble(e)

    def _trouble(self, e: Exception) -> None:
        if one_line(e) != self._hook_trouble:
            self._hook_trouble = one_line(e)
            log.warning("after a commit: %s (tried again after the next)", _why(e))

    def _broke(self, futures: list[Future[Any]], cause: BaseException, outcome: Commit) -> None:
        """A commit failed: tell its futures what it left behind, and stop."""
        error: StorageError
        if outcome is Commit.ROLLED_BACK:
            error = WriteFailed(f"the write failed and nothing of it was stored: {_why(cause)}")
        else:
            error = WriteUnknown(
                f"the node cannot tell whether this write was stored ({_why(cause)}): retry "
                "publishes with the same ids (stored once) and deletes (idempotent)"
            )
        error.__cause__ = cause
        for f in futures:
            f.set_exception(error)
        self._stop(cause)

    def _stop(self, cause: BaseException) -> None:
        """Take no more work: the in-memory state may be ahead of the disk now."""
        if self._failed is not None:
            return
        self._failed = cause
        log.error("the store failed and takes no writes until it is reopened: %s", _why(cause))
        try:
            self._on_failed(cause)
        except Exception:  # a bug in a listener must not stop the writer's thread
            log.exception("a store-failure listener failed")

    def _after_commit(self, batches: list[RowBatch], futures: list[Future[Any]]) -> None:
        for b, f in zip(batches, futures, strict=True):
            try:
                for callback in b.callbacks:
                    callback()
            except Exception as e:  # a bug in a callback must not stop the writer
                f.set_exception(e)
            else:
                f.set_result(None)

    def _rollback(self) -> None:
        with contextlib.suppress(duckdb.Error):  # no transaction open: nothing to undo
            self._conn.execute("ROLLBACK")

    def _refuse(self, futures: list[Future[Any]]) -> None:
        assert self._failed is not None
        error = StorageError(
            f"the store failed and takes no writes until it is reopened: {_why(self._failed)}"
        )
        error.__cause__ = self._failed
        for f in futures:
            f.set_exception(error)
