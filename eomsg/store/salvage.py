"""``eomsg salvage``: open a damaged store again, keeping everything still readable.

A node refuses a data directory that lost acknowledged writes or that DuckDB cannot read
(:mod:`eomsg.store.integrity`). Salvage is a person's decision to accept that loss and
go on with what is left. It plans first (``--dry-run`` prints the plan), then:

1. copies the damaged files (the journal's too) into ``DIR/damaged-<time>/``,
   untouched, for later study;
2. cuts the WAL after its last transaction whose records all check out (what DuckDB
   can replay), and opens the store read-only in a work directory;
3. finds the data blocks whose checksum fails and gives each, in the work copy only, its
   checksum again so DuckDB reads the rest of the table; the rows stored in such a
   block are left out (their bytes are not to be trusted). Then it copies every table
   into a new store, 122,880 rows at a time, narrowing down around anything that still
   cannot be read, and counts what was lost (rows, once each);
4. puts every readable record of the journal past what the store held into the new
   store — past a hole too (:mod:`eomsg.store.journaled` names what a hole took) —
   and names the acknowledged messages it could not keep: those queues still waited
   for, and the seqs missing inside the log;
5. swaps the new store in: a journal (``DIR/eomsg.salvage``) is written first, so a
   salvage killed during the swap is finished by the next run (a node refuses to open
   while the journal is there), and the journal starts afresh past the records kept.

Nothing is deleted that is not copied first; the report says what was lost.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from eomsg.errors import DataDirDamaged, DataDirError, UsageError, one_line
from eomsg.failpoints import failpoint
from eomsg.store import integrity, journal, journaled, logread, spill, wal
from eomsg.store.files import DB_NAME, owner_only, sync
from eomsg.store.lock import DataDirLock
from eomsg.store.logread import stored_seq
from eomsg.store.schema import hash_publish_ids, migrate, route_runs_from_destinations
from eomsg.store.watermark import MARK_NAME, Mark, Watermark
from eomsg.store.writer import applied_lsn, journal_format

JOURNAL = "eomsg.salvage"
SALVAGED_SUFFIX = ".salvaged"
WORK_DIR = ".salvage-work"
CHUNK = 122_880  # rows copied at a time (DuckDB's default row group)
SMALLEST = 2_048  # a chunk this small that cannot be read is given up as lost
BLOCK = 262_144  # DuckDB's block size (each starts with its u64 checksum)
_LOCATION = re.compile(r"in block at location (\d+)")


@dataclass(frozen=True)
class SalvagePlan:
    """What salvage would do, decided before anything is written."""

    data_dir: Path
    problem: str  # why the store needs salvage ("" if it does not)
    wal_size: int
    wal_keep: int  # bytes of the WAL kept (its complete, checked transactions)
    wal_commits: int
    journal_lost: int = 0  # the first journal record lost to damage (0: none)
    journal_keep: int = 0  # readable journal records past what the store holds, kept
    journal_loss: str = ""  # what the journal's damage took, in words
    resume: bool = False  # a salvage was interrupted during its swap: finish it

    @property
    def needed(self) -> bool:
        return bool(self.problem) or self.resume

    def lines(self) -> list[str]:
        if self.resume:
            return [f"finish the salvage of {self.data_dir} that was interrupted"]
        if not self.problem:
            return [f"{self.data_dir} is not damaged: nothing to salvage"]
        out = [f"damage     {self.problem}"]
        if self.wal_size:
            out.append(
                f"WAL        keep {self.wal_keep} of {self.wal_size} bytes "
                f"({self.wal_commits} transactions); drop {self.wal_size - self.wal_keep}"
            )
        if self.journal_lost:
            out.append(
                f"journal    keep its {self.journal_keep} readable records past what the store "
                f"holds; {self.journal_loss}"
            )
        out += [
            f"backup     {self.data_dir}/damaged-<time>/ (the damaged files, untouched)",
            "copy       every table into a new store, skipping unreadable blocks",
        ]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "data": str(self.data_dir),
            "damage": self.problem or None,
            "resume": self.resume,
            "wal_size": self.wal_size,
            "wal_keep": self.wal_keep,
            "wal_commits": self.wal_commits,
            "journal_lost": self.journal_lost or None,
            "journal_keep": self.journal_keep,
            "journal_loss": self.journal_loss or None,
        }


@dataclass
class Salvaged:
    """What salvage kept and lost."""

    backup: str
    tables: dict[str, int] = field(default_factory=dict)  # rows kept, by table
    lost_rows: dict[str, int] = field(default_factory=dict)  # rows in unreadable blocks
    wal_dropped: int = 0  # WAL bytes not replayed
    last_seq: int = 0
    acknowledged_seq: int | None = None  # the last seq a commit had marked, if known
    journal_lsn: int | None = None  # the last journal record the new store holds
    journal_kept: int = 0  # readable records of the journal put into the new store
    lost_waiting: dict[str, list[int]] = field(default_factory=dict)  # queue -> seqs
    log_gaps: list[tuple[int, int]] = field(default_factory=list)  # seqs missing, ranges

    def to_json(self) -> dict[str, Any]:
        return {
            "backup": self.backup,
            "tables": self.tables,
            "lost_rows": self.lost_rows,
            "wal_dropped": self.wal_dropped,
            "last_seq": self.last_seq,
            "acknowledged_seq": self.acknowledged_seq,
            "journal_lsn": self.journal_lsn,
            "journal_kept": self.journal_kept,
            "lost_waiting": self.lost_waiting,
            "log_gaps": self.log_gaps,
        }

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> Salvaged:
        return cls(
            found["backup"],
            found["tables"],
            found["lost_rows"],
            found["wal_dropped"],
            found["last_seq"],
            found["acknowledged_seq"],
            found["journal_lsn"],
            found["journal_kept"],
            found["lost_waiting"],
            [(a, b) for a, b in found["log_gaps"]],
        )


def plan(data_dir: Path) -> SalvagePlan:
    """Find out whether and how the store of ``data_dir`` needs salvage; changes nothing.
    Takes the directory's lock for the moment (DataDirLocked while a node holds it)."""
    lock = DataDirLock(data_dir, create=False)
    try:
        return _plan(data_dir)
    finally:
        lock.release()


