"""Publish ids that left the node's memory: the oldest of its dedup window, on disk.

The dedup window (:mod:`eomsg.core.dedup`) remembers an id as long as its message can
live — a day by default — which at a steady rate is more ids than memory should hold.
Past its share of the node's memory the window hands its oldest run here, and an id it
does not find in memory is looked up here before it counts as new. DuckDB holds every
id too (``publish_ids``), but only a scan could find one there; this is SQLite, a B-tree
on each id's hash, so a lookup costs a seek, and its page cache is bounded.

It is an index of what the store holds, never the only copy: the ids it covers — every
live one numbered below :attr:`SpilledIds.covered` — are in ``publish_ids`` too. A
spill commits with the new ``covered`` in one transaction, so a crash leaves it as it
was before or after; opening a node loads the ids from ``covered`` on from DuckDB. A
file that cannot be read is emptied, and the open loads every id from DuckDB; salvage
deletes the file (:func:`remove`), since it may name ids of messages salvage lost.

Most ids looked up are new, and a new id would cost a seek each: a filter in memory
(a bitmap of the hashes here, :meth:`SpilledIds.start_filter`) answers "not here" for
most of them without SQLite. A bit is set before an id's run leaves the window's memory
and is never cleared (an id collected leaves a false "maybe", which SQLite answers);
until the filter has read the hashes already here (:meth:`SpilledIds.fill_filter`, a
chunk at a time on the maintenance thread) every lookup goes to SQLite.

File: ``DIR/dedup.sqlite`` (owner-only), rows ``(seq, h, id, expires)``: ``seq`` is the
rowid (garbage collection drops a range of it), ``h`` the id's 32-bit hash, indexed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from eomsg.core.dedup import RetainedIds, hashes_of, id_hash
from eomsg.store.files import PRIVATE_FILE, owner_only

NAME = "dedup.sqlite"
CHUNK = 50_000  # rows a transaction writes or deletes: lookups get in between
FILTER_BYTES = 16 << 20  # the filter's bitmap at most (2^27 bits)
CACHE_BYTES = 8 << 20  # SQLite's page cache
log = logging.getLogger("eomsg.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ids (
    seq INTEGER PRIMARY KEY,  -- the rowid: a range of it is deleted by garbage collection
    h INTEGER NOT NULL,
    id TEXT NOT NULL,
    expires REAL  -- seconds; NULL: lives as long as the log keeps it
);
CREATE INDEX IF NOT EXISTS ids_h ON ids (h);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class SpilledIds:
    """The spilled publish ids of one data directory (see the module docstring).
    Thread-safe: lookups (under the node's lock) and spills and collections (on the
    maintenance thread) take turns, a chunk at a time."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / NAME
        self._lock = threading.Lock()
        try:
            self._open()
        except sqlite3.DatabaseError as e:  # damaged: it is only an index, made anew
            log.warning("%s cannot be read (%s): making it anew from the store", self.path, e)
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            remove(data_dir)
            self._open()

    def _open(self) -> None:
        if not self.path.exists():
            self.path.touch(mode=PRIVATE_FILE)
        owner_only(self.path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")  # an index of what DuckDB holds
        self._db.execute(f"PRAGMA cache_size = -{CACHE_BYTES >> 10}")
        self._db.execute("PRAGMA mmap_size = 0")
        self._db.executescript(_SCHEMA)
        self._covered = self._meta("covered")
        self._count = self._meta("count")  # about: a count(*) would read the whole index
        self._filter: np.ndarray | None = None  # the bitmap of hashes, once started
        self._shift = 32
        self._unread: int | None = None  # the seq its reading of the file goes on from

    def start_filter(self, nbytes: int) -> None:
        """Keep a filter of about ``nbytes`` (a power of two, at most FILTER_BYTES; none
        below 4 KiB) of the hashes here; it answers once :meth:`fill_filter` has read
        every hash the file held."""
        size = min(FILTER_BYTES, 1 << max(0, nbytes.bit_length() - 1))
        if size < 4096:
            return
        with self._lock:
            self._filter = np.zeros(size, np.uint8)
            self._shift = 32 - (size * 8).bit_length() + 1
            self._unread = 0 if self._count else None

    def fill_filter(self) -> bool:
        """Read the next chunk of the hashes here into the filter; True once it holds
        them all (it answers from then on)."""
        with self._lock:
            start = self._unread
            if start is None or self._filter is None:
                return True
            rows = self._db.execute(
                "SELECT seq, h FROM ids WHERE seq >= ? ORDER BY seq LIMIT ?", [start, CHUNK]
            ).fetchall()
        if rows:
            self._mark(np.fromiter((h for _, h in rows), np.uint32, len(rows)))
        with self._lock:
            self._unread = None if len(rows) < CHUNK else rows[-1][0] + 1
            return self._unread is None

    def _mark(self, hashes: np.ndarray) -> None:
        if self._filter is not None:
            bits = hashes >> self._shift
            np.bitwise_or.at(self._filter, bits >> 3, (1 << (bits & 7)).astype(np.uint8))

    def _maybe(self, msg_ids: Sequence[str]) -> Sequence[str]:
        """Those of ``msg_ids`` that may be here (all of them until the filter answers)."""
        bitmap = self._filter
        if bitmap is None or self._unread is not None:
            return msg_ids
        bits = hashes_of(msg_ids) >> self._shift
        maybe = (bitmap[bits >> 3] >> (bits & 7)) & 1
        return [msg_id for msg_id, m in zip(msg_ids, maybe.tolist(), strict=True) if m]

    @property
    def filter_bytes(self) -> int:
        return 0 if self._filter is None else len(self._filter)

    def _meta(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return int(row[0]) if row else 0

    @property
    def covered(self) -> int:
        """Every live id numbered below it is here (0: none is)."""
        return self._covered

    def __len__(self) -> int:
        return self._count

    def add(self, run: RetainedIds) -> None:
        """Put the ids of ``run`` here (a chunk a transaction), then note that every id
        below the run's last seq is: the run is the window's oldest, so what is older
        was spilled before. Idempotent (a row's seq is its key)."""
        self._mark(run.hashes)  # first: a lookup that skips SQLite finds it in memory meanwhile
        order = run.seqs.argsort()
        seqs, hashes, expires = run.seqs[order], run.hashes[order], run.expires[order]
        ids = run.ids.take(order.astype("int64"))
        for lo in range(0, len(seqs), CHUNK):
            hi = min(lo + CHUNK, len(seqs))
            rows = zip(
                seqs[lo:hi].tolist(),
                hashes[lo:hi].tolist(),
                ids.slice(lo, hi - lo).to_pylist(),
                [None if math.isnan(e) else e for e in expires[lo:hi].tolist()],
                strict=True,
            )
            with self._lock:
                self._db.execute("BEGIN")
                self._db.executemany("INSERT OR REPLACE INTO ids VALUES (?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")
        covered = max(self._covered, run.last_seq + 1)
        with self._lock:
            # Those below what was covered were here already (the same run again, after
            # the window merged or swept it as it was written): counted once.
            self._count += int((seqs >= self._covered).sum())
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [("covered", covered), ("count", self._count)],
            )
            self._covered = covered

    def find(self, msg_ids: Sequence[str], now: float, horizon: int) -> dict[str, int]:
        """The seqs of those of ``msg_ids`` that are here and can still live (expiry
        and the log's horizon checked, as the window does): one indexed query for the
        batch, the id itself compared at each hash match — for the ids the filter does
        not rule out."""
        if not msg_ids or not self._count:
            return {}
        msg_ids = self._maybe(msg_ids)
        if not msg_ids:
            return {}
        wanted = {id_hash(i) for i in msg_ids}
        names = set(msg_ids)
        found: dict[str, int] = {}
        with self._lock:
            for lo in range(0, len(wanted), 500):  # SQLite's bound on parameters
                part = list(wanted)[lo : lo + 500]
                rows = self._db.execute(
                    f"SELECT id, seq, expires FROM ids WHERE h IN ({','.join('?' * len(part))})",
                    part,
                ).fetchall()
                for msg_id, seq, expires in rows:
                    if msg_id not in names:
                        continue
                    live = expires > now if expires is not None else seq >= horizon
                    if live and seq > found.get(msg_id, -1):
                        found[msg_id] = seq
        return found

    def forget_below(self, horizon: int, now: float) -> int:
        """Drop the ids numbered below ``horizon`` (their messages left the log) — but
        those with a time to live that has not run out, which the window remembers until
        it has — a chunk a transaction; how many."""
        dropped = 0
        while True:
            with self._lock:
                done = self._db.execute(
                    """DELETE FROM ids WHERE seq IN (
                           SELECT seq FROM ids
                           WHERE seq < ? AND (expires IS NULL OR expires <= ?) LIMIT ?)""",
                    [horizon, now, CHUNK],
                ).rowcount
                self._count = max(0, self._count - done)
                if done:
                    self._db.execute(
                        "INSERT OR REPLACE INTO meta VALUES ('count', ?)", [self._count]
                    )
            dropped += done
            if done < CHUNK:
                return dropped

    @property
    def disk_bytes(self) -> int:
        with contextlib.suppress(OSError):
            return self.path.stat().st_size
        return 0

    def close(self) -> None:
        with self._lock:
            self._db.close()


def remove(data_dir: Path) -> None:
    """Delete the spill file of ``data_dir`` and SQLite's files beside it (idempotent):
    the next open loads every live id from DuckDB."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{data_dir / NAME}{suffix}").unlink(missing_ok=True)
