"""The ``eomsg`` command line (:mod:`eomsg.cli.app`)."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``eomsg`` command. ``eomsg --version`` alone is answered before the
    commands (and the client, typer, rich) are imported: scripts and package managers
    call it to learn what is installed, and it takes a third of the time."""
    if sys.argv[1:] == ["--version"]:
        from importlib.metadata import version

        sys.stdout.write(f"eomsg {version('eomsg')}\n")
        return
    from eomsg.cli.app import main as run

    run()
