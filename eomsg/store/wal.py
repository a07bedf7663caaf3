"""DuckDB's write-ahead log, read by eomsg to tell a torn tail from damage.

DuckDB replays its WAL at open and stops, without a word, at the first record whose
length runs past the end of the file: after a crash that is a write cut off before it
was acknowledged, but a truncated file or a flipped bit in a length looks the same, and
then committed — acknowledged — writes vanish. A record whose checksum fails makes DuckDB
refuse to open at all. So eomsg reads the file first (:func:`scan`): where the last
complete commit ends, whether bytes follow it, and whether those bytes hold a complete,
checksum-valid record (damage, not a cut-off write).

The format (DuckDB 2.0, WAL version 2, unencrypted): a header of serialized fields
ending ``ff ff``; then records of ``u64 size | u64 checksum | payload``, the payload a
serialized object whose first field (``64 00``) is the record type; a transaction's
records end with a WAL_FLUSH record, whose payload is ``64 00 64 ff ff``. A WAL of
another version is not read (:func:`scan` says so) and the checks that need it are
skipped. The checksum is DuckDB's: 5381 xor each little-endian 64-bit word times
0xbf58476d1ce4e5b9, xor a MurmurHash64A-style hash of the last partial word.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

M64 = (1 << 64) - 1
_WORD = 0xBF58476D1CE4E5B9
_MURMUR = 0xC6A4A7935BD1E995
_FRAME = struct.Struct("<QQ")
FLUSH = b"\x64\x00\x64\xff\xff"  # the WAL_FLUSH record: a transaction's end
VERSION = 2


@dataclass(frozen=True, slots=True)
class Scan:
    """What a WAL file holds. ``committed_end``: the offset just after the last complete
    transaction (what DuckDB replays up to); ``tail``: bytes after it; ``damage``: the
    offset of the first bad record, if the file is damaged rather than cut short;
    ``readable``: False for a WAL this eomsg cannot read (then only ``size`` is known)."""

    size: int
    readable: bool = True
    committed_end: int = 0
    commits: int = 0
    damage: int | None = None
    why: str = ""

    @property
    def tail(self) -> int:
        return self.size - self.committed_end if self.readable else 0


def checksum(payload: bytes) -> int:
    """DuckDB's checksum of a record's payload."""
    n8 = len(payload) // 8
    result = 5381
    for (word,) in struct.iter_unpack("<Q", payload[: n8 * 8]):
        result ^= (word * _WORD) & M64
    if len(payload) > n8 * 8:
        result ^= _tail_hash(payload[n8 * 8 :])
    return result


def _tail_hash(data: bytes) -> int:
    h = (0xE17A1465 ^ (len(data) * _MURMUR)) & M64
    for j in range(len(data) - 1, -1, -1):
        h ^= data[j] << (8 * j)
    h = (h * _MURMUR) & M64
    h ^= h >> 47
    h = (h * _MURMUR) & M64
    h ^= h >> 47
    return h


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _header(data: bytes) -> tuple[int, int]:
    """The WAL's version and the offset where its records begin."""
    pos, version = 0, -1
    while True:
        (field,) = struct.unpack_from("<H", data, pos)
        pos += 2
        if field == 0xFFFF:
            return version, pos
        if field == 102:  # the database identifier: a count, then that many varints
            count, pos = _varint(data, pos)
            for _ in range(count):
                _, pos = _varint(data, pos)
        else:
            value, pos = _varint(data, pos)
            if field == 101:
                version = value


def _valid_record(data: bytes, pos: int) -> bool:
    """Whether a complete record with a good checksum starts at ``pos``."""
    if pos + 16 > len(data):
        return False
    size, stored = _FRAME.unpack_from(data, pos)
    if size == 0 or pos + 16 + size > len(data):
        return False
    payload = data[pos + 16 : pos + 16 + size]
    return payload[:2] == b"\x64\x00" and checksum(payload) == stored


def scan(path: Path, *, verify: bool = False) -> Scan | None:
    """Read the WAL at ``path`` (None if there is none). Walks the records by their
    lengths, as DuckDB's replay does; with ``verify`` it checks every checksum too (what
    salvage needs to cut at the first bad record), else only those past a tear."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        version, pos = _header(data)
    except (struct.error, IndexError):
        return Scan(len(data), readable=len(data) == 0, why="the WAL's header is cut short")
    if version != VERSION:
        return Scan(len(data), readable=False, why=f"WAL version {version} is not read here")
    end, commits = pos, 0
    while pos < len(data):
        if pos + 16 > len(data):
            break
        size, stored = _FRAME.unpack_from(data, pos)
        if size == 0 or pos + 16 + size > len(data):
            break
        payload = data[pos + 16 : pos + 16 + size]
        if verify and checksum(payload) != stored:
            return Scan(len(data), True, end, commits, pos, f"record at byte {pos} is damaged")
        pos += 16 + size
        if payload == FLUSH:
            end, commits = pos, commits + 1
    if end < len(data):
        # Bytes after the last commit: a write cut off, unless a good record follows
        # (then a length was damaged and DuckDB would drop committed transactions).
        start = pos
        while (found := data.find(b"\x64\x00", start + 1)) != -1:
            if found - 16 > pos and _valid_record(data, found - 16):
                return Scan(
                    len(data),
                    True,
                    end,
                    commits,
                    pos,
                    f"record at byte {pos} is damaged and complete records follow it",
                )
            start = found
    return Scan(len(data), True, end, commits)
