"""Opening a store's database: the checks that may refuse it, then its first writes.

Everything that may refuse the open — an interrupted salvage, a WAL or journal that lost
acknowledged writes, a damaged file — is checked before anything is written, and a
failed open changes nothing (DuckDB does not fold the WAL into the file as the
connection closes): the next open finds the files as this one did and says the same.
Only then is the schema migrated, DuckDB's memory limit and configuration set, and the
journal's records DuckDB does not hold yet applied (:mod:`eomsg.store.journaled`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import duckdb

from eomsg.errors import DataDirError, one_line
from eomsg.store import compact, integrity, journal, journaled, logread, salvage
from eomsg.store.files import DB_NAME
from eomsg.store.journal import Journal
from eomsg.store.schema import migrate
from eomsg.store.watermark import Watermark
from eomsg.store.writer import applied_lsn, journal_format

DUCKDB_CONFIG: dict[str, Any] = {
    # Every commit goes through the WAL, so a COMMIT that returned is durable. By
    # default DuckDB writes a commit of 100 kB or more straight into a checkpoint,
    # which is lost whole if that checkpoint fails.
    "auto_checkpoint_skip_wal_threshold": 1 << 62,
    # No checkpoint inside a COMMIT: the writer checkpoints, between commits, when the
    # WAL passes its bound (Checkpoints.wal_limit), after marking the WAL empty (watermark).
    "wal_autocheckpoint": "1000TiB",
}
CATALOG = Path(DB_NAME).stem  # the database's name in SQL, as DuckDB names an opened file
# Rows a checkpoint writes into one row group. DuckDB's default, 122,880, made the
# checkpoint that fills a row group of the log take 0.4-0.9 s and 100-125 MiB of the
# node's memory outside DuckDB's own accounting (a spike above its RSS at every such
# checkpoint); at 16,384 the worst measured was 0.28 s and 28 MiB. An option of ATTACH
# only, not kept in the file: every open gives it again.
ROW_GROUP_ROWS = 16_384
SAVED_SETTINGS = """SELECT substr(key, 9), value FROM node_meta WHERE key LIKE 'setting.%'"""


class Opened(NamedTuple):
    """A database opened by :func:`open_database`, and what opening it found."""

    db: duckdb.DuckDBPyConnection
    journal: Journal  # open for appending
    warnings: list[str]  # writes a crash cut off, dropped (never acknowledged)
    memory_limit: int | None  # DuckDB's, in bytes (None: DuckDB's default)


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    """The node's connection to the database file ``path``: attached as :data:`CATALOG`
    with :data:`ROW_GROUP_ROWS` (the default database of every cursor, which must say
    so, :func:`cursor`), DuckDB's spill files beside it, and file access turned off
    once it is open — the node reads and writes only its own file, and `inspect sql`
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


