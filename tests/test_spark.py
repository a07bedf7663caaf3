"""The ``eomsg`` Spark source and the replay job on local[2], one session for the module:
replays run twice give the same output once, into Parquet, DuckDB and a topic; a stream
stopped and restarted from its checkpoint delivers every message exactly once."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from eomsg.cli.common import open_broker
from eomsg.client.sync import connect
from eomsg.core.queues import QueueConfig
from eomsg.errors import Interrupted, ReplayFailed, SinkConflict, TransformError
from eomsg.node.node import Node, NodeSettings
from eomsg.spark.job import ReplayResult, ReplaySpec, execute, plan
from tests.conftest import NodeProcess

N = 3000

pytestmark = [pytest.mark.spark, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _publish(data: Path, start: int, count: int) -> None:
    with open_broker(data) as node:
        for lo in range(start, start + count, 500):
            node.publish_batch([_message(i) for i in range(lo, min(lo + 500, start + count))])


def _message(i: int) -> Any:
    from eomsg.core.message import Outgoing

    topic = ("orders/eu/new", "orders/us/new", "billing/invoice")[i % 3]
    return Outgoing(topic, json.dumps({"n": i, "price": i / 10}).encode(), id=f"m-{i}")


@pytest.fixture
def filled(data_dir: Path) -> Path:
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.admin.create_queue(QueueConfig("orders", ("orders/>",)))
    _publish(data_dir, 0, N)
    return data_dir


def _orders(upto: int = N) -> list[int]:
    """The seqs of the order messages among the first ``upto`` (seq = i + 1)."""
    return [i + 1 for i in range(upto) if i % 3 != 2]


def run(
    spark: Any, data: Path, force: bool = False, allow_fewer: bool = False, **spec: Any
) -> ReplayResult:
    s = ReplaySpec(**spec)
    with open_broker(data) as node:
        p = plan(s, node, data=data, force=force)
    return execute(p, lambda: open_broker(data), lambda: spark, allow_fewer=allow_fewer)


def test_source_reads_the_file_and_through_a_node(
    spark: Any, filled: Path, serve: Callable[..., NodeProcess]
) -> None:
    def seqs(**options: str) -> list[int]:
        reader = spark.read.format("eomsg")
        for k, v in options.items():
            reader = reader.option(k, v)
        return [r.seq for r in reader.load().orderBy("seq").collect()]

    data = str(filled)
    assert seqs(data=data, topic="orders/>") == _orders()
    assert seqs(data=data, queue="orders", rowsPerPartition="700") == _orders()
    assert seqs(data=data, topic="billing/>,orders/eu/*", fromSeq="10", toSeq="20") == [
        s for s in range(10, 21) if (s - 1) % 3 != 1
    ]
    df = spark.read.format("eomsg").option("data", data).option("partitions", "3").load()
    assert df.rdd.getNumPartitions() == 3 and df.count() == N
    row = df.orderBy("seq").first()
    assert (row.seq, row.topic, row.id, json.loads(row.payload)) == (
        1, "orders/eu/new", "m-0", {"n": 0, "price": 0.0},
    )  # fmt: skip

    node = serve()
    assert seqs(data=data, topic="orders/>") == _orders()  # through the node's socket
    assert seqs(broker=node.tcp, token=node.token, queue="orders") == _orders()


def test_replay_into_parquet_twice_gives_one_identical_output(spark: Any, filled: Path) -> None:
    out = filled.parent / "out"
    first = run(spark, filled, sink=f"parquet:{out}", topic="orders/>", job_id="p1", partitions=4)
    assert (first.status, first.rows) == ("done", len(_orders()))
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    table = pq.read_table(out)
    assert sorted(table["seq"].to_pylist()) == _orders()  # each once
    assert table.column_names == ["seq", "id", "topic", "published_at", "headers", "payload"]

    again = run(spark, filled, sink=f"parquet:{out}", topic="orders/>", job_id="p1", partitions=4)
    assert (again.status, again.rows) == ("skipped", first.rows)
    forced = run(
        spark, filled, True, sink=f"parquet:{out}", topic="orders/>", job_id="p1", partitions=4
    )
    assert (forced.status, forced.digest) == ("done", first.digest)
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == files
    with open_broker(filled) as node:
        [job] = node.replay_jobs("p1")
    assert (job.status.value, job.rows, job.digest) == ("done", first.rows, first.digest)

    with pytest.raises(SinkConflict, match="holds the output of replay job p1"):
        run(spark, filled, sink=f"parquet:{out}", topic="billing/>", job_id="p2")


def test_row_transform_into_duckdb_twice_no_duplicates(
    spark: Any, filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fixes_for_test.py").write_text(
        "def reprice(row):\n"
        "    p = row['payload']\n"
        "    if p['n'] % 2:\n"
        "        return None\n"
        "    return {'n': p['n'], 'price': p['price'] * 2}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sink = f"duckdb:{tmp_path / 'app.duckdb'}:repriced"
    spec = dict(sink=sink, queue="orders", transform="fixes_for_test:reprice", decode="json")
    first = run(spark, filled, **spec)  # type: ignore[arg-type]
    expected = [s for s in _orders() if (s - 1) % 2 == 0]
    assert first.rows == len(expected)
    assert run(spark, filled, **spec).status == "skipped"  # type: ignore[arg-type]
    assert run(spark, filled, True, **spec).status == "done"  # type: ignore[arg-type]
    with duckdb.connect(str(tmp_path / "app.duckdb")) as conn:
        rows = conn.execute(
            "SELECT seq, n, price, replay_job FROM repriced ORDER BY seq"
        ).fetchall()
        ledger = conn.execute("SELECT job_id, rows FROM eomsg_replay_ledger").fetchall()
    assert [r[0] for r in rows] == expected  # once each, after three runs
    assert all(r[1] == r[0] - 1 and r[2] == pytest.approx((r[0] - 1) / 5) for r in rows)
    assert ledger == [(first.job_id, len(expected))]


def test_dataframe_and_sql_transforms(
    spark: Any, filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "df_fixes.py").write_text(
        "from pyspark.sql import DataFrame, functions as F\n"
        "def evens(df: DataFrame) -> DataFrame:\n"
        "    return df.where(F.col('seq') % 2 == 0).select('seq', 'id', 'topic',\n"
        "        F.get_json_object('payload', '$.n').cast('int').alias('n'))\n"
        "def drops_seq(df: DataFrame) -> DataFrame:\n"
        "    return df.select('id', 'topic')\n"
        "def fails(row):\n"
        "    raise ValueError('bad row')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "evens"
    run(spark, filled, sink=f"parquet:{out}", transform="df_fixes:evens", to_seq=100)
    table = pq.read_table(out)
    assert table["seq"].to_pylist() == list(range(2, 101, 2))
    assert table["n"].to_pylist() == [s - 1 for s in range(2, 101, 2)]

    out = tmp_path / "sql"
    sql = "SELECT seq, id, topic, upper(payload) AS p FROM messages WHERE topic LIKE 'billing/%'"
    assert run(spark, filled, sink=f"parquet:{out}", sql=sql).rows == N // 3
    assert pq.read_table(out)["p"][0].as_py() == '{"N": 2, "PRICE": 0.2}'

    with pytest.raises(TransformError, match="lacks seq: keep seq, id and topic"):
        run(spark, filled, sink=f"parquet:{tmp_path / 'x'}", transform="df_fixes:drops_seq")
    with pytest.raises(TransformError, match="df_fixes:fails failed on seq 1: bad row"):
        run(spark, filled, sink=f"parquet:{tmp_path / 'y'}", transform="df_fixes:fails")
    with pytest.raises(TransformError, match="cannot import 'nope'"):
        run(spark, filled, sink=f"parquet:{tmp_path / 'z'}", transform="nope:f")
    with open_broker(filled) as node:
        failed = {j.job_id: j.status.value for j in node.replay_jobs()}
    assert sorted(failed.values()) == ["done", "done", "failed", "failed"]


def test_output_is_replaced_by_fewer_rows_only_when_asked(spark: Any, filled: Path) -> None:
    out = filled.parent / "few"
    every = "SELECT seq, id, topic FROM messages"
    first = run(spark, filled, sink=f"parquet:{out}", sql=every, job_id="f1")
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    fewer = "SELECT seq, id, topic FROM messages WHERE seq <= 10"
    with pytest.raises(SinkConflict, match=f"holds {first.rows} rows of job f1; this run made 10"):
        run(spark, filled, True, sink=f"parquet:{out}", sql=fewer, job_id="f1")
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == files
    assert not list(filled.parent.glob(".few.eomsg-staging-*"))
    with open_broker(filled) as node:  # the record, like the output, as it was
        assert node.replay_jobs("f1")[0].status.value == "done"
    assert run(spark, filled, True, True, sink=f"parquet:{out}", sql=fewer, job_id="f1").rows == 10
    assert pq.read_table(out).num_rows == 10


def test_replay_into_a_topic_twice_publishes_each_message_once(spark: Any, filled: Path) -> None:
    spec = dict(sink="topic:replayed/orders", topic="orders/>", job_id="t1")
    first = run(spark, filled, **spec)  # type: ignore[arg-type]
    forced = run(spark, filled, True, **spec)  # type: ignore[arg-type]
    assert first.rows == forced.rows == len(_orders())
    with open_broker(filled) as node:
        log = node.log("replayed/orders", 0, 10 * N)
    assert len(log) == len(_orders())  # the forced run's publishes were duplicates
    assert [m.id for m in log] == [f"replay:t1:{s}" for s in _orders()]
    assert json.loads(log[0].payload) == {"n": 0, "price": 0.0}
    assert log[0].headers["eomsg-source-seq"] == "1"


def test_stream_stopped_and_restarted_from_its_checkpoint_is_exactly_once(
    spark: Any, filled: Path, serve: Callable[..., NodeProcess]
) -> None:
    serve()
    out, checkpoint = filled.parent / "stream", filled.parent / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        df = (
            spark.readStream.format("eomsg")
            .option("data", str(filled))
            .option("topic", "orders/>")
            .option("maxRowsPerTrigger", "400")
            .load()
        )
        return (
            df.select("seq", "id", "topic")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start({"processingTime": "1 second"})
    with connect(filled) as client:  # the node keeps taking messages meanwhile
        for lo in range(N, N + 1500, 100):
            client.publish_batch([_message(i) for i in range(lo, lo + 100)])
        deadline = time.monotonic() + 60
        while len(query.recentProgress) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()  # mid-stream: not everything has been read
        first = _committed(spark, out)
        client.publish_batch([_message(i) for i in range(N + 1500, N + 1600)])
    total = N + 1600
    assert 0 < len(first) < len(_orders(total))

    query = start({"availableNow": True})
    query.awaitTermination(120)
    assert _committed(spark, out) == _orders(total)  # every order once, none twice


def _committed(spark: Any, out: Path) -> list[int]:
    """The seqs the stream's committed batches wrote, sorted. Spark reads a file sink's
    directory through its ``_spark_metadata`` log, so a part file that a batch stopped
    mid-write left behind (empty, or half written) is not read — as a reader of the
    stream's output must not read it."""
    if not (out / "_spark_metadata").exists():
        return []
    rows = spark.read.schema("seq LONG, id STRING, topic STRING").parquet(str(out)).collect()
    return sorted(row.seq for row in rows)


