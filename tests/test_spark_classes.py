"""Spark's class-data archive (``eomsg.spark.classes``): made once by a replay, published
only after its JVM exited cleanly, never handed to a JVM unless whole, and damage to it
costing only speed — a truncated archive would crash every JVM that maps it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eomsg.core.message import Outgoing
from eomsg.node.node import Node, NodeSettings
from eomsg.spark import classes
from eomsg.spark.classes import Archive, drop_refused, finish, prepare
from tests.conftest import spark_or_skip

JAVA = "/usr/bin/env"  # any file: the key is made of its path and stat, never run


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spark_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EOMSG_SPARK_CLASSES", raising=False)
    return tmp_path / "cache" / "eomsg" / "spark"


def writer_at_exit(archive: Archive, size: int, code: int = 0) -> subprocess.Popen[bytes]:
    """A process that, as PySpark's gateway JVM does, runs until its stdin closes and then
    writes ``size`` bytes where the archive's making path says, exiting with ``code``."""
    assert archive.making is not None
    script = (
        "import sys; sys.stdin.buffer.read(); "
        f"open({str(archive.making)!r}, 'wb').write(b'x' * {size}); sys.exit({code})"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


def published(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir())


def test_nothing_is_asked_of_the_jvm_without_an_archive_or_a_wish_to_make_one(
    cache: Path,
) -> None:
    assert prepare(JAVA) == Archive("")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # owner-only, as every file of ours


def test_one_start_makes_it_and_the_next_uses_it(cache: Path) -> None:
    making = prepare(JAVA, make=True)
    assert making.making is not None and making.claim is not None
    assert making.options == f"-XX:ArchiveClassesAtExit={making.making}"
    assert making.claim.read_text() == str(os.getpid())
    assert prepare(JAVA, make=True) == Archive("")  # one maker at a time

    finish(making, writer_at_exit(making, 4096), keep=True)
    (name,) = published(cache)
    assert name.endswith("-4096.jsa")
    assert stat.S_IMODE((cache / name).stat().st_mode) == 0o400
    assert prepare(JAVA, make=True) == Archive(
        f"-XX:SharedArchiveFile={cache / name} -Xshare:auto -XX:+VerifySharedSpaces",
        used=cache / name,
    )
    finish(making, None, keep=True)  # idempotent
    assert published(cache) == [name]


@pytest.mark.parametrize("keep, code", [(False, 0), (True, 1)])
def test_a_run_that_failed_or_a_jvm_that_failed_keeps_nothing(
    cache: Path, keep: bool, code: int
) -> None:
    making = prepare(JAVA, make=True)
    jvm = writer_at_exit(making, 4096, code)
    finish(making, jvm, keep=keep)
    assert jvm.returncode is not None
    assert published(cache) == []  # no archive, no claim, nothing half-written
    assert prepare(JAVA, make=True).making is not None  # the next run makes it


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(min_value=-4096, max_value=64))
def test_an_archive_of_another_size_than_its_name_is_never_handed_to_a_jvm(cut: int) -> None:
    """Cut short (a disk filled, a copy stopped) or grown: removed, and made again by the
    next run that asks; mapped, a truncated archive crashes the JVM with SIGBUS."""
    cache = classes.cache_dir()
    for old in cache.glob("*") if cache.exists() else []:
        old.unlink()
    making = prepare(JAVA, make=True)
    finish(making, writer_at_exit(making, 4096), keep=True)
    (path,) = cache.glob("*.jsa")
    path.chmod(0o600)
    with open(path, "r+b") as f:
        if cut < 0:
            f.truncate(4096 + cut)
        elif cut > 0:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * cut)
    again = prepare(JAVA, make=True)
    if cut == 0:
        assert again.options.startswith("-XX:SharedArchiveFile=")
    else:
        assert again.making is not None and not path.exists()
        finish(again, None, keep=False)


