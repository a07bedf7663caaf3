"""A throwaway PostgreSQL server for the tests and benchmarks: its own data directory,
reached on a Unix socket in a directory of its own (no TCP port to collide with), with
``max_prepared_transactions`` set so that eomsg's PostgreSQL resource can prepare.

    python scripts/pgcluster.py start   # prints the directory, then the DSN
    python scripts/pgcluster.py stop DIR

The server programs come from Debian's package (``scripts/postgres.sh`` installs it). As
root, the server runs as the ``postgres`` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PORT = 5432  # only names the socket file: the server listens on no TCP port


def server_bin() -> Path | None:
    """The newest installed directory of PostgreSQL server programs, None if none."""
    found = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if all((d / p).is_file() for p in ("postgres", "initdb", "pg_ctl")):
            found.append(d)
    found.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    return found[-1] if found else None


class Cluster:
    """One server in a fresh temporary directory; :meth:`stop` removes it all."""

    def __init__(self, root: Path | None = None) -> None:
        bin_dir = server_bin()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL server installed: run scripts/postgres.sh")
        self.bin = bin_dir
        self.root = root or Path(tempfile.mkdtemp(prefix="eomsg-pg-"))
        self.data = self.root / "data"
        self.dsn = f"host={self.root} port={PORT} user=postgres dbname=postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> str:
        """Create the cluster if needed and start it; returns the DSN."""
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--locale=C", "--no-sync")  # fmt: skip
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    "listen_addresses = ''\n"
                    f"unix_socket_directories = '{self.root}'\n"
                    f"port = {PORT}\n"
                    "max_prepared_transactions = 64\n"
                    "max_connections = 100\n"
                )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start")
        return self.dsn

    def crash(self) -> None:
        """Stop as a crash would: no checkpoint, recovery from the WAL at the next start
        (prepared transactions survive it, as they survive a power cut)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        """Stop the server (if running) and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and len(argv) == 1:
        cluster = Cluster()
        print(cluster.root)
        print(cluster.start())
        return 0
    if argv[:1] == ["stop"] and len(argv) == 2:
        Cluster(Path(argv[1])).stop()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
