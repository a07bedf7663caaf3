"""Starting Spark for eomsg: Java checked first, so a missing one is a clear one-line
error instead of a JVM launch failure; the ``eomsg`` source registered; Spark's console
chatter turned down."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from eomsg.errors import InvalidInput, SparkUnavailable

MIN_JAVA = 17
DEFAULT_MASTER = "local[*]"
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_version() -> int:
    """The major version of the Java Spark will use (``JAVA_HOME``, else ``PATH``);
    SparkUnavailable when there is none or it is older than 17."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailable(
            f"Java not found ({'JAVA_HOME=' + home if home else 'no java on PATH'}): Spark "
            f"needs Java {MIN_JAVA}+ (Debian: apt install openjdk-17-jre-headless)"
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SparkUnavailable(f"cannot run {java}: {e}") from e
    m = _VERSION.search(out.stderr + out.stdout)
    if m is None:
        raise SparkUnavailable(f"cannot tell the version of {java}: Spark needs Java {MIN_JAVA}+")
    major = int(m.group(1))
    if major == 1 and m.group(2):  # 1.8 is Java 8
        major = int(m.group(2))
    if major < MIN_JAVA:
        raise SparkUnavailable(
            f"{java} is Java {major}; Spark needs Java {MIN_JAVA}+ (set JAVA_HOME to a newer one)"
        )
    return major


def start(master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession on ``master`` with ``conf``, the ``eomsg`` source registered."""
    java_version()
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkUnavailable(
            "PySpark is not installed: pip install 'eomsg[spark]' (PySpark 4.2+)"
        ) from e
    from eomsg.spark.source import register

    # Executors run this interpreter (it has eomsg), unless the user chose another.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName("eomsg")
    settings = {"spark.ui.showConsoleProgress": "false", **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def parse_conf(pairs: list[str]) -> dict[str, str]:
    """``--conf k=v`` pairs as a dict; a pair without ``=`` is an InvalidInput."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--conf {pair!r} must be key=value")
        out[key.strip()] = value
    return out
