"""A wall clock a run can move: the shim ``clock.c`` loaded into the node offsets every
read of ``CLOCK_REALTIME`` — ``time.time()``, DuckDB's ``now()``, the log's timestamps —
by what the run writes into a file, while the monotonic clocks run on: as when NTP steps
a machine's clock, or a person sets it.
"""

from __future__ import annotations

import os
from pathlib import Path

from eomsg.chaos.shim import build_shim

SOURCE = Path(__file__).with_name("clock.c")
HOUR = 3600
NS = 1_000_000_000


class WallClock:
    """The offset of a node's wall clock from the machine's, kept in ``workdir/NAME``
    (8 bytes, nanoseconds) for the shim built into ``workdir``."""

    def __init__(self, workdir: Path, name: str = "clock") -> None:
        self.path = workdir / name
        self.shim = build_shim(SOURCE, workdir, "clock-jump")
        self.offset = 0
        self.path.write_bytes(bytes(8))

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with what runs a process on this clock (after any shim it preloads
        already)."""
        preload = " ".join(filter(None, [base.get("LD_PRELOAD", ""), str(self.shim)]))
        return {**base, "LD_PRELOAD": preload, "EOMSG_CLOCK_FILE": str(self.path)}

    def jump(self, seconds: int) -> None:
        """Move the clock by ``seconds`` from where it is: the node's next read sees it
        (the shim maps the file; one aligned 8-byte write is never read torn)."""
        self.offset += seconds
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, (self.offset * NS).to_bytes(8, "little", signed=True), 0)
        finally:
            os.close(fd)
