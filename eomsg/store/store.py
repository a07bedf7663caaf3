"""The store: a data directory holding one DuckDB database, and every SQL statement eomsg
runs against it.

Opening takes the directory's lock, opens the database read-write, migrates it and starts
the :class:`~eomsg.store.writer.Writer`. Writes go through the writer (group commit);
reads run on per-thread cursors of the same database and see only committed data.

Times cross this boundary as integer microseconds since the epoch (UTC); the table
columns are ``TIMESTAMP`` so that ``inspect sql`` shows readable times.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, overload

import duckdb
import numpy as np
import pyarrow as pa

from eomsg.core.dedup import RetainedIds
from eomsg.core.message import Message, Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.core.replay import JobRecord, JobStatus, Selection
from eomsg.errors import (
    DataDirDamaged,
    DataDirError,
    DiskFull,
    InvalidQuery,
    StorageError,
    one_line,
)
from eomsg.store import compact, integrity, journal, journaled, logread, salvage, sandbox
from eomsg.store.files import DB_NAME, owner_only
from eomsg.store.journal import Journal
from eomsg.store.lock import DataDirLock
from eomsg.store.schema import migrate
from eomsg.store.spill import SpilledIds
from eomsg.store.watermark import Mark, Watermark
from eomsg.store.writer import APPLY_DELAY, Writer, applied_lsn, journal_format

US = 1_000_000
WAL_LIMIT = 16 << 20  # the WAL's default bound: past it the writer checkpoints
log = logging.getLogger("eomsg.store")

DUCKDB_CONFIG: dict[str, Any] = {
    # Every commit goes through the WAL, so a COMMIT that returned is durable. By
    # default DuckDB writes a commit of 100 kB or more straight into a checkpoint,
    # which is lost whole if that checkpoint fails.
    "auto_checkpoint_skip_wal_threshold": 1 << 62,
    # No checkpoint inside a COMMIT: the writer checkpoints, between commits, when the
    # WAL passes its bound (Store.wal_limit), after marking the WAL empty (watermark).
    "wal_autocheckpoint": "1000TiB",
}
CATALOG = Path(DB_NAME).stem  # the database's name in SQL, as DuckDB names an opened file
# Rows a checkpoint writes into one row group. DuckDB's default, 122,880, made the
# checkpoint that fills a row group of the log take 0.4-0.9 s and 100-125 MiB of the
# node's memory outside DuckDB's own accounting (a spike above its RSS at every such
# checkpoint); at 16,384 the worst measured was 0.28 s and 28 MiB. An option of ATTACH
# only, not kept in the file: every open gives it again.
ROW_GROUP_ROWS = 16_384


def _connect(path: Path) -> duckdb.DuckDBPyConnection:
    """The node's connection to the database file ``path``: attached as :data:`CATALOG`
    with :data:`ROW_GROUP_ROWS` (the default database of every cursor, which must say
    so, :meth:`Store._cursor`), DuckDB's spill files beside it, and file access turned
    off once it is open — the node reads and writes only its own file, and `inspect sql`
    can reach no other."""
    db = duckdb.connect(":memory:", config={**DUCKDB_CONFIG, "temp_directory": f"{path}.tmp"})
    try:
        db.execute(f"ATTACH ? AS {CATALOG} (ROW_GROUP_SIZE {ROW_GROUP_ROWS})", [str(path)])
        db.execute(f"USE {CATALOG}")
        db.execute("SET enable_external_access = false")
    except BaseException:
        db.close()
        raise
    return db


class PendingRow(NamedTuple):
    """One unsettled (queue, message) pair found on recovery; times in microseconds (a
    tuple: a recovery reads millions)."""

    queue_id: int
    seq: int
    expires_us: int | None
    attempt: int | None  # None: never delivered
    due_us: int | None
    released: bool | None


@dataclass(frozen=True, slots=True)
class PreparedRow:
    """A transaction found prepared on recovery (seed 000), with its work."""

    txid: str
    coordinator: str
    principal: str | None  # who prepared it (None: before principals existed)
    prepared_us: int
    messages: list[Outgoing]
    deletes: list[tuple[int, int]]  # (queue_id, seq)


@dataclass(frozen=True, slots=True)
class SettledCounts:
    deleted: int = 0
    expired: int = 0
    dead_lettered: int = 0
    purged: int = 0


_MESSAGE_COLUMNS = "seq, topic, id, epoch_us(published_at), epoch_us(expires_at), headers, payload"
# A ``messages`` row as the writer's overlay and :meth:`Store.fetch_rows` give it: seq,
# topic, id, published and expires (µs), headers (JSON text or None), payload.
MessageRow = tuple[int, str, str | None, int, int | None, str | None, bytes]


def _message(row: Sequence[Any]) -> Message:
    seq, topic, msg_id, published_us, expires_us, headers, payload = row
    return Message(
        seq=seq,
        topic=topic,
        payload=bytes(payload),
        id=msg_id,
        published_at=published_us / US,
        expires_at=None if expires_us is None else expires_us / US,
        headers=json.loads(headers) if headers else {},
    )


MiB = 1 << 20
_SAVED_SETTINGS = """SELECT substr(key, 9), value FROM node_meta WHERE key LIKE 'setting.%'"""


def room_to_open(data_dir: Path) -> tuple[int, int]:
    """Free bytes on the data directory's disk, and what opening its store needs: DuckDB
    replays its WAL and checkpoints it, which takes about the WAL's size again, the
    journal's records go into the WAL (their bytes, not the segments' allocated size,
    which is on the disk already), plus a margin (a new journal segment among it). An
    estimate: an open that fails all the same is tried again."""
    st = os.statvfs(data_dir)
    wal = data_dir / f"{DB_NAME}.wal"
    size = wal.stat().st_size if wal.exists() else 0
    return st.f_bavail * st.f_frsize, size + journal.written_bytes(data_dir) + (16 << 20)


def _no_space(error: BaseException) -> bool:
    """Whether opening failed because the disk is full (DuckDB says so in words)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__  # type: ignore[assignment]
    return False


