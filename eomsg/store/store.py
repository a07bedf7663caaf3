"""The store: a data directory holding one DuckDB database, opened read-write by one
process, and the one door through which the node reads and changes it.

Opening takes the directory's lock, opens the database read-write, migrates it and starts
the :class:`~eomsg.store.writer.Writer` (:mod:`eomsg.store.opening`). Writes go through
the writer (group commit), as jobs the concern modules make; reads run on per-thread
cursors of the same database and see only committed data (:mod:`eomsg.store.reads`).
:class:`Store` holds the lifecycle — open, close, abandon, the writer's failure — and
names every read and job the node uses; the SQL lives in the modules of each concern:

- :mod:`~eomsg.store.recovery`: what a node reads as it opens;
- :mod:`~eomsg.store.messages` and :mod:`~eomsg.store.backlog`: the log's messages, and
  what the queues hold, measured;
- :mod:`~eomsg.store.replays`: the log as a replay reads it, and the replay jobs;
- :mod:`~eomsg.store.node_meta`, :mod:`~eomsg.store.jobs`: ``node_meta``, queues and links;
- :mod:`~eomsg.store.access`: principals, grants and the audit log;
- :mod:`~eomsg.store.gc`: compaction, forgotten transactions, the log's GC;
- :mod:`~eomsg.store.checkpoints`: when the WAL is folded into the file.

Times cross this boundary as integer microseconds since the epoch (UTC); the table
columns are ``TIMESTAMP`` so that ``inspect sql`` shows readable times.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import duckdb

from eomsg.core.message import Message, MessageColumns
from eomsg.core.queues import QueueConfig
from eomsg.core.replay import JobRecord, Selection
from eomsg.errors import DataDirError, DiskFull
from eomsg.store import (
    access,
    backlog,
    gc,
    jobs,
    journal,
    logread,
    messages,
    node_meta,
    opening,
    recovery,
    replays,
)
from eomsg.store.checkpoints import Checkpoints
from eomsg.store.files import DB_NAME, make_private
from eomsg.store.lock import DataDirLock
from eomsg.store.messages import US, MessageRow
from eomsg.store.opening import CATALOG, room_to_open
from eomsg.store.reads import Reads, read_error
from eomsg.store.recovery import PendingRow, PreparedRow, SettledCounts, UnreadRun
from eomsg.store.spill import SpilledIds
from eomsg.store.watermark import Watermark
from eomsg.store.writer import APPLY_DELAY, Writer

if TYPE_CHECKING:
    from eomsg.core.idruns import RetainedIds

__all__ = [  # what the node imports of the store from here
    "US",
    "WAL_LIMIT",
    "MessageRow",
    "MiB",
    "PendingRow",
    "PreparedRow",
    "SettledCounts",
    "Store",
    "UnreadRun",
    "room_to_open",
]

WAL_LIMIT = 16 << 20  # the WAL's default bound: past it the writer checkpoints
MiB = 1 << 20
log = logging.getLogger("eomsg.store")


class Store:
    """A data directory opened read-write by this process (see the module docstring).

    Opening checks the directory first (:mod:`eomsg.store.integrity`): DataDirDamaged if
    acknowledged writes were lost, a warning (in :attr:`warnings`, and logged) for a
    write a crash cut off. Each of :attr:`failure_listeners` hears, once and on the
    writer's journal or applier thread, that the writer stopped taking work (the store
    must be reopened). Every job (``…_job``) is a function of the writer's connection,
    run by :meth:`Writer.run` in its own transaction."""

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
        """``memory_limit``: DuckDB's memory limit from the settings the directory saved
        (None: DuckDB's default); set as it opens, before anything large is read."""
        self.data_dir = data_dir
        self.path = data_dir / DB_NAME
        self.wal_path = data_dir / f"{DB_NAME}.wal"
        self._lock = DataDirLock(data_dir, create=create)
        if not create and not self.path.exists():
            self._lock.release()
            raise DataDirError(f"no eomsg data in {data_dir} yet (check --data)")
        self._mark = Watermark(data_dir)
        self.checkpoints = Checkpoints(self._mark, self.wal_path, wal_limit)
        try:
            opened = opening.open_database(
                data_dir,
                self._mark,
                journal_segment=journal_segment,
                bound=self.checkpoints.bound,
                memory_limit=memory_limit,
            )
        except BaseException as e:
            self._mark.close()
            self._lock.release()
            if opening.no_space(e):
                free, need = room_to_open(data_dir)
                raise DiskFull(
                    f"the disk holding {data_dir} is full: {free / MiB:.1f} MiB free, about "
                    f"{need / MiB:.1f} MiB needed to open the store (its WAL's checkpoint and "
                    "its journal's records): free some space and run it again"
                ) from e
            raise
        self._db, self._journal, self.warnings, self.memory_limit = opened
        for warning in self.warnings:
            log.warning("%s", warning)
        try:
            make_private(data_dir)
            conn = opening.cursor(self._db)  # the writer's
            try:
                last = logread.stored_seq(conn)
            except duckdb.Error as e:
                raise read_error(data_dir, e, "reading the store") from e
            self.checkpoints.mark(last)
            self.spill = SpilledIds(data_dir)  # the dedup window's oldest ids
        except BaseException:  # (a full disk): let go of everything, as a failed open
            self._journal.close_file()
            self._db.close()
            self._mark.close()
            self._lock.release()
            raise
        self.failure_listeners: list[Callable[[BaseException], None]] = []
        self.writer = Writer(
            conn,
            self._journal,
            last,
            self.checkpoints.committed,
            self.checkpoints.checkpoint,
            self._writer_failed,
            apply_delay,
        )
        self.reads = Reads(self._db, data_dir, self.writer)

    def close(self) -> None:
        """Finish queued writes, checkpoint, close the database and drop the lock."""
        self.writer.close()
        self.reads.close()
        # DuckDB checkpoints as it closes, whether we do or not: mark the WAL empty first.
        self.checkpoints.mark_empty(self.writer.last_seq)
        if not self.writer.failed:
            with contextlib.suppress(duckdb.Error):  # the WAL replays at the next open
                self._db.execute(f"CHECKPOINT {CATALOG}")
        self._db.close()
        self.spill.close()
        self._mark.close()
        make_private(self.data_dir)
        self._lock.release()

    def abandon(self) -> None:
        """Close after an open that failed past the store's (the node's recovery could
        not read it): no checkpoint and no mark written, so the next open finds the
        files as this one did — but for the journal records it applied, which DuckDB
        then holds as it would have."""
        self.writer.close()
        self.reads.close()
        self._db.close()
        self.spill.close()
        self._mark.close()
        self._lock.release()

    def _writer_failed(self, cause: BaseException) -> None:
        """The writer stopped taking work (on its journal or applier thread): tell each
        of :attr:`failure_listeners`."""
        for listener in self.failure_listeners:
            listener(cause)

    # -- the store's resources --------------------------------------------------------------

    def duckdb_memory(self) -> int:
        """The bytes DuckDB's buffer manager holds now."""
        rows = self.reads.rows("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")
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

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """``inspect sql``: see :meth:`Reads.sandboxed`."""
        return self.reads.sandboxed(sql)

    # -- recovery (eomsg.store.recovery) ----------------------------------------------------

    def load_queues(self) -> list[tuple[int, QueueConfig]]:
        """See :func:`eomsg.store.recovery.load_queues`."""
        return recovery.load_queues(self.reads)

    def last_seq(self) -> int:
        """The highest sequence number ever assigned durably (log GC included)."""
        return self.reads.on_reader(logread.stored_seq, "reading the store")

    def load_pending(self) -> Iterator[PendingRow | UnreadRun]:
        """See :func:`eomsg.store.recovery.load_pending`."""
        return recovery.load_pending(self.reads)

    def few_publish_ids(
        self, now_us: int, from_seq: int, most: int
    ) -> list[tuple[str, int, float | None]] | None:
        """See :func:`eomsg.store.recovery.few_publish_ids`."""
        return recovery.few_publish_ids(self.reads, now_us, from_seq, most)

    def publish_id_runs(self, now_us: int, from_seq: int, rows: int) -> Iterator[RetainedIds]:
        """See :func:`eomsg.store.recovery.publish_id_runs`."""
        return recovery.publish_id_runs(self.reads, now_us, from_seq, rows)

    def finished_txns(self) -> dict[str, str]:
        """See :func:`eomsg.store.recovery.finished_txns`."""
        return recovery.finished_txns(self.reads)

    def load_prepared(self, finished: set[str]) -> list[PreparedRow]:
        """See :func:`eomsg.store.recovery.load_prepared`."""
        return recovery.load_prepared(self.reads, finished)

    def load_counts(self) -> dict[int, SettledCounts]:
        """See :func:`eomsg.store.recovery.load_counts`."""
        return recovery.load_counts(self.reads)

    def load_route_runs(self) -> dict[int, list[tuple[int, int]]]:
        """See :func:`eomsg.store.recovery.load_route_runs`."""
        return recovery.load_route_runs(self.reads)

    # -- node_meta (eomsg.store.node_meta) ----------------------------------------------

    def meta(self, key: str) -> str | None:
        """See :func:`eomsg.store.node_meta.meta`."""
        return node_meta.meta(self.reads, key)

    def meta_prefixed(self, prefix: str) -> dict[str, str]:
        """See :func:`eomsg.store.node_meta.meta_prefixed`."""
        return node_meta.meta_prefixed(self.reads, prefix)

    def settings(self) -> dict[str, str]:
        """See :func:`eomsg.store.node_meta.settings`."""
        return node_meta.settings(self.reads)

    save_meta_job = staticmethod(node_meta.save_meta_job)
    save_setting_job = staticmethod(node_meta.save_setting_job)

    # -- the log's messages (eomsg.store.messages) and the backlog (eomsg.store.backlog) ----

    def fetch(self, seqs: Sequence[int]) -> dict[int, Message]:
        """The messages with these sequence numbers (ascending), by seq (see
        :meth:`fetch_rows`)."""
        rows = [row for row in self.fetch_rows(seqs) if row is not None]
        return dict(zip(map(itemgetter(0), rows), messages.messages_of(rows), strict=True))

    @overload
    def fetch_columns(self, seqs: Sequence[int]) -> MessageColumns: ...
    @overload
    def fetch_columns(self, seqs: Sequence[int], *, memory_only: bool) -> MessageColumns | None: ...

    def fetch_columns(
        self, seqs: Sequence[int], *, memory_only: bool = False
    ) -> MessageColumns | None:
        """The messages with these sequence numbers (ascending) that the log holds, as
        columns (see :meth:`fetch_rows`, and its ``memory_only``): a consumer's take."""
        rows = self.fetch_rows(seqs, memory_only=memory_only)
        if rows is None:
            return None
        return messages.columns_of([row for row in rows if row is not None])

    @overload
    def fetch_rows(self, seqs: Sequence[int]) -> list[MessageRow | None]: ...
    @overload
    def fetch_rows(
        self, seqs: Sequence[int], *, memory_only: bool
    ) -> list[MessageRow | None] | None: ...

    def fetch_rows(
        self, seqs: Sequence[int], *, memory_only: bool = False
    ) -> list[MessageRow | None] | None:
        """See :func:`eomsg.store.messages.fetch_rows`: for a caller that needs a few
        columns of many messages (a link's sender) and would waste a :class:`Message` on
        each."""
        return messages.fetch_rows(self.reads, seqs, memory_only=memory_only)

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
        """See :func:`eomsg.store.messages.log`."""
        return messages.log(
            self.reads,
            topic_regex,
            from_seq,
            limit,
            newest=newest,
            to_seq=to_seq,
            until_us=until_us,
        )

    def expiries(self, seqs: Sequence[int]) -> dict[int, float]:
        """See :func:`eomsg.store.messages.expiries`."""
        return messages.expiries(self.reads, seqs)

    def published_at(self, seqs: Sequence[int]) -> dict[int, float]:
        """See :func:`eomsg.store.messages.published_at`."""
        return messages.published_at(self.reads, seqs)

    def payload_sizes_of(self, seqs: Sequence[int]) -> dict[int, int]:
        """See :func:`eomsg.store.messages.payload_sizes_of`."""
        return messages.payload_sizes_of(self.reads, seqs)

    def pending_bytes(self) -> dict[int, int]:
        """See :func:`eomsg.store.backlog.pending_bytes`."""
        return backlog.pending_bytes(self.reads)

    def payload_sizes(self, sample: int = 1000) -> dict[int, float]:
        """See :func:`eomsg.store.backlog.payload_sizes`."""
        return backlog.payload_sizes(self.reads, sample)

    def queue_payload_sizes(self, queue_id: int) -> dict[int, int]:
        """See :func:`eomsg.store.backlog.queue_payload_sizes`."""
        return backlog.queue_payload_sizes(self.reads, queue_id)

    def settled_rows(self) -> int:
        """See :func:`eomsg.store.backlog.settled_rows`."""
        return backlog.settled_rows(self.reads)

    # -- replay (eomsg.store.replays) -------------------------------------------------------

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None:
        """See :func:`eomsg.store.replays.log_bounds`."""
        return replays.log_bounds(self.reads, sel)

    def log_horizon(self) -> tuple[int, int | None]:
        """See :func:`eomsg.store.replays.log_horizon`."""
        return replays.log_horizon(self.reads)

    def log_chunk(self, sel: Selection, lo: int, hi: int, max_bytes: int) -> tuple[Any, int]:
        """See :func:`eomsg.store.replays.log_chunk`."""
        return replays.log_chunk(self.reads, sel, lo, hi, max_bytes)

    def replay_jobs(self, job_id: str | None = None) -> list[JobRecord]:
        """See :func:`eomsg.store.replays.replay_jobs`."""
        return replays.replay_jobs(self.reads, job_id)

    record_replay_job = staticmethod(replays.record_replay_job)

    # -- access (eomsg.store.access) --------------------------------------------------------

    def load_access(self) -> tuple[dict[str, int], list[tuple[str, str, str, str]]]:
        """See :func:`eomsg.store.access.load_access`."""
        return access.load_access(self.reads)

    def audit_log(self, limit: int, before_us: int | None = None) -> list[tuple[Any, ...]]:
        """See :func:`eomsg.store.access.audit_log`."""
        return access.audit_log(self.reads, limit, before_us)

    audited = staticmethod(access.audited)
    add_principal_job = staticmethod(access.add_principal_job)
    remove_principal_job = staticmethod(access.remove_principal_job)
    grant_job = staticmethod(access.grant_job)

    # -- queues and links (eomsg.store.jobs); compaction and GC (eomsg.store.gc) -----------

    create_queue_job = staticmethod(jobs.create_queue_job)
    update_queue_job = staticmethod(jobs.update_queue_job)
    drop_queue_job = staticmethod(jobs.drop_queue_job)
    drop_link_job = staticmethod(jobs.drop_link_job)
    compact_job = staticmethod(gc.compact_job)
    forget_txns_job = staticmethod(gc.forget_txns_job)
    collect_garbage_job = staticmethod(gc.collect_garbage_job)
