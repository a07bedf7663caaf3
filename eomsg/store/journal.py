"""The journal: where a write is durable before DuckDB holds it.

DuckDB costs about 2.5 ms of CPU per commit whatever it holds, and a disk's fdatasync a
tenth of that; so the writer acknowledges a write once it is here — appended and
fdatasynced, one record per group commit — and applies records to DuckDB behind, many
at a time (:mod:`eomsg.store.writer`). DuckDB records, in the same transaction as the
rows, the last record it holds (``node_meta.journal_lsn``); opening a store applies the
records past it, so replaying one twice changes nothing.

Files: ``DIR/journal/<first lsn, 20 digits>.seg``, owner-only. A segment is a header,
records one after the other, then zeros up to the size it was given when it was made::

    segment header  magic "eomsgJ2\\n" | u64 first lsn | u64 size | u32 0 | u32 crc
    record header   u32 crc of the 20 bytes after it | 4-byte kind | u32 length
                    | u64 lsn | u32 crc of the payload; then ``length`` bytes of payload

What the writing guarantees, and so what reading can tell a crash from damage by:

* **A segment is whole before it has its name**: allocated to its size, its header
  written and synced under a temporary name, renamed into place, the directory synced.
  A segment file shorter (or longer) than its header says was cut, not crashed.
* **One record at a time**, written with one pwrite and fdatasynced before it is
  acknowledged: a crash leaves at most one unfinished record, the last of the last
  segment, and what of it never reached the disk reads as zeros (the segment was
  allocated as zeros; a disk writes whole sectors; a killed write stops at a page).
* **A record's header has its own checksum**, so its length is trusted apart from its
  payload: a record whose payload is damaged is stepped over, and what follows it read.
* **A full segment is sealed**: the next one is made first, then a seal (a header of
  kind ``SEAL`` naming the next segment's first lsn) written and synced after the last
  record. A sealed segment whose successor is not there lost it.
* **The current segment is never deleted**, even when DuckDB holds all of it (a data
  directory closed cleanly keeps one); a store whose journal is written this way says so
  (``node_meta.journal_format``), and a journal of such a store with no segment lost it.

Reading (:func:`scan`) walks every segment and finds the readable records and the
*holes*: lsns that should be there and cannot be read (a record cut short or failing its
checksum, a segment cut short, gone, or out of order). A hole is a **torn tail** — a
write a crash cut off, never acknowledged — only when it is the last bad bytes of the
last segment and looks as a crash leaves them: the segment whole, the unfinished
record's missing part read as zeros, nothing written past it. Every other hole is
**damage**: it may hold acknowledged writes. A store refuses to open over damage past
what DuckDB holds (:class:`~eomsg.errors.DataDirDamaged`); ``eomsg salvage`` keeps every
readable record and names what the holes took.

A segment without the magic was written by an eomsg before this format (records with a
16-byte header, ``u32 crc | u32 length | u64 lsn``, from byte 0); it is read by the
rules of its time (a bad record that no valid one follows is a torn tail), and only while
the store does not say it writes the new format.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from eomsg.failpoints import failpoint
from eomsg.store.files import PRIVATE_DIR, PRIVATE_FILE, owner_only, sync

DIR_NAME = "journal"
SUFFIX = ".seg"
MAKING = ".making"  # a segment being made, before it has its name
FORMAT = 2  # node_meta.journal_format of a store whose journal is written this way
MAGIC = b"eomsgJ2\n"
SEGMENT_HEADER = struct.Struct("<8sQQII")  # magic, first lsn, size, 0, crc of the rest
HEADER = struct.Struct("<I4sIQI")  # header crc, kind, length, lsn, payload crc
RECORD = b"eoR1"  # a record: its payload follows
SEAL = b"eoS1"  # the segment is full: the next one starts at this header's lsn
SEGMENT_BYTES = 8 << 20  # a segment's size, unless one record needs more
MAX_RECORD = (1 << 32) - 1
SECTOR = 512  # what a disk writes whole, at least
LEGACY_HEADER = struct.Struct("<IIQ")  # before format 2: crc, length, lsn


def encode(lsn: int, payload: bytes, kind: bytes = RECORD) -> bytes:
    """One record: its header, then ``payload``."""
    if len(payload) > MAX_RECORD:
        raise ValueError(f"a journal record holds at most {MAX_RECORD} bytes")
    rest = struct.pack("<4sIQI", kind, len(payload), lsn, zlib.crc32(payload))
    return struct.pack("<I", zlib.crc32(rest)) + rest + payload


def segment_header(first_lsn: int, size: int) -> bytes:
    rest = struct.pack("<8sQQI", MAGIC, first_lsn, size, 0)
    return rest + struct.pack("<I", zlib.crc32(rest))


@dataclass(frozen=True, slots=True)
class Record:
    lsn: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Hole:
    """Records the journal should hold and cannot serve: lsns ``first`` to ``last``
    (None: on to wherever the journal ended, which cannot be known), found at byte
    ``offset`` of segment ``path``. ``torn``: the write a crash cut off."""

    path: Path
    offset: int
    first: int
    last: int | None
    why: str
    torn: bool = False
    payload: bytes = b""  # a record's, whose payload fails its checksum (its header is good)

    def past(self, applied: int) -> bool:
        """Whether it may hold records DuckDB lacks (numbered past ``applied``)."""
        return self.last is None or self.last > applied

    @property
    def lsns(self) -> str:
        """Its records in words: ``record 7``, ``records 7 to 9``, ``records from 7 on``."""
        if self.last is None:
            return f"records from {self.first} on"
        if self.last == self.first:
            return f"record {self.first}"
        return f"records {self.first} to {self.last}"

    def describe(self) -> str:
        return f"{self.path.name}: {self.why} ({self.lsns})"


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment file as read: its records, its holes, how it ends."""

    path: Path
    first_lsn: int
    records: list[Record]
    holes: list[Hole]
    end: int  # the offset just past the last good record (or seal)
    size: int
    next_lsn: int | None  # the lsn its successor starts at (None: unknown, a hole is open)
    sealed: bool = False
    legacy: bool = False

    @property
    def last_lsn(self) -> int:
        return self.records[-1].lsn if self.records else self.first_lsn - 1


