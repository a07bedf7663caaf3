"""The journal: where a write is durable before DuckDB holds it.

DuckDB costs about 2.5 ms of CPU per commit whatever it holds, and a disk's fdatasync a
tenth of that; so the writer acknowledges a write once it is here — appended and
fdatasynced, one record per group commit — and applies records to DuckDB behind, many
at a time (:mod:`eomsg.store.writer`). DuckDB records, in the same transaction as the
rows, the last record it holds (``node_meta.journal_lsn``); opening a store applies the
records past it (:func:`recover`), so replaying one twice changes nothing.

Files: ``DIR/journal/<first lsn, 20 digits>.seg``, owner-only. A record is a header —
CRC-32 of everything after it, the payload's length, the record's sequence number (lsn,
one more than the record before it, across segments) — and the payload::

    u32 crc | u32 length | u64 lsn | payload

A segment is allocated whole when it starts (:data:`SEGMENT_BYTES`, zeros), so a full
disk is met there, before a record is written, never in the middle of one; a record
that would not fit starts the next segment, whose name is made durable before a record
in it is acknowledged. Zeros after the last record are the unused rest of a segment. A
segment whose records DuckDB holds is deleted (:meth:`Journal.forget`).

Reading (:func:`scan`) walks the records. The first bad one — cut short, or its CRC or
lsn wrong — ends what is served. It is a *torn tail* (a write the crash cut off, never
acknowledged) when nothing valid follows it anywhere; it is *damage* when a valid record
follows (in its segment or a later one): acknowledged writes would be lost, and opening
refuses to serve a journal like that (:class:`~eomsg.errors.DataDirDamaged`) unless
DuckDB already holds everything up to the damage.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from eomsg.failpoints import failpoint
from eomsg.store.files import PRIVATE_DIR, PRIVATE_FILE, owner_only, sync

DIR_NAME = "journal"
SUFFIX = ".seg"
HEADER = struct.Struct("<IIQ")  # crc, length, lsn
SEGMENT_BYTES = 8 << 20  # a segment past this size ends; the next record starts one
MAX_RECORD = (1 << 32) - 1


def encode(lsn: int, payload: bytes) -> bytes:
    """One record: the header, then ``payload``."""
    if len(payload) > MAX_RECORD:
        raise ValueError(f"a journal record holds at most {MAX_RECORD} bytes")
    tail = struct.pack("<IQ", len(payload), lsn)
    return struct.pack("<I", zlib.crc32(payload, zlib.crc32(tail))) + tail + payload


@dataclass(frozen=True, slots=True)
class Record:
    lsn: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment file's readable records, and what ends them."""

    path: Path
    first_lsn: int
    records: list[Record]
    end: int  # the offset just past the last good record
    size: int
    why: str = ""  # why reading stopped before ``size`` ("" at a clean end)

    @property
    def last_lsn(self) -> int:
        return self.records[-1].lsn if self.records else self.first_lsn - 1


def _valid_at(data: bytes, pos: int, lsn: int) -> bool:
    """Whether a whole record with sequence number ``lsn`` and a good CRC starts at
    ``pos``."""
    if pos < 0 or pos + HEADER.size > len(data):
        return False
    crc, length, found = HEADER.unpack_from(data, pos)
    end = pos + HEADER.size + length
    if found != lsn or end > len(data):
        return False
    return _sound(data, pos, end, crc)


def _sound(data: bytes, pos: int, end: int, crc: int) -> bool:
    """Whether the record in ``data[pos:end]`` matches its CRC ``crc``."""
    return crc == zlib.crc32(data[pos + HEADER.size : end], zlib.crc32(data[pos + 4 : pos + 16]))


