"""``DIR/eomsg.mark``: after every commit, how long the WAL was and the highest message
seq the store holds — what the next open checks the store against.

DuckDB alone cannot tell a WAL cut short by damage (a truncated file, a restored old
copy) from one that simply holds less: both replay without a word, and acknowledged
messages are gone. The mark is written after each commit returned (so it never claims
more than is durable) and is not synced then (so it costs one small ``pwrite``, no
flush): after a power cut it may lag behind a WAL that grew, which only makes the check
weaker. The WAL shrinks only at a checkpoint, and before each the mark is set to an
empty WAL and synced, so no crash or power cut leaves it above the WAL. At open, a WAL
shorter than marked, or a store whose last seq is below the marked one, has lost
acknowledged writes (see :mod:`eomsg.store.integrity`).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

MARK_NAME = "eomsg.mark"
_LAYOUT = struct.Struct("<4sHHQQ")  # magic, version, unused, wal size, last seq
_MAGIC, _VERSION = b"EOMK", 1


@dataclass(frozen=True, slots=True)
class Mark:
    wal_size: int
    last_seq: int


class Watermark:
    """The mark file of one data directory, open for the store's lifetime."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / MARK_NAME
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._last: Mark | None = None

    def read(self) -> Mark | None:
        """The mark left by the last commit, or None (a new or older data directory, or a
        mark torn by a power cut: the checks that need it are skipped)."""
        data = os.pread(self._fd, _LAYOUT.size + 4, 0)
        if len(data) != _LAYOUT.size + 4:
            return None
        body, (crc,) = data[: _LAYOUT.size], struct.unpack("<I", data[_LAYOUT.size :])
        if zlib.crc32(body) != crc:
            return None
        magic, version, _, wal_size, last_seq = _LAYOUT.unpack(body)
        if magic != _MAGIC or version != _VERSION:
            return None
        return Mark(wal_size, last_seq)

    def write(self, mark: Mark, *, sync: bool = False) -> None:
        """Record ``mark`` (a no-op when it has not changed); ``sync`` makes it durable
        before returning (before a checkpoint shrinks the WAL)."""
        if mark != self._last:
            body = _LAYOUT.pack(_MAGIC, _VERSION, 0, mark.wal_size, mark.last_seq)
            os.pwrite(self._fd, body + struct.pack("<I", zlib.crc32(body)), 0)
            self._last = mark
        if sync:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
