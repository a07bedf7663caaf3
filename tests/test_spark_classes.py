"""Spark's class-data archive (``eomsg.spark.classes``): made once by a replay, published
only after its JVM exited cleanly, never handed to a JVM unless whole, never where it
cannot work or would change the user's settings, and damage to it costing only speed — a
truncated archive would crash every JVM that maps it."""

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

pytestmark = pytest.mark.spark

JAVA = "/usr/bin/env"  # any file: the key is made of its path and stat, never run
NONE: dict[str, str] = {}


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spark_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("EOMSG_SPARK_CLASSES", *classes._CLASSPATH_ENV):
        monkeypatch.delenv(name, raising=False)
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


def made(conf: dict[str, str] = NONE, size: int = 4096) -> Path:
    """Make and publish an archive as a run would; its path."""
    making = prepare(JAVA, conf, make=True)
    assert making.making is not None
    finish(making, writer_at_exit(making, size), keep=True)
    used = prepare(JAVA, conf).used
    assert used is not None
    return used


def published(cache: Path) -> list[str]:
    """What the cache holds but its lock files."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".making"))


def test_nothing_is_asked_of_the_jvm_without_an_archive_or_a_wish_to_make_one(
    cache: Path,
) -> None:
    assert prepare(JAVA, NONE) == Archive("")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # owner-only, as every file of ours


def test_one_start_makes_it_and_the_next_uses_it(cache: Path) -> None:
    making = prepare(JAVA, NONE, make=True)
    assert making.making is not None and making.lock is not None
    assert making.options == f"-XX:ArchiveClassesAtExit={making.making}"
    assert prepare(JAVA, NONE, make=True) == Archive("")  # one maker at a time

    finish(making, writer_at_exit(making, 4096), keep=True)
    (name,) = published(cache)
    assert name.endswith("-4096.jsa")
    assert stat.S_IMODE((cache / name).stat().st_mode) == 0o400
    assert prepare(JAVA, NONE, make=True) == Archive(
        f"-XX:SharedArchiveFile={cache / name} -Xshare:auto -XX:+VerifySharedSpaces",
        used=cache / name,
    )
    finish(making, None, keep=True)  # idempotent
    assert published(cache) == [name]


def test_a_failed_run_keeps_nothing_and_a_jvm_that_could_not_write_is_not_asked_again(
    cache: Path,
) -> None:
    making = prepare(JAVA, NONE, make=True)
    jvm = writer_at_exit(making, 4096)
    finish(making, jvm, keep=False)
    assert jvm.returncode is not None and published(cache) == []
    making = prepare(JAVA, NONE, make=True)  # the next run makes it
    finish(making, writer_at_exit(making, 4096, code=1), keep=True)
    (marker,) = published(cache)
    assert marker.endswith(".failed")
    assert prepare(JAVA, NONE, make=True) == Archive("")  # not every run pays for trying


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
    path = made()
    path.chmod(0o600)
    with open(path, "r+b") as f:
        if cut < 0:
            f.truncate(4096 + cut)
        elif cut > 0:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * cut)
    again = prepare(JAVA, NONE, make=True)
    if cut == 0:
        assert again.used == path
    else:
        assert again.making is not None and not path.exists()
        finish(again, None, keep=False)


def test_a_maker_killed_leaves_its_lock_to_the_next_run_and_its_jvms_file_is_removed(
    cache: Path,
) -> None:
    """A real process making it, SIGKILLed: the lock (flock) goes with it; its JVM's
    half-written file is removed by the next maker. The lock file's bytes mean nothing."""
    ready = cache.parent / "ready"
    maker = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from eomsg.spark.classes import prepare; "
         f"a = prepare({JAVA!r}, {{}}, make=True); a.making.write_bytes(b'half'); "
         f"open({str(ready)!r}, 'w'); time.sleep(600)"],
        env={**os.environ, "XDG_CACHE_HOME": str(cache.parent.parent)},
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert maker.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    (half,) = cache.glob("*.tmp")
    assert prepare(JAVA, NONE, make=True) == Archive("")  # held while it lives
    maker.kill()
    maker.wait()
    for lock in cache.glob("*.making"):
        lock.write_bytes(b"\xff" * 40)  # damaged: flock does not read it
    taken = prepare(JAVA, NONE, make=True)
    assert taken.making is not None and not half.exists()
    finish(taken, writer_at_exit(taken, 100), keep=True)
    assert [n.endswith("-100.jsa") for n in published(cache)] == [True]


