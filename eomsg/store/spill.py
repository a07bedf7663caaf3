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
file that cannot be read (or one an older eomsg wrote) is emptied, and the open loads
every id from DuckDB; salvage deletes the file (:func:`remove`), since it may name ids
of messages salvage lost.

**Partitions**, so that a spill costs the same after a month as after a minute. The ids
go into tables of about :data:`PART_ROWS` each, by seq (``part_1``, ``part_2``, …; the
newest takes each run until it is full). A run is written in its hash order into the
newest table's index only, so a spill touches a bounded number of pages — one B-tree
over every id would take random inserts across a file that grows with the window, each
a page read and written (measured: 180,000 ids/s at one million ids, falling to 55,000
at seven million; partitioned, flat near 200,000). Garbage collection drops a table
whole once every id in it is dead (``DROP TABLE``, not a ``DELETE`` through an index).
A lookup queries the tables newest first, and stops for an id once it is found live:
what an older table holds is numbered lower.

Most ids looked up are new, and a new id would cost a query per table: a filter in
memory (a Bloom filter of the hashes here, :meth:`SpilledIds.start_filter`) answers "not
here" for most of them without SQLite. With one bit an id, 8 % of new ids passed the
16 MiB filter once it held 11 million, each a query per table — a node's lookups grew
with its spilled ids, the very cost partitions bound; with four, 0.6 %. As more ids
fill it, fewer probes rule out more (:func:`_probes`): the filter is read anew with
fewer once that holds for the ids here, as it is when tables are dropped. The
bits are set before an id's run leaves the window's memory; until the filter has read
the hashes already here (:meth:`SpilledIds.fill_filter`, a bounded number at a time on
the maintenance thread) every lookup goes to SQLite. Once tables are dropped a new
filter is read from what is left while the old one (a superset) still answers, so the
filter tracks the ids that can still live rather than every id ever spilled.

Lookups read through a connection of their own: SQLite's WAL gives them the last
committed state while a spill writes, so a publish never waits for one. Rows go in and
hashes come out as one JSON array a statement, never a row a step: Python's ``sqlite3``
lets go of the GIL at every step, and a thread that must win it back a row at a time from
the busy event loop took minutes over one run (measured: 65,536 rows in 136 s beside a
busy thread with ``executemany``, 0.22 s as one ``json_each``).

File: ``DIR/dedup.sqlite`` (owner-only); table ``parts`` lists the partitions
``(n, hi, count, expires)``: ``hi`` is above every seq in ``part_n``, ``expires`` the
latest time to live in it; each ``part_n`` has rows ``(seq, h, id, expires)`` with
``seq`` the rowid and ``h`` the id's 32-bit hash, indexed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from eomsg.errors import StorageError
from eomsg.store.files import PRIVATE_FILE, owner_only

if TYPE_CHECKING:  # numpy and Arrow: imported once a run or a partition is here
    import numpy as np

    from eomsg.core.idruns import HashBitmap, RetainedIds