def test_a_claim_whose_maker_is_gone_is_taken_over(cache: Path) -> None:
    making = prepare(JAVA, make=True)
    assert making.making is not None and making.claim is not None
    making.making.write_bytes(b"half an archive")  # its JVM was writing when it died
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    making.claim.write_text(gone.stdout.strip())
    taken = prepare(JAVA, make=True)
    assert taken.making is not None and taken.claim is not None
    assert not making.making.exists() or making.making == taken.making
    assert taken.claim.read_text() == str(os.getpid())
    finish(taken, None, keep=False)

    taken.claim.write_text("")  # a maker between making its claim and writing its id
    assert prepare(JAVA, make=True) == Archive("")
    old = time.time() - classes.STALE - 1
    os.utime(taken.claim, (old, old))
    assert prepare(JAVA, make=True).making is not None


@pytest.mark.parametrize(
    "switch, user", [("off", ""), ("", "-Xshare:off"), ("", "-XX:SharedArchiveFile=/x.jsa")]
)
def test_turned_off_or_the_users_own_class_sharing_asks_nothing(
    cache: Path, monkeypatch: pytest.MonkeyPatch, switch: str, user: str
) -> None:
    monkeypatch.setenv("EOMSG_SPARK_CLASSES", switch)
    assert prepare(JAVA, user, make=True) == Archive("")


def test_a_replay_keeps_sparks_classes_and_a_damaged_archive_costs_only_speed(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path, tmp_path: Path, cache: Path
) -> None:
    """Through real Spark: the first replay says it keeps the classes and publishes the
    archive; the next maps it — here with bytes flipped in it, which the JVM's checksum
    refuses: the replay gives the same rows and removes the archive it refused."""
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.publish_batch([Outgoing(f"orders/{i % 2}", b"m%d" % i) for i in range(50)])
    env = {**cli_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def replay(n: int) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [eomsg_bin, "spark-replay", "--master", "local[2]", "--topic", "orders/>",
             "--sink", f"parquet:{tmp_path / f'out{n}'}", "--job-id", f"j{n}"],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert pq.read_table(tmp_path / f"out{n}").num_rows == 50
        return r

    first = replay(1)
    assert "keeping Spark's classes in the user's cache for faster starts (once)" in first.stderr
    (archive,) = cache.glob("*.jsa")
    assert published(cache) == [archive.name]  # no claim, nothing half-written
    assert archive.name.endswith(f"-{archive.stat().st_size}.jsa")

    archive.chmod(0o600)
    with open(archive, "r+b") as f:
        for offset in (4096, archive.stat().st_size // 2, archive.stat().st_size - 4096):
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    second = replay(2)
    assert "keeping" not in second.stderr
    assert published(cache) == []  # refused, so removed: the next run makes a good one


def test_ctrl_c_while_the_archive_is_written_stops_only_that(cache: Path) -> None:
    """The replay before it is done: Ctrl-C (KeyboardInterrupt) while its JVM writes the
    archive kills that JVM, keeps nothing, and is not raised."""
    making = prepare(JAVA, make=True)
    assert making.making is not None
    writing = making.making.with_name("writing")
    script = (
        f"import sys, time; sys.stdin.buffer.read(); open({str(writing)!r}, 'w'); time.sleep(600)"
    )
    jvm = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)

    def ctrl_c() -> None:
        while not writing.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    finish(making, jvm, keep=True)
    assert jvm.returncode == -signal.SIGKILL
    writing.unlink()
    assert published(cache) == []


def test_an_archive_the_jvm_refused_is_removed_and_one_it_took_is_kept(
    cache: Path, tmp_path: Path
) -> None:
    making = prepare(JAVA, make=True)
    finish(making, writer_at_exit(making, 4096), keep=True)
    used = prepare(JAVA)
    assert used.used is not None
    log = tmp_path / "spark.log"
    log.write_text("Using Spark's default log4j profile\n")
    drop_refused(used, log)
    assert used.used.exists()
    log.write_text(f"[0.05s][warning][cds,dynamic] {classes.REFUSED}. The top archive failed\n")
    drop_refused(used, log)
    assert published(cache) == []
    drop_refused(used, tmp_path / "no such log")  # never raises