_ZEROS = bytes(1 << 16)


def _zero(data: bytes | memoryview, start: int, end: int | None = None) -> bool:
    """Whether ``data[start:end]`` (``start``, ``end`` ≥ 0) holds only zeros: compared a block of
    :data:`_ZEROS` at a time, as a segment's room left is megabytes, looked at every
    time a node or a command opens the journal (copying it whole to strip it took 5 ms
    a look, 45 ms an open)."""
    end = len(data) if end is None else min(end, len(data))
    for at in range(start, end, len(_ZEROS)):
        stop = min(at + len(_ZEROS), end)
        if bytes(data[at:stop]) != _ZEROS[: stop - at]:
            return False
    return True


def _zero_sector(data: bytes, start: int, end: int) -> bool:
    """Whether a disk sector overlapping ``data[start:end]`` reads as zeros whole: what a
    write that never reached the disk leaves."""
    first = start - start % SECTOR
    for at in range(first, min(end, len(data)), SECTOR):
        if _zero(data, at, min(at + SECTOR, len(data))):
            return True
    return False


def _header_ok(data: bytes, pos: int) -> bool:
    """Whether a record header with a good checksum starts at ``pos``."""
    if pos < 0 or pos + HEADER.size > len(data):
        return False
    crc = struct.unpack_from("<I", data, pos)[0]
    kind = data[pos + 4 : pos + 8]
    return kind in (RECORD, SEAL) and crc == zlib.crc32(data[pos + 4 : pos + HEADER.size])