def read_segment(path: Path, first_lsn: int, start: int = 0, start_lsn: int = 0) -> Segment:
    """The records of one segment file, up to the first that is cut short or bad (from
    byte ``start``, where record ``start_lsn`` is, when given)."""
    data = path.read_bytes()
    records: list[Record] = []
    pos, lsn = start, start_lsn or first_lsn
    why = ""
    while pos < len(data):
        if not data[pos : pos + HEADER.size].strip(b"\0") and not data[pos:].strip(b"\0"):
            break  # the unused, allocated rest of the segment
        if pos + HEADER.size > len(data):
            why = f"a record header cut short at byte {pos}"
            break
        crc, length, found = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if end > len(data):
            why = f"a record cut short at byte {pos} ({length} bytes, {len(data) - pos} there)"
            break
        if not _sound(data, pos, end, crc):
            why = f"the record at byte {pos} fails its checksum"
            break
        if found != lsn:
            why = f"the record at byte {pos} is numbered {found}, not {lsn}"
            break
        records.append(Record(lsn, data[pos + HEADER.size : end]))
        pos, lsn = end, lsn + 1
    return Segment(path, first_lsn, records, pos, len(data), why)


FOLLOWING = 64  # how many records past a bad one are looked for: a torn tail has none


def _find(data: bytes, start: int, lsn: int) -> int | None:
    """Where a valid record numbered ``lsn`` starts past ``start``, if one does."""
    key = struct.pack("<Q", lsn)
    at = data.find(key, start + 1)
    while at != -1:
        if _valid_at(data, at - 8, lsn):
            return at - 8
        at = data.find(key, at + 1)
    return None


def _follows(data: bytes, start: int, lsn: int) -> bool:
    """Whether a valid record numbered ``lsn`` or up to :data:`FOLLOWING` past it starts
    past ``start``: what makes a bad record damage (a garbled page takes several records
    with it) rather than a torn tail."""
    return any(_find(data, start, n) is not None for n in range(lsn, lsn + FOLLOWING))


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
    """What a journal holds: its records past ``after`` in order, the last lsn it
    holds, and what ended it. ``torn`` describes a tail cut off by a crash (dropped:
    never acknowledged); ``damage`` a bad record that valid records follow."""

    records: list[Record]
    last_lsn: int
    segments: list[Segment] = field(default_factory=list)
    torn: str = ""
    damage: str = ""
    damaged_lsn: int = 0  # the lsn of the first record lost to damage


def scan(directory: Path, after: int = 0) -> Scan:
    """Read every segment in ``directory``; keep the records numbered past ``after``
    (those DuckDB holds may be damaged: reading goes on at the first it lacks)."""
    found = segments(directory)
    read: list[Segment] = []
    records: list[Record] = []
    last, expect = after, 0
    for i, (first, path) in enumerate(found):
        if expect and first != expect and first > after + 1:
            return Scan(
                records,
                last,
                read,
                damage=f"segment {path.name} starts at {first}, after {expect - 1}",
                damaged_lsn=max(expect, after + 1),
            )
        segment = read_segment(path, first)
        if segment.why and segment.last_lsn < after:  # bad, but DuckDB holds it
            at = _find(path.read_bytes(), segment.end, after + 1)
            if at is not None:
                segment = read_segment(path, first, at, after + 1)
            else:  # what DuckDB lacks starts in a later segment, or nowhere
                segment = Segment(path, first, [], segment.end, segment.size)
                expect = 0
        read.append(segment)
        records.extend(r for r in segment.records if r.lsn > after)
        last = max(last, segment.last_lsn)
        if segment.why:
            # A later segment starts only once this one's last record was acknowledged.
            if i + 1 < len(found) or _follows(path.read_bytes(), segment.end, last + 1):
                where = f"{path.name}: {segment.why}, and records follow it"
                return Scan(records, last, read, damage=where, damaged_lsn=last + 1)
            return Scan(records, last, read, torn=f"{path.name}: {segment.why}")
        if segment.records:
            expect = segment.last_lsn + 1
    return Scan(records, last, read)


def check(directory: Path, applied: int) -> Scan:
    """:func:`scan` past ``applied`` (the last record DuckDB holds), with records
    missing between it and the journal's first counted as damage too."""
    found = scan(directory, applied)
    first = next((s for s in found.segments if s.records or s.why), None)
    if not found.damage and first is not None and first.first_lsn > applied + 1:
        return Scan(
            [],
            found.last_lsn,
            found.segments,
            damage=f"records {applied + 1} to {first.first_lsn - 1} are missing",
            damaged_lsn=applied + 1,
        )
    return found