def cursor(db: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A new cursor of ``db``, reading and writing the store's file (a cursor starts in
    DuckDB's own in-memory database: :func:`connect`)."""
    new = db.cursor()
    new.execute(f"USE {CATALOG}")
    return new


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


def no_space(error: BaseException) -> bool:
    """Whether opening failed because the disk is full (DuckDB says so in words)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__  # type: ignore[assignment]
    return False


def has_meta(db: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store's database has its tables yet (not a store made just now).
    (Asked of the store's database alone: of every database, ≈ 5 ms more an open.)"""
    [(n,)] = db.execute(
        "SELECT count(*) FROM duckdb_tables() "
        "WHERE database_name = current_database() AND table_name = 'node_meta'"
    ).fetchall()
    return bool(n)


def open_database(
    data_dir: Path,
    watermark: Watermark,
    *,
    journal_segment: int,
    bound: Callable[[duckdb.DuckDBPyConnection], None],
    memory_limit: Callable[[Mapping[str, str]], int] | None,
) -> Opened:
    """Check and open the database of ``data_dir`` (its lock held; ``watermark``: where
    the last commit marked what it wrote) and apply its journal, calling ``bound`` to keep
    the WAL within its bound as it goes. ``memory_limit``: DuckDB's memory limit from
    the settings the directory saved, set before anything large is read. DataDirDamaged
    if acknowledged writes were lost, DataDirError if it cannot be opened otherwise."""
    path = data_dir / DB_NAME
    if (data_dir / salvage.JOURNAL).exists():
        raise integrity.damaged(data_dir, "a salvage of it was interrupted")
    for stale in compact.leftovers(data_dir):  # of a compaction that was killed
        stale.unlink()
    mark = watermark.read()
    warnings = integrity.before_open(data_dir, data_dir / f"{DB_NAME}.wal", mark)
    try:
        db = connect(path)
    except duckdb.Error as e:
        if integrity.is_damage(e):
            raise integrity.damaged(data_dir, one_line(e)) from e
        raise DataDirError(f"cannot open {path}: {one_line(e)}") from e
    try:
        # A failed open changes nothing: DuckDB does not fold the WAL into the file as
        # the connection closes (close() checkpoints when all went well).
        db.execute("PRAGMA disable_checkpoint_on_shutdown")
        # Everything that may refuse the open is checked before the first write.
        found = _check_journal(data_dir, db, warnings) if has_meta(db) else None
        if found is not None:
            integrity.after_open(data_dir, mark, logread.stored_seq(db))
        migrate(db)
        limit = None
        if memory_limit is not None:  # past it DuckDB spills beside its file
            limit = memory_limit(dict(db.execute(SAVED_SETTINGS).fetchall()))
            db.execute(f"SET memory_limit = '{int(limit)}B'")
        # From here on no connection of this database can change a setting: what
        # `inspect sql` runs cannot turn fsync or checkpoints off, whatever it is.
        db.execute("SET lock_configuration = true")
        opened = _replay_journal(data_dir, db, found, journal_segment, bound)
    except duckdb.Error as e:
        db.close()
        if integrity.is_damage(e):
            raise integrity.damaged(data_dir, one_line(e)) from e
        raise DataDirError(f"cannot open {path}: {one_line(e)}") from e
    except BaseException:
        db.close()
        raise
    return Opened(db, opened, warnings, limit)


def _check_journal(
    data_dir: Path, db: duckdb.DuckDBPyConnection, warnings: list[str]
) -> journal.Scan:
    """What the journal holds past what DuckDB does. DataDirDamaged if any of it is
    lost to damage — a record damaged, a segment cut short or gone — naming the file,
    the last good record and what may be lost: serving what follows would skip
    acknowledged writes. A tail a crash cut off is only warned of, in ``warnings`` (it
    was never acknowledged)."""
    applied = applied_lsn(db)
    legacy = journal_format(db) < journal.FORMAT
    found = journal.check(data_dir / journal.DIR_NAME, applied, legacy)
    if found.damage:
        raise integrity.damaged(data_dir, journaled.damage(db, found))
    if found.torn:
        warnings.append(
            f"the journal ended with a write that a crash cut off ({found.torn}): "
            "dropped (its writer never acknowledged it)"
        )
    return found


def _replay_journal(
    data_dir: Path,
    db: duckdb.DuckDBPyConnection,
    found: journal.Scan | None,
    segment: int,
    bound: Callable[[duckdb.DuckDBPyConnection], None],
) -> Journal:
    """Apply the journal's records DuckDB does not hold yet (``found``: a node stopped
    without closing), then open it for appending."""
    directory = data_dir / journal.DIR_NAME
    if found is None:  # a store made just now
        found = journal.check(directory, applied_lsn(db), legacy=True)
    applied, legacy = found.after, journal_format(db) < journal.FORMAT
    last = max(applied, journaled.apply(db, found.records, lambda: bound(db)))
    opened = Journal.start(directory, last, segment, found)
    if legacy:  # from now on the journal always keeps a segment
        journaled.set_format(db)
    return opened