@pytest.mark.parametrize(
    "switch, conf", [("off", {}), ("", {"spark.driver.extraJavaOptions": "-Xshare:off"}),
                     ("", {"spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/x.jsa"})],
)  # fmt: skip
def test_turned_off_or_the_users_own_class_sharing_asks_nothing(
    monkeypatch: pytest.MonkeyPatch, switch: str, conf: dict[str, str]
) -> None:
    monkeypatch.setenv("EOMSG_SPARK_CLASSES", switch)
    assert prepare(JAVA, conf, make=True) == Archive("")


def test_never_where_the_launcher_would_split_the_path_or_drop_the_users_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache path with a space (Spark's launcher splits options on whitespace: the JVM
    would not start); Java options in spark-defaults.conf (a --conf replaces them); a
    non-empty directory on the classpath (the JVM cannot archive with one)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a b"))
    assert prepare(JAVA, NONE, make=True) == Archive("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert prepare(JAVA, NONE, make=True).making is not None  # an empty conf dir is fine
    (conf / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -Djavax.net.ssl.trustStore=/etc/ts\n"
    )
    assert prepare(JAVA, NONE, make=True) == Archive("")
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert prepare(JAVA, NONE, make=True) == Archive("")  # non-empty, on the classpath
    monkeypatch.delenv("SPARK_CONF_DIR")
    hadoop = tmp_path / "hadoop"
    hadoop.mkdir()
    (hadoop / "core-site.xml").write_text("<configuration/>")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(hadoop))
    assert prepare(JAVA, NONE, make=True) == Archive("")


def test_an_archive_is_for_its_classpath_and_the_newest_two_are_kept(cache: Path) -> None:
    first = made({"spark.driver.extraClassPath": "/opt/a.jar"})
    assert prepare(JAVA, NONE).used is None  # another classpath: not this archive
    os.utime(first, (1, 1))  # the oldest
    made()
    made({"spark.driver.extraClassPath": "/opt/b.jar"})
    assert len(list(cache.glob("*.jsa"))) == classes.KEPT and not first.exists()


def test_a_replay_keeps_sparks_classes_and_a_damaged_archive_costs_only_speed(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path, tmp_path: Path, cache: Path
) -> None:
    """Through real Spark: the first replay says it keeps the classes and publishes the
    archive; the next maps it — here with bytes flipped in it, which the JVM's checksum
    refuses: the replay gives the same rows and removes the archive it refused."""
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish_batch([Outgoing(f"orders/{i % 2}", b"m%d" % i) for i in range(50)])
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
    assert published(cache) == [archive.name]  # nothing half-written
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
    making = prepare(JAVA, NONE, make=True)
    assert making.making is not None
    writing = cache.parent / "writing"
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
    assert published(cache) == []
    assert prepare(JAVA, NONE, make=True).making is not None  # no marker: tried again


def test_an_archive_the_jvm_refused_is_removed_and_one_it_took_is_kept(
    cache: Path, tmp_path: Path
) -> None:
    used = Archive("", used=made())
    assert used.used is not None
    log = tmp_path / "spark.log"
    log.write_text("Using Spark's default log4j profile\n")
    drop_refused(used, log)
    assert used.used.exists()
    log.write_text(f"[0.05s][warning][cds,dynamic] {classes.REFUSED}. The top archive failed\n")
    drop_refused(used, log)
    assert published(cache) == []
    drop_refused(used, tmp_path / "no such log")  # never raises
