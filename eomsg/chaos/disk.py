"""A small disk a run or a test fills up: a tmpfs of its own (mounted as root, or through
``sudo -n``), and a file that takes its room."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from eomsg.errors import EomsgError

MiB = 1 << 20


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted at ``root``, and a file that fills it.
    EomsgError if it cannot be mounted here."""

    def __init__(self, root: Path, size: int) -> None:
        self.root = root
        self.filler = root / "filler"
        prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
        root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [*prefix, "mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(root)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise EomsgError(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
        self._umount = [*prefix, "umount", "-l", str(root)]

    def free(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        """Grow the filler until only about ``leave`` bytes are free. The disk's other
        writers (the nodes) go on meanwhile and may take the last free bytes first: the
        filler then gives back what it took past ``leave``."""
        try:
            with open(self.filler, "ab", buffering=0) as f:
                while (gap := self.free() - leave) > 0:
                    f.write(b"\0" * min(gap, 4 * MiB))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            if (short := leave - self.free()) > 0:
                os.truncate(self.filler, max(0, self.filler.stat().st_size - short))

    def empty(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(self._umount, capture_output=True)
