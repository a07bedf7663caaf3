"""The data directory and every file in it are their owner's alone (issue 15, item 7),
under a loose umask, embedded and served, and a directory left wide open by an older
eomsg is narrowed when opened."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import eomsg
from eomsg.node.node import Node, NodeSettings
from tests.conftest import NodeProcess


def modes(data_dir: Path) -> dict[str, int]:
    """Every entry of the data directory (and the directory itself), by name: its mode."""
    out = {".": stat.S_IMODE(data_dir.stat().st_mode)}
    for entry in data_dir.rglob("*"):
        out[str(entry.relative_to(data_dir))] = stat.S_IMODE(entry.lstat().st_mode)
    return out


def assert_owner_only(data_dir: Path) -> None:
    found = modes(data_dir)
    wide = {name: oct(mode) for name, mode in found.items() if mode & 0o077}
    assert not wide, wide
    assert "eomsg.duckdb" in found


def loose_umask() -> None:
    os.umask(0o022)


def test_embedded_cli_under_umask_022(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    def run(*args: str) -> None:
        done = subprocess.run(
            [eomsg_bin, *args], env=cli_env, capture_output=True, preexec_fn=loose_umask
        )
        assert done.returncode == 0, done.stderr

    run("queue", "create", "q", "-s", "t")
    run("publish", "t", "secret")
    assert_owner_only(data_dir)


def test_served_node_under_umask_022(
    serve: Any, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    """While the node runs, its WAL (re-made after every checkpoint), socket, token and
    lock are all owner-only."""
    old = os.umask(0o022)
    try:
        node: NodeProcess = serve()
    finally:
        os.umask(old)
    with eomsg.connect(data_dir) as client:
        client.create_queue(eomsg.QueueConfig("q", ("t",)))
        for i in range(200):
            client.publish("t", b"secret %d" % i)
        assert (data_dir / "eomsg.duckdb.wal").exists()
        assert_owner_only(data_dir)
    node.stop()
    assert_owner_only(data_dir)


def test_a_wal_made_anew_after_a_checkpoint_is_narrowed(data_dir: Path) -> None:
    """In a process with a loose umask (a library user's), DuckDB makes each new WAL
    0644; the node narrows it after the commit that made it."""
    old = os.umask(0o022)
    try:
        settings = NodeSettings(tick=None, wal_limit=64 << 10, apply_delay=0)
        with Node.open(data_dir, settings) as node:
            wal = data_dir / "eomsg.duckdb.wal"
            previous = remade = 0
            for _ in range(50):
                node.ingress.publish("t", os.urandom(4096) * 4)
                node.store.writer.sync()  # DuckDB holds it: its WAL grew, or was checkpointed
                size = wal.stat().st_size if wal.exists() else 0
                if size:
                    assert stat.S_IMODE(wal.stat().st_mode) == 0o600
                remade += size < previous
                previous = size
            assert remade > 3  # checkpoints removed it, commits made it anew
    finally:
        os.umask(old)


def test_a_wide_open_directory_is_narrowed_at_open(data_dir: Path) -> None:
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish("t", b"secret")
    os.chmod(data_dir, 0o755)
    for entry in data_dir.iterdir():
        if entry.is_file():
            os.chmod(entry, 0o644)
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish("t", b"more")
        assert_owner_only(data_dir)
