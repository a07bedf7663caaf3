"""The single writer: group commit into the journal, DuckDB applied behind it.

Callers hand it work and wait on a future. Two threads, in the order the work came:

* the **journal thread** takes every :class:`RowBatch` that queued while it wrote the
  previous record, appends them as one record to the journal and fdatasyncs it
  (:mod:`eomsg.store.journal`) — about a tenth of a millisecond — then runs the batches'
  after-commit callbacks in submission order (so in-memory indexes see writes in the
  order the log holds them) and resolves their futures. An acknowledgement built on one
  is durable. The messages of a record stay readable from memory (:attr:`Writer.overlay`)
  until DuckDB holds them, then for a while longer (:attr:`Writer.recent`).
* the **applier thread** puts records into DuckDB, many in one transaction (one Arrow
  insert per table), which also notes the last record applied in ``node_meta``; the
  store then deletes the journal segments DuckDB holds. After each DuckDB commit it runs
  the store's ``committed`` hook (its watermark, the WAL's mode) and, when the hook asks,
  the store's ``checkpoint`` (DuckDB's own, inside a COMMIT, is turned off).

A **job**, ``fn(conn) -> T`` (queue changes, compaction, GC), runs alone in its own DuckDB
transaction after everything journaled before it is applied, and the journal thread
waits for it: nothing queued after a job is durable before it, as one thread made it.
:meth:`Writer.sync` waits until DuckDB holds everything acknowledged so far (readers that
must see every acknowledged write call it first).

When writing the journal fails, the futures learn exactly what is known: nothing of the
record stayed (:class:`~eomsg.errors.WriteFailed`: the segment was cut back to its last
whole record) or it cannot be known (:class:`~eomsg.errors.WriteUnknown`). When DuckDB
fails, what was journaled stays durable and is applied at the next open. Either way the
writer then refuses further work and tells ``failed``: the in-memory state may be ahead
of the disk, and only reopening the store (which rebuilds it from disk) makes them agree
again.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import msgpack

from eomsg.core.idhash import id_hash
from eomsg.errors import NodeClosed, StorageError, WriteFailed, WriteUnknown, one_line
from eomsg.failpoints import failpoint
from eomsg.store.journal import Journal
from eomsg.store.recent import Recent
from eomsg.store.schema import ROW_TABLES, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

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

    def settle_run(self, queue_id: int, first: int, last: int, outcome: int, at_us: int) -> None:
        """Record every seq from ``first`` to ``last`` of queue ``queue_id`` settled with
        ``outcome`` at ``at_us``: one journal row (seed 003: a delete of a run of
        deliveries as a range), a ``settled`` row each in DuckDB. For seqs all of which
        the queue holds in flight, each once."""
        self.add(SETTLED_RUNS, queue_id, first, last, outcome, at_us)

    def settled_seqs(self) -> list[int]:
        """The seqs this batch settles, in ``settled`` rows and in runs."""
        seqs = [row[1] for row in self.tables.get("settled", ())]
        for _, first, last, *_ in self.tables.get(SETTLED_RUNS, ()):
            seqs.extend(range(first, last + 1))
        return seqs

    def set_meta(self, key: str, value: str) -> None:
        """Set ``node_meta``'s ``key`` with these rows (a later setting wins)."""
        self.add(META, key, value)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the journal thread once these rows are durable (in the
        journal), before the batch's future resolves."""
        self.callbacks.append(callback)

    def merge(self, other: RowBatch) -> None:
        for name, rows in other.tables.items():
            self.rows_of(name).extend(rows)

    @property
    def size(self) -> int:
        """The rows it puts into DuckDB (a run of settled seqs: a row each)."""
        runs = self.tables.get(SETTLED_RUNS, ())
        return sum(len(rows) for rows in self.tables.values()) + sum(
            int(r[2]) - int(r[1]) for r in runs
        )

    def encode(self) -> bytes:
        """The batch's rows as one journal record's payload."""
        return msgpack.packb(self.tables, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, payload: bytes) -> RowBatch:
        """A batch from a journal record's payload (rows come back as lists)."""
        batch = cls()
        batch.tables = msgpack.unpackb(payload, raw=False, use_list=True)
        return batch


