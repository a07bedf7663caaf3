"""``eomsg spark-replay`` on a real standalone cluster: a master and a worker started with
``spark-class`` on loopback, in this test's own directories, and replays run through them
into every sink — each row exactly once, the tasks run by the worker's executors — plus a
resource request no worker can meet, which says so and stops cleanly at Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from eomsg.core.message import Outgoing
from eomsg.node.node import Node, NodeSettings
from tests.conftest import eventually, spark_or_skip

pytestmark = pytest.mark.spark

N = 3000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and one worker (2 cores, 1 GiB) on loopback: its URL."""
    spark_or_skip()
    import pyspark

    home = Path(pyspark.__file__).parent
    root = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_LOCAL_DIRS": str(root / "local"),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",  # as the drivers (conftest)
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    spark_class = str(home / "bin" / "spark-class")
    started = []
    master_log = (root / "master.log").open("w")
    worker_log = (root / "worker.log").open("w")
    try:
        started.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(_free_port())],
            env=env, stdout=master_log, stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
        url = f"spark://127.0.0.1:{port}"
        assert eventually(lambda: "I have been elected leader" in _read(root / "master.log"), 120)
        started.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--cores", "2", "--memory", "1g", "--work-dir", str(root / "work"),
             "--webui-port", str(_free_port())],
            env=env, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
        assert eventually(lambda: "Successfully registered" in _read(root / "worker.log"), 120)
        yield url
    finally:
        for proc in started:
            with_group(proc, signal.SIGKILL)
        master_log.close()
        worker_log.close()


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def with_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal ``proc``'s whole process group (spark-class starts a JVM beneath it)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    proc.wait(30)


@pytest.fixture
def filled(data_dir: Path) -> Path:
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish_batch(
            [Outgoing(f"orders/{i % 3}", f"m{i}".encode(), f"id{i}") for i in range(N)]
        )
    return data_dir


def replay(
    eomsg_bin: str, env: dict[str, str], url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [eomsg_bin, "spark-replay", "--master", url, "--topic", "orders/>", "--partitions", "4",
         "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1", *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_replay_through_a_standalone_cluster_gives_each_row_once(
    cluster: str, filled: Path, eomsg_bin: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    out, db = tmp_path / "out", tmp_path / "app.duckdb"
    stop = tmp_path / "stop-looking"
    looker = subprocess.Popen(  # looks at the jobs all along: waits its turn, stops nothing
        [
            "bash",
            "-c",
            f"while [ ! -e {stop} ]; do {eomsg_bin} inspect jobs --json >/dev/null; sleep 0.3;"
            " done",
        ],
        env=cli_env,
    )
    try:
        r = replay(eomsg_bin, cli_env, cluster, "--sink", f"parquet:{out}", "--json")
        assert (r.returncode, json.loads(r.stdout or "{}").get("rows")) == (0, N), r.stderr
        r = replay(eomsg_bin, cli_env, cluster, "--sink", f"duckdb:{db}:orders", "--json")
        assert json.loads(r.stdout or "{}").get("rows") == N, r.stderr
    finally:  # the loop ends after the look under way, so none holds the data at serve
        stop.touch()
        looker.wait(120)
    seqs = pq.read_table(out, columns=["seq"]).column("seq").to_pylist()
    assert sorted(seqs) == list(range(1, N + 1))
    with duckdb.connect(str(db)) as conn:
        rows = conn.execute("SELECT count(*), count(DISTINCT seq) FROM orders").fetchone()
    assert rows == (N, N)
    node = subprocess.Popen(
        [eomsg_bin, "serve", "--json"], env=cli_env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert node.stdout is not None and json.loads(node.stdout.readline())["event"] == "ready"
        subprocess.run([eomsg_bin, "queue", "create", "copies", "-s", "copies/>"], env=cli_env,
                       check=True, capture_output=True)  # fmt: skip
        r = replay(eomsg_bin, cli_env, cluster, "--sink", "topic:copies/orders", "--json")
        assert json.loads(r.stdout or "{}").get("rows") == N, r.stderr
        stats = subprocess.run([eomsg_bin, "inspect", "queues", "--json"], env=cli_env,
                               check=True, capture_output=True, text=True).stdout  # fmt: skip
        assert {s["name"]: s["depth"] for s in json.loads(stats)}["copies"] == N
        assert [p.name for p in filled.iterdir() if "staging" in p.name] == []
    finally:
        node.terminate()
        node.wait(30)


@pytest.mark.slow
def test_a_request_no_worker_can_meet_says_so_and_stops_at_ctrl_c(
    cluster: str, filled: Path, eomsg_bin: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    run = subprocess.Popen(
        [eomsg_bin, "spark-replay", "--master", cluster, "--topic", "orders/>",
         "--conf", "spark.executor.memory=4g", "--sink", f"parquet:{tmp_path / 'out'}",
         "--job-id", "too-big"],
        env=cli_env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert run.stderr is not None
        started = time.monotonic()
        for line in run.stderr:
            if "no executor has taken a task for 30 s" in line:
                break
        assert time.monotonic() - started < 200
        run.send_signal(signal.SIGINT)
        rest = run.stderr.read()
        assert run.wait(120) == 130
    finally:
        run.kill()
    assert rest == (
        "Error: interrupted: job too-big was recorded failed; run the same command again to "
        "redo it\n"
    )
    jobs = subprocess.run([eomsg_bin, "inspect", "jobs", "--json"], env=cli_env,
                          check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert [(j["job_id"], j["status"]) for j in json.loads(jobs)] == [("too-big", "failed")]
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []
