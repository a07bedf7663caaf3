"""The processes of a fault-injection or fuzzing run: each started again after a kill
with the same command, its standard error kept in ``workdir/NAME.log``."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from eomsg.errors import EomsgError


class Process:
    """A process of the run, started again after each kill with the same command."""

    def __init__(
        self, name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name, self.cmd, self.workdir, self.env = name, cmd, workdir, env
        self.proc: subprocess.Popen[str] | None = None

    output: int = subprocess.DEVNULL  # where its standard output goes

    def start(self) -> None:
        with (self.workdir / f"{self.name}.log").open("a") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=self.output, stderr=log, text=True, cwd=self.workdir,
                env=self.env,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, and SIGKILL if it is still there after ``timeout``."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class Node(Process):
    """``eomsg serve … --json``: started, it has said it is ready (:attr:`ready`, the
    line that says so, with where it listens)."""

    output = subprocess.PIPE  # its first line says it is ready, and where it listens
    ready: dict[str, Any]

    def start(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()  # the last start's
        super().start()
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.ready = json.loads(line) if line else {}
        if self.ready.get("event") != "ready":
            raise EomsgError(f"the node did not start: see {self.workdir / self.name}.log")
