"""Starting Spark for eomsg: Java checked first, so a missing one is a clear one-line
error instead of a JVM launch failure; the ``eomsg`` source registered; Spark's console
chatter turned down."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from eomsg.errors import InvalidInput, SparkUnavailable
from eomsg.spark import classes

MIN_JAVA = 17
MASTER_TIMEOUT = 5.0  # seconds to wait for a standalone master to accept a connection
DEFAULT_MASTER = "local[*]"
# The module Spark runs its Python daemon with (tasks' workers fork from it): ours moves
# Spark's zip of PySpark behind the installed, compiled package (eomsg.spark.daemon).
DAEMON = "spark.python.daemon.module"
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java() -> str:
    """The Java Spark will use (``JAVA_HOME``, else ``PATH``); SparkUnavailable when
    there is none."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not found or not os.path.exists(found):
        raise SparkUnavailable(
            f"Java not found ({'JAVA_HOME=' + home if home else 'no java on PATH'}): Spark "
            f"needs Java {MIN_JAVA}+ (Debian: apt install openjdk-17-jre-headless)"
        )
    return found


def java_version() -> int:
    """The major version of :func:`java`; SparkUnavailable when there is none or it is
    older than 17."""
    path = java()
    try:
        out = subprocess.run(
            [path, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkUnavailable(f"cannot run {path}: {e}") from e
    m = _VERSION.search(out.stderr + out.stdout)
    if m is None:
        raise SparkUnavailable(f"cannot tell the version of {path}: Spark needs Java {MIN_JAVA}+")
    major = int(m.group(1))
    if major == 1 and m.group(2):  # 1.8 is Java 8
        major = int(m.group(2))
    if major < MIN_JAVA:
        raise SparkUnavailable(
            f"{path} is Java {major}; Spark needs Java {MIN_JAVA}+ (set JAVA_HOME to a newer one)"
        )
    return major


def check_master(master: str) -> None:
    """For a standalone cluster (``spark://HOST:PORT[,HOST:PORT…]``), that a master
    answers, before anything is recorded: a wrong host is one line at once, not a minute
    of Spark's retries ending in a Java trace. SparkUnavailable if none answers."""
    if not master.startswith("spark://"):
        return
    reasons = []
    for hostport in master.removeprefix("spark://").split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidInput(f"--master {master!r}: expected spark://HOST:PORT")
        try:
            socket.create_connection((host, int(port)), timeout=MASTER_TIMEOUT).close()
            return
        except OSError as e:
            reasons.append(f"{host}:{port}: {_why(e)}")
    raise SparkUnavailable(f"cannot reach the Spark master ({'; '.join(reasons)})")


def _why(e: OSError) -> str:
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror})"
    if isinstance(e, TimeoutError):
        return f"no answer in {MASTER_TIMEOUT:g} s"
    return e.strerror or str(e)


