"""The power-loss shim (eomsg.chaos.powerloss): a real process run with it writes files
under its data directory in every way a store does; after a kill and a power off, each
file holds exactly what was fsynced or fdatasynced — nothing unsynced, nothing synced
lost — and files outside the directory are untouched."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eomsg.chaos.powerloss import Disk, build
from eomsg.errors import EomsgError
from tests.conftest import missing_service


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build(tmp_path_factory.mktemp("shim"))
    except EomsgError as e:
        missing_service(e.message)
        raise


def run_with(disk: Disk, script: str) -> None:
    """Run ``script`` (Python, with ``D`` the data directory) on ``disk``, killed at
    its end by itself (SIGKILL: nothing flushed on the way out)."""
    code = "import os, mmap, signal\nD = " + repr(str(disk.data)) + "\n"
    code += textwrap.dedent(script) + "\nos.kill(os.getpid(), signal.SIGKILL)\n"
    done = subprocess.run([sys.executable, "-c", code], env=disk.env(), capture_output=True)
    assert done.returncode == -9, done.stderr.decode()


def test_what_was_synced_stays_and_what_was_not_is_lost(shim: Path, tmp_path: Path) -> None:
    disk = Disk(tmp_path / "data", tmp_path / "shadow", shim)
    outside = tmp_path / "outside.txt"
    (disk.data / "old").write_bytes(b"before the run")
    disk.settle()
    run_with(
        disk,
        f"""
        fd = os.open(D + "/log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(fd, b"synced;")
        os.fsync(fd)
        os.write(fd, b"not synced")
        f = os.open(D + "/db", os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(f, b"x" * 8192, 0)
        os.fdatasync(f)
        os.pwrite(f, b"y" * 10, 100)          # lost: not synced
        os.ftruncate(f, 4096)                  # lost too: the size at the last sync stays
        n = os.open(D + "/never", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(n, b"never synced")
        t = os.open(D + "/tmp", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(t, b"replaced whole")
        os.fsync(t)
        os.replace(D + "/tmp", D + "/target")  # names are durable at once
        u = os.open(D + "/tmp2", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(u, b"renamed unsynced")
        os.replace(D + "/tmp2", D + "/target2")
        d = os.dup(fd)
        os.write(d, b"+dup")
        os.fsync(d)
        o = os.open(D + "/old", os.O_WRONLY | os.O_TRUNC)  # truncated, never synced
        with open({str(outside)!r}, "w") as out:
            out.write("outside")
        """,
    )
    lost = disk.power_off()
    assert (disk.data / "log").read_bytes() == b"synced;not synced+dup"  # the dup's sync
    assert (disk.data / "db").read_bytes() == b"x" * 8192
    assert (disk.data / "never").read_bytes() == b""
    assert (disk.data / "target").read_bytes() == b"replaced whole"
    assert (disk.data / "target2").read_bytes() == b""
    assert (disk.data / "old").read_bytes() == b"before the run"
    assert outside.read_text() == "outside"
    assert lost.files == 4  # db, never, target2 and old went back to what was durable


def test_a_file_whose_inode_is_reused_starts_with_an_empty_image(
    shim: Path, tmp_path: Path
) -> None:
    disk = Disk(tmp_path / "data", tmp_path / "shadow", shim)
    run_with(
        disk,
        """
        for i in range(20):
            fd = os.open(D + "/seg", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"%d" % i * 100)
            os.fsync(fd)
            os.close(fd)
            os.unlink(D + "/seg")
        fd = os.open(D + "/new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"unsynced")
        """,
    )
    disk.power_off()
    assert (disk.data / "new").read_bytes() == b""


def test_a_file_mapped_for_writing_is_synced_whole(shim: Path, tmp_path: Path) -> None:
    disk = Disk(tmp_path / "data", tmp_path / "shadow", shim)
    run_with(
        disk,
        """
        fd = os.open(D + "/mapped", os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        m = mmap.mmap(fd, 4096)
        m[:5] = b"hello"
        m.flush()
        os.fsync(fd)
        """,
    )
    disk.power_off()
    assert (disk.data / "mapped").read_bytes()[:5] == b"hello"


def test_the_node_s_token_survives_a_power_loss(shim: Path, tmp_path: Path) -> None:
    """Found by the first power-loss run: the token was written without a sync, and the
    node would not start again on the empty file."""
    disk = Disk(tmp_path / "data", tmp_path / "shadow", shim)
    run_with(
        disk,
        """
        from pathlib import Path
        from eomsg.server.server import load_token
        print(load_token(Path(D)), file=open(D + "/../given", "w"), flush=True)
        """,
    )
    disk.power_off()
    from eomsg.server.server import load_token

    given = (tmp_path / "given").read_text().strip()
    assert given and load_token(disk.data) == given
    assert not (disk.data / "eomsg.token.new").exists()  # renamed into place


def test_a_sync_after_a_restart_makes_what_the_killed_process_left_durable(
    shim: Path, tmp_path: Path
) -> None:
    """A process killed (no power loss) leaves writes in the page cache; the next one's
    sync of the file makes them durable, as a disk would."""
    disk = Disk(tmp_path / "data", tmp_path / "shadow", shim)
    first = """
        fd = os.open(D + "/wal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(fd, b"A" * 10)
        os.fsync(fd)
        os.write(fd, b"B" * 10)
        """
    run_with(disk, first)  # killed: B is in the page cache, not on the disk
    second = """
        fd = os.open(D + "/wal", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"C" * 10)
        os.fdatasync(fd)
        """
    run_with(disk, second)
    disk.power_off()
    assert (disk.data / "wal").read_bytes() == b"A" * 10 + b"B" * 10 + b"C" * 10


def test_a_file_cut_shorter_then_written_past_the_cut_holds_no_stale_bytes(
    shim: Path, tmp_path: Path
) -> None:
    disk = Disk(tmp_path / "data", tmp_path / "shadow", shim)
    run_with(
        disk,
        """
        fd = os.open(D + "/f", os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b"old!" * 4)
        os.fsync(fd)
        os.ftruncate(fd, 4)
        os.pwrite(fd, b"new", 12)
        os.fsync(fd)
        """,
    )
    disk.power_off()
    assert (disk.data / "f").read_bytes() == b"old!" + bytes(8) + b"new"