def _has_meta(db: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store's database has its tables yet (not a store made just now).
    (Asked of the store's database alone: of every database, ≈ 5 ms more an open.)"""
    [(n,)] = db.execute(
        "SELECT count(*) FROM duckdb_tables() "
        "WHERE database_name = current_database() AND table_name = 'node_meta'"
    ).fetchall()
    return bool(n)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class Store:
    """A data directory opened read-write by this process (see the module docstring).

    Opening checks the directory first (:mod:`eomsg.store.integrity`): DataDirDamaged if
    acknowledged writes were lost, a warning (in :attr:`warnings`, and logged) for a
    write a crash cut off. Each of :attr:`failure_listeners` hears, once and on the
    writer's journal or applier thread, that the writer stopped taking work (the store
    must be reopened)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        create: bool = True,
        wal_limit: int = WAL_LIMIT,
        journal_segment: int = journal.SEGMENT_BYTES,
        apply_delay: float = APPLY_DELAY,
        memory_limit: Callable[[Mapping[str, str]], int] | None = None,
    ) -> None:
        self.data_dir = data_dir
        # DuckDB's memory limit from the settings the directory saved (None: DuckDB's
        # default); set as it opens, before anything large is read.
        self._memory_limit = memory_limit
        self.memory_limit: int | None = None
        self.wal_limit = wal_limit
        self.journal_segment = journal_segment
        self.path = data_dir / DB_NAME
        self.wal_path = data_dir / f"{DB_NAME}.wal"
        self._lock = DataDirLock(data_dir, create=create)
        if not create and not self.path.exists():
            self._lock.release()
            raise DataDirError(f"no eomsg data in {data_dir} yet (check --data)")
        self._mark = Watermark(data_dir)
        try:
            self._db = self._open()
        except BaseException as e:
            self._mark.close()
            self._lock.release()
            if _no_space(e):
                free, need = room_to_open(data_dir)
                raise DiskFull(
                    f"the disk holding {data_dir} is full: {free / MiB:.1f} MiB free, about "
                    f"{need / MiB:.1f} MiB needed to open the store (its WAL's checkpoint and "
                    "its journal's records): free some space and run it again"
                ) from e
            raise
        for warning in self.warnings:
            log.warning("%s", warning)
        self._local = threading.local()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._cursors_lock = threading.Lock()
        try:
            self._private()
            last = self.last_seq()
            self._mark.write(Mark(_size(self.wal_path), last))
            self.spill = SpilledIds(data_dir)  # the dedup window's oldest ids
        except BaseException:  # (a full disk): let go of everything, as a failed _open
            self._journal.close_file()
            self._db.close()
            self._mark.close()
            self._lock.release()
            raise
        self.failure_listeners: list[Callable[[BaseException], None]] = []
        self.writer = Writer(
            self._cursor(),
            self._journal,
            last,
            self._committed,
            self._checkpoint,
            self._writer_failed,
            apply_delay,
        )

    def _open(self) -> duckdb.DuckDBPyConnection:
        if (self.data_dir / salvage.JOURNAL).exists():
            raise integrity.damaged(self.data_dir, "a salvage of it was interrupted")
        for stale in compact.leftovers(self.data_dir):  # of a compaction that was killed
            stale.unlink()
        mark = self._mark.read()
        self.warnings = integrity.before_open(self.data_dir, self.wal_path, mark)
        try:
            db = _connect(self.path)
        except duckdb.Error as e:
            if integrity.is_damage(e):
                raise integrity.damaged(self.data_dir, one_line(e)) from e
            raise DataDirError(f"cannot open {self.path}: {one_line(e)}") from e
        try:
            # A failed open changes nothing: DuckDB does not fold the WAL into the file
            # as the connection closes (close() checkpoints when all went well).
            db.execute("PRAGMA disable_checkpoint_on_shutdown")
            # Everything that may refuse the open is checked before the first write.
            found = self._check_journal(db) if _has_meta(db) else None
            if found is not None:
                integrity.after_open(self.data_dir, mark, logread.stored_seq(db))
            migrate(db)
            if self._memory_limit is not None:  # past it DuckDB spills beside its file
                saved = dict(db.execute(_SAVED_SETTINGS).fetchall())
                self.memory_limit = self._memory_limit(saved)
                db.execute(f"SET memory_limit = '{int(self.memory_limit)}B'")
            # From here on no connection of this database can change a setting: what
            # `inspect sql` runs cannot turn fsync or checkpoints off, whatever it is.
            db.execute("SET lock_configuration = true")
            self._journal = self._replay_journal(db, found)
        except duckdb.Error as e:
            db.close()
            if integrity.is_damage(e):
                raise integrity.damaged(self.data_dir, one_line(e)) from e
            raise DataDirError(f"cannot open {self.path}: {one_line(e)}") from e
        except BaseException:
            db.close()
            raise
        return db

    def _check_journal(self, db: duckdb.DuckDBPyConnection) -> journal.Scan:
        """What the journal holds past what DuckDB does. DataDirDamaged if any of it is
        lost to damage — a record damaged, a segment cut short or gone — naming the file,
        the last good record and what may be lost: serving what follows would skip
        acknowledged writes. A tail a crash cut off is only warned of (it was never
        acknowledged)."""
        applied = applied_lsn(db)
        legacy = journal_format(db) < journal.FORMAT
        found = journal.check(self.data_dir / journal.DIR_NAME, applied, legacy)
        if found.damage:
            raise integrity.damaged(self.data_dir, journaled.damage(db, found))
        if found.torn:
            self.warnings.append(
                f"the journal ended with a write that a crash cut off ({found.torn}): "
                "dropped (its writer never acknowledged it)"
            )
        return found

    def _replay_journal(self, db: duckdb.DuckDBPyConnection, found: journal.Scan | None) -> Journal:
        """Apply the journal's records DuckDB does not hold yet (``found``: a node
        stopped without closing), then open it for appending."""
        directory = self.data_dir / journal.DIR_NAME
        if found is None:  # a store made just now
            found = journal.check(directory, applied_lsn(db), legacy=True)
        applied, legacy = found.after, journal_format(db) < journal.FORMAT

        def bounded() -> None:
            if _size(self.wal_path) > self.wal_limit:  # as the writer would
                self._checkpoint(db, logread.stored_seq(db))

        last = max(applied, journaled.apply(db, found.records, bounded))
        opened = Journal.start(directory, last, self.journal_segment, found)
        if legacy:  # from now on the journal always keeps a segment
            journaled.set_format(db)
        return opened

    def close(self) -> None:
        """Finish queued writes, checkpoint, close the database and drop the lock."""
        self.writer.close()
        with self._cursors_lock:
            for cursor in self._cursors:
                cursor.close()
            self._cursors.clear()
        # DuckDB checkpoints as it closes, whether we do or not: mark the WAL empty first.
        self._mark.write(Mark(0, self.writer.last_seq), sync=True)
        if not self.writer.failed:
            with contextlib.suppress(duckdb.Error):  # the WAL replays at the next open
                self._db.execute(f"CHECKPOINT {CATALOG}")
        self._db.close()
        self.spill.close()
        self._mark.close()
        self._private()
        self._lock.release()

    def abandon(self) -> None:
        """Close after an open that failed past the store's (the node's recovery could
        not read it): no checkpoint and no mark written, so the next open finds the
        files as this one did — but for the journal records it applied, which DuckDB
        then holds as it would have."""
        self.writer.close()
        with self._cursors_lock:
            for cursor in self._cursors:
                cursor.close()
            self._cursors.clear()
        self._db.close()
        self.spill.close()
        self._mark.close()
        self._lock.release()

    def _error(self, e: duckdb.Error, doing: str) -> StorageError | DataDirDamaged:
        """A read that failed: DataDirDamaged when DuckDB found a damaged block (the
        node goes on with what it can read; salvage keeps the rest), else StorageError."""
        if integrity.is_damage(e):
            return integrity.damaged(self.data_dir, f"{doing} failed: {one_line(e)}")
        return StorageError(f"{doing} failed: {one_line(e)}")

    def _checkpoint(self, conn: duckdb.DuckDBPyConnection, last_seq: int) -> None:
        """Merge the WAL into the store file. The mark says "empty WAL" first, synced:
        a checkpoint shrinks the WAL, and a mark left above it would be taken for lost
        writes at the next open."""
        self._mark.write(Mark(0, last_seq), sync=True)
        conn.execute(f"CHECKPOINT {CATALOG}")

    def _writer_failed(self, cause: BaseException) -> None:
        for listener in self.failure_listeners:
            listener(cause)

    def duckdb_memory(self) -> int:
        """The bytes DuckDB's buffer manager holds now."""
        rows = self._query("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")
        return int(rows[0][0])

    def disk_free(self) -> int:
        """Bytes an unprivileged writer may still use now on the data directory's disk
        (one statvfs, about a microsecond: a fresh reading at each call; a caller says
        how long one stands)."""
        st = os.statvfs(self.data_dir)
        return st.f_bavail * st.f_frsize

    def journal_bytes(self) -> int:
        """The bytes the journal's segment files take on disk now (0 if none)."""
        total = 0
        with (
            contextlib.suppress(FileNotFoundError),
            os.scandir(self.data_dir / journal.DIR_NAME) as entries,
        ):
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):  # retired meanwhile
                    total += entry.stat().st_size
        return total

    def _private(self) -> None:
        """Narrow every file of the data directory to its owner (DuckDB makes its files
        with the process's umask, and its WAL anew after each checkpoint)."""
        for entry in self.data_dir.iterdir():
            owner_only(entry)

    def _committed(self, last_seq: int) -> bool:
        """After each commit, on the writer thread (a stat and a small pwrite): mark how
        long the WAL is and the last seq stored; narrow a WAL that DuckDB made anew
        (after a checkpoint) to its owner. True asks for a checkpoint: the WAL outgrew
        :attr:`wal_limit`."""
        try:
            st = os.stat(self.wal_path)
        except FileNotFoundError:
            size = 0
        else:
            size = st.st_size
            if st.st_mode & 0o077:  # made anew by DuckDB with the process's umask
                owner_only(self.wal_path)
        self._mark.write(Mark(size, last_seq))
        return size > self.wal_limit

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor of the database, reading and writing the store's file (a cursor
        starts in DuckDB's own in-memory database: :func:`_connect`)."""
        cursor = self._db.cursor()
        cursor.execute(f"USE {CATALOG}")
        return cursor

    def _reader(self) -> duckdb.DuckDBPyConnection:
        cursor: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if cursor is None:
            cursor = self._cursor()
            self._local.cursor = cursor
            with self._cursors_lock:
                self._cursors.append(cursor)
        return cursor

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read. A read DuckDB found no memory for — a large payload read
        while the writer commits or checkpoints another — runs once more with the
        writer held between its commits (:meth:`Writer.alone`)."""
        try:
            return self._reader().execute(sql, params).fetchall()
        except duckdb.OutOfMemoryException:
            pass
        except duckdb.Error as e:
            raise self._error(e, "reading the store") from e
        with self.writer.alone():
            try:
                return self._reader().execute(sql, params).fetchall()
            except duckdb.Error as e:
                raise self._error(e, "reading the store") from e

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one plain SELECT in a read-only transaction: column names, rows. Anything
        else — several statements, a write, a setting, a checkpoint, a file — is
        InvalidQuery, refused before it runs (see :mod:`eomsg.store.sandbox`)."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        cursor = self._cursor()
        try:
            sandbox.check(cursor, sql)
            cursor.execute("BEGIN TRANSACTION READ ONLY")
            result = cursor.execute(sql)
            columns = [d[0] for d in result.description or []]
            return columns, result.fetchall()
        except (duckdb.InvalidInputException, duckdb.PermissionException) as e:
            raise InvalidQuery(f"inspect sql is read-only: {one_line(e)}") from e
        except duckdb.Error as e:
            if integrity.is_damage(e):
                raise self._error(e, "the query") from e
            raise InvalidQuery(f"query failed: {one_line(e)}") from e
        finally:
            cursor.close()

    # -- recovery -----------------------------------------------------------------------

    def load_queues(self) -> list[tuple[int, QueueConfig]]:
        rows = self._query("SELECT queue_id, config FROM queues ORDER BY queue_id")
        return [(qid, QueueConfig.from_json(json.loads(config))) for qid, config in rows]

    def meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM node_meta WHERE key = ?", [key])
        return rows[0][0] if rows else None

    def meta_prefixed(self, prefix: str) -> dict[str, str]:
        """Every ``node_meta`` entry whose key starts with ``prefix``."""
        rows = self._query(
            "SELECT key, value FROM node_meta WHERE starts_with(key, ?) ORDER BY key", [prefix]
        )
        return dict(rows)

    def last_seq(self) -> int:
        """The highest sequence number ever assigned durably (log GC included)."""
        try:
            return logread.stored_seq(self._reader())
        except duckdb.Error as e:
            raise self._error(e, "reading the store") from e

    def load_pending(self) -> Iterator[PendingRow]:
        """Every unsettled (queue, message) pair with its latest delivery attempt, ordered
        by queue then seq. Reads only the hot tables and the log range they point into.

        An attempt counts while it was handed out more often than it was given back
        unseen (the number is reused by the next delivery, so the two are counted): the
        attempt restored is the highest that counts (0: none did). When that is below
        the highest ever made, the message is ready again since its last return, as the
        cursor keeps it in memory."""
        sql = """
            WITH hot AS (
                SELECT d.queue_id, d.seq FROM destinations d
                ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
            ), latest AS (
                SELECT queue_id, seq, max(attempt) AS top,
                       arg_max(epoch_us(due), attempt * 2 + released::INTEGER) AS due,
                       arg_max(released, attempt * 2 + released::INTEGER) AS released
                FROM deliveries GROUP BY queue_id, seq
            ), handed AS (
                SELECT queue_id, seq, attempt, count(*) FILTER (NOT released) AS n
                FROM deliveries GROUP BY queue_id, seq, attempt
            ), back AS (
                SELECT queue_id, seq, attempt, count(*) AS n,
                       max(epoch_us(returned_at)) AS at
                FROM returned GROUP BY queue_id, seq, attempt
            ), counted AS (
                SELECT h.queue_id, h.seq,
                       coalesce(max(h.attempt) FILTER (WHERE h.n > coalesce(b.n, 0)), 0)
                           AS attempt,
                       max(b.at) AS at
                FROM handed h LEFT JOIN back b USING (queue_id, seq, attempt)
                GROUP BY h.queue_id, h.seq
            )
            SELECT h.queue_id, h.seq, epoch_us(m.expires_at), c.attempt,
                   CASE WHEN c.attempt < l.top THEN c.at ELSE l.due END,
                   c.attempt < l.top OR l.released
            FROM hot h
            JOIN messages m ON m.seq = h.seq
            LEFT JOIN latest l ON l.queue_id = h.queue_id AND l.seq = h.seq
            LEFT JOIN counted c ON c.queue_id = h.queue_id AND c.seq = h.seq
            WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)
            ORDER BY h.queue_id, h.seq
        """
        try:
            result = self._reader().execute(sql)
            while chunk := result.fetchmany(65536):
                yield from map(PendingRow._make, chunk)
        except duckdb.Error as e:
            raise self._error(e, "recovering pending messages") from e

    def publish_id_runs(self, now_us: int, from_seq: int, rows: int) -> Iterator[RetainedIds]:
        """The live publish ids numbered from ``from_seq`` on, in runs of about ``rows``
        ids in seq order, each sorted by hash for the dedup window (DuckDB keeps each
        id's hash: none is computed here)."""
        cursor = self._cursor()  # its own: a scan left unfinished blocks checkpoints
        try:
            relation = cursor.sql(
                """SELECT h, seq, id,
                          coalesce(epoch_us(expires_at) / 1e6, 'NaN'::DOUBLE) AS expires
                   FROM publish_ids
                   WHERE seq >= ? AND (expires_at IS NULL OR epoch_us(expires_at) > ?)
                   ORDER BY seq""",
                params=[from_seq, now_us],
            )
            for chunk in relation.to_arrow_reader(rows):
                if not chunk.num_rows:
                    continue
                hashes = chunk.column("h").to_numpy(zero_copy_only=False).astype(np.uint32)
                order = np.argsort(hashes, kind="stable")
                yield RetainedIds(
                    hashes[order],
                    chunk.column("seq").to_numpy(zero_copy_only=False)[order],
                    chunk.column("expires").to_numpy(zero_copy_only=False)[order],
                    pa.chunked_array([chunk.column("id").take(pa.array(order))]),
                )
        except duckdb.Error as e:
            raise self._error(e, "reading the store") from e
        finally:
            cursor.close()

    def finished_txns(self) -> dict[str, str]:
        """The final state of every finished transaction still recorded, by txid."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        return dict(self._query("SELECT txid, state FROM txn_log WHERE state <> 'prepared'"))

    def load_prepared(self, finished: set[str]) -> list[PreparedRow]:
        """Prepared transactions not among ``finished``, with what they publish and
        delete, in preparation order."""
        heads = self._query(
            """SELECT txid, coordinator, principal, epoch_us(logged_at) FROM txn_log
               WHERE state = 'prepared' ORDER BY logged_at, txid"""
        )
        open_ = [h for h in heads if h[0] not in finished]
        if not open_:
            return []
        ids = [h[0] for h in open_]
        messages: dict[str, list[Outgoing]] = {}
        for txid, topic, msg_id, ttl, headers, payload in self._query(
            """SELECT txid, topic, id, ttl, headers, payload FROM txn_messages
               WHERE txid IN (SELECT unnest(?::VARCHAR[])) ORDER BY txid, idx""",
            [ids],
        ):
            messages.setdefault(txid, []).append(
                Outgoing(topic, bytes(payload), msg_id, ttl, json.loads(headers) if headers else {})
            )
        deletes: dict[str, list[tuple[int, int]]] = {}
        for txid, queue_id, seq in self._query(
            """SELECT txid, queue_id, seq FROM txn_deletes
               WHERE txid IN (SELECT unnest(?::VARCHAR[])) ORDER BY txid, queue_id, seq""",
            [ids],
        ):
            deletes.setdefault(txid, []).append((queue_id, seq))
        return [
            PreparedRow(
                txid, coordinator, principal, at_us, messages.get(txid, []), deletes.get(txid, [])
            )
            for txid, coordinator, principal, at_us in open_
        ]

    def load_counts(self) -> dict[int, SettledCounts]:
        """Settled totals per queue: compacted totals plus records not yet compacted."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        rows = self._query(
            """SELECT queue_id, sum(deleted), sum(expired), sum(dead_lettered), sum(purged)
               FROM (
                   SELECT queue_id, deleted, expired, dead_lettered, purged FROM queue_stats
                   UNION ALL
                   SELECT queue_id, (outcome = 0)::INT, (outcome = 1)::INT,
                          (outcome = 2)::INT, (outcome = 3)::INT FROM settled
               ) GROUP BY queue_id"""
        )
        return {qid: SettledCounts(*(int(v) for v in vals)) for qid, *vals in rows}

    # -- reading messages ----------------------------------------------------------------

    def fetch(self, seqs: Sequence[int]) -> dict[int, Message]:
        """The messages with these sequence numbers (ascending), by seq (see
        :meth:`fetch_rows`)."""
        return {row[0]: _message(row) for row in self.fetch_rows(seqs) if row is not None}

    @overload
    def fetch_rows(self, seqs: Sequence[int]) -> list[MessageRow | None]: ...
    @overload
    def fetch_rows(
        self, seqs: Sequence[int], *, memory_only: bool
    ) -> list[MessageRow | None] | None: ...

    def fetch_rows(
        self, seqs: Sequence[int], *, memory_only: bool = False
    ) -> list[MessageRow | None] | None:
        """The ``messages`` rows of these sequence numbers (ascending), in their order,
        None for one not in the log: those DuckDB does not hold yet from the writer's
        overlay, the rest from DuckDB (a message leaves the overlay only after DuckDB
        committed it, so looking there first never misses one). For a caller that needs
        a few columns of many messages (a link's sender) and would waste a
        :class:`Message` on each. ``memory_only``: None rather than read DuckDB (for a
        caller that must not block)."""
        rows: list[Any] = list(map(self.writer.overlay.get, seqs))
        if None not in rows:  # the usual case: a busy link sends what was just written
            return rows
        if memory_only:
            return None
        rest = [seq for seq, row in zip(seqs, rows, strict=True) if row is None]
        low, high = rest[0], rest[-1]
        if high - low < 4 * len(rest):  # dense, the usual case: a plain range scan
            read = self._query(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE seq BETWEEN ? AND ?",
                [low, high],
            )
        else:
            read = self._query(
                f"""SELECT {_MESSAGE_COLUMNS} FROM messages
                    WHERE seq BETWEEN ? AND ? AND seq IN (SELECT unnest(?::BIGINT[]))""",
                [low, high, rest],
            )
        found = {row[0]: row for row in read}
        return [found.get(seq) if row is None else row for seq, row in zip(seqs, rows, strict=True)]

    def log(
        self,
        topic_regex: str | None,
        from_seq: int,
        limit: int,
        *,
        newest: bool = False,
        to_seq: int | None = None,
        until_us: int | None = None,
    ) -> list[Message]:
        """Retained messages from ``from_seq`` on (to ``to_seq``; published before
        ``until_us``, microseconds since the epoch), optionally filtered by a topic
        regex, oldest first: the first ``limit``, or with ``newest`` the last."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        where = "seq >= ?"
        params: list[Any] = [from_seq]
        if to_seq is not None:
            where += " AND seq <= ?"
            params.append(to_seq)
        if until_us is not None:
            where += " AND published_at < make_timestamp(?)"
            params.append(until_us)
        if topic_regex is not None:
            where += " AND regexp_full_match(topic, ?)"
            params.append(topic_regex)
        rows = self._query(
            f"""SELECT {_MESSAGE_COLUMNS} FROM messages WHERE {where}
                ORDER BY seq {"DESC" if newest else ""} LIMIT ?""",
            [*params, limit],
        )
        return [_message(r) for r in (reversed(rows) if newest else rows)]

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None:
        """The first and last seq ``sel`` selects (see :mod:`eomsg.store.logread`)."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        try:
            return logread.bounds(self._reader(), sel)
        except duckdb.Error as e:
            raise self._error(e, "reading the log") from e

    def log_horizon(self) -> tuple[int, int | None]:
        """See :func:`eomsg.store.logread.horizon`."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        try:
            return logread.horizon(self._reader())
        except duckdb.Error as e:
            raise self._error(e, "reading the log") from e

    def log_chunk(self, sel: Selection, lo: int, hi: int, max_bytes: int) -> tuple[Any, int]:
        """Up to about ``max_bytes`` of ``sel`` in ``[lo, hi)`` as an Arrow table, and
        the seq to go on from."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        try:
            return logread.read_chunk(self._reader(), sel, lo, hi, max_bytes)
        except duckdb.Error as e:
            raise self._error(e, "reading the log") from e

    # -- replay jobs ---------------------------------------------------------------------

    def replay_jobs(self, job_id: str | None = None) -> list[JobRecord]:
        """The latest record of every replay job (or of ``job_id``), newest first: each
        field the latest row's, none taken from an older row (a failed run's rows and
        digest are none, not a done run's before it)."""
        where, params = ("WHERE job_id = ?", [job_id]) if job_id is not None else ("", [])
        rows = self._query(
            f"""SELECT job_id, arg_max(status, recorded_at), arg_max(spec, recorded_at),
                       arg_max(lo, recorded_at), arg_max(hi, recorded_at),
                       arg_max_null(rows, recorded_at), arg_max_null(digest, recorded_at),
                       epoch_us(max(recorded_at))
                FROM replay_jobs {where} GROUP BY job_id ORDER BY max(recorded_at) DESC""",
            params,
        )
        return [
            JobRecord(jid, JobStatus(st), json.loads(spec), lo, hi, n, dg, at / US)
            for jid, st, spec, lo, hi, n, dg, at in rows
        ]

    @staticmethod
    def record_replay_job(record: JobRecord) -> Any:
        """Append one status row of a replay job (insert-only: the latest row wins)."""

        def job(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute(
                "INSERT INTO replay_jobs VALUES (?, ?, ?, ?, ?, ?, ?, make_timestamp(?))",
                [
                    record.job_id,
                    record.status.value,
                    json.dumps(record.spec, sort_keys=True),
                    record.lo,
                    record.hi,
                    record.rows,
                    record.digest,
                    int(record.recorded_at * US),
                ],
            )

        return job

    def published_at(self, seqs: Sequence[int]) -> dict[int, float]:
        """Publish times of a few messages, by seq."""
        return {seq: us / US for seq, us in self._columns(seqs, 3, "published_at").items()}

    def load_route_runs(self) -> dict[int, list[tuple[int, int]]]:
        """What the links' routes were given and not compacted yet: by route id, its
        runs of seqs (first, last), ascending. At recovery (node/links.py)."""
        runs: dict[int, list[tuple[int, int]]] = {}
        for route_id, lo, hi in self._query(
            "SELECT route_id, lo, hi FROM route_runs ORDER BY route_id, lo"
        ):
            runs.setdefault(route_id, []).append((lo, hi))
        return runs

    def pending_bytes(self) -> dict[int, int]:
        """Payload bytes of the messages each queue still holds, by queue id. Reads the
        hot tables and the log range they point into: its cost grows with the backlog,
        not with the log (an operator's look, not a per-message path)."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        rows = self._query(
            """WITH hot AS (
                   SELECT d.queue_id, d.seq FROM destinations d
                   ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
               )
               SELECT h.queue_id, sum(octet_length(m.payload))::BIGINT
               FROM hot h JOIN messages m ON m.seq = h.seq
               WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)
               GROUP BY h.queue_id"""
        )
        return {queue_id: int(total) for queue_id, total in rows}

    def payload_sizes(self, sample: int = 1000) -> dict[int, float]:
        """About the payload of the messages each queue holds, by queue id: the mean over
        its ``sample`` oldest (read at open, so that what a take reads into memory is
        bounded from the first: not a read of every payload the backlog holds)."""
        rows = self._query(
            """WITH hot AS (
                   SELECT d.queue_id, d.seq FROM destinations d
                   ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
                   QUALIFY row_number() OVER (PARTITION BY d.queue_id ORDER BY d.seq) <= ?
               )
               SELECT h.queue_id, avg(octet_length(m.payload))
               FROM hot h JOIN messages m ON m.seq = h.seq
               WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)
               GROUP BY h.queue_id""",
            [sample],
        )
        return {int(queue_id): float(size) for queue_id, size in rows}

    def _fresh(self, seqs: Sequence[int]) -> tuple[dict[int, Any], list[int]]:
        """The ``messages`` rows of ``seqs`` still in the writer's overlay (DuckDB may not
        hold them yet), by seq, and the seqs to read from DuckDB."""
        overlay = self.writer.overlay
        fresh: dict[int, Any] = {}
        rest = []
        for seq in seqs:
            row = overlay.get(seq)
            if row is None:
                rest.append(seq)
            else:
                fresh[seq] = row
        return fresh, rest

    def expiries(self, seqs: Sequence[int]) -> dict[int, float]:
        """Expiry times of the messages among ``seqs`` that have one, by seq."""
        found = self._columns(seqs, 4, "expires_at")
        return {seq: us / US for seq, us in found.items() if us is not None}

    def queue_payload_sizes(self, queue_id: int) -> dict[int, int]:
        """Payload bytes of each message queue ``queue_id`` still holds, by seq: what a
        queue given a max-bytes starts counting from. Every acknowledged write, not only
        what DuckDB holds (it waits for those); reads the queue's hot rows and the log
        range they point into (0.24 s for 10^6 messages here), so call it outside the
        node's lock."""
        self.writer.sync()
        return dict(
            self._query(
                """WITH hot AS (
                       SELECT d.seq FROM destinations d
                       ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
                       WHERE d.queue_id = ?
                   )
                   SELECT m.seq, octet_length(m.payload) FROM hot JOIN messages m ON m.seq = hot.seq
                   WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)""",
                [queue_id],
            )
        )

    def payload_sizes_of(self, seqs: Sequence[int]) -> dict[int, int]:
        """Payload bytes of the messages among ``seqs`` still in the log, by seq: from
        the writer's overlay, else DuckDB (see :meth:`fetch`)."""
        fresh, rest = self._fresh(seqs)
        found = {seq: len(row[6]) for seq, row in fresh.items()}
        if rest:
            found.update(
                self._query(
                    "SELECT seq, octet_length(payload) FROM messages "
                    "WHERE seq IN (SELECT unnest(?::BIGINT[]))",
                    [rest],
                )
            )
        return found

    def _columns(self, seqs: Sequence[int], index: int, column: str) -> dict[int, Any]:
        """One timestamp column of ``messages`` (``index`` in its rows) for ``seqs``, in
        microseconds: from the writer's overlay, else DuckDB (see :meth:`fetch`)."""
        fresh, rest = self._fresh(seqs)
        found = {seq: row[index] for seq, row in fresh.items()}
        if rest:
            found.update(
                self._query(
                    f"SELECT seq, epoch_us({column}) FROM messages "
                    "WHERE seq IN (SELECT unnest(?::BIGINT[]))",
                    [rest],
                )
            )
        return found

    def settled_rows(self) -> int:
        """Settlement records not yet compacted."""
        self.writer.sync()  # every acknowledged write, not only what DuckDB holds
        return int(self._query("SELECT count(*) FROM settled")[0][0])

    # -- jobs for the writer (each runs in its own transaction) ---------------------------

    @staticmethod
    def create_queue_job(config: QueueConfig, now_us: int) -> Any:
        def job(conn: duckdb.DuckDBPyConnection) -> int:
            row = conn.execute(
                """INSERT INTO queues VALUES (nextval('queue_ids'), ?, ?, make_timestamp(?))
                   RETURNING queue_id""",
                [config.name, json.dumps(config.to_json()), now_us],
            ).fetchone()
            assert row is not None
            return int(row[0])

        return job

    @staticmethod
    def update_queue_job(queue_id: int, config: QueueConfig) -> Any:
        def job(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute(
                "UPDATE queues SET config = ? WHERE queue_id = ?",
                [json.dumps(config.to_json()), queue_id],
            )

        return job

    @staticmethod
    def drop_queue_job(queue_id: int) -> Any:
        """Remove a queue and every record of it, atomically."""

        def job(conn: duckdb.DuckDBPyConnection) -> None:
            for table in (
                "destinations",
                "deliveries",
                "returned",
                "settled",
                "queue_stats",
                "queues",
            ):
                conn.execute(f"DELETE FROM {table} WHERE queue_id = ?", [queue_id])

        return job

    @staticmethod
    def drop_link_job(prefix: str, route_ids: Sequence[int]) -> Any:
        """Remove a link: its ``node_meta`` entries (keys starting with ``prefix``) and
        every record of its routes, atomically."""

        def job(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute("DELETE FROM node_meta WHERE starts_with(key, ?)", [prefix])
            conn.execute(
                "DELETE FROM route_runs WHERE route_id IN (SELECT unnest(?::INTEGER[]))",
                [list(route_ids)],
            )

        return job

    def settings(self) -> dict[str, str]:
        """Node settings saved in the data directory (``eomsg config set``)."""
        return dict(self._query(_SAVED_SETTINGS))

    # -- principals, grants and the audit log (core/access.py) ------------------------------

    def load_access(self) -> tuple[dict[str, int], list[tuple[str, str, str, str]]]:
        """Every principal (name → when it was added, µs) and every grant, as
        (principal, right, kind, name)."""
        principals = dict(self._query("SELECT name, epoch_us(created_at) FROM principals"))
        grants = self._query('SELECT principal, "right", kind, name FROM grants')
        return principals, [tuple(g) for g in grants]

    def audit_log(self, limit: int, before_us: int | None = None) -> list[tuple[Any, ...]]:
        """Up to ``limit`` audit records, newest first (before ``before_us``, if given):
        (at µs, principal, action, target, detail) — and more when records share the
        last one's time: a page never splits them, so paging back from its last time
        skips none."""
        self.writer.sync()  # every acknowledged change, not only what DuckDB holds
        select = """SELECT epoch_us(recorded_at), principal, action, target, detail
                    FROM audit WHERE {} ORDER BY recorded_at DESC, rowid DESC {}"""
        rows = self._query(
            select.format("? IS NULL OR recorded_at < make_timestamp(?)", "LIMIT ?"),
            [before_us, before_us, limit],
        )
        if len(rows) == limit and rows:
            last = rows[-1][0]
            ties = self._query(select.format("recorded_at = make_timestamp(?)", ""), [last])
            rows = [r for r in rows if r[0] != last] + ties
        return rows

    @staticmethod
    def audited(job: Any, entry: tuple[int, str, str, str, str]) -> Any:
        """``job`` with the audit record ``entry`` (at µs, principal, action, target,
        detail) appended in its own transaction: the change and its record commit
        together or not at all."""

        def audited_job(conn: duckdb.DuckDBPyConnection) -> Any:
            result = job(conn) if job is not None else None
            conn.execute("INSERT INTO audit VALUES (make_timestamp(?), ?, ?, ?, ?)", list(entry))
            return result

        return audited_job

    @staticmethod
    def add_principal_job(name: str, now_us: int) -> Any:
        def job(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute("INSERT INTO principals VALUES (?, make_timestamp(?))", [name, now_us])

        return job

    @staticmethod
    def remove_principal_job(name: str) -> Any:
        """Remove principal ``name`` and every grant it holds."""

        def job(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute("DELETE FROM grants WHERE principal = ?", [name])
            conn.execute("DELETE FROM principals WHERE name = ?", [name])

        return job

    @staticmethod
    def grant_job(grant: tuple[str, str, str, str], given: bool) -> Any:
        """Add (``given``) or remove the grant (principal, right, kind, name)."""

        def job(conn: duckdb.DuckDBPyConnection) -> None:
            if given:
                conn.execute("INSERT INTO grants VALUES (?, ?, ?, ?)", list(grant))
            else:
                conn.execute(
                    """DELETE FROM grants
                       WHERE principal = ? AND "right" = ? AND kind = ? AND name = ?""",
                    list(grant),
                )

        return job

    @staticmethod
    def save_setting_job(name: str, value: str) -> Any:
        return Store.save_meta_job(f"setting.{name}", value)

    @staticmethod
    def save_meta_job(key: str, value: str) -> Any:
        """Set one ``node_meta`` entry (upsert)."""

        def job(conn: duckdb.DuckDBPyConnection) -> None:
            conn.execute(
                """INSERT INTO node_meta VALUES (?, ?)
                   ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
                [key, value],
            )

        return job

    @staticmethod
    def compact_job(routes_taken: Mapping[int, int]) -> Any:
        """Drop the hot-table rows of every settled (queue, message) pair, folding their
        outcomes into ``queue_stats``, and the links' route runs that end where each
        route's peer took them or before (``routes_taken``: route id → seq; kept as one
        number per link, not as ``settled`` rows). Returns the number of rows compacted
        (pairs and runs)."""

        def job(conn: duckdb.DuckDBPyConnection) -> int:
            count = 0
            if routes_taken:
                row = conn.execute(
                    """DELETE FROM route_runs r
                       USING (SELECT unnest(?::INTEGER[]) AS route_id,
                                     unnest(?::BIGINT[]) AS upto) t
                       WHERE r.route_id = t.route_id AND r.hi <= t.upto""",
                    [list(routes_taken), list(routes_taken.values())],
                ).fetchone()
                count = int(row[0]) if row else 0
            row = conn.execute("SELECT count(*) FROM settled").fetchone()
            settled = int(row[0]) if row else 0
            if not settled:
                return count
            count += settled
            conn.execute(
                """INSERT INTO queue_stats
                   SELECT queue_id, count(*) FILTER (outcome = 0), count(*) FILTER (outcome = 1),
                          count(*) FILTER (outcome = 2), count(*) FILTER (outcome = 3)
                   FROM settled GROUP BY queue_id
                   ON CONFLICT (queue_id) DO UPDATE SET
                       deleted = deleted + excluded.deleted,
                       expired = expired + excluded.expired,
                       dead_lettered = dead_lettered + excluded.dead_lettered,
                       purged = purged + excluded.purged"""
            )
            for table in ("destinations", "deliveries", "returned"):
                conn.execute(
                    f"""DELETE FROM {table} t USING settled s
                        WHERE t.queue_id = s.queue_id AND t.seq = s.seq"""
                )
            conn.execute("DELETE FROM settled")
            return count

        return job

    @staticmethod
    def forget_txns_job(cutoff_us: int) -> Any:
        """Drop the work of every finished transaction (a commit copied it into the log
        and the settlement records), and the records of those finished before
        ``cutoff_us``: past that, a coordinator no longer asks. Returns how many were
        forgotten."""

        def job(conn: duckdb.DuckDBPyConnection) -> int:
            done = "SELECT txid FROM txn_log WHERE state <> 'prepared'"
            for table in ("txn_messages", "txn_deletes"):
                conn.execute(f"DELETE FROM {table} WHERE txid IN ({done})")
            row = conn.execute(
                f"""DELETE FROM txn_log WHERE txid IN (
                        {done} AND logged_at < make_timestamp(?)) RETURNING state""",
                [cutoff_us],
            ).fetchall()
            return sum(1 for (state,) in row if state != "prepared")

        return job

    @staticmethod
    def collect_garbage_job(floor: int, cutoff_us: int, now_us: int) -> Any:
        """Drop the retained log below the GC horizon: no message at or above ``floor`` is
        pending anywhere, and none published after ``cutoff_us`` is past retention.
        Also trims expired publish ids. Returns the new horizon (first seq kept)."""

        def job(conn: duckdb.DuckDBPyConnection) -> int:
            row = conn.execute(
                """SELECT least(?, coalesce(
                       (SELECT min(seq) FROM messages WHERE published_at > make_timestamp(?)),
                       ?))""",
                [floor, cutoff_us, floor],
            ).fetchone()
            horizon = int(row[0]) if row else 0
            # What a replay selecting by publish time must know it can no longer read.
            conn.execute(
                """INSERT INTO node_meta
                   SELECT 'gc_published_us', epoch_us(max(published_at))::VARCHAR
                   FROM messages WHERE seq < ? HAVING count(*) > 0
                   ON CONFLICT (key) DO UPDATE
                   SET value = greatest(value::BIGINT, excluded.value::BIGINT)::VARCHAR""",
                [horizon],
            )
            conn.execute("DELETE FROM messages WHERE seq < ?", [horizon])
            conn.execute(
                """DELETE FROM publish_ids
                   WHERE (expires_at IS NOT NULL AND expires_at <= make_timestamp(?))
                      OR (expires_at IS NULL AND seq < ?)""",
                [now_us, horizon],
            )
            conn.execute(
                """INSERT INTO node_meta VALUES ('gc_at', ?::VARCHAR)
                   ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
                [now_us / US],
            )
            conn.execute(
                """INSERT INTO node_meta VALUES ('gc_horizon', ?::VARCHAR)
                   ON CONFLICT (key) DO UPDATE
                   SET value = greatest(value::BIGINT, excluded.value::BIGINT)::VARCHAR""",
                [horizon],
            )
            return horizon

        return job
