"""Reading slices of the retained log as Arrow: the SQL behind replays, shared by the
node's store and by :class:`FileLog`, which opens a data directory no node holds.

A slice is a :class:`~eomsg.core.replay.Selection` cut to a half-open sequence range.
Everything below the highest committed seq is immutable (the writer commits in sequence
order), so the same slice read twice gives the same rows in the same order — the
property that lets Spark retry a task or a whole job without changing its output.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from eomsg.core.queues import QueueConfig
from eomsg.core.replay import Selection
from eomsg.errors import DataDirError, DataDirLocked, QueueNotFound, StorageError, one_line
from eomsg.store import journal
from eomsg.store.files import DB_NAME
from eomsg.store.lock import LOCK_NAME, holder_of
from eomsg.store.schema import ROW_TABLES, arrow_schema
from eomsg.store.writer import applied_lsn, journal_format

if TYPE_CHECKING:  # (a read as Arrow imports it: DuckDB hands the rows over as Arrow)
    import pyarrow as pa

_COLUMNS = ", ".join(column for column, _ in ROW_TABLES["messages"])


def _where(sel: Selection, lo: int | None = None, hi: int | None = None) -> tuple[str, list[Any]]:
    """The WHERE clause of ``sel`` within ``[lo, hi)`` and its parameters."""
    clauses = ["seq >= ?"]
    params: list[Any] = [max(sel.from_seq, lo or 1)]
    if sel.to_seq is not None:
        clauses.append("seq <= ?")
        params.append(sel.to_seq)
    if hi is not None:
        clauses.append("seq < ?")
        params.append(hi)
    regex = sel.regex()
    if regex is not None:
        clauses.append("regexp_full_match(topic, ?)")
        params.append(regex)
    if sel.since_us is not None:
        clauses.append("published_at >= make_timestamp(?)")
        params.append(sel.since_us)
    if sel.until_us is not None:
        clauses.append("published_at < make_timestamp(?)")
        params.append(sel.until_us)
    return " AND ".join(clauses), params


def bounds(conn: duckdb.DuckDBPyConnection, sel: Selection) -> tuple[int, int] | None:
    """The first and last seq ``sel`` selects, or None when it selects nothing."""
    where, params = _where(sel)
    [row] = conn.execute(
        f"SELECT min(seq), max(seq) FROM messages WHERE {where}", params
    ).fetchall()
    if row[0] is None:
        return None
    return int(row[0]), int(row[1])


def horizon(conn: duckdb.DuckDBPyConnection) -> tuple[int, int | None]:
    """The first seq log garbage collection kept (1 if it never collected any), and the
    latest publish time among the messages it collected, in microseconds (None if it
    collected none)."""
    meta = dict(
        conn.execute(
            "SELECT key, value FROM node_meta WHERE key IN ('gc_horizon', 'gc_published_us')"
        ).fetchall()
    )
    published = meta.get("gc_published_us")
    return int(meta.get("gc_horizon") or 1), None if published is None else int(published)


def stored_seq(conn: duckdb.DuckDBPyConnection) -> int:
    """The highest sequence number ever stored, those log GC dropped included (what a
    commit's watermark records, and what the next seq follows)."""
    [(top,)] = conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchall()
    return max(int(top), horizon(conn)[0] - 1)


def last_seq(conn: duckdb.DuckDBPyConnection) -> int:
    """The highest committed seq (0 for an empty log): everything below it is final."""
    [(top,)] = conn.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchall()
    return int(top)


def read(
    conn: duckdb.DuckDBPyConnection, sel: Selection, lo: int, hi: int, batch_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """The rows of ``sel`` in ``[lo, hi)``, in seq order, as Arrow batches (streamed on
    a cursor of its own, so other reads of ``conn`` may go on meanwhile)."""
    where, params = _where(sel, lo, hi)
    with conn.cursor() as cursor:
        rel = cursor.sql(
            f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY seq", params=params
        )
        yield from rel.to_arrow_reader(batch_rows)


def read_chunk(
    conn: duckdb.DuckDBPyConnection, sel: Selection, lo: int, hi: int, max_bytes: int
) -> tuple[pa.Table, int]:
    """A prefix of the rows of ``sel`` in ``[lo, hi)`` of at most about ``max_bytes``
    (at least one row), and the seq to continue from (``hi`` once the range is done)."""
    import pyarrow.compute as pc  # here: its import costs every command opening a store 30 ms

    rows = 4096
    while True:
        where, params = _where(sel, lo, hi)
        table = conn.sql(
            f"SELECT {_COLUMNS} FROM messages WHERE {where} ORDER BY seq LIMIT {rows}",
            params=params,
        ).to_arrow_table()
        size = pc.add(
            pc.binary_length(table["payload"]),
            pc.add(
                pc.fill_null(pc.binary_length(table["headers"]), 0),
                pc.add(pc.binary_length(table["topic"]), 48),
            ),
        )
        cumulative = pc.cumulative_sum(size).to_pylist()
        fit = sum(1 for c in cumulative if c <= max_bytes) or min(1, table.num_rows)
        exhausted = table.num_rows < rows  # the query found every row left in the range
        if fit < table.num_rows or exhausted:
            done = exhausted and fit == table.num_rows
            table = table.slice(0, fit)
            next_seq = hi if done else int(table["seq"][-1].as_py()) + 1
            return table.cast(arrow_schema("messages")), next_seq
        rows *= 4


def queue_patterns(conn: duckdb.DuckDBPyConnection, queue: str) -> tuple[str, ...]:
    """The topic patterns queue ``queue`` subscribes to."""
    rows = conn.execute("SELECT config FROM queues WHERE name = ?", [queue]).fetchall()
    if not rows:
        raise QueueNotFound(f"no queue named {queue!r}")
    return QueueConfig.from_json(json.loads(rows[0][0])).subscriptions


class FileLog:
    """The log of a data directory that no node holds, opened read-only.

    Any number of processes (Spark tasks) may hold one at once: each takes a *shared*
    lock on the directory's lock file, so a node cannot start meanwhile (it needs the
    exclusive lock) and a running node makes opening fail at once with DataDirLocked.
    DuckDB replays a leftover WAL in memory; nothing on disk changes. A directory whose
    journal holds records (its node was killed) is refused: only opening the store
    applies them, and the log read without them would miss acknowledged messages.
    """

    def __init__(self, data_dir: Path | str, wait: float = 0.0) -> None:
        """Open the log read-only; a data directory held by another process is waited
        for up to ``wait`` seconds (a command's moment), then DataDirLocked names it."""
        self.data_dir = Path(data_dir)
        path = self.data_dir / DB_NAME
        if not path.exists():
            raise DataDirError(f"no eomsg data in {self.data_dir} (check --data)")
        self._fd = os.open(self.data_dir / LOCK_NAME, os.O_RDONLY | os.O_CREAT, 0o600)
        deadline, delay = time.monotonic() + wait, 0.05
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                if time.monotonic() + delay <= deadline:
                    time.sleep(delay)
                    delay = min(2 * delay, 1.0)
                    continue
                os.close(self._fd)
                raise DataDirLocked(
                    f"data directory {self.data_dir} is in use by {holder_of(self.data_dir)}"
                    ": read through its node (its socket or --broker), or when it is done"
                ) from e
        try:
            self.conn = duckdb.connect(
                str(path), read_only=True, config={"enable_external_access": False}
            )
            lacking = journal.check(
                self.data_dir / journal.DIR_NAME,
                applied_lsn(self.conn),
                legacy=journal_format(self.conn) < journal.FORMAT,
            )
        except duckdb.Error as e:
            os.close(self._fd)
            raise DataDirError(f"cannot read {path}: {one_line(e)}") from e
        if lacking.records or lacking.damage:
            self.close()
            raise DataDirError(
                f"{self.data_dir} holds acknowledged messages its log file does not have yet "
                "(its node stopped without closing): open it with eomsg once (any command, "
                "e.g. `eomsg inspect queues`), which applies them, then read it again"
            )

    def close(self) -> None:
        """Close the database and drop the shared lock. Idempotent."""
        if self._fd >= 0:
            self.conn.close()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bounds(self, sel: Selection) -> tuple[int, int] | None:
        with _guard("reading the log"):
            return bounds(self.conn, sel)

    def last_seq(self) -> int:
        with _guard("reading the log"):
            return last_seq(self.conn)

    def horizon(self) -> tuple[int, int | None]:
        with _guard("reading the log"):
            return horizon(self.conn)

    def queue_patterns(self, queue: str) -> tuple[str, ...]:
        with _guard("reading the queues"):
            return queue_patterns(self.conn, queue)

    def batches(self, sel: Selection, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        with _guard("reading the log"):
            yield from read(self.conn, sel, lo, hi)


@contextlib.contextmanager
def _guard(doing: str) -> Iterator[None]:
    """Turn a DuckDB error into the StorageError that says what was being done."""
    try:
        yield
    except duckdb.Error as e:
        raise StorageError(f"{doing} failed: {one_line(e)}") from e
