"""Start-up of the command line: the wall time of whole ``eomsg`` processes.

  cli  the median wall time of ``eomsg --version``, ``eomsg --help``, ``eomsg publish``
       and ``eomsg inspect queues`` through a node (``eomsg serve``) on a temporary data
       directory, and of the last two on another directory no node serves (embedded:
       the command opens the store itself), each run ``n`` times; also which heavy
       modules each loaded

What no change to eomsg can take away is timed beside them, ``n`` runs each of this
interpreter: starting it (``python ms``), importing typer (``import typer ms``), and the
store's libraries (``import duckdb pyarrow ms``) — so that figures taken at different
times (this VM's speed drifts by half over minutes) can be read against the floor of
their own moment.

A command through a running node should load neither the store (DuckDB, Arrow) nor
Spark nor an application database's driver: ``loaded`` lists those a run imported (read
from ``python -X importtime``, in a run of its own so the timed runs are not slowed).

The programs run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed) and one
untimed run first, as an installed wheel's modules are compiled when it is installed:
otherwise each run would compile every eomsg module it imports from source.

``--eomsg`` names the program to time (default: the ``eomsg`` beside this
interpreter), so another checkout's install can be measured the same way; ``--baseline``
names a second one timed in turn with it, run by run (``… baseline ms``): on a machine
whose speed drifts by tens of per cent over minutes (this VM's does), only runs
interleaved like that compare two versions.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCENARIOS = ("cli",)
HEAVY = ("duckdb", "pyarrow", "psycopg", "pyspark", "pandas")
# name: the command's words, and whether it runs through the node (else embedded)
COMMANDS = {
    "version": (["--version"], True),
    "help": (["--help"], True),
    "publish": (["publish", "bench/cli", "hello"], True),
    "inspect queues": (["inspect", "queues"], True),
    "publish embedded": (["publish", "bench/cli", "hello"], False),
    "inspect queues embedded": (["inspect", "queues"], False),
}
# name: what this interpreter runs (-c), the floor beneath every command's time
FLOOR = {
    "python": "pass",
    "import typer": "import typer",
    "import duckdb pyarrow": "import duckdb, pyarrow",
}


def run(n: int, program: str, tmp: Path, baseline: str | None = None) -> dict[str, object]:
    data = tmp / "data"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("EOMSG_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["EOMSG_DATA"] = str(data)
    node = subprocess.Popen(
        [program, "serve", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert node.stdout is not None
        if json.loads(node.stdout.readline())["event"] != "ready":
            raise RuntimeError("eomsg serve did not start")
        embedded = {**env, "EOMSG_DATA": str(tmp / "embedded")}
        for where in (env, embedded):  # through the node, which made its directory
            subprocess.run(
                [program, "--init", "queue", "create", "bench", "--subscribe", "bench/>"],
                env=where, check=True, capture_output=True,
            )  # fmt: skip
        result: dict[str, object] = {"scenario": "cli", "n": n, "program": program}
        timed = {"": program, " baseline": baseline} if baseline else {"": program}
        for name, (args, served) in COMMANDS.items():
            where = env if served else embedded
            times: dict[str, list[float]] = {key: [] for key in timed}
            for i in range(n + 1):  # the first run of each is not timed
                for key, prog in timed.items():
                    start = time.perf_counter()
                    subprocess.run([prog, *args], env=where, check=True, capture_output=True)
                    if i:
                        times[key].append(time.perf_counter() - start)
            for key, took in times.items():
                result[f"{name}{key} ms"] = round(statistics.median(took) * 1000, 1)
            result[f"{name} loaded"] = _heavy_modules(program, args, where)
        for name, code in FLOOR.items():
            took = []
            for i in range(n + 1):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", code], env=env, check=True)
                if i:
                    took.append(time.perf_counter() - start)
            result[f"{name} ms"] = round(statistics.median(took) * 1000, 1)
        return result
    finally:
        node.terminate()
        node.wait(30)


def _heavy_modules(program: str, args: list[str], env: dict[str, str]) -> list[str]:
    """The heavy top-level modules one run of ``program args`` imported."""
    done = subprocess.run(
        [program, *args], env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, check=True,
        capture_output=True, text=True,
    )  # fmt: skip
    names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    return sorted(m for m in HEAVY if m in names)


def default_program() -> str:
    beside = Path(sys.executable).with_name("eomsg")
    return str(beside) if beside.exists() else "eomsg"