ARROW_CHUNK = 4096
SMALL_INSERT = 8  # rows up to which a table's insert uses parameters, not Arrow


def _arrow(name: str, rows: Sequence[Sequence[Any]]) -> pa.Table:
    """Rows of table ``name`` as Arrow, built a chunk at a time (other threads get the
    GIL between chunks: converting a large batch at once would stall them)."""
    import pyarrow as pa  # (not for a few rows: a command's open and its own record)

    schema = arrow_schema(name)
    chunks = []
    for i in range(0, len(rows), ARROW_CHUNK):
        columns = zip(*rows[i : i + ARROW_CHUNK], strict=True)
        chunks.append(
            pa.RecordBatch.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
                schema=schema,
            )
        )
    return pa.Table.from_batches(chunks, schema=schema)


@functools.cache
def _values_sql(name: str, count: int) -> str:
    """``INSERT INTO name VALUES (…), …`` for ``count`` rows; timestamps arrive as
    microseconds, as they do in the Arrow path."""
    row = ", ".join(
        "make_timestamp(?)" if kind.startswith("timestamp") else "?" for _, kind in ROW_TABLES[name]
    )
    return f"INSERT INTO {name} VALUES " + ", ".join([f"({row})"] * count)


_FATAL = (duckdb.IOException, duckdb.FatalException, duckdb.InternalException)
_Job = Callable[[duckdb.DuckDBPyConnection], Any]
_STOP = object()
_SYNC = object()
APPLY_ROWS = 50_000  # rows that make the applier commit to DuckDB at once
APPLY_BYTES = 8 << 20  # journal bytes that do too (what one DuckDB transaction writes)
APPLY_DELAY = 0.25  # seconds a journaled row waits at most before it is applied
# An apply DuckDB has no memory for (readers of large payloads hold it) is tried again
# this many times, this long apart, before the writer stops.
APPLY_MEMORY_TRIES = 100
APPLY_MEMORY_WAIT = 0.1
MAX_BEHIND = 32 << 20  # journal bytes not yet applied past which the journal waits
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


META = "node_meta"  # a RowBatch's pseudo-table of (key, value) upserts
SETTLED_RUNS = "settled_runs"  # its pseudo-table of runs of settled seqs (settle_run)
_INSERT_SETTLED_RUN = """INSERT INTO settled
    SELECT ?, range, ?, make_timestamp(?) FROM range(?, ?)"""
_UPSERT_META = """INSERT INTO node_meta VALUES (?, ?)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value"""


def insert_rows(conn: duckdb.DuckDBPyConnection, batch: RowBatch, lsn: int) -> None:
    """Insert ``batch``'s rows and note journal record ``lsn`` as applied, in the
    transaction open on ``conn`` (so a record is applied exactly once, whoever applies
    it: the applier, or recovery at open)."""
    for name, rows in batch.tables.items():
        if not rows:
            continue
        if name == META:  # settings the node keeps: the last value of a key wins
            conn.executemany(_UPSERT_META, list({r[0]: r for r in rows}.values()))
            continue
        if name == SETTLED_RUNS:  # a settled row each, made by DuckDB
            runs = [(q, outcome, at, first, last + 1) for q, first, last, outcome, at in rows]
            conn.executemany(_INSERT_SETTLED_RUN, runs)
            continue
        # Positional: ROW_TABLES lists the columns in table order (a test checks it). A
        # relation, not a replacement scan: the node runs with file access off, which
        # turns replacement scans off too. A few rows go faster as parameters: building
        # Arrow arrays costs more than it saves for them.
        if name == "publish_ids":  # with the hash the dedup window loads them sorted by
            rows = [(*r, id_hash(r[0])) for r in rows]
        if len(rows) <= SMALL_INSERT:
            conn.execute(_values_sql(name, len(rows)), [v for r in rows for v in r])
        else:
            conn.from_arrow(_arrow(name, rows)).insert_into(name)
    conn.execute(_UPSERT_META, ["journal_lsn", str(lsn)])