def _header_follows(data: bytes, start: int) -> bool:
    """Whether a record header with a good checksum starts anywhere past ``start``."""
    for kind in (RECORD, SEAL):
        at = data.find(kind, start + 1)
        while at != -1:
            if _header_ok(data, at - 4):
                return True
            at = data.find(kind, at + 1)
    return False


def _torn_header(data: bytes, pos: int) -> bool:
    """Whether the unreadable header at ``pos`` looks as a crash leaves one: the part of
    it in some sector never written (zeros), nothing well formed after it."""
    end = min(pos + HEADER.size, len(data))
    boundary = pos - pos % SECTOR + SECTOR
    parts = [(pos, min(boundary, end)), (boundary, end)] if boundary < end else [(pos, end)]
    if not any(_zero(data, a, b) for a, b in parts):
        return False
    return not _header_follows(data, pos)


def read_segment(path: Path, first_lsn: int, legacy: bool = False) -> Segment:
    """The records of one segment file and its holes (see the module docstring).
    ``legacy``: a file without the magic is a segment of format 1."""
    data = path.read_bytes()
    if legacy and not data.startswith(MAGIC):
        return _read_legacy(path, first_lsn, data)
    size = len(data)
    if size < SEGMENT_HEADER.size:
        hole = Hole(path, 0, first_lsn, None, f"cut short at byte {size}, inside its header")
        return Segment(path, first_lsn, [], [hole], 0, size, None)
    magic, named, room, _, crc = SEGMENT_HEADER.unpack_from(data)
    good_header = (
        magic == MAGIC and crc == zlib.crc32(data[: SEGMENT_HEADER.size - 4]) and named == first_lsn
    )
    if not good_header:
        room = size  # its size cannot be checked: whatever reads is read, the rest a hole
    return _SegmentReader(path, data, first_lsn, room, good_header).read()


