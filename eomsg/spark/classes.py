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
time makes it (a claim file, taken over once its maker is gone); the directory is
owner-only. ``EOMSG_SPARK_CLASSES=off`` turns all of it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

STALE = 1800.0  # seconds after which a claim or a half-made archive is abandoned
EXIT_WAIT = 120.0  # seconds the maker waits for its JVM to write the archive and exit
_ARCHIVE = re.compile(r"(?P<key>[0-9a-f]{16})-(?P<size>\d{1,15})\.jsa")
_OURS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
REFUSED = "Unable to use shared archive"  # what the JVM logs of an archive it will not map


@dataclass(frozen=True)
class Archive:
    """What a start adds to the driver's Java options, and, when this start makes the
    archive, where its JVM writes it."""

    options: str
    making: Path | None = None
    claim: Path | None = None
    used: Path | None = None


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/eomsg/spark`` (``~/.cache/eomsg/spark``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eomsg" / "spark"


def prepare(java: str, user_options: str = "", *, make: bool = False) -> Archive:
    """The archive for this Java and this Spark: used when there is one; made by this
    start when ``make`` and no other run is making it. Nothing (empty options) when
    turned off, when the user's own Java options set class sharing, or when the cache
    directory cannot be made — the archive only ever saves time."""
    if os.environ.get("EOMSG_SPARK_CLASSES", "").lower() in ("off", "0", "no", "false"):
        return Archive("")
    if any(word in user_options for word in _OURS):
        return Archive("")
    try:
        directory = cache_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = _key(java)
        found = _published(directory, key)
        if found is not None:
            options = f"-XX:SharedArchiveFile={found} -Xshare:auto -XX:+VerifySharedSpaces"
            return Archive(options, used=found)
        if not make:
            return Archive("")
        claim = directory / f"{key}.making"
        if not _claim(claim):
            return Archive("")
        making = directory / f"{key}.{os.getpid()}.tmp"
        making.unlink(missing_ok=True)
        return Archive(f"-XX:ArchiveClassesAtExit={making}", making, claim)
    except (OSError, RuntimeError):  # RuntimeError: no home directory to be found
        return Archive("")


def finish(archive: Archive, jvm: subprocess.Popen[bytes] | None, *, keep: bool) -> None:
    """After the session stopped: when this start made the archive, end its JVM and,
    if ``keep`` and it exited cleanly with the archive written, publish it (atomically,
    named with its size); else kill it (nothing is written) and drop what it began.
    Idempotent; never raises."""
    if archive.making is None or archive.claim is None:
        return
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
        done = keep and jvm is not None and jvm.returncode == 0
        if done and archive.making.exists():
            size = archive.making.stat().st_size
            key = archive.claim.name.removesuffix(".making")
            os.chmod(archive.making, 0o400)
            os.replace(archive.making, archive.making.with_name(f"{key}-{size}.jsa"))
    except OSError:
        pass
    finally:
        archive.making.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if archive.claim.read_text() == str(os.getpid()):
                archive.claim.unlink()


def drop_refused(archive: Archive, jvm_log: Path) -> None:
    """When the JVM refused the archive it was given (its log says so: damaged bytes,
    another classpath), remove it, so that the next run that asks makes a good one
    rather than every run starting without. Never raises."""
    if archive.used is None:
        return
    with contextlib.suppress(OSError):
        with open(jvm_log, errors="replace") as f:
            refused = any(REFUSED in line for line in f)
        if refused:
            archive.used.unlink(missing_ok=True)


def _end(jvm: subprocess.Popen[bytes]) -> None:
    """PySpark's gateway JVM exits when its stdin closes (its driver is gone); it writes
    the archive as it exits."""
    if jvm.stdin is not None:
        with contextlib.suppress(OSError):
            jvm.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        jvm.wait(timeout=EXIT_WAIT)


def _key(java: str) -> str:
    """This Java binary and this Spark's jars: an archive is only good for the two it was
    made with (the JVM checks that too, and refuses a mismatch without harm)."""
    import pyspark

    real = os.path.realpath(java)
    st = os.stat(real)
    jars = Path(pyspark.__file__).parent / "jars"
    text = f"{real}|{st.st_size}|{st.st_mtime_ns}|{pyspark.__version__}|{jars}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _published(directory: Path, key: str) -> Path | None:
    """The archive for ``key`` if one is whole (its size is its name's); one that is not
    is removed — mapped, it would crash the JVM."""
    for path in directory.glob(f"{key}-*.jsa"):
        m = _ARCHIVE.fullmatch(path.name)
        if m is not None and path.stat().st_size == int(m["size"]):
            return path
        path.unlink(missing_ok=True)
    return None


def _claim(claim: Path) -> bool:
    """Take the claim to make the archive (a file holding this process's id), taking
    over one whose maker is gone or that is older than STALE; False if another run
    holds it."""
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if not _abandoned(claim):
                return False
            for tmp in claim.parent.glob(claim.name.removesuffix(".making") + ".*.tmp"):
                tmp.unlink(missing_ok=True)
            claim.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _abandoned(claim: Path) -> bool:
    try:
        text = claim.read_text()
        age = time.time() - claim.stat().st_mtime
        pid = int(text or "0")
    except (OSError, ValueError):
        return True
    if not text:  # its maker is between making the file and writing its id
        return age > 5.0
    if age > STALE or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