def test_an_error_once_a_signal_came_is_the_interruption(filled: Path) -> None:
    """DuckDB turns a KeyboardInterrupt raised inside a query into
    ``RuntimeError('Query interrupted')``: once the caller says a signal came, any error
    ends the run as Interrupted (the CLI's exit 130), not as a failed Spark job; without
    one, the same error is a failed replay. Either way the job is failed, staging gone."""
    with open_broker(filled) as node:
        p = plan(ReplaySpec(sink=f"parquet:{filled.parent / 'o'}", topic="orders/>", job_id="i"),
                 node, data=filled)  # fmt: skip

    def cut() -> Any:
        p.staging.mkdir(parents=True)
        raise RuntimeError("Query interrupted")

    with pytest.raises(Interrupted, match=r"^interrupted: job i was recorded failed; run the "):
        execute(p, lambda: open_broker(filled), cut, interrupted=lambda: True)
    with pytest.raises(ReplayFailed, match=r"^the Spark job failed: Query interrupted$"):
        execute(p, lambda: open_broker(filled), cut)
    with open_broker(filled) as node:
        assert [j.status.value for j in node.replay_jobs("i")] == ["failed"]
    assert not p.staging.exists() and not (filled.parent / "o").exists()


def test_the_source_module_loads_neither_client_nor_store() -> None:
    """Spark imports ``eomsg.spark.source`` in a Python process of its own to look the
    source up and in another for its schema: neither loads the client or the store
    (asyncio, DuckDB, Arrow: ≈ 0.4 s each), only a process that opens a log does."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import eomsg.spark.source"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "eomsg.spark.source" in loaded
    heavy = {"duckdb", "pyarrow", "eomsg.client.sync", "eomsg.store.logread", "asyncio"}
    assert not loaded & heavy, sorted(loaded & heavy)


def test_tasks_run_the_installed_pyspark_not_the_zip_spark_puts_first(spark: Any) -> None:
    """Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python workers'
    path, and a zip's bytecode is never cached: the daemon the session names
    (``eomsg.spark.daemon``) moves it behind the installed PySpark (the same files,
    compiled once), so a task imports PySpark from there."""
    import os

    import pyspark

    home = os.environ.get("SPARK_HOME")
    own = bool(home) and Path(home).resolve() != Path(pyspark.__file__).parent.resolve()

    def where(_: Any) -> list[str]:
        import sys

        import pyspark as theirs

        return [theirs.__file__ or "", *(p for p in sys.path if p.endswith(".zip"))]

    (found,) = spark.sparkContext.parallelize([0], 1).mapPartitions(where).glom().collect()
    if own:  # a Spark installed on its own: its zip is what it needs, left first
        assert ".zip" in found[0], found
    else:
        assert found[0] == pyspark.__file__
        assert found[1:] and all(p.endswith(".zip") for p in found[1:])  # still there


def test_the_daemon_moves_only_the_zips_of_the_spark_home_installed_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyspark

    from eomsg.spark.daemon import _zips

    home = Path(pyspark.__file__).parent
    lib = home / "python" / "lib"
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-src.zip"), "/elsewhere", *sys.path]
    monkeypatch.setenv("SPARK_HOME", str(home))
    assert _zips(path) == path[:2]
    # a Spark installed on its own: its zips are what this Spark needs
    other = tmp_path / "spark"
    (other / "python" / "lib").mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(other))
    assert _zips([str(other / "python" / "lib" / "pyspark.zip"), *sys.path]) == []
    monkeypatch.delenv("SPARK_HOME")
    assert _zips(path) == []
    # no PySpark installed outside the zip: the zip stays first
    monkeypatch.setenv("SPARK_HOME", str(home))
    assert _zips([str(lib / "pyspark.zip"), "/elsewhere"]) == []


@pytest.mark.parametrize(
    "text, named",
    [
        ("spark.python.daemon.module my.daemon\n", True),
        ("  spark.python.daemon.module=my.daemon\n", True),
        ("spark.python.daemon.module:my.daemon\n", True),
        ("# spark.python.daemon.module my.daemon\n", False),
        ("! spark.python.daemon.module my.daemon\n", False),
        ("spark.python.daemon.modules x\nspark.ui.enabled false\n", False),
        ("", False),
    ],
)
def test_a_daemon_module_of_the_users_own_is_read_as_spark_reads_its_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, named: bool
) -> None:
    from eomsg.spark.classes import defaults_keys
    from eomsg.spark.session import DAEMON

    (tmp_path / "spark-defaults.conf").write_text(text)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert (DAEMON in defaults_keys()) is named
