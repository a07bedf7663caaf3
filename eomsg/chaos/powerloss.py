"""Power loss for the node of a run: writes it did not fsync are lost.

The node runs with a small shim (``powerloss.c``, built here with the machine's C
compiler and loaded with ``LD_PRELOAD``) that keeps, for every file under the data
directory, the image a disk would hold after a power loss: what the file held at its
last fsync or fdatasync. :meth:`Disk.power_off`, once the node is killed, puts each file
back as its image — a file never synced comes back empty — as LazyFS does when it drops
its cache; names (files made, renamed, removed) are durable at once, as there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eomsg.chaos.shim import build_shim

SOURCE = Path(__file__).with_name("powerloss.c")


def build(into: Path) -> Path:
    """The shim compiled into ``into``; EomsgError without a C compiler."""
    return build_shim(SOURCE, into, "power-loss")


BLOCK = 4096


@dataclass
class Lost:
    """What one power loss took: files whose contents went back, and the 4 KiB blocks
    (and bytes past the end) that differed from what was durable."""

    files: int = 0
    blocks: int = 0


class Disk:
    """The data directory ``data`` of a process started with :meth:`env`, and the
    durable images of its files in ``shadow``."""

    def __init__(self, data: Path, shadow: Path, shim: Path) -> None:
        self.data, self.shadow, self.shim = data, shadow, shim
        shadow.mkdir(mode=0o700, parents=True, exist_ok=True)
        data.mkdir(mode=0o700, parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """The environment that runs a process on this disk."""
        return {
            **os.environ,
            "LD_PRELOAD": str(self.shim),
            "EOMSG_POWERLOSS_DIR": str(self.data),
            "EOMSG_POWERLOSS_SHADOW": str(self.shadow),
        }

    def settle(self) -> None:
        """Everything the data directory holds is durable now (a disk after it booted,
        or before the first start): each file's image is the file."""
        for old in self.shadow.iterdir():
            old.unlink()
        for path, ino in self._files():
            image = self.shadow / str(ino)
            shutil.copyfile(path, image)
            image.chmod(0o600)

    def power_off(self) -> Lost:
        """The process is gone: every file goes back to its image (empty without one),
        then that is what is durable. Call only once the process is dead."""
        lost = Lost()
        for path, ino in self._files():
            image = self.shadow / str(ino)
            held = image.read_bytes() if image.exists() else b""
            now = path.read_bytes()
            if now != held:
                lost.files += 1
                lost.blocks += sum(
                    now[at : at + BLOCK] != held[at : at + BLOCK]
                    for at in range(0, max(len(now), len(held)), BLOCK)
                )
                with path.open("r+b") as f:
                    f.write(held)
                    f.truncate()
        self.settle()
        return lost

    def _files(self) -> Iterator[tuple[Path, int]]:
        for path in sorted(self.data.rglob("*")):
            st = path.lstat()
            if path.is_file() and not path.is_symlink():
                yield path, st.st_ino
