"""Start-up of the command line: the wall time of whole ``eomsg`` processes.

  cli  the median wall time of ``eomsg --version``, ``eomsg --help``, ``eomsg publish``
       and ``eomsg inspect queues``, the last two through a node (``eomsg serve``) on a
       temporary data directory, each run ``n`` times; also which heavy modules each
       loaded

A command through a running node should load neither the store (DuckDB, Arrow) nor
Spark nor an application database's driver: ``loaded`` lists those a run imported (read
from ``python -X importtime``, in a run of its own so the timed runs are not slowed).

``--eomsg`` names the program to time (default: the ``eomsg`` beside this
interpreter), so another checkout's install can be measured the same way.
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
COMMANDS = {
    "version": ["--version"],
    "help": ["--help"],
    "publish": ["publish", "bench/cli", "hello"],
    "inspect queues": ["inspect", "queues"],
}


def run(n: int, program: str, tmp: Path) -> dict[str, object]:
    data = tmp / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
    env["EOMSG_DATA"] = str(data)
    node = subprocess.Popen(
        [program, "serve", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert node.stdout is not None
        if json.loads(node.stdout.readline())["event"] != "ready":
            raise RuntimeError("eomsg serve did not start")
        subprocess.run(  # through the node, which made the data directory
            [program, "queue", "create", "bench", "--subscribe", "bench/>"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        result: dict[str, object] = {"scenario": "cli", "n": n, "program": program}
        for name, args in COMMANDS.items():
            times = []
            for _ in range(n):
                start = time.perf_counter()
                subprocess.run([program, *args], env=env, check=True, capture_output=True)
                times.append(time.perf_counter() - start)
            result[f"{name} ms"] = round(statistics.median(times) * 1000, 1)
            result[f"{name} loaded"] = _heavy_modules(program, args, env)
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