def _plan(data_dir: Path) -> SalvagePlan:
    path, wal_path = data_dir / DB_NAME, data_dir / (DB_NAME + ".wal")
    if (data_dir / JOURNAL).exists():
        return SalvagePlan(data_dir, "", 0, 0, 0, resume=True)
    if not path.exists():
        raise DataDirError(f"no eomsg data in {data_dir} (check --data)")
    scan = wal.scan(wal_path, verify=True)
    size = scan.size if scan else 0
    keep = scan.committed_end if scan and scan.readable else size
    commits = scan.commits if scan else 0
    problem = _problem(data_dir, path, wal_path)
    found, loss = _journal_damage(data_dir, path)
    if found is None:
        return SalvagePlan(data_dir, problem, size, keep, commits)
    return SalvagePlan(
        data_dir,
        problem or f"its journal is damaged ({found.damage})",
        size,
        keep,
        commits,
        journal_lost=found.damaged_lsn,
        journal_keep=len(found.records),
        journal_loss=loss,
    )


def _journal_damage(data_dir: Path, path: Path) -> tuple[journal.Scan | None, str]:
    """The journal's check when it is damaged past what DuckDB holds, and what that
    took in words (else None): what a node's open would refuse."""
    try:
        db = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None, ""  # the store itself is unreadable: salvaged first, looked at again
    try:
        applied = applied_lsn(db)
        legacy = journal_format(db) < journal.FORMAT
        found = journal.check(data_dir / journal.DIR_NAME, applied, legacy)
        return (found, journaled.loss(db, found).line()) if found.damage else (None, "")
    except duckdb.Error:
        return None, ""  # its node_meta cannot be read: the copy keeps the journal as is
    finally:
        db.close()


