"""What a data directory must pass before the node uses it: acknowledged writes are never
lost without a word.

Before DuckDB replays the WAL (which would drop a damaged tail in silence), the WAL is
read (:mod:`eomsg.store.wal`) and held against the mark of the last commit
(:mod:`eomsg.store.watermark`); after the store is open, its last seq is. The verdicts:

- a WAL that ends with part of a write cut off by a crash — bytes after the last complete
  transaction, within what was never marked as committed — is normal after a crash or a
  power cut: it was never acknowledged. The node opens and says so, loudly.
- anything that loses what a commit had made durable — a WAL shorter than marked or
  missing, a damaged record followed by complete ones, a checksum DuckDB refuses, a store
  that ends below the marked seq — is damage: the node refuses to open
  (:class:`~eomsg.errors.DataDirDamaged`) and points to ``eomsg salvage``, which keeps
  everything still readable once a person accepts the loss.
"""

from __future__ import annotations

from pathlib import Path

from eomsg.errors import DataDirDamaged
from eomsg.store import wal
from eomsg.store.watermark import Mark

SALVAGE_HINT = "run `eomsg salvage --data {dir}` to keep what is readable (see docs/reliability.md)"

# What DuckDB says when it will not open (or read) a damaged file.
_DAMAGE_WORDS = (
    "corrupt",
    "checksum",
    "does not match",
    "failure while replaying wal",
    "could not read enough bytes",
    "not a valid duckdb database file",
)
HEADERS = 3 * 4096  # DuckDB's file headers, before its first block


def damaged(data_dir: Path, what: str) -> DataDirDamaged:
    return DataDirDamaged(f"{data_dir} is damaged: {what}; " + SALVAGE_HINT.format(dir=data_dir))


def before_open(data_dir: Path, wal_path: Path, mark: Mark | None) -> list[str]:
    """Check the WAL before DuckDB replays it: DataDirDamaged if replaying it would lose
    acknowledged writes; else the warnings to give (a write cut off by a crash)."""
    scan = wal.scan(wal_path)
    if scan is None:
        if mark is not None and mark.wal_size > 0:
            raise damaged(
                data_dir, f"the WAL is missing, and held {mark.wal_size} bytes at its last commit"
            )
        return []
    if mark is not None and scan.size < mark.wal_size:
        raise damaged(
            data_dir,
            f"the WAL is {scan.size} bytes, {mark.wal_size} at its last commit: it was cut "
            "short, and acknowledged writes with it",
        )
    if not scan.readable:
        return []
    if scan.damage is not None:
        raise damaged(data_dir, f"the WAL's {scan.why}")
    if scan.tail:
        if mark is not None and scan.committed_end < mark.wal_size:
            raise damaged(
                data_dir,
                f"the WAL's record at byte {scan.committed_end} is cut short, below the "
                f"{mark.wal_size} bytes its last commit had made durable",
            )
        return [
            f"the WAL of {data_dir} ends with {scan.tail} bytes of a write that a crash or "
            f"power cut interrupted (after {scan.commits} complete transactions): that write "
            "was never acknowledged and is dropped"
        ]
    return []


def is_damage(error: Exception) -> bool:
    """Whether DuckDB refused to open because a file is damaged."""
    text = str(error).lower()
    return any(word in text for word in _DAMAGE_WORDS)


def after_open(data_dir: Path, mark: Mark | None, last_seq: int) -> None:
    """DataDirDamaged if the store ends below the last seq a commit had stored."""
    if mark is not None and last_seq < mark.last_seq:
        raise damaged(
            data_dir,
            f"the store ends at seq {last_seq}, but messages up to seq {mark.last_seq} were "
            "stored and acknowledged",
        )