def start(
    master: str = DEFAULT_MASTER,
    conf: Mapping[str, str] | None = None,
    *,
    keep_classes: bool = False,
) -> Any:
    """A SparkSession on ``master`` with ``conf``, the ``eomsg`` source registered; its
    driver started from the class-data archive in the user's cache when there is one
    (``eomsg.spark.classes``), its Python daemon from the installed PySpark's compiled
    files on a ``local`` master (``eomsg.spark.daemon``; unless ``conf`` or
    spark-defaults.conf names another).
    With ``keep_classes``, a start that finds none makes it: end such a session with
    :func:`stop`, which publishes it."""
    java_version()
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkUnavailable(
            "PySpark is not installed: pip install 'eomsg[spark]' (PySpark 4.2+)"
        ) from e
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    from eomsg.spark.source import register

    # Executors run this interpreter (it has eomsg), unless the user chose another.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):  # one machine: no guessing at a network address
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {"spark.ui.showConsoleProgress": "false", **(conf or {})}
    # On one machine the tasks' Python is this one, which has eomsg installed; a
    # cluster's executors may have it only shipped (--py-files), after the daemon starts.
    if master.startswith("local") and DAEMON not in {*settings, *classes.defaults_keys()}:
        settings[DAEMON] = "eomsg.spark.daemon"  # PySpark's, from its compiled files
    archive = classes.prepare(java(), settings, make=keep_classes)
    if archive.options:
        options = settings.get(classes.JAVA_OPTIONS, "")
        settings[classes.JAVA_OPTIONS] = f"{options} {archive.options}".strip()
    spark_conf = SparkConf().setMaster(master).setAppName("eomsg").setAll(list(settings.items()))
    gateway = None
    try:
        # The JVM's own output (log4j's start-up lines, its warnings) goes to a log of its
        # own, named in errors; the terminal gets eomsg's lines only.
        with tempfile.NamedTemporaryFile(prefix="eomsg-spark-", suffix=".log", delete=False) as log:
            gateway = launch_gateway(  # type: ignore[no-untyped-call]
                spark_conf, popen_kwargs={"stdout": log, "stderr": log}
            )
        context = SparkContext(conf=spark_conf, gateway=gateway)
    except BaseException:  # a start that failed makes nothing
        classes.finish(archive, getattr(gateway, "proc", None), keep=False)
        raise
    context.setLogLevel("ERROR")
    spark = SparkSession(context)
    spark.eomsg_log = log.name  # type: ignore[attr-defined]
    spark.eomsg_classes = archive  # type: ignore[attr-defined]
    _quiet_py4j()
    register(spark)
    return spark


def stop(spark: Any, *, ok: bool = True) -> None:
    """Stop a session :func:`start` gave. When its start was making the class-data
    archive, its JVM is ended here: if the session did its work (``ok``), the JVM writes
    the archive as it exits (some 15 s, once) and it is published; else, or at Ctrl-C,
    the JVM is killed and nothing is kept. Idempotent; raises nothing."""
    archive = getattr(spark, "eomsg_classes", None)
    jvm = getattr(spark.sparkContext._gateway, "proc", None)
    try:
        if ok or archive is None or archive.making is None:
            spark.stop()  # (a failed run's JVM, making the archive, is killed instead)
        else:
            _stop_accumulators(spark.sparkContext)
    except KeyboardInterrupt:  # Ctrl-C here stops the keeping, not the run before it
        ok = False
    except Exception:  # a session that cannot stop is ended with its JVM below
        pass
    if archive is not None:
        classes.finish(archive, jvm, keep=ok)


def _stop_accumulators(context: Any) -> None:
    """Stop the driver's accumulator server before its JVM is killed: the JVM's end cuts
    the server's connection, and its handler would print a traceback on the terminal.
    Waits (up to about 1.5 s: the handler polls every second) for the handler to leave
    its loop, as ``spark.stop()`` does."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.shutdown()
        context._accumulatorServer = None


def making_classes(spark: Any) -> bool:
    """Whether this session's start is making the class-data archive (then end it with
    :func:`stop`, or the archive is not kept)."""
    archive = getattr(spark, "eomsg_classes", None)
    return archive is not None and archive.making is not None


class _NotPy4J(logging.Filter):
    """Drops what Py4J logs through the root logger (its connection's tracebacks when
    Ctrl-C cuts a call short): the interruption is reported once, as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "py4j" not in record.pathname


def _quiet_py4j() -> None:
    """Give the root logger a stderr handler that drops Py4J's records (so Python does
    not make its default one, which would print them); everyone else's warnings stay."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    if not any(isinstance(f, _NotPy4J) for h in logging.root.handlers for f in h.filters):
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        handler.addFilter(_NotPy4J())
        logging.root.addHandler(handler)


def parse_conf(pairs: list[str]) -> dict[str, str]:
    """``--conf k=v`` pairs as a dict; a pair without ``=`` is an InvalidInput."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--conf {pair!r} must be key=value")
        out[key.strip()] = value
    return out
