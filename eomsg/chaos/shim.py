"""The C shims a run loads into the node with ``LD_PRELOAD`` (``powerloss.c``,
``clock.c``, beside this module), compiled with the machine's C compiler where a run needs
them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from eomsg.errors import EomsgError


def build_shim(source: Path, into: Path, what: str) -> Path:
    """The LD_PRELOAD shim ``source`` (C, beside this module) compiled into ``into``;
    EomsgError without a C compiler, or if it does not build."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise EomsgError(
            f"a {what} run needs a C compiler: install gcc (apt-get install gcc libc6-dev)"
        )
    out = into / source.with_suffix(".so").name
    building = out.with_suffix(".so.new")  # then renamed: a process using the last is left be
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(building), str(source), "-ldl", "-lpthread"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        said = done.stderr.splitlines()
        first = next((line for line in said if "error" in line), said[0] if said else "no output")
        raise EomsgError(f"the {what} shim did not build: {first.strip()}")
    os.replace(building, out)
    return out