def _keep_journal(new: duckdb.DuckDBPyConnection, data_dir: Path, out: Salvaged) -> None:
    """Put every readable record of the journal past what the new store holds into it,
    holes and all (what a hole took is named by the plan). Left as it is when the store
    lost its note of what it applied yet holds messages: then which records it holds
    cannot be told (with none, it holds none of them)."""
    directory = data_dir / journal.DIR_NAME
    (noted,) = new.execute("SELECT count(*) FROM node_meta WHERE key = 'journal_lsn'").fetchall()[0]
    (held,) = new.execute("SELECT count(*) FROM messages").fetchall()[0]
    if not noted and held:
        return
    applied = applied_lsn(new)
    found = journal.scan(directory, applied, journal_format(new) < journal.FORMAT)
    out.journal_kept = len(found.records)
    out.journal_lsn = max(applied, journaled.apply(new, found.records))
    journaled.set_format(new)


def _problem(data_dir: Path, path: Path, wal_path: Path) -> str:
    """Why a node would refuse the store ("" if it would open it)."""
    mark_file = Watermark(data_dir)
    try:
        mark = mark_file.read()
    finally:
        mark_file.close()
    try:
        integrity.before_open(data_dir, wal_path, mark)
        db = duckdb.connect(str(path), read_only=True)
    except DataDirDamaged as e:
        return _bare(e.message)
    except duckdb.Error as e:
        return one_line(e)
    try:
        integrity.after_open(data_dir, mark, stored_seq(db))
        for (table,) in db.execute("SELECT table_name FROM duckdb_tables()").fetchall():
            # hashing whole rows reads every block of the table (a count would not)
            db.execute(f'SELECT bit_xor(hash(t)) FROM "{table}" t').fetchall()
    except DataDirDamaged as e:
        return _bare(e.message)
    except duckdb.Error as e:
        return one_line(e)
    finally:
        db.close()
    return ""


def _bare(message: str) -> str:
    """A DataDirDamaged message without its pointer to salvage."""
    return message.split("; run `eomsg salvage", 1)[0].split(" is damaged: ", 1)[-1]


def execute(p: SalvagePlan) -> Salvaged:
    """Carry out ``p`` (see the module docstring). UsageError if there is nothing to
    salvage; DataDirDamaged if nothing at all can be read."""
    if not p.needed:
        raise UsageError(f"{p.data_dir} is not damaged: nothing to salvage")
    data_dir = p.data_dir
    lock = DataDirLock(data_dir, create=False)
    try:
        if p.resume:
            return _swap(data_dir, json.loads((data_dir / JOURNAL).read_text()))
        return _salvage(p)
    finally:
        lock.release()


def _salvage(p: SalvagePlan) -> Salvaged:
    data_dir = p.data_dir
    mark_file = Watermark(data_dir)
    try:
        mark = mark_file.read()
    finally:
        mark_file.close()
    backup = data_dir / time.strftime("damaged-%Y%m%dT%H%M%S", time.gmtime())
    backup.mkdir(mode=0o700)
    for name in (DB_NAME, DB_NAME + ".wal", MARK_NAME):
        if (data_dir / name).exists():
            shutil.copy2(data_dir / name, backup / name)
            sync(backup / name)
    sync(backup)  # the originals are copied durably before anything replaces them
    if (data_dir / journal.DIR_NAME).exists():
        shutil.copytree(data_dir / journal.DIR_NAME, backup / journal.DIR_NAME)
        sync(backup)
    work = data_dir / WORK_DIR
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    shutil.copy2(data_dir / DB_NAME, work / DB_NAME)
    if p.wal_size:
        with (
            open(data_dir / (DB_NAME + ".wal"), "rb") as src,
            open(work / (DB_NAME + ".wal"), "wb") as dst,
        ):
            dst.write(src.read(p.wal_keep))
    result = Salvaged(str(backup), wal_dropped=p.wal_size - p.wal_keep)
    result.acknowledged_seq = mark.last_seq if mark else None
    skip = _mend(work / DB_NAME)
    fresh = data_dir / (DB_NAME + SALVAGED_SUFFIX)
    fresh.unlink(missing_ok=True)
    new = duckdb.connect(str(fresh))
    try:
        migrate(new)
        _attach_readable(new, work)
        _copy_tables(new, result, skip)
        new.execute("DETACH old")
        _keep_journal(new, data_dir, result)
        _name_losses(new, result)
        result.last_seq = stored_seq(new)
        new.execute("CHECKPOINT")
    finally:
        new.close()
    record = {"backup": str(backup), "result": result.to_json()}
    _write_synced(data_dir / JOURNAL, json.dumps(record))
    return _swap(data_dir, record)