def applied_lsn(conn: duckdb.DuckDBPyConnection) -> int:
    """The last journal record DuckDB holds (0: none)."""
    # fetchall: a result left unread keeps its transaction open on the connection, and
    # that blocks every checkpoint (DuckDB: "other write transactions active").
    rows = conn.execute("SELECT value FROM node_meta WHERE key = 'journal_lsn'").fetchall()
    return int(rows[0][0]) if rows else 0


def journal_format(conn: duckdb.DuckDBPyConnection) -> int:
    """The format the store's journal is written in (1: from before segments had
    headers, when a clean close left no segment: :mod:`eomsg.store.journal`)."""
    rows = conn.execute("SELECT value FROM node_meta WHERE key = 'journal_format'").fetchall()
    return int(rows[0][0]) if rows else 1


class Writer:
    """The journal and applier threads. See the module docstring."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        journal: Journal,
        last_seq: int = 0,
        committed: Callable[[int], bool] = lambda last_seq: False,
        checkpoint: Callable[[duckdb.DuckDBPyConnection, int], None] = lambda conn, last: None,
        failed: Callable[[BaseException], None] = lambda cause: None,
        apply_delay: float = APPLY_DELAY,
    ) -> None:
        self._conn = conn
        self._journal = journal
        self._apply_delay = apply_delay  # how long a journaled row waits for company
        self.last_seq = last_seq  # the highest message seq DuckDB holds
        self.applied = journal.last_lsn  # the last journal record DuckDB holds
        # Messages journaled but not yet in DuckDB, by seq: the rows of ROW_TABLES'
        # "messages". Added before a record is acknowledged, removed once DuckDB
        # commits it, so a reader that misses here finds the message in DuckDB.
        self.overlay: dict[int, list[Any] | tuple[Any, ...]] = {}
        # Then, once DuckDB holds them, the latest of them for a while (see Recent).
        self.recent = Recent()
        # After each DuckDB commit, on the applier, with last_seq: True asks for a
        # checkpoint.
        self._committed = committed
        self._checkpoint = checkpoint  # runs one, on the applier's connection
        self._on_failed = failed  # once, when the writer stops taking work
        self._hook_trouble = ""  # the last error of the hook, said once
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._applier: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._behind = 0  # journal bytes handed to the applier and not yet applied
        self._caught_up = threading.Condition()
        self._failed: BaseException | None = None
        self._closed = False
        self._gate = threading.Lock()  # orders work handed in against close()
        self._quiet = threading.Lock()  # held by the applier as it commits or checkpoints
        self._apply_thread = threading.Thread(
            target=self._apply_run, name="eomsg-applier", daemon=True
        )
        self._thread = threading.Thread(target=self._run, name="eomsg-writer", daemon=True)
        self._apply_thread.start()
        self._thread.start()

    @property
    def failed(self) -> bool:
        """True once a write failed; the writer then refuses all work."""
        return self._failed is not None

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Hold the applier between its commits and checkpoints: for a read DuckDB had
        no memory for beside them (a large payload in each). Takes no other lock, and
        the applier takes none while it holds this one."""
        with self._quiet:
            yield

    @property
    def behind(self) -> int:
        """Journal bytes not yet in DuckDB (their messages are read from :attr:`overlay`
        meanwhile): at most about MAX_BEHIND."""
        return self._behind

    @property
    def failure(self) -> BaseException | None:
        """Why the writer stopped taking work, if it did."""
        return self._failed

    def write(self, batch: RowBatch) -> Future[None]:
        """Queue rows for the next group commit; the future resolves once they are
        durable (journaled) and their callbacks ran."""
        return self._submit(batch)

    def run(self, job: Callable[[duckdb.DuckDBPyConnection], T]) -> Future[T]:
        """Queue ``job`` to run alone in its own DuckDB transaction, after everything
        queued before it is in DuckDB."""
        return self._submit(job)

    def sync(self) -> None:
        """Return once DuckDB holds every write acknowledged before this call (at once
        when it does already)."""
        if self._journal.last_lsn <= self.applied:
            return
        future: Future[None] = Future()
        with self._gate:  # never after close() let the applier stop
            self._check()
            self._applier.put((_SYNC, future))
        future.result()

    def close(self) -> None:
        """Finish the queued work, apply everything to DuckDB, then stop both threads.
        Idempotent."""
        with self._gate:
            if self._closed:
                return
            self._closed = True
        self._queue.put((_STOP, None))
        self._thread.join()

    def _check(self) -> None:
        if self._failed is not None:
            raise StorageError(
                f"the store failed and takes no writes until it is reopened: {_why(self._failed)}"
            )
        if self._closed:
            raise NodeClosed("the node is closed")

    def _submit(self, work: Any) -> Future[Any]:
        future: Future[Any] = Future()
        # Running from the start, so never cancelled: the work is queued and will be
        # done, and a waiter that gives up (a task cancelled while it awaits the future
        # wrapped) must not take the writer's future — and its thread — with it.
        future.set_running_or_notify_cancel()
        with self._gate:  # never after close() let the journal thread stop
            self._check()
            self._queue.put((work, future))
        return future

    # -- the journal thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._journal_loop()
        except BaseException as e:  # a bug: stop taking work rather than hang every caller
            log.exception("the journal thread failed")
            self._stop(e)
            self._applier.put((_STOP, None))
            self._drain(self._queue, e)

    def _journal_loop(self) -> None:
        pending: list[tuple[Any, Future[Any]]] = []
        while True:
            if not pending:
                pending.append(self._queue.get())
            while True:  # drain what queued during the last write
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            group: list[tuple[RowBatch, Future[Any]]] = []
            while pending and isinstance(pending[0][0], RowBatch):
                group.append(pending.pop(0))
            if group:
                self._journal_rows(group)
                continue
            work, future = pending.pop(0)
            if work is _STOP:
                for _, f in pending:
                    f.set_exception(NodeClosed("the node closed before this write ran"))
                self._applier.put((_STOP, None))
                self._apply_thread.join()
                self._journal.close(self.applied)
                # A connection left open keeps DuckDB's instance of the file alive, and
                # the next open of the same path in this process would get it back.
                with contextlib.suppress(duckdb.Error):
                    self._conn.close()
                return
            if self._failed is not None:
                self._refuse([future])
                continue
            self._applier.put((work, future))
            wait([future])  # nothing after a job is durable before it

    def _journal_rows(self, group: list[tuple[RowBatch, Future[Any]]]) -> None:
        batch = group[0][0] if len(group) == 1 else RowBatch()
        if len(group) > 1:
            for b, _ in group:
                batch.merge(b)
        futures = [f for _, f in group]
        if self._failed is not None:
            return self._refuse(futures)
        try:
            payload = batch.encode()
        except Exception as e:  # a value the journal cannot hold: nothing was written
            return self._broke(futures, e, Commit.ROLLED_BACK)
        size = len(payload)
        # DuckDB too far behind: wait, so that memory and the journal stay bounded.
        with self._caught_up:
            while self._behind > MAX_BEHIND and self._failed is None:
                self._caught_up.wait()
            self._behind += size
        try:
            failpoint("store.commit.before")
            lsn = self._journal.append(payload)
        except Exception as e:
            outcome = Commit.ROLLED_BACK if self._journal.cut() else Commit.UNKNOWN
            with self._caught_up:
                self._behind -= size
            return self._broke(futures, e, outcome)
        failpoint("store.commit.after")
        overlay = self.overlay
        for row in batch.tables.get("messages", ()):
            overlay[row[0]] = row
        self._applier.put((batch, lsn, size))
        for b, f in group:
            try:
                for callback in b.callbacks:
                    callback()
            except Exception as e:  # a bug in a callback must not stop the writer
                f.set_exception(e)
            else:
                f.set_result(None)
        self._journal.forget(self.applied)
        return None

    # -- the applier thread ---------------------------------------------------------------

    def _apply_run(self) -> None:
        try:
            self._apply_loop()
        except BaseException as e:  # a bug: what is journaled stays for the next open
            log.exception("the applier thread failed")
            self._stop(e)
            with self._caught_up:
                self._behind = 0
                self._caught_up.notify_all()
            self._drain(self._applier, e)

    def _drain(self, work: queue.SimpleQueue[Any], cause: BaseException) -> None:
        """After a thread failed: fail every future still queued for it."""
        while True:
            try:
                item = work.get(timeout=0.5)
            except queue.Empty:
                if self._closed:
                    return
                continue
            future = item[1] if len(item) == 2 else None
            if item[0] is _STOP:
                return
            if isinstance(future, Future) and not future.done():
                error = StorageError(f"the store failed: {_why(cause)}")
                error.__cause__ = cause
                future.set_exception(error)

    def _apply_loop(self) -> None:
        rows: list[tuple[RowBatch, int]] = []
        count = size = 0
        deadline = 0.0
        while True:
            if rows:
                try:
                    item = self._applier.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    item = None
            else:
                item = self._applier.get()
                deadline = time.monotonic() + self._apply_delay
            if item is not None and isinstance(item[0], RowBatch):
                batch, lsn, nbytes = item
                rows.append((batch, lsn))
                count += batch.size
                size += nbytes
                if count < APPLY_ROWS and size < APPLY_BYTES and time.monotonic() < deadline:
                    continue
            if rows:
                self._apply(rows, size)
                rows, count, size = [], 0, 0
            if item is None or isinstance(item[0], RowBatch):
                continue
            work, future = item
            if work is _STOP:
                return
            if work is _SYNC:
                if self._failed is not None and self.applied < self._journal.last_lsn:
                    self._refuse([future])
                else:
                    future.set_result(None)
            elif self._failed is not None:
                self._refuse([future])
            else:
                self._commit_job(work, future)

    def _apply(self, records: list[tuple[RowBatch, int]], size: int) -> None:
        """Put journal records (``size`` bytes of it) into DuckDB in one transaction."""
        batch = RowBatch()
        for b, _ in records:
            batch.merge(b)
        lsn = records[-1][1]
        if self._failed is None:
            conn = self._conn
            committed = False
            for attempt in range(APPLY_MEMORY_TRIES):
                committing = False
                try:
                    with self._quiet:
                        conn.execute("BEGIN TRANSACTION")
                        insert_rows(conn, batch, lsn)
                        failpoint("journal.apply.before_commit")
                        committing = True
                        conn.execute("COMMIT")
                    committed = True
                except duckdb.OutOfMemoryException as e:
                    self._rollback()
                    if committing or attempt + 1 == APPLY_MEMORY_TRIES:
                        self._stop(e)  # what is journaled stays: the next open applies it
                    else:
                        # Readers of large payloads hold DuckDB's memory: the records
                        # are journaled and their messages in the overlay, so they wait.
                        time.sleep(APPLY_MEMORY_WAIT)
                        continue
                except Exception as e:
                    self._rollback()
                    self._stop(e)  # what is journaled stays: the next open applies it
                break
            if committed:
                failpoint("journal.apply.after_commit")
                messages = batch.tables.get("messages")
                if messages:
                    self.last_seq = max(self.last_seq, messages[-1][0])
                    self.recent.add(messages)  # first: a reader finds each in one or the other
                    overlay = self.overlay
                    for row in messages:
                        overlay.pop(row[0], None)
                if self._note():
                    self._checkpoint_now()
                self.applied = lsn  # last: sync() then also finds the hook run
        with self._caught_up:
            self._behind -= size
            self._caught_up.notify_all()

    def _commit_job(self, job: _Job, future: Future[Any]) -> None:
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
        durable_but: BaseException | None = None
        try:
            conn.execute("COMMIT")
        except Exception as e:
            if classify(e) is not Commit.DURABLE:
                self._rollback()
                return self._broke([future], e, classify(e))
            durable_but = e  # committed, but the database failed after: reopen it
        due = self._note()
        future.set_result(result)
        if durable_but is not None:
            self._stop(durable_but)
        elif due:
            self._checkpoint_now()
        return None

    def _note(self) -> bool:
        """The store's after-commit hook (before a job's commit is acknowledged: the
        mark it writes is then never behind an acknowledged write); True if it asks for
        a checkpoint. Its own trouble (a file it cannot stat or write) is said once and
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
            with self._quiet:
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
        """A write failed: tell its futures what it left behind, and stop."""
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
        with self._caught_up:
            self._caught_up.notify_all()
        log.error("the store failed and takes no writes until it is reopened: %s", _why(cause))
        try:
            self._on_failed(cause)
        except Exception:  # a bug in a listener must not stop the writer's thread
            log.exception("a store-failure listener failed")

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