NAME = "dedup.sqlite"
PART_ROWS = 1 << 20  # ids a partition takes before the next is started
CHUNK = 50_000  # hashes a filter reads at a time (lookups get in between)
FILL_ROWS = 4 * CHUNK  # hashes :meth:`SpilledIds.fill_filter` reads a call
FILTER_BYTES = 16 << 20  # the filter's bitmap at most (2^27 bits)
PROBES = 4  # the filter's bits an id at most (fewer as ids fill it up: :func:`_probes`)
MARK_ROWS = 1 << 16  # hashes marked at a time, lookups waiting meanwhile
CACHE_BYTES = 8 << 20  # SQLite's page cache, for each of the two connections
WAL_BYTES = 16 << 20  # the WAL is cut back to this after a checkpoint
P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("eomsg.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS parts (
    n INTEGER PRIMARY KEY,  -- its table is part_<n>
    hi INTEGER NOT NULL,  -- above every seq in it
    count INTEGER NOT NULL,
    expires REAL  -- the latest time to live of its ids; NULL: none has one
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class _Part:
    """One partition's row of ``parts``."""

    n: int
    hi: int
    count: int
    expires: float | None

    @property
    def table(self) -> str:
        return f"part_{self.n}"

    def dead(self, horizon: int, now: float) -> bool:
        """Every id in it is: the log collected them, and any time to live ran out."""
        return self.hi <= horizon and (self.expires is None or self.expires <= now)


def _json_rows(run: RetainedIds, new: np.ndarray, expires: np.ndarray) -> Iterator[str]:
    """The rows of ``run`` at positions ``new`` (whose expiries are ``expires``) as JSON
    arrays of (seq, hash, id, expires) rows, CHUNK at a time: one chunk's copy at a time
    in memory."""
    for lo in range(0, len(new), CHUNK):
        some = new[lo : lo + CHUNK]
        rows = zip(
            run.seqs[some].tolist(),
            run.hashes[some].tolist(),
            run.ids_at(some).to_pylist(),
            [None if math.isnan(e) else e for e in expires[lo : lo + CHUNK].tolist()],
            strict=True,
        )
        yield json.dumps(list(rows))


def _maintenance(method: Callable[P, R]) -> Callable[P, R]:
    """A spill, a collection, or a step of a filter's reading: one at a time (each
    changes the partitions and the filters in more than one step), and what SQLite or a
    damaged file raises becomes a StorageError naming the file (the node's maintenance
    logs it and tries again at its next tick)."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        spill = args[0]
        assert isinstance(spill, SpilledIds)
        with spill._maintaining, spill._failures():
            return method(*args, **kwargs)

    return run


def _probes(nbytes: int, ids: int) -> int:
    """The probes an id of a filter of ``nbytes`` holding ``ids`` hashes that let the
    fewest new ids through: ln 2 times its bits an id, 1 to :data:`PROBES`."""
    return max(1, min(PROBES, round(math.log(2) * 8 * nbytes / max(ids, 1))))


class SpilledIds:
    """The spilled publish ids of one data directory (see the module docstring).
    Thread-safe: lookups (under the node's lock) read through their own connection and
    wait only while the list of partitions or a filter changes; spills, collections and
    the filter's reading (on the maintenance thread) take turns and write through the
    other connection."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / NAME
        self._maintaining = threading.Lock()  # see _maintenance; taken before the others
        self._lock = threading.Lock()  # the writing connection
        self._reading = threading.Lock()  # the reading connection and ``_parts``
        try:
            self._open()
        except (sqlite3.DatabaseError, TypeError, ValueError) as e:  # damaged or old: it is
            # only an index, made anew
            log.warning("%s cannot be used (%s): making it anew from the store", self.path, e)
            self._close_quietly()
            remove(data_dir)
            self._open()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA cache_size = -{CACHE_BYTES >> 10}")
        db.execute("PRAGMA mmap_size = 0")
        return db

    def _open(self) -> None:
        if not self.path.exists():
            self.path.touch(mode=PRIVATE_FILE)
        owner_only(self.path)
        self._db = self._connect()
        self._reader: sqlite3.Connection | None = None
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")  # an index of what DuckDB holds
        self._db.execute(f"PRAGMA journal_size_limit = {WAL_BYTES}")  # (a spill is one
        # transaction: a WAL left the size of the largest would stay so)
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'ids'").fetchone():
            raise sqlite3.DatabaseError("written by an older eomsg, as one table")
        self._db.executescript(_SCHEMA)
        self._reader = self._connect()
        self._reader.execute("PRAGMA query_only = 1")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'covered'").fetchone()
        self._covered = int(row[0]) if row else 0
        self._parts = [
            _Part(int(n), int(hi), int(count), None if e is None else float(e))
            for n, hi, count, e in self._db.execute(
                "SELECT n, hi, count, expires FROM parts ORDER BY n"
            )
        ]
        tables = {t for (t,) in self._db.execute("SELECT name FROM sqlite_master")}
        for part in self._parts:
            if part.table not in tables:
                raise sqlite3.DatabaseError(f"{part.table}, listed in parts, is missing")
        self._last_n = self._parts[-1].n if self._parts else 0
        self._filter: HashBitmap | None = None  # answers "not here" once it holds every hash
        self._filling: HashBitmap | None = None  # reading the hashes here, to answer next
        self._planned = 0  # bytes of the filter made at the first spill, when none is yet
        self._unread: list[tuple[int, int]] = []  # what it has still to read: (n, from seq)

    def _close_quietly(self) -> None:
        for db in (getattr(self, "_db", None), getattr(self, "_reader", None)):
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()

    # -- the filter ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, ValueError, OverflowError) as e:
            raise StorageError(f"the dedup spill {self.path} failed: {e}") from e

    @_maintenance
    def start_filter(self, nbytes: int) -> None:
        """Keep a filter of about ``nbytes`` (a power of two, at most FILTER_BYTES; none
        below 4 KiB) of the hashes here; it answers once :meth:`fill_filter` has read
        every hash the file held."""
        size = min(FILTER_BYTES, 1 << max(0, nbytes.bit_length() - 1))
        if size < 4096:
            return
        with self._reading:
            if self._parts:
                from eomsg.core.idruns import HashBitmap  # ids are here: numpy is needed

                self._refill(HashBitmap(size, _probes(size, len(self))))
            else:  # empty: made with the first run spilled (a store without spilled ids
                self._planned = size  # never loads numpy), and counted from now on

    def _refill(self, filter_: HashBitmap) -> None:
        """Read every partition into ``filter_``, to answer once it has. Under ``_reading``."""
        self._filling = filter_
        self._unread = [(p.n, 0) for p in self._parts]

    @_maintenance
    def fill_filter(self) -> bool:
        """Read up to :data:`FILL_ROWS` more of the hashes here into the filter being
        filled; True once none is (the filter answers from then on)."""
        for _ in range(FILL_ROWS // CHUNK):
            with self._reading:
                if self._filling is None:
                    return True
                if not self._unread:
                    self._filter, self._filling = self._filling, None
                    return True
                n, start = self._unread[0]
                hashes: list[int] = []
                last = start
                if any(p.n == n for p in self._parts):  # (it may have been dropped)
                    found, last = self._reader.execute(  # type: ignore[union-attr]
                        f"""SELECT json_group_array(h), max(seq) FROM (
                                SELECT seq, h FROM part_{n} WHERE seq >= ? ORDER BY seq LIMIT ?)""",
                        [start, CHUNK],
                    ).fetchone()
                    hashes = json.loads(found)
                if hashes:
                    self._filling.mark(hashes)
                if len(hashes) < CHUNK:
                    del self._unread[0]
                else:
                    self._unread[0] = (n, last + 1)
        return False

    def _mark(self, hashes: np.ndarray) -> None:
        """Set the bits of ``hashes`` a slice at a time, lookups getting in between (a
        run's million hashes, four bits each, take a third of a second): bits are only
        ever set, and the ids are still in the window's memory until this returns."""
        for lo in range(0, len(hashes), MARK_ROWS):
            with self._reading:
                for f in (self._filter, self._filling):
                    if f is not None:
                        f.mark(hashes[lo : lo + MARK_ROWS])

    @property
    def filter_bytes(self) -> int:
        made = sum(f.nbytes for f in (self._filter, self._filling) if f is not None)
        return made + self._planned

    # -- what is here -------------------------------------------------------------------

    @property
    def covered(self) -> int:
        """Every live id numbered below it is here (0: none is)."""
        return self._covered

    def __len__(self) -> int:
        """Ids on disk: those of the partitions not yet dropped (some may be dead)."""
        return sum(p.count for p in self._parts)

    @property
    def partitions(self) -> int:
        return len(self._parts)

    @_maintenance
    def add(self, run: RetainedIds) -> None:
        """Put the ids of ``run`` here and note that every id below the run's last seq
        is, in one transaction: the run is the window's oldest, so what is older was
        spilled before. Idempotent: ids below what was covered are here already (the
        same run again, after the window merged or swept it as it was written)."""
        if self._planned:
            from eomsg.core.idruns import HashBitmap  # (loaded: the run is one)

            with self._reading:
                self._filter, self._planned = HashBitmap(self._planned, PROBES), 0
        self._mark(run.hashes)  # first: a lookup that skips SQLite finds it in memory meanwhile
        new = (run.seqs >= self._covered).nonzero()[0]  # in hash order, as the run is
        covered = max(self._covered, run.last_seq + 1)
        if not len(new):
            return
        expires = run.expires[new]
        timed = expires[expires == expires]  # those not NaN: with a time to live
        latest = float(timed.max()) if len(timed) else None
        with self._lock:
            part, fresh = self._grown(len(new), covered, latest)
            self._write(part, fresh, covered, _json_rows(run, new, expires))
            self._took(part, fresh)
            self._covered = covered

    def _grown(self, count: int, covered: int, latest: float | None) -> tuple[_Part, bool]:
        """The newest partition's row once ``count`` more ids covering seqs below
        ``covered``, expiring at ``latest`` at most (None: never), are added — and True if
        that is a new partition (there is none yet, or the newest is full). Under the
        lock; changes nothing."""
        newest = self._parts[-1] if self._parts else None
        fresh = newest is None or newest.count >= PART_ROWS
        if fresh:
            newest = _Part(self._last_n + 1, 0, 0, None)
        assert newest is not None
        part = replace(
            newest,
            hi=max(newest.hi, covered),
            count=newest.count + count,
            expires=max(e for e in (newest.expires, latest) if e is not None)
            if newest.expires is not None or latest is not None
            else None,
        )
        return part, fresh

    def _write(self, part: _Part, fresh: bool, covered: int, rows: Iterable[str]) -> None:
        """In one SQLite transaction: ``part``'s table made if ``fresh``, the ``rows``
        (each a JSON array of rows) put in it, its row of ``parts`` and the ``covered``
        seq recorded. Rolled back and raised if any of it fails."""
        db = self._db
        db.execute("BEGIN")
        try:
            if fresh:
                db.execute(
                    f"""CREATE TABLE {part.table} (
                            seq INTEGER PRIMARY KEY, h INTEGER NOT NULL,
                            id TEXT NOT NULL, expires REAL)"""
                )
                db.execute(f"CREATE INDEX {part.table}_h ON {part.table} (h)")
            for chunk in rows:
                db.execute(
                    f"INSERT OR REPLACE INTO {part.table} "
                    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
                    "json_extract(value, '$[2]'), json_extract(value, '$[3]') "
                    "FROM json_each(?)",
                    [chunk],
                )
            db.execute(
                "INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)",
                [part.n, part.hi, part.count, part.expires],
            )
            db.execute("INSERT OR REPLACE INTO meta VALUES ('covered', ?)", [covered])
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def _took(self, part: _Part, fresh: bool) -> None:
        """``part``, written, is the newest partition in memory (a new one if ``fresh``).
        Under the lock."""
        with self._reading:
            if fresh:
                self._parts.append(part)
                self._last_n = part.n
            else:
                self._parts[-1] = part
            f = self._filter  # grown past what its probes suit: read anew with fewer
            if (
                f is not None
                and self._filling is None
                and (fewer := _probes(f.nbytes, len(self))) < f.probes
            ):
                self._refill(type(f)(f.nbytes, fewer))

    def find(self, msg_ids: Sequence[str], now: float, horizon: int) -> dict[str, int]:
        """The seqs of those of ``msg_ids`` that are here and can still live (expiry
        and the log's horizon checked, as the window does): one indexed query for the
        batch in each partition, newest first, the id itself compared at each hash
        match — for the ids the filter does not rule out."""
        if not msg_ids or not self._parts:
            return {}
        from eomsg.core.idruns import hashes_of  # (loaded: ids are here)

        hashes = hashes_of(msg_ids)
        found: dict[str, int] = {}
        with self._reading, self._failures():
            if self._filter is not None:
                maybe = self._filter.maybe(hashes)
                pending = {
                    i: h for i, h, m in zip(msg_ids, hashes.tolist(), maybe, strict=True) if m
                }
            else:
                pending = dict(zip(msg_ids, hashes.tolist(), strict=True))
            for part in reversed(self._parts):
                if not pending:
                    break
                wanted = list(set(pending.values()))
                for lo in range(0, len(wanted), 500):  # SQLite's bound on parameters
                    some = wanted[lo : lo + 500]
                    rows = self._reader.execute(  # type: ignore[union-attr]
                        f"SELECT id, seq, expires FROM {part.table} "
                        f"WHERE h IN ({','.join('?' * len(some))})",
                        some,
                    ).fetchall()
                    for msg_id, seq, expires in rows:
                        live = expires > now if expires is not None else seq >= horizon
                        if live and msg_id in pending and seq > found.get(msg_id, -1):
                            found[msg_id] = seq
                # What an older partition holds is numbered lower: found live, done.
                pending = {i: h for i, h in pending.items() if i not in found}
        return found

    @_maintenance
    def forget_below(self, horizon: int, now: float) -> int:
        """Drop the partitions whose every id is dead — numbered below ``horizon``
        (their messages left the log), any time to live run out — a table a
        transaction; how many ids went. A partition with an id still live stays whole
        (a lookup checks each id's life). The filter is then read anew from what is
        left, the old one answering meanwhile."""
        dropped = 0
        while True:
            with self._reading:
                dead = next((p for p in self._parts if p.dead(horizon, now)), None)
                if dead is None:
                    break
                self._parts.remove(dead)  # no lookup reads it from here on
            with self._lock:
                self._db.execute("BEGIN")
                try:
                    self._db.execute(f"DROP TABLE {dead.table}")
                    self._db.execute("DELETE FROM parts WHERE n = ?", [dead.n])
                    self._db.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                    with self._reading:  # still here, and still looked up
                        self._parts.insert(sum(p.n < dead.n for p in self._parts), dead)
                    raise
            dropped += dead.count
        if dropped:
            with self._reading:
                f = self._filter
                if f is not None and self._filling is None:
                    self._refill(type(f)(f.nbytes, _probes(f.nbytes, len(self))))
        return dropped

    @property
    def disk_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += Path(f"{self.path}{suffix}").stat().st_size
        return total

    def close(self) -> None:
        with self._maintaining, self._lock, self._reading:
            self._close_quietly()


def remove(data_dir: Path) -> None:
    """Delete the spill file of ``data_dir`` and SQLite's files beside it (idempotent):
    the next open loads every live id from DuckDB."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{data_dir / NAME}{suffix}").unlink(missing_ok=True)
