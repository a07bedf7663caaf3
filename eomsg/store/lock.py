"""One process owns a data directory: an exclusive ``flock`` on ``DIR/eomsg.lock``.

DuckDB would refuse a second writer anyway, but with an error about its file; taking our
own lock first lets the message name the holder and say what to do. The kernel drops the
lock when the holder dies, however it dies, so a crash never leaves the directory stuck.

The directory holds message payloads, so it is its owner's alone: created mode 0700, and
tightened to that at every open if it is found wider (the files in it are then out of
reach of other users whatever their own modes; :func:`owner_only` narrows those too).
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from eomsg.core.text import is_text
from eomsg.errors import DataDirError, DataDirLocked
from eomsg.store.files import PRIVATE_DIR, PRIVATE_FILE, owner_only

LOCK_NAME = "eomsg.lock"


# What this process is, as other processes are told when it holds a data directory: the
# command line sets it (``eomsg queue purge``); else the program and its first argument.
PURPOSE: str | None = None


def _command() -> str:
    return " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:2]])


def holder_of(data_dir: Path) -> str:
    """Who holds ``data_dir``, as its holder wrote it in the lock file (``pid 4242
    (eomsg consume)``), or ``another process``."""
    try:
        said = (data_dir / LOCK_NAME).read_bytes()[:256].decode(errors="replace").strip()
    except OSError:
        said = ""
    return said or "another process"


class DataDirLock:
    """An exclusive, non-blocking lock on a data directory, held until :meth:`release`."""

    def __init__(self, data_dir: Path, *, create: bool = True) -> None:
        self.data_dir = data_dir
        self._fd: int | None = None
        self._acquire(create)

    def _acquire(self, create: bool) -> None:
        d = self.data_dir
        if not is_text(str(d)):  # DuckDB takes UTF-8 paths only: refuse before making it
            raise DataDirError(f"data directory {str(d)!r} is not a UTF-8 path (check --data)")
        if d.exists() and not d.is_dir():
            raise DataDirError(f"{d} is not a directory (check --data)")
        try:
            if create:
                d.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
            elif not d.exists():
                raise DataDirError(f"no eomsg data in {d} yet (check --data)")
            owner_only(d)
            fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        except PermissionError as e:
            raise DataDirError(f"cannot use data directory {d}: permission denied") from e
        except FileNotFoundError as e:
            raise DataDirError(f"data directory {d} does not exist (check --data)") from e
        except OSError as e:
            raise DataDirError(f"cannot use data directory {d}: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            holder = holder_of(d)
            raise DataDirLocked(
                f"data directory {d} is in use by {holder}; wait for it to finish or "
                "point --data elsewhere"
            ) from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({PURPOSE or _command()})".encode(errors="replace"), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock. Idempotent."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
