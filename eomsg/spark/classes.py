"""A class-data archive of Spark's driver JVM, kept in the user's cache.

A Spark driver loads some twenty thousand classes before it runs a task; mapped from an
archive the JVM made of them once (Java's application class-data sharing), its start
takes about two thirds of the time and a short replay a third less CPU (figures in
docs/benchmarks.md). The first run that asks for it makes it: its JVM writes the classes
it loaded as it exits (``-XX:ArchiveClassesAtExit``: about 165 MB, some 15 s once), and
the archive is published by rename only after that JVM exited cleanly.

Damage never costs more than the speed: a truncated archive would crash every JVM that
maps it (SIGBUS), so the archive is named with its size and a file of another size is
removed (and made again by the next run that asks); one of the right size with damaged
bytes is refused by the JVM's own checksum (``-XX:+VerifySharedSpaces``), Spark starts
as without, and the archive is removed once the run saw the JVM refuse it. One run at a
time makes it (an flock on ``KEY.making``, gone with its process: the next maker removes a
killed one's half-written file); the directory is owner-only. Never where it cannot
work or would change the user's settings: a cache path the launcher would split
(whitespace, quotes), a non-empty directory on the driver's classpath (a conf dir: the
JVM cannot archive with one), Java options of the user's own in ``spark-defaults.conf``
(ours would replace them). ``EOMSG_SPARK_CLASSES=off`` turns all of it off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

EXIT_WAIT = 120.0  # seconds the maker waits for its JVM to write the archive and exit
KEPT = 2  # archives kept (for as many Java and Spark pairs), the newest
REFUSED = "Unable to use shared archive"  # what the JVM logs of an archive it will not map
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_ARCHIVE = re.compile(r"(?P<key>[0-9a-f]{16})-(?P<size>\d{1,15})\.jsa")
_OURS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
_SPLIT = re.compile(r"[\s'\"\\]")  # what Spark's launcher splits or unquotes in options
# What puts entries on the driver's classpath besides Spark's jars: part of the key (an
# archive is only good for one classpath), and a directory among them must be empty.
_CLASSPATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR",
                  "SPARK_CLASSPATH", "SPARK_DIST_CLASSPATH")  # fmt: skip


@dataclass(frozen=True)
class Archive:
    """What a start adds to the driver's Java options; the archive it maps (``used``),
    or, when this start makes it, where its JVM writes it and the lock it holds."""

    options: str
    used: Path | None = None
    making: Path | None = None
    lock: int | None = None  # a descriptor holding the key's lock (flock) while making


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/eomsg/spark`` (``~/.cache/eomsg/spark``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eomsg" / "spark"


def prepare(java: str, settings: Mapping[str, str], *, make: bool = False) -> Archive:
    """The archive for this Java, this Spark and this classpath (``settings``: the
    session's Spark settings): used when there is one; made by this start when ``make``
    and no other run is making it. Nothing (empty options) when turned off or where it
    cannot work (module docstring) — the archive only ever saves time, so any error here
    is no archive."""
    try:
        if not _wanted(settings):
            return Archive("")
        directory = cache_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
        if _SPLIT.search(str(directory)):
            return Archive("")
        key = _key(java, settings)
        found = _published(directory, key)
        if found is not None:
            return _using(found)
        if not make or (directory / f"{key}.failed").exists():
            return Archive("")
        lock = os.open(directory / f"{key}.making", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another run is making it
            os.close(lock)
            return Archive("")
        found = _published(directory, key)  # made while this run waited for the lock
        if found is not None:
            os.close(lock)
            return _using(found)
        for orphan in directory.glob(f"{key}.*.tmp"):  # a maker killed: its JVM's file
            orphan.unlink(missing_ok=True)
        making = directory / f"{key}.{os.getpid()}.tmp"
        return Archive(f"-XX:ArchiveClassesAtExit={making}", making=making, lock=lock)
    except Exception:  # no home, a read-only cache, a damaged file: no archive
        return Archive("")


def finish(archive: Archive, jvm: subprocess.Popen[bytes] | None, *, keep: bool) -> None:
    """After the session stopped: when this start made the archive, end its JVM and,
    if ``keep`` and it exited cleanly with the archive written, publish it (atomically,
    named with its size); else kill it (nothing is written) and drop what it began. A
    JVM that exited with an error while writing leaves a ``KEY.failed`` marker: no run
    tries again for that key (deleting the cache directory does). Ctrl-C while it
    writes (KeyboardInterrupt) is taken as not keeping it: the run it followed is done
    all the same. Idempotent; never raises."""
    if archive.making is None or archive.lock is None:
        return
    making = archive.making
    try:
        if jvm is not None:
            if keep:
                try:
                    _end(jvm)
                except KeyboardInterrupt:  # Ctrl-C while it writes stops only that
                    keep = False
            if jvm.poll() is None:
                jvm.kill()
                jvm.wait()
        if keep and jvm is not None:
            key = making.name.split(".", 1)[0]
            if jvm.returncode == 0 and making.exists():
                making.chmod(0o400)
                os.replace(making, making.with_name(f"{key}-{making.stat().st_size}.jsa"))
                _prune(making.parent)
            else:
                making.with_name(f"{key}.failed").write_text(
                    f"the JVM exited {jvm.returncode} writing the archive (its log says why)\n"
                )
    except Exception:  # the archive only ever saves time
        pass
    finally:
        with contextlib.suppress(OSError):
            making.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.close(archive.lock)  # idempotent: a second close is EBADF, suppressed


def drop_refused(archive: Archive, jvm_log: Path) -> None:
    """When the JVM refused the archive it was given (its log says so: damaged bytes),
    remove it, so that the next run that asks makes a good one rather than every run
    starting without. Never raises."""
    if archive.used is None:
        return
    with contextlib.suppress(OSError):
        with open(jvm_log, errors="replace") as f:
            refused = any(REFUSED in line for line in f)
        if refused:
            archive.used.unlink(missing_ok=True)


def _using(path: Path) -> Archive:
    return Archive(f"-XX:SharedArchiveFile={path} -Xshare:auto -XX:+VerifySharedSpaces", path)


def _wanted(settings: Mapping[str, str]) -> bool:
    """Not turned off, no class sharing of the user's own, no Java options of theirs in
    ``spark-defaults.conf`` (a ``--conf`` of ours would replace them), and no non-empty
    directory on the driver's classpath (the JVM cannot archive with one)."""
    if os.environ.get("EOMSG_SPARK_CLASSES", "").lower() in ("off", "0", "no", "false"):
        return False
    if any(word in settings.get(JAVA_OPTIONS, "") for word in _OURS):
        return False
    if any("JavaOptions" in key for key in defaults_keys()):
        return False
    conf = conf_dir()
    dirs = [conf] + [Path(os.environ[v]) for v in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")
                     if os.environ.get(v)]  # fmt: skip
    return not any(d.is_dir() and any(d.iterdir()) for d in dirs)


def defaults_keys() -> set[str]:
    """The settings the user's ``spark-defaults.conf`` makes, read as Spark reads it (a
    Java properties file: ``key value``, ``key=value`` or ``key:value``; ``#`` and ``!``
    start a comment). A ``--conf`` of ours would replace any of them."""
    try:
        lines = (conf_dir() / "spark-defaults.conf").read_text(errors="replace").splitlines()
    except OSError:
        return set()
    found = (re.match(r"\s*([^\s=:#!][^\s=:]*)", line) for line in lines)
    return {m[1] for m in found if m}


def conf_dir() -> Path:
    """Where Spark's launcher reads ``spark-defaults.conf`` (and puts on the classpath)."""
    if os.environ.get("SPARK_CONF_DIR"):
        return Path(os.environ["SPARK_CONF_DIR"])
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"]) / "conf"
    import pyspark

    return Path(pyspark.__file__).parent / "conf"


def _end(jvm: subprocess.Popen[bytes]) -> None:
    """PySpark's gateway JVM exits when its stdin closes (its driver is gone); it writes
    the archive as it exits."""
    if jvm.stdin is not None:
        with contextlib.suppress(OSError):
            jvm.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        jvm.wait(timeout=EXIT_WAIT)


def _key(java: str, settings: Mapping[str, str]) -> str:
    """This Java binary, this Spark's jars and what else goes on the driver's classpath:
    an archive is only good for what it was made with (the JVM checks that too, and
    refuses a mismatch without harm)."""
    import pyspark

    real = os.path.realpath(java)
    st = os.stat(real)
    jars = Path(pyspark.__file__).parent / "jars"
    parts = [real, str(st.st_size), str(st.st_mtime_ns), pyspark.__version__, str(jars)]
    parts += [os.environ.get(v, "") for v in _CLASSPATH_ENV]
    parts.append(settings.get("spark.driver.extraClassPath", ""))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _published(directory: Path, key: str) -> Path | None:
    """The archive for ``key`` if one is whole (its size is its name's); one that is not
    is removed — mapped, it would crash the JVM."""
    for path in directory.glob(f"{key}-*.jsa"):
        m = _ARCHIVE.fullmatch(path.name)
        if m is not None and path.stat().st_size == int(m["size"]):
            return path
        path.unlink(missing_ok=True)
    return None


def _prune(directory: Path) -> None:
    """Keep the KEPT newest archives (another Java or Spark installed leaves its own)."""
    archives = sorted(directory.glob("*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[KEPT:]:
        old.unlink(missing_ok=True)