def written_bytes(data_dir: Path) -> int:
    """About how many bytes of records ``data_dir``'s journal holds — what replaying it
    may write into DuckDB's WAL — by hopping from header to header, not the segments'
    allocated size (mostly zeros, and already on the disk). Checks nothing: an estimate."""
    total = 0
    for _, path in segments(data_dir / DIR_NAME):
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                pos = 0
                while pos + HEADER.size <= size:
                    _, length, lsn = HEADER.unpack(os.pread(f.fileno(), HEADER.size, pos))
                    if lsn == 0 or pos + HEADER.size + length > size:
                        break  # the zeroed rest of the segment (or a torn record)
                    pos += HEADER.size + length
                total += pos
        except OSError:  # deleted meanwhile: the writer applied it
            continue
    return total


def pending(data_dir: Path) -> bool:
    """Whether ``data_dir`` has journal records at all (a node stopped without closing;
    DuckDB may hold them: :func:`check` says which it lacks)."""
    for _, path in segments(data_dir / DIR_NAME):
        with open(path, "rb") as f:
            if f.read(HEADER.size).strip(b"\0"):
                return True
    return False


class Journal:
    """The open journal of a store, appended to by the writer's thread alone.

    :meth:`append` returns once the record is durable (written and fdatasynced; a new
    segment's name synced too). :meth:`forget` deletes the segments DuckDB holds."""

    def __init__(self, directory: Path, last_lsn: int, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        if not directory.exists():
            directory.mkdir(mode=PRIVATE_DIR)
            sync(directory.parent)  # the journal's own name, durable before any record
        owner_only(directory)
        self.last_lsn = last_lsn
        self._fd = -1
        self._size = 0  # where the next record goes in the current segment
        self._room = 0  # the current segment's allocated size
        self._writing = 0  # the size of the record being appended
        self._files: list[tuple[int, Path]] = segments(directory)

    def append(self, payload: bytes) -> int:
        """Write one record and make it durable; its lsn. When this raises, nothing of
        the record counts as written: :meth:`cut` takes away what reached the file."""
        lsn = self.last_lsn + 1
        record = encode(lsn, payload)
        if self._fd < 0 or self._size + len(record) > self._room:
            self._start(lsn, len(record))
        failpoint("journal.append.before")
        self._writing = len(record)
        written = 0
        while written < len(record):
            written += os.pwrite(self._fd, record[written:], self._size + written)
        failpoint("journal.append.before_sync")
        os.fdatasync(self._fd)
        self._size += len(record)
        self.last_lsn = lsn
        return lsn

    def cut(self) -> bool:
        """After a failed :meth:`append`: zero what of the record reached the file,
        durably. False if that failed too (then what the file holds is unknown)."""
        if self._fd < 0:
            return True
        zeros = bytes(min(self._writing, self._room - self._size))
        try:
            done = 0
            while done < len(zeros):
                done += os.pwrite(self._fd, zeros[done:], self._size + done)
            os.fdatasync(self._fd)
        except OSError:
            return False
        return True

    def _start(self, lsn: int, need: int) -> None:
        """End the current segment and start one named ``lsn``, allocated whole (at
        least ``need`` bytes); its name is durable (the directory synced) before
        anything in it is acknowledged. A full disk fails here, with nothing written."""
        self._close_file()
        path = self.directory / f"{lsn:020d}{SUFFIX}"
        room = max(self.segment_bytes, need)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        try:
            os.posix_fallocate(fd, 0, room)
            sync(self.directory)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._size, self._room = fd, 0, room
        self._files.append((lsn, path))

    def forget(self, applied: int) -> None:
        """Delete every segment all of whose records DuckDB holds (``applied``: the last
        lsn it holds), but the one being written to. Idempotent; a crash between two
        deletions leaves segments that the next open skips."""
        while len(self._files) > 1 and self._files[1][0] <= applied + 1:
            _, path = self._files.pop(0)
            failpoint("journal.forget.before")
            path.unlink(missing_ok=True)

    def close(self, applied: int) -> None:
        """Close the file; delete every segment when DuckDB holds all of it."""
        self._close_file()
        if applied >= self.last_lsn:
            for _, path in self._files:
                path.unlink(missing_ok=True)
            self._files.clear()

    def _close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
