"""Spark's Python daemon (``pyspark.daemon``), run from the compiled PySpark beside it.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every Python
process it starts. Python never writes bytecode for a zip, so each of them compiles
PySpark from source: about a second of CPU per daemon, and a replay on ``local[N]``
starts four (one for the tasks, three for the data source's planning); a cluster, as many
on each executor. Where the PySpark installed for this interpreter is that very
``SPARK_HOME`` (a pip install of PySpark: ``SPARK_HOME`` is the package's directory) the
zip holds the same files, so it is moved behind the installed package, whose bytecode
is compiled once. Anything else (a Spark installed on its own, a Python with only the
zip) keeps the path Spark gave. :func:`eomsg.spark.session.start` names this module as
``spark.python.daemon.module`` on a ``local`` master unless the user chose one (a
cluster's executors may have eomsg only shipped with ``--py-files``, which reaches the
path after the daemon starts); a session of the user's own, whose tasks' Python has
eomsg installed, can too (``--conf spark.python.daemon.module=eomsg.spark.daemon``).

Imports nothing of PySpark or eomsg before the path is settled (``eomsg.spark`` loads
its names lazily for this).
"""

import os
import runpy
import sys
from importlib.machinery import PathFinder


def _zips(path: list[str]) -> list[str]:
    """The entries of ``path`` inside ``$SPARK_HOME/python/lib`` (its pyspark and py4j
    zips), when PySpark installed outside them is that same ``SPARK_HOME``."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        return []
    lib = os.path.join(os.path.realpath(home), "python", "lib")
    zips = [p for p in path if os.path.dirname(os.path.realpath(p)) == lib]
    rest = [p for p in path if p not in zips]
    spec = PathFinder.find_spec("pyspark", rest) if zips else None
    if spec is None or spec.origin is None:
        return []
    installed = os.path.dirname(os.path.realpath(spec.origin))
    return zips if installed == os.path.realpath(home) else []


def main() -> None:
    zips = _zips(sys.path)
    sys.path[:] = [p for p in sys.path if p not in zips] + zips
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