def _attach_readable(new: duckdb.DuckDBPyConnection, work: Path) -> None:
    """Attach the work copy read-only as ``old``; without its WAL if even the cut WAL
    will not replay."""
    copy = str(work / DB_NAME)
    try:
        new.execute("ATTACH ? AS old (READ_ONLY)", [copy])
        return
    except duckdb.Error:
        (work / (DB_NAME + ".wal")).unlink(missing_ok=True)
    try:
        new.execute("ATTACH ? AS old (READ_ONLY)", [copy])
    except duckdb.Error as e:
        raise DataDirDamaged(
            f"nothing of {work.parent} can be read ({one_line(e)}); the damaged files are "
            "kept in its damaged-* directory"
        ) from e


Ranges = dict[str, list[tuple[int, int]]]  # by table: half-open rowid ranges


def _mend(path: Path) -> Ranges:
    """Make the data blocks of the store at ``path`` that fail their checksum readable
    again, giving each its checksum anew; return the rows they hold, to leave out. A
    damaged block that holds no table's data (metadata) is left as it is."""
    skip: Ranges = {}
    mended: set[int] = set()
    while True:
        try:
            db = duckdb.connect(str(path), read_only=True)
        except duckdb.Error:
            return skip  # not even its metadata: the copy says so
        try:
            location, rows = _first_bad_block(db)
        finally:
            db.close()
        if location is None or location in mended or not rows:
            return skip
        _reseal(path, location)
        mended.add(location)
        listed = [(t, lo, hi) for t, ranges in skip.items() for lo, hi in ranges]
        skip = {}
        for table, lo, hi in _merged(listed + rows):
            skip.setdefault(table, []).append((lo, hi))


