"""The data directory's files as the operating system sees them: who may read them, and
making a rename or a new file durable."""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
DB_NAME = "eomsg.duckdb"  # the database file in a data directory


def holds_store(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds an eomsg store (without opening or importing it)."""
    return (data_dir / DB_NAME).exists()


def owner_only(path: Path) -> None:
    """Take every right of group and others away from ``path``, if it exists and has
    any (a file or directory made by an older eomsg, or under a loose umask)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    if mode & 0o077:
        os.chmod(path, mode & 0o700)


def sync(path: Path) -> None:
    """fsync a file, or a directory (so the names in it, after a rename, are durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