class _SegmentReader:
    """The reading of one segment's records, from just past its header (a good one, or
    not: ``good_header``) to where they end; ``room``, the size its header gives it. As
    it goes: the records read, the holes found, the position and lsn it is at, and once
    it stopped, whether a seal ended it and the lsn the next segment starts at (None: a
    hole is open)."""

    def __init__(
        self, path: Path, data: bytes, first_lsn: int, room: int, good_header: bool
    ) -> None:
        self.path, self.data, self.size = path, data, len(data)
        self.room, self.good_header, self.cut = room, good_header, len(data) < room
        self.first_lsn = first_lsn
        self.pos, self.lsn = SEGMENT_HEADER.size, first_lsn
        self.records: list[Record] = []
        self.holes: list[Hole] = []
        self.next_lsn: int | None = None
        self.sealed = False

    def read(self) -> Segment:
        """The segment, its records read to where they end."""
        while self.step():
            pass
        return Segment(
            self.path,
            self.first_lsn,
            self.records,
            self.holes,
            self.pos,
            self.size,
            self.next_lsn,
            self.sealed,
        )

    def step(self) -> bool:
        """Read the record at :attr:`pos`: True if the records go on past it, False if
        they ended there (at the segment's end, a seal or a hole)."""
        data, pos, lsn, size = self.data, self.pos, self.lsn, self.size
        if pos >= size or (_zero(data, pos, pos + HEADER.size) and _zero(data, pos)):
            self._ended()
            return False
        if pos + HEADER.size > size:
            self._hole(f"cut short, {size} of its {self.room} bytes there")
            return False
        if not _header_ok(data, pos):
            torn = self.good_header and not self.cut and _torn_header(data, pos)
            self._hole(f"the record header at byte {pos} fails its checksum", torn)
            return False
        _, kind, length, found, payload_crc = HEADER.unpack_from(data, pos)
        if found != lsn:
            self._hole(f"the record at byte {pos} is numbered {found}, not {lsn}")
            return False
        end = pos + HEADER.size + length
        if kind == SEAL:
            self._seal(end, length)
            return False
        if end > size:
            self._hole(
                f"the record at byte {pos} is cut short, {size} of its {self.room} bytes there"
            )
            return False
        return self._record(end, payload_crc)

    def _ended(self) -> None:
        """No record follows: the segment's end if nothing says otherwise, else a hole
        from here on."""
        if self.cut:
            self._hole(f"cut short, {self.size} of its {self.room} bytes there")
        elif not self.good_header:
            self._hole("its header is damaged: where it ended cannot be told")
        else:
            self.next_lsn = self.lsn

    def _seal(self, end: int, length: int) -> None:
        """The seal here (of ``length`` bytes, ending at ``end``) ends the segment; any
        byte after it is a hole."""
        self.sealed, self.pos = True, end
        if length or not _zero(self.data, end):
            self._hole(f"bytes follow its seal at byte {end - HEADER.size}")
        else:
            self.next_lsn = self.lsn

    def _record(self, end: int, crc: int) -> bool:
        """The record here, whose header is good, ends at ``end``: kept if its payload
        matches ``crc``, else a hole — the last one (False), or one the next record's
        position is known past (True, read on)."""
        payload = self.data[self.pos + HEADER.size : end]
        if zlib.crc32(payload) == crc:
            self.records.append(Record(self.lsn, payload))
        elif _zero(self.data, end):
            # The last record: a crash's unfinished write if part of it never reached the
            # disk. Open: the segment after it, if any, says whether it was acknowledged
            # (a successor starting past it) or abandoned (one starting at it).
            torn = self.good_header and not self.cut and _zero_sector(self.data, self.pos, end)
            self._hole(f"the record at byte {self.pos} fails its checksum", torn, payload)
            return False
        else:  # damaged where it lies; its header says where the next one starts
            why = f"the record at byte {self.pos} fails its checksum"
            self._hole(why, payload=payload, last=self.lsn)
        self.pos, self.lsn = end, self.lsn + 1
        return True

    def _hole(
        self, why: str, torn: bool = False, payload: bytes = b"", last: int | None = None
    ) -> None:
        """A hole at the current position, from the current lsn to ``last`` (None: on)."""
        self.holes.append(Hole(self.path, self.pos, self.lsn, last, why, torn, payload))


def _read_legacy(path: Path, first_lsn: int, data: bytes) -> Segment:
    """A segment an eomsg before format 2 wrote: records from byte 0 until the first bad
    one, which is a torn tail unless a valid record follows (the rules of its time)."""
    records: list[Record] = []
    pos, lsn = 0, first_lsn
    why = ""
    while pos < len(data):
        if _zero(data, pos):
            break  # the unused, allocated rest of the segment
        crc, length, found = (
            LEGACY_HEADER.unpack_from(data, pos) if pos + 16 <= len(data) else (0, 0, 0)
        )
        end = pos + LEGACY_HEADER.size + length
        if pos + 16 > len(data) or end > len(data):
            why = f"a record cut short at byte {pos}"
            break
        if crc != zlib.crc32(data[pos + 16 : end], zlib.crc32(data[pos + 4 : pos + 16])):
            why = f"the record at byte {pos} fails its checksum"
            break
        if found != lsn:
            why = f"the record at byte {pos} is numbered {found}, not {lsn}"
            break
        records.append(Record(lsn, data[pos + 16 : end]))
        pos, lsn = end, lsn + 1
    holes = []
    if why:
        key = [struct.pack("<Q", n) for n in range(lsn, lsn + 64)]
        follows = any(data.find(k, pos + 1) != -1 for k in key)
        holes.append(
            Hole(path, pos, lsn, None, why + " (a journal of an older eomsg)", not follows)
        )
    return Segment(
        path, first_lsn, records, holes, pos, len(data), None if why else lsn, False, True
    )


