"""How an ``eomsg`` process ends (``eomsg.cli.leave``): without the interpreter's
teardown, yet with everything exit does that a command needs — its exit status, its
output whole, the threads it left waited for, the ``atexit`` functions run — and what a
command wrote durable and readable by the next one, embedded or through a node."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Cli, messages


def leaving(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (Python) then ``leave(...)`` as its last line says, in a process."""
    script = "import atexit, sys, threading, time\nfrom eomsg.cli import leave\n"
    script += textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), (256 + 7, 7, ""), (-1, 255, ""), ("no", 1, "no\n")],
)
def test_the_status_is_what_sys_exit_would_give(
    tmp_path: Path, code: object, status: int, stderr: str
) -> None:
    done = leaving(f"leave({code!r})\n", tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (status, "", stderr)


def test_output_atexit_functions_and_threads_are_finished_first(tmp_path: Path) -> None:
    """Buffered output is flushed, an ``atexit`` function runs (and what it prints is
    flushed too), and a thread that is no daemon is waited for, as at Python's exit;
    an object's finaliser is not run (the teardown skipped)."""
    done = leaving(
        """
        sys.stdout = open(sys.stdout.fileno(), "w", buffering=1 << 20, closefd=False)
        sys.stdout.write("x" * 100_000)
        atexit.register(lambda: sys.stdout.write("|atexit"))
        def late():
            time.sleep(0.2)
            open("thread-done", "w").close()
        threading.Thread(target=late).start()
        class Noisy:
            def __del__(self):
                sys.stdout.write("|finalised")
        kept = Noisy()
        leave(5)
        """,
        tmp_path,
    )
    assert (done.returncode, done.stderr) == (5, "")
    assert done.stdout == "x" * 100_000 + "|atexit"
    assert (tmp_path / "thread-done").exists()


def test_a_closed_pipe_is_reported_as_python_reports_it(tmp_path: Path) -> None:
    """stdout closed by its reader: the flush fails and the interpreter's own exit
    reports it (status 120), as it did before the teardown was skipped."""
    script = (
        "import os, sys\nfrom eomsg.cli import leave\n"
        "sys.stdout = open(sys.stdout.fileno(), 'w', buffering=1 << 16, closefd=False)\n"
        "sys.stdout.write('x' * 1000)\nos.close(1)\nleave(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 120, done.stderr


def test_what_a_command_wrote_the_next_one_reads(cli: Cli) -> None:
    """A run of commands embedded, each ending without the teardown: every publish is
    in the log and consumed once, and the store opens clean for the next command."""
    cli("queue", "create", "q", "--subscribe", "t/>")
    for i in range(5):
        assert cli("publish", "t/x", f"m{i}", "--id", f"i{i}").stdout == (
            f"published seq {i + 1}\n".encode()
        )
    assert cli("publish", "t/x", "m0", "--id", "i0").stdout == (
        b"duplicate of seq 1 (id i0): stored once\n"
    )
    got = messages(cli("consume", "q", "--max", "10", "--json").stdout)
    assert [m["payload"] for m in got] == [f"m{i}" for i in range(5)]
    queues = json.loads(cli("inspect", "queues", "--json").stdout)
    assert [(q["name"], q["depth"]) for q in queues] == [("q", 0)]
