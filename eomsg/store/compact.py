"""``eomsg compact``: give back the disk space a store no longer uses.

DuckDB reuses the blocks that deletes free (settled messages, collected log), but never
shrinks its file. Compaction copies what the store holds now into a new file and swaps
it in: the copy is written and synced under a temporary name, then renamed over the old
file in one atomic step, so a compaction killed at any point leaves either the old store
or the new one, each whole. It runs with no node holding the directory (it takes the
directory's lock), since the node's connection must not see files change under it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import duckdb

from eomsg.errors import DataDirError, one_line
from eomsg.failpoints import failpoint
from eomsg.store import integrity
from eomsg.store.files import DB_NAME, owner_only, sync
from eomsg.store.lock import DataDirLock
from eomsg.store.logread import stored_seq
from eomsg.store.schema import migrate
from eomsg.store.watermark import Mark, Watermark

COMPACT_SUFFIX = ".compact"  # the copy's name while it is written


@dataclass(frozen=True, slots=True)
class Compacted:
    """Sizes of the store before (its file and WAL) and after compaction, in bytes."""

    before: int
    after: int

    def to_json(self) -> dict[str, int]:
        return {"before": self.before, "after": self.after, "freed": self.before - self.after}


def leftovers(data_dir: Path) -> list[Path]:
    """Files a compaction that was killed left behind (never the store itself)."""
    return sorted(data_dir.glob(DB_NAME + COMPACT_SUFFIX + "*"))


def compact(data_dir: Path) -> Compacted:
    """Rewrite the store of ``data_dir`` into a file of just what it holds, atomically.
    DataDirLocked while a node holds the directory; DataDirDamaged if the store fails
    the checks a node makes at open (salvage it first)."""
    lock = DataDirLock(data_dir, create=False)
    mark = Watermark(data_dir)
    try:
        path = data_dir / DB_NAME
        wal = data_dir / (DB_NAME + ".wal")
        if not path.exists():
            raise DataDirError(f"no eomsg data in {data_dir} yet (check --data)")
        for stale in leftovers(data_dir):
            stale.unlink()
        before = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        known = mark.read()
        integrity.before_open(data_dir, wal, known)
        fresh = data_dir / (DB_NAME + COMPACT_SUFFIX)
        last = _copy(path, fresh, data_dir, known, mark)
        sync(fresh)
        failpoint("compact.before_swap")
        os.replace(fresh, path)  # the atomic step: old store, or new one
        sync(data_dir)
        wal.unlink(missing_ok=True)  # checkpointed into the copy; belongs to the old file
        mark.write(Mark(0, last))
        owner_only(path)
        return Compacted(before, path.stat().st_size)
    finally:
        mark.close()
        lock.release()


def _copy(path: Path, fresh: Path, data_dir: Path, known: Mark | None, mark: Watermark) -> int:
    """Copy the store at ``path`` into ``fresh``; returns its last seq."""
    try:
        db = duckdb.connect(str(path))
    except duckdb.Error as e:
        if integrity.is_damage(e):
            raise integrity.damaged(data_dir, one_line(e)) from e
        raise DataDirError(f"cannot open {path}: {one_line(e)}") from e
    try:
        migrate(db)
        last = stored_seq(db)
        integrity.after_open(data_dir, known, last)
        mark.write(Mark(0, last), sync=True)  # before the checkpoint empties the WAL
        db.execute("CHECKPOINT")
        (name,) = db.execute("SELECT current_database()").fetchone() or ("",)
        db.execute("ATTACH ? AS compacted", [str(fresh)])
        db.execute(f'COPY FROM DATABASE "{name}" TO compacted')
        db.execute("DETACH compacted")
    except duckdb.Error as e:
        if integrity.is_damage(e):
            raise integrity.damaged(data_dir, one_line(e)) from e
        raise DataDirError(
            f"compacting {path} failed, the store is as it was: {one_line(e)}"
        ) from e
    finally:
        db.close()
    return last