def segments(directory: Path) -> list[tuple[int, Path]]:
    """The segment files in ``directory`` as (first lsn, path), in order."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        stem = name.removesuffix(SUFFIX)
        if name.endswith(SUFFIX) and stem.isdigit():
            found.append((int(stem), directory / name))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class Scan:
    """What a journal holds, as seen by a store that holds records up to ``after``: the
    readable records past it in order, the last lsn the journal holds, every hole, and
    the verdict on the holes past ``after``: ``torn`` (a tail a crash cut off: dropped,
    never acknowledged) and ``damage`` (a hole that may hold acknowledged writes)."""

    records: list[Record]
    last_lsn: int
    segments: list[Segment] = field(default_factory=list)
    holes: list[Hole] = field(default_factory=list)
    after: int = 0

    @property
    def lost(self) -> list[Hole]:
        """The holes that may hold records past ``after``, torn tail included."""
        return [h for h in self.holes if h.past(self.after)]

    @property
    def damage(self) -> str:
        first = next((h for h in self.lost if not h.torn), None)
        return first.describe() if first else ""

    @property
    def damaged_lsn(self) -> int:
        """The first record lost to damage (0: none)."""
        first = next((h for h in self.lost if not h.torn), None)
        return max(first.first, self.after + 1) if first else 0

    @property
    def torn(self) -> str:
        tail = next((h for h in self.lost if h.torn), None)
        return tail.describe() if tail else ""

    @property
    def last_good(self) -> int:
        """The last record before the first damage past ``after`` (or the last of all)."""
        lsn = self.damaged_lsn
        if not lsn:
            return self.last_lsn
        return max([self.after, *(r.lsn for r in self.records if r.lsn < lsn)])


def scan(directory: Path, after: int = 0, legacy: bool = False) -> Scan:
    """Read every segment in ``directory`` and keep the records numbered past ``after``
    (those DuckDB holds). ``legacy``: the journal may be of format 1 (its store does not
    say it writes format 2), whose segments have no header and which a clean close left
    with no segment; else one with no segment lost it."""
    found = segments(directory)
    read: list[Segment] = []
    holes: list[Hole] = []
    expect: int | None = None  # the lsn the next segment should start at (None: unknown)
    for first, path in found:
        segment = read_segment(path, first, legacy)
        if read:
            before = read[-1]
            if expect is None:  # the hole it ended in runs to where this one starts
                gap = holes.pop()
                if first - 1 >= gap.first:
                    holes.append(replace(gap, last=first - 1, torn=False))
                elif first < gap.first:
                    holes.append(_overlap(path, first, gap.first - 1))
            elif first > expect:
                why = f"records {expect} to {first - 1} are missing before {path.name}"
                if before.sealed:
                    why = f"the segment {before.path.name} was sealed for is gone"
                holes.append(Hole(path, 0, expect, first - 1, why))
            elif first < expect:
                holes.append(_overlap(path, first, expect - 1))
        read.append(segment)
        holes.extend(segment.holes)
        expect = segment.next_lsn
    if not found:
        if not legacy:
            holes.append(Hole(directory, 0, after + 1, None, "its segments are gone"))
    else:
        last = read[-1]
        if last.sealed and expect is not None:
            name = f"{expect:020d}{SUFFIX}"
            why = f"{name}, which {last.path.name} was sealed for, is gone"
            holes.append(Hole(directory / name, 0, expect, None, why))
        start = min(s.first_lsn for s in read)
        if start > after + 1 and (not legacy or any(s.records for s in read)):
            why = f"records {after + 1} to {start - 1} are missing before {read[0].path.name}"
            holes.insert(0, Hole(read[0].path, 0, after + 1, start - 1, why))
    records = sorted((r for s in read for r in s.records if r.lsn > after), key=lambda r: r.lsn)
    last_lsn = max([after, *(s.last_lsn for s in read)])
    # (A torn hole is open; a segment after it closes it as damage: it stays torn only at
    # the very end of the journal.)
    return Scan(records, last_lsn, read, holes, after)


def _overlap(path: Path, first: int, last: int) -> Hole:
    why = f"{path.name} starts at {first}, below record {last} of the one before"
    return Hole(path, 0, first, last, why)


def check(directory: Path, applied: int, legacy: bool = False) -> Scan:
    """:func:`scan` past ``applied`` (the last record DuckDB holds): what a store's open
    decides by."""
    return scan(directory, applied, legacy)


def written_bytes(data_dir: Path) -> int:
    """About how many bytes of records ``data_dir``'s journal holds — what replaying it
    may write into DuckDB's WAL — by hopping from header to header, not the segments'
    allocated size (mostly zeros, and already on the disk). Checks nothing: an estimate."""
    total = 0
    for _, path in segments(data_dir / DIR_NAME):
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                pos = SEGMENT_HEADER.size
                while pos + HEADER.size <= size:
                    _, kind, length, _, _ = HEADER.unpack(os.pread(f.fileno(), HEADER.size, pos))
                    if kind != RECORD or pos + HEADER.size + length > size:
                        break  # the zeroed rest, a seal (or a torn or legacy record)
                    pos += HEADER.size + length
                total += max(0, pos - SEGMENT_HEADER.size)  # (none in one cut short)
        except OSError:  # deleted meanwhile: the writer applied it
            continue
    return total


def restart(directory: Path, last_lsn: int) -> None:
    """Leave ``directory`` with one empty segment, numbered ``last_lsn + 1``, and no
    other: made durably first, then the others deleted (after salvage put every record
    that could be read into the store). Idempotent."""
    if not directory.exists():
        directory.mkdir(mode=PRIVATE_DIR)
        sync(directory.parent)
    j = Journal(directory)
    fd, _ = j._make(last_lsn + 1, 0)
    os.close(fd)
    for first, path in segments(directory):
        if first != last_lsn + 1:
            path.unlink()
    sync(directory)


class Journal:
    """The open journal of a store, appended to by the writer's thread alone.

    :meth:`start` opens it for appending after what a :func:`scan` found (reusing the
    last segment when it is whole, or making one). :meth:`append` returns once the
    record is durable. :meth:`forget` deletes the segments DuckDB holds, never the
    current one."""

    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.last_lsn = 0
        self._fd = -1
        self._first = 0  # the current segment's first lsn
        self._size = 0  # where the next record goes in the current segment
        self._room = 0  # the current segment's allocated size
        self._writing = 0  # the size of the record being appended
        self._files: list[tuple[int, Path]] = []

    @classmethod
    def start(
        cls,
        directory: Path,
        last_lsn: int,
        segment_bytes: int = SEGMENT_BYTES,
        found: Scan | None = None,
    ) -> Journal:
        """The journal of ``directory``, whose records up to ``last_lsn`` DuckDB holds
        (``found``: what a scan of it found). Appends go on in its last segment when that
        one is whole, holds no record past ``last_lsn`` and has room; otherwise a
        segment numbered ``last_lsn + 1`` is made, durably, before the others are
        deleted — so at no moment is there no segment."""
        if not directory.exists():
            directory.mkdir(mode=PRIVATE_DIR)
            sync(directory.parent)  # the journal's own name, durable before any record
        owner_only(directory)
        for stale in directory.glob(f"*{MAKING}"):  # a segment whose making was cut off
            stale.unlink()
        j = cls(directory, segment_bytes)
        j.last_lsn = last_lsn
        j._files = segments(directory)
        last = found.segments[-1] if found is not None and found.segments else None
        if (
            last is not None
            and not (last.legacy or last.sealed or last.holes)
            and last.next_lsn == last_lsn + 1
            and last.end + 2 * HEADER.size <= last.size
        ):
            j._fd = os.open(last.path, os.O_RDWR)
            j._first, j._size, j._room = last.first_lsn, last.end, last.size
        else:
            j._fd, j._room = j._make(last_lsn + 1, 0)
            j._first, j._size = last_lsn + 1, SEGMENT_HEADER.size
        j.forget(last_lsn)
        sync(directory)  # the older segments' deletion durable before a record is written
        return j

    def append(self, payload: bytes) -> int:
        """Write one record and make it durable; its lsn. When this raises, nothing of
        the record counts as written: :meth:`cut` takes away what reached the file."""
        lsn = self.last_lsn + 1
        record = encode(lsn, payload)
        if self._size + len(record) + HEADER.size > self._room:  # room for a seal kept
            self._roll(lsn, len(record))
        failpoint("journal.append.before")
        self._write(record)
        failpoint("journal.append.before_sync")
        os.fdatasync(self._fd)
        self._size += len(record)
        self._writing = 0
        self.last_lsn = lsn
        return lsn

    def _write(self, data: bytes) -> None:
        """Write ``data`` where the current segment's next record goes (not yet synced)."""
        self._writing = len(data)
        written = 0
        while written < len(data):
            written += os.pwrite(self._fd, data[written:], self._size + written)

    def cut(self) -> bool:
        """After a failed :meth:`append`: zero what of the record (or seal) reached the
        file, durably. False if that failed too (then what the file holds is unknown)."""
        if self._fd < 0 or not self._writing:
            return True
        zeros = bytes(min(self._writing, self._room - self._size))
        try:
            done = 0
            while done < len(zeros):
                done += os.pwrite(self._fd, zeros[done:], self._size + done)
            os.fdatasync(self._fd)
        except OSError:
            return False
        self._writing = 0
        return True

    def _roll(self, lsn: int, need: int) -> None:
        """Make the segment that starts at ``lsn`` (with room for a record of ``need``
        bytes), then seal the current one and go on in the new one. A full disk fails
        the making, before anything is written where a reader would look; a failed seal
        leaves the new segment empty, which a reader takes as the successor it is."""
        fd, room = self._make(lsn, need)
        try:
            self._write(encode(lsn, b"", SEAL))
            failpoint("journal.seal.before_sync")
            os.fdatasync(self._fd)
        except BaseException:
            os.close(fd)
            raise
        self._writing = 0
        os.close(self._fd)
        self._fd, self._first, self._size, self._room = fd, lsn, SEGMENT_HEADER.size, room

    def _make(self, lsn: int, need: int) -> tuple[int, int]:
        """Make segment ``lsn`` whole (allocated, its header synced) under a temporary
        name, then give it its name durably: its open descriptor and size. A full disk
        fails here, leaving no segment of that name (or the one that had it)."""
        room = max(self.segment_bytes, SEGMENT_HEADER.size + need + HEADER.size)
        path = self.directory / f"{lsn:020d}{SUFFIX}"
        making = path.with_name(path.name + MAKING)
        fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            os.posix_fallocate(fd, 0, room)
            os.pwrite(fd, segment_header(lsn, room), 0)
            os.fdatasync(fd)
            os.rename(making, path)
            sync(self.directory)
        except BaseException:
            os.close(fd)
            making.unlink(missing_ok=True)
            raise
        # A segment of that name is replaced: one whose only record was torn (this
        # open's successor of the last whole record starts where it started).
        self._files = [(first, p) for first, p in self._files if first != lsn]
        self._files.append((lsn, path))
        return fd, room

    def forget(self, applied: int) -> None:
        """Delete every segment all of whose records DuckDB holds (``applied``: the last
        lsn it holds), but the one being written to. Idempotent; a crash between two
        deletions leaves segments that the next open skips."""
        while len(self._files) > 1 and self._files[1][0] <= applied + 1:
            _, path = self._files.pop(0)
            failpoint("journal.forget.before")
            path.unlink(missing_ok=True)

    def close(self, applied: int) -> None:
        """Close the file and delete the segments DuckDB holds, but the current one."""
        self.close_file()
        self.forget(applied)

    def close_file(self) -> None:
        """Close the file and delete nothing (idempotent): for an open given up."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