def _first_bad_block(
    db: duckdb.DuckDBPyConnection,
) -> tuple[int | None, list[tuple[str, int, int]]]:
    """The file offset of the first block a full read fails on, and the rows of every
    table stored in it (none if it holds no table's data)."""
    tables = [t for (t,) in db.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    for table in tables:
        try:
            db.execute(f'SELECT bit_xor(hash(t)) FROM "{table}" t').fetchall()
        except duckdb.Error as e:
            found = _LOCATION.search(str(e))
            if found is None:
                return None, []
            location = int(found.group(1))
            block = (location - integrity.HEADERS) // BLOCK
            rows = []
            for name in tables:
                first = _row_group_starts(db, name)
                for group, start, count in db.execute(
                    "SELECT row_group_id, start, count FROM pragma_storage_info(?) "
                    "WHERE block_id = ? AND persistent",
                    [name, block],
                ).fetchall():
                    lo = first[int(group)] + int(start)
                    rows.append((name, lo, lo + int(count)))
            return location, rows
    return None, []


def _row_group_starts(db: duckdb.DuckDBPyConnection, table: str) -> dict[int, int]:
    """The first row of each row group of ``table``. Their sizes differ within one
    file: DuckDB's default (122,880 rows) where compaction, salvage or an eomsg from
    before :data:`eomsg.store.opening.ROW_GROUP_ROWS` wrote them, that where the node did."""
    sizes = db.execute(
        "SELECT row_group_id, max(start + count) FROM pragma_storage_info(?) "
        "WHERE column_id = 0 GROUP BY row_group_id ORDER BY row_group_id",
        [table],
    ).fetchall()
    first, at = {}, 0
    for group, size in sizes:
        first[int(group)] = at
        at += int(size)
    return first


def _merged(rows: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Row ranges by table with overlaps joined: a block holds a segment of each of
    several columns of the same rows, each listed apart (counted once, not per column)."""
    out: list[tuple[str, int, int]] = []
    for table, lo, hi in sorted(rows):
        if out and out[-1][0] == table and lo <= out[-1][2]:
            out[-1] = (table, out[-1][1], max(hi, out[-1][2]))
        else:
            out.append((table, lo, hi))
    return out


def _reseal(path: Path, location: int) -> None:
    """Write the checksum of the block at ``location`` anew (DuckDB's: the checksum of
    the rest of the block, in its first 8 bytes)."""
    with open(path, "r+b") as f:
        f.seek(location)
        block = f.read(BLOCK)
        f.seek(location)
        f.write(struct.pack("<Q", wal.checksum(block[8:])))


def _copy_tables(new: duckdb.DuckDBPyConnection, out: Salvaged, skip: Ranges) -> None:
    """Copy every table of ``old`` into the new store's (its schema made by migrate),
    but for the rows in ``skip``."""
    tables = [
        t
        for (t,) in new.execute(
            """SELECT table_name FROM duckdb_tables()
               WHERE database_name = current_database() AND table_name <> 'schema_migrations'"""
        ).fetchall()
    ]
    present = {
        t
        for (t,) in new.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'old'"
        ).fetchall()
    }
    for table in tables:
        if table not in present:
            continue
        # The old store's columns: a store from before a migration that added some lacks
        # them (they are filled below, as that migration fills them).
        columns = ", ".join(
            f'"{c}"'
            for (c,) in new.execute(
                """SELECT column_name FROM duckdb_columns()
                   WHERE database_name = 'old' AND table_name = ? ORDER BY column_index""",
                [table],
            ).fetchall()
        )
        try:
            (bound,) = new.execute(
                f'SELECT greatest(coalesce(max(rowid) + 1, 0), count(*)) FROM old."{table}"'
            ).fetchall()[0]
        except duckdb.Error:
            bound = 1 << 40  # its rowids cannot be read: try the whole range, halving
        kept = lost = 0
        left_out = skip.get(table, [])
        for lo, hi in left_out:
            (n,) = new.execute(
                f'SELECT count(*) FROM old."{table}" WHERE rowid >= ? AND rowid < ?', [lo, hi]
            ).fetchall()[0]
            lost += int(n)
        for lo in range(0, int(bound), CHUNK):
            k, miss = _copy_range(new, table, columns, lo, min(lo + CHUNK, int(bound)), left_out)
            kept, lost = kept + k, lost + miss
        out.tables[table] = kept
        if lost:
            out.lost_rows[table] = lost
    # (Every result above is fetched whole: DuckDB refuses a relation while one is open.)
    hash_publish_ids(new)
    route_runs_from_destinations(new)
    (top,) = new.execute("SELECT coalesce(max(queue_id), 0) FROM queues").fetchall()[0]
    new.execute(f"CREATE OR REPLACE SEQUENCE queue_ids START {int(top) + 1}")


def _name_losses(new: duckdb.DuckDBPyConnection, out: Salvaged) -> None:
    """Name the acknowledged messages the new store lacks: those its queues still waited
    for (their destination rows, dropped so that no queue counts what it cannot hand
    out), and the seqs missing inside the log (lost, or never written: messages a link
    held in memory and whose consumers settled them there)."""
    waiting = new.execute(
        """SELECT q.name, d.seq FROM destinations d
           JOIN queues q ON q.queue_id = d.queue_id
           ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
           ANTI JOIN messages m ON m.seq = d.seq
           ORDER BY q.name, d.seq"""
    ).fetchall()
    for name, seq in waiting:
        out.lost_waiting.setdefault(str(name), []).append(int(seq))
    new.execute(
        """DELETE FROM destinations d WHERE d.queue_id > 0
           AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.seq = d.seq)
           AND NOT EXISTS (SELECT 1 FROM settled s
                           WHERE s.queue_id = d.queue_id AND s.seq = d.seq)"""
    )
    # The ids of lost messages are forgotten, so that a producer's retry of one is
    # taken as new (kept, it would be answered with the seq of a message that is gone).
    # Below the log's horizon an id outlives its message by its own expiry: kept.
    new.execute(
        """DELETE FROM publish_ids p WHERE p.seq >= ?
           AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.seq = p.seq)""",
        [logread.horizon(new)[0]],
    )
    out.log_gaps = [
        (int(a), int(b))
        for a, b in new.execute(
            """SELECT seq + 1, next - 1 FROM (
                   SELECT seq, lead(seq) OVER (ORDER BY seq) AS next FROM messages)
               WHERE next > seq + 1 ORDER BY seq"""
        ).fetchall()
    ]


def _copy_range(
    new: duckdb.DuckDBPyConnection,
    table: str,
    columns: str,
    lo: int,
    hi: int,
    left_out: Sequence[tuple[int, int]] = (),
) -> tuple[int, int]:
    """Copy ``columns`` of the rows of ``old.table`` with rowid in ``[lo, hi)``, but those
    ``left_out`` (one statement: all or nothing): (rows kept, rows lost), halving the
    range around a block that cannot be read down to :data:`SMALLEST` rows, given up as
    lost."""
    where = "rowid >= ? AND rowid < ?" + " AND NOT (rowid >= ? AND rowid < ?)" * len(left_out)
    params = [lo, hi, *(x for r in left_out for x in r)]
    try:
        (n,) = new.execute(
            f'INSERT INTO main."{table}" ({columns}) SELECT {columns} FROM old."{table}" '
            f"WHERE {where}",
            params,
        ).fetchall()[0]
        return int(n), 0
    except duckdb.Error:
        if hi - lo <= SMALLEST:
            try:
                (n,) = new.execute(
                    f'SELECT count(*) FROM old."{table}" WHERE {where}', params
                ).fetchall()[0]
            except duckdb.Error:
                n = hi - lo  # not even its row ids can be read: at most this many
            return 0, int(n)
        mid = (lo + hi) // 2
        a = _copy_range(new, table, columns, lo, mid, left_out)
        b = _copy_range(new, table, columns, mid, hi, left_out)
        return a[0] + b[0], a[1] + b[1]


def _swap(data_dir: Path, record: dict[str, Any]) -> Salvaged:
    """Put the salvaged store in place (idempotent: a run that died here is redone)."""
    fresh = data_dir / (DB_NAME + SALVAGED_SUFFIX)
    failpoint("salvage.swap")
    if fresh.exists():
        os.replace(fresh, data_dir / DB_NAME)
    (data_dir / (DB_NAME + ".wal")).unlink(missing_ok=True)
    result = record["result"]
    if result["journal_lsn"] is not None:  # its records are in the new store now
        journal.restart(data_dir / journal.DIR_NAME, int(result["journal_lsn"]))
    mark = Watermark(data_dir)
    try:
        mark.write(Mark(0, int(result["last_seq"])))
    finally:
        mark.close()
    spill.remove(data_dir)  # it may know ids of messages lost: a retry of one is taken
    shutil.rmtree(data_dir / WORK_DIR, ignore_errors=True)
    for entry in data_dir.iterdir():
        owner_only(entry)
    (data_dir / JOURNAL).unlink()
    return Salvaged.from_json({"backup": record["backup"], **result})


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    sync(path.parent)
