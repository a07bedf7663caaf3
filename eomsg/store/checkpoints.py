"""When DuckDB's WAL is folded into the store's file, and the watermark that must say so
first (:mod:`eomsg.store.watermark`).

The writer calls :meth:`Checkpoints.committed` after each commit and
:meth:`Checkpoints.checkpoint` between commits when the WAL outgrew its bound; opening
calls :meth:`Checkpoints.bound` while it applies the journal, as the writer would. The
order is the durability contract: the mark says "empty WAL", synced, before a checkpoint
shrinks the WAL, so no crash leaves a mark above the WAL (taken for lost writes at the
next open).
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from eomsg.store import logread
from eomsg.store.files import owner_only
from eomsg.store.opening import CATALOG
from eomsg.store.watermark import Mark, Watermark


def _file_size(path: Path) -> int:
    """The size of ``path`` in bytes, 0 if there is no such file."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class Checkpoints:
    """The WAL of one opened store (``wal_path``), its bound (``wal_limit``, bytes) and
    the watermark written after each commit and before each checkpoint."""

    def __init__(self, mark: Watermark, wal_path: Path, wal_limit: int) -> None:
        self._mark = mark
        self.wal_path = wal_path
        self.wal_limit = wal_limit

    def mark(self, last_seq: int) -> None:
        """Mark how long the WAL is and the last seq stored (at open, before the writer
        runs: what it marks after each commit)."""
        self._mark.write(Mark(_file_size(self.wal_path), last_seq))

    def committed(self, last_seq: int) -> bool:
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

    def checkpoint(self, conn: duckdb.DuckDBPyConnection, last_seq: int) -> None:
        """Merge the WAL into the store file. The mark says "empty WAL" first, synced:
        a checkpoint shrinks the WAL, and a mark left above it would be taken for lost
        writes at the next open."""
        self.mark_empty(last_seq)
        conn.execute(f"CHECKPOINT {CATALOG}")

    def bound(self, db: duckdb.DuckDBPyConnection) -> None:
        """Checkpoint ``db`` if its WAL outgrew the bound, as the writer would: for the
        journal's records applied at open, before the writer runs."""
        if _file_size(self.wal_path) > self.wal_limit:
            self.checkpoint(db, logread.stored_seq(db))

    def mark_empty(self, last_seq: int) -> None:
        """Mark the WAL empty, synced: before anything that checkpoints (a clean close
        does, whether asked to or not)."""
        self._mark.write(Mark(0, last_seq), sync=True)
