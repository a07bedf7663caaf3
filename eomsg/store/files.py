"""The data directory's files as the operating system sees them: who may read them, and
making a rename or a new file durable."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from eomsg.errors import DataDirError

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


def replace_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (owner-only), durably and atomically: written under
    another name and synced, renamed into place, the directory synced — neither a crash
    nor a power loss leaves it empty, half written or a mix of old and new."""
    fresh = path.with_name(path.name + ".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(fresh, path)
    sync(path.parent)


def read_json_object(path: Path, remedy: str) -> dict[str, Any]:
    """The JSON object kept in the owner-only file ``path`` (narrowed to its owner if
    it was not), empty if there is no file. DataDirError, saying ``remedy``, if it
    cannot be read or holds no JSON object."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise DataDirError(f"cannot read {path}: {e.strerror}") from e
    owner_only(path)
    try:
        found = json.loads(text)
    except ValueError as e:
        raise DataDirError(f"{path} is not JSON ({e}); {remedy}") from e
    if not isinstance(found, dict):
        raise DataDirError(f"{path} does not hold a JSON object; {remedy}")
    return found


def make_private(data_dir: Path) -> None:
    """Narrow every file of ``data_dir`` to its owner (DuckDB makes its files with the
    process's umask, and its WAL anew after each checkpoint)."""
    for entry in data_dir.iterdir():
        owner_only(entry)
