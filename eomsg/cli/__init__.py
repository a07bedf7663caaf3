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

    try:
        run()
    except SystemExit as e:
        leave(e.code)
    leave(0)


def leave(code: object) -> None:
    """End the process with ``code`` once its command is done, skipping the interpreter's
    teardown: freeing every module and object a command loaded (DuckDB, Arrow, the
    node's state) took 60 to 80 ms of a quick embedded command's 0.4 s, and did nothing a
    command needs — by then the command has closed what it opened (the node's close
    syncs and closes the store), and anything it left open is left as by a crash, which
    every eomsg file survives. What exit does that matters still happens, in Python's
    order: the threads that are not daemons are waited for, the ``atexit`` functions
    run, standard output and error are flushed. If a flush fails (a pipe closed), the
    interpreter's own exit handles it as it always did."""
    import atexit
    import os
    import threading

    status = _status(code)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(status)
    os._exit(status)


def _status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives: None is 0, an int itself, anything else
    printed on stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1
