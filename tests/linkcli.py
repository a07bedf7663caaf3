"""`eomsg serve` processes and the CLI for the link tests of issue 35
(tests/test_link_names.py, tests/test_link_removal.py, tests/test_link_grants.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import NodeProcess


class Nodes:
    """`eomsg serve` processes on data directories under ``tmp``, and the CLI, with no
    EOMSG_ variable set (no --init but where a command says it)."""

    def __init__(self, eomsg_bin: str, tmp: Path, env: dict[str, str]) -> None:
        self.eomsg_bin, self.tmp = eomsg_bin, tmp
        self.env = {k: v for k, v in env.items() if not k.startswith("EOMSG_")}
        self.procs: list[NodeProcess] = []

    def dir(self, name: str) -> str:
        return str(self.tmp / name)

    def start(self, name: str, *args: str) -> NodeProcess:
        proc = NodeProcess(self.eomsg_bin, self.tmp / name, self.env, "--heartbeat", "1", *args)
        self.procs.append(proc.start())
        return proc

    def run(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.eomsg_bin, *args], env=self.env, capture_output=True, text=True,
            timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == code, (args, done.stdout, done.stderr)
        return done

    def links(self, name: str) -> list[dict[str, Any]]:
        shown = self.run("inspect", "links", "--json", "--data", self.dir(name)).stdout
        found: list[dict[str, Any]] = json.loads(shown)
        return found

    def state(self, name: str) -> list[tuple[str, str, str | None]]:
        return [(x["peer"], x["state"], x["error"]) for x in self.links(name)]

    def token_file(self, name: str, token: str) -> str:
        path = self.tmp / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return str(path)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
