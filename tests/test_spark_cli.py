"""``eomsg spark-replay`` as users run it, in real processes: exact output and exit
codes, a missing Java, and runs killed (SIGKILL) mid-way then run again, whose output must
equal a clean run's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from eomsg.core.message import Outgoing
from eomsg.node.node import Node, NodeSettings
from tests.conftest import NodeProcess, spark_or_skip, wait_stopped
from tests.test_tls import Pki

pytestmark = pytest.mark.spark

N = 2000


def gated_transform(at: Path, hold_above: int) -> str:
    """A row transform whose rows past seq ``hold_above`` wait while the file ``at/gate``
    exists, after touching ``at/entered``: a test stops or kills a run mid-Spark by
    holding the gate, not by guessing how long Spark takes."""
    gate, entered = str(at / "gate"), str(at / "entered")
    return (
        "import os, time\n"
        "def slow(row):\n"
        f"    if row['seq'] > {hold_above}:\n"
        f"        open({entered!r}, 'a').close()\n"
        f"        while os.path.exists({gate!r}):\n"
        "            time.sleep(0.01)\n"
        "    return {'n': row['seq'] * 2}\n"
    )


def wait_for(path: Path, proc: subprocess.Popen[Any]) -> None:
    """Until ``path`` exists (or ``proc`` ended, which fails the test)."""
    deadline = time.monotonic() + 300
    while not path.exists():
        assert proc.poll() is None, f"the run ended first ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


@pytest.fixture
def filled(data_dir: Path) -> Path:
    spark_or_skip()
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish_batch(
            [Outgoing(f"orders/{i % 2}", f'{{"n": {i}}}'.encode(), f"m{i}") for i in range(N)]
        )
    return data_dir


def replay(
    eomsg_bin: str, env: dict[str, str], *args: str, failpoints: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**env, "EOMSG_FAILPOINTS": failpoints} if failpoints else env
    return subprocess.run(
        [eomsg_bin, "spark-replay", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         *args],
        env=env, capture_output=True, text=True, timeout=300, cwd=cwd,
    )  # fmt: skip


def staging_left(*dirs: Path) -> list[str]:
    """Staging directories of replays left in ``dirs``."""
    return [p.name for d in dirs if d.exists() for p in d.iterdir() if "staging" in p.name]


# What a run prints on stderr: its own timestamped steps, and nothing of Spark's.
STEP = re.compile(r"^\[ *\d+\.\ds\] \S")


def test_a_run_that_fails_is_recorded_failed_and_leaves_nothing_behind(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    with Node.open(filled, NodeSettings(tick=None)) as node:
        node.ingress.publish("orders/0", b"p\xce\x01")  # seq N + 1: not text
    (tmp_path / "ident.py").write_text("def same(row):\n    return row\n")
    out, db = tmp_path / "out", tmp_path / "app.duckdb"
    # The first run finds no class-data archive in its cache: it was making one when it
    # failed (its JVM killed, nothing kept), and still prints its steps and error only.
    fresh = {**cli_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for env, args in (
        (fresh, ["--transform", "ident:same", "--sink", f"parquet:{out}", "--job-id", "rows"]),
        (cli_env, ["--sink", f"duckdb:{db}:t", "--job-id", "plain"]),
    ):
        r = replay(eomsg_bin, env, "--topic", "orders/>", *args, cwd=tmp_path)
        assert (r.returncode, r.stdout) == (3, ""), r.stderr
        assert r.stderr.splitlines()[-1] == (
            f"Error: the payload of message {N + 1} is not UTF-8 text: replay with --decode binary"
        )
        assert all(STEP.match(line) for line in r.stderr.splitlines()[:-1]), r.stderr
    assert {k: v["status"] for k, v in jobs(eomsg_bin, cli_env).items()} == {
        "rows": "failed",
        "plain": "failed",
    }
    kept = [p.name for p in (tmp_path / "cache" / "eomsg" / "spark").iterdir()]
    assert [name[-7:] for name in kept] == [".making"], kept  # its lock: it was making one
    assert staging_left(tmp_path, filled) == [] and not out.exists()
    r = replay(eomsg_bin, cli_env, "--topic", "orders/>", "--decode", "binary",
               "--sink", f"duckdb:{db}:t", "--json")  # fmt: skip
    assert json.loads(r.stdout)["rows"] == N + 1, r.stderr


def test_a_sink_that_cannot_take_the_output_is_refused_before_spark(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    db = tmp_path / "app.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE orders (seq BIGINT, note VARCHAR)")
    started = time.monotonic()
    r = replay(eomsg_bin, cli_env, "--topic", "orders/>", "--sink", f"duckdb:{db}:orders")
    assert (r.returncode, r.stderr) == (
        3,
        f"Error: sink 'duckdb:{db}:orders': table orders lacks id, topic, replay_job, which a "
        "replay writes; name another table (it is created) or add them\n",
    )
    r = replay(eomsg_bin, cli_env, "--topic", "orders/>", "--sink", "topic:orders/replayed")
    assert (r.returncode, r.stderr) == (
        3,
        "Error: sink 'topic:orders/replayed': the job reads orders/>, which takes in "
        "orders/replayed, so a run again would replay its own output; publish to a topic it "
        "does not read\n",
    )
    r = replay(eomsg_bin, cli_env, "--sink", "topic:anything/else")
    assert r.returncode == 3 and "the job reads every topic" in r.stderr
    assert time.monotonic() - started < 60  # no Spark was started for any of them
    assert jobs(eomsg_bin, cli_env) == {}


def test_an_unreachable_master_is_one_line_at_once(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    sink = ["--sink", f"parquet:{tmp_path / 'out'}"]
    for master, why in (
        ("spark://no-such-host.invalid:7077", "no-such-host.invalid:7077: unknown host ("),
        ("spark://127.0.0.1:9", "127.0.0.1:9: Connection refused)"),
    ):
        r = subprocess.run(
            [eomsg_bin, "spark-replay", "--master", master, *sink], env=cli_env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 9 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"Error: cannot reach the Spark master ({why.split(' (')[0]}")
    assert jobs(eomsg_bin, cli_env) == {} and not (tmp_path / "out").exists()


def test_an_interrupted_run_is_recorded_failed_and_a_look_does_not_stop_it(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT) mid-run: exit 130, one line, staging gone, the job failed; and
    ``eomsg inspect jobs`` while a run holds the data directory only waits its turn."""
    (tmp_path / "slow.py").write_text(gated_transform(tmp_path, 0))
    (tmp_path / "gate").touch()  # every row waits: the run is mid-Spark until the signal
    out = tmp_path / "out"
    args = [eomsg_bin, "spark-replay", "--master", "local[2]", "--topic", "orders/>",
            "--transform", "slow:slow", "--sink", f"parquet:{out}", "--job-id", "slow"]  # fmt: skip
    run = subprocess.Popen(args, env=cli_env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stderr is not None
        wait_for(tmp_path / "entered", run)
        looked = subprocess.run(
            [eomsg_bin, "inspect", "jobs", "--json"], env=cli_env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert looked.returncode == 0, looked.stderr
        assert [j["status"] for j in json.loads(looked.stdout)] == ["running"]
        run.send_signal(signal.SIGINT)
        rest = run.stderr.read()
        assert run.wait(120) == 130, rest
    finally:
        run.kill()
        (tmp_path / "gate").unlink()
    assert rest.splitlines()[-1] == (
        "Error: interrupted: job slow was recorded failed; run the same command again to redo it"
    )
    assert jobs(eomsg_bin, cli_env)["slow"]["status"] == "failed"
    assert staging_left(tmp_path, filled) == [] and not out.exists()
    r = subprocess.run(args, env=cli_env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == f"replayed {N} rows into parquet:{out} (job slow)\n"
    assert all(STEP.match(line) for line in r.stderr.splitlines()), r.stderr  # no Spark noise


@pytest.mark.parametrize("step", ["replay.staged", "replay.committed"])
def test_ctrl_c_between_the_steps_of_a_run_is_an_interruption(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path, step: str
) -> None:
    """SIGINT after Spark staged the output, or after the sink took it: exit 130 and the
    job failed, never a Spark failure (exit 1); run again, the job is done and its output
    whole, committed once."""
    out = tmp_path / "out"
    args = [eomsg_bin, "spark-replay", "--master", "local[2]", "--topic", "orders/>",
            "--sink", f"parquet:{out}", "--job-id", "cut"]  # fmt: skip
    env = {**cli_env, "EOMSG_FAILPOINTS": f"{step}=stop"}
    run = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_stopped(run, timeout=300)
        run.send_signal(signal.SIGINT)  # delivered once it runs on
        run.send_signal(signal.SIGCONT)
        assert run.stderr is not None
        rest = run.stderr.read()
        assert run.wait(120) == 130, rest
    finally:
        run.kill()
    assert rest.splitlines()[-1] == (
        "Error: interrupted: job cut was recorded failed; run the same command again to redo it"
    )
    assert jobs(eomsg_bin, cli_env)["cut"]["status"] == "failed"
    assert staging_left(tmp_path, filled) == []
    assert out.exists() == (step == "replay.committed")
    r = subprocess.run(args, env=cli_env, capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout) == (0, f"replayed {N} rows into parquet:{out} (job cut)\n")
    assert ("output already committed" in r.stderr) == (step == "replay.committed")
    assert pq.read_table(out).num_rows == N and jobs(eomsg_bin, cli_env)["cut"]["status"] == "done"


def test_dry_run_json_and_a_bad_transform(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["--topic", "orders/1", "--to-seq", "100", "--sink", f"parquet:{out}", "--job-id", "j"]
    r = replay(eomsg_bin, cli_env, *args, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "job        j (new): will run",
        "select     orders/1",
        "range      seq 2 .. 100 (1 partitions)",
        f"read from  file {filled.resolve()}",
        "transform  none (payload decoded as text)",
        f"stage in   {tmp_path / '.out.eomsg-staging-j'}",
        f"sink       parquet:{out}",
    ]
    r = replay(eomsg_bin, cli_env, *args, "--json")
    assert (r.returncode, json.loads(r.stdout)) == (
        0,
        {"job_id": "j", "status": "done", "rows": 50},
    )
    r = replay(eomsg_bin, cli_env, *args, "--json")
    assert json.loads(r.stdout) == {"job_id": "j", "status": "skipped", "rows": 50}
    r = replay(eomsg_bin, cli_env, *args)
    assert (
        r.stdout == "job j is already done (50 rows): nothing to do (use --force to run it again)\n"
    )

    r = replay(eomsg_bin, cli_env, "--sink", f"parquet:{tmp_path / 'x'}", "--transform", "nope:f")
    assert (r.returncode, r.stderr) == (
        3, "Error: cannot import 'nope' for the transform: No module named 'nope'\n",
    )  # fmt: skip
    r = replay(eomsg_bin, cli_env, "--sink", "kafka:x")
    assert (r.returncode, r.stderr) == (
        3, "Error: sink 'kafka:x': use parquet:DIR, duckdb:PATH:TABLE or topic:NAME\n",
    )  # fmt: skip
    r = replay(eomsg_bin, cli_env, "--sink", f"parquet:{tmp_path / 'x'}", "--conf", "novalue")
    assert (r.returncode, r.stderr) == (3, "Error: --conf 'novalue' must be key=value\n")
    assert not (tmp_path / "x").exists()


def test_force_after_garbage_collection_never_destroys_the_output(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """The issue's repro: a finished job, then the log collected (retention 0), then
    --force. The job's range is fixed at its first record; no longer in the log, it is
    refused (exit 4, one line) and the output, its manifest and the job's record stay."""
    out = tmp_path / "out"
    args = ["--topic", "orders/>", "--sink", f"parquet:{out}", "--job-id", "big1"]
    r = replay(eomsg_bin, cli_env, *args, "--json")
    assert json.loads(r.stdout) == {"job_id": "big1", "status": "done", "rows": N}, r.stderr
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([eomsg_bin, *argv], env=cli_env, capture_output=True, text=True)

    assert cli("config", "set", "retention", "0").returncode == 0
    assert cli("config", "set", "gc-interval", "0").returncode == 0  # collects as it closes
    assert cli("inspect", "log", "--json").stdout == ""  # nothing left
    r = replay(eomsg_bin, cli_env, *args, "--force")
    assert (r.returncode, r.stderr) == (
        4,
        f"Error: job big1 reads seq 1 .. {N}, but the log keeps seq {N + 1} and later "
        "(older messages were collected)\n",
    )
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == files
    job = jobs(eomsg_bin, cli_env)["big1"]
    assert (job["status"], job["lo"], job["hi"], job["rows"]) == ("done", 1, N + 1, N)
    r = replay(eomsg_bin, cli_env, "--from-seq", "5", "--sink", f"parquet:{tmp_path / 'new'}")
    assert r.returncode == 4 and "starts at seq 5" in r.stderr
    r = replay(eomsg_bin, cli_env, "--since", "1d", "--sink", f"parquet:{tmp_path / 'new'}")
    assert r.returncode == 4 and "published since" in r.stderr
    assert not (tmp_path / "new").exists()


def test_missing_java_is_a_clear_error(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    env = {**cli_env, "JAVA_HOME": str(tmp_path / "no-java")}
    r = replay(eomsg_bin, env, "--sink", f"parquet:{tmp_path / 'out'}")
    assert (r.returncode, r.stderr) == (
        9,
        f"Error: Java not found (JAVA_HOME={tmp_path / 'no-java'}): Spark needs Java 17+ "
        "(Debian: apt install openjdk-17-jre-headless)\n",
    )
    assert not (tmp_path / "out").exists()
    assert jobs(eomsg_bin, env) == {}  # nothing recorded


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, eomsg_bin: str) -> dict[str, object]:
    """One log for the kill tests, with the slow transform beside it; clean runs cached."""
    spark_or_skip()
    root = tmp_path_factory.mktemp("replay-kills")
    with Node.open(root / "data", NodeSettings(tick=None)) as node:
        node.ingress.publish_batch(
            [Outgoing(f"orders/{i % 2}", f'{{"n": {i}}}'.encode(), f"m{i}") for i in range(N)]
        )
    (root / "slowfix.py").write_text(gated_transform(root, N // 2))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
    env |= {"EOMSG_DATA": str(root / "data"), "PYTHONPATH": str(root)}
    return {"root": root, "env": env, "clean": {}}


COMMON = ["--topic", "orders/>", "--transform", "slowfix:slow", "--partitions", "4", "--json"]


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["mid-spark", "replay.staged", "replay.committed"])
@pytest.mark.parametrize("sink", ["parquet", "duckdb"])
def test_a_killed_replay_run_again_equals_a_clean_run(
    eomsg_bin: str, world: dict[str, Any], kill: str, sink: str
) -> None:
    root: Path = world["root"]
    env: dict[str, str] = world["env"]

    def target(name: str) -> str:
        return f"parquet:{root / name}" if sink == "parquet" else f"duckdb:{root / name}.duckdb:t"

    clean_id = f"clean-{sink}"
    if sink not in world["clean"]:
        clean = replay(eomsg_bin, env, *COMMON, "--sink", target(clean_id), "--job-id", clean_id)
        assert clean.returncode == 0, clean.stderr
        assert json.loads(clean.stdout)["rows"] == N
        world["clean"][sink] = True

    job = f"{sink}-{kill.replace('.', '-')}"
    args = [*COMMON, "--sink", target(job), "--job-id", job]
    if kill == "mid-spark":
        (root / "gate").touch()  # rows past N/2 wait: the partitions holding them stay open
        proc = subprocess.Popen(
            [eomsg_bin, "spark-replay", "--master", "local[2]", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        name = job if sink == "parquet" else f"{job}.duckdb"
        staging = root / f".{name}.eomsg-staging-{job}"
        try:
            wait_for(root / "entered", proc)
            deadline = time.monotonic() + 300
            while not list(staging.glob("part-*.parquet")):
                assert proc.poll() is None and time.monotonic() < deadline, "no task finished"
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
            proc.wait()
            (root / "gate").unlink()
        assert len(list(staging.glob("part-*.parquet"))) < 4  # killed mid-way
    else:
        r = replay(eomsg_bin, env, *args, failpoints=f"{kill}=crash")
        assert r.returncode == -signal.SIGKILL, r.stderr
    assert jobs(eomsg_bin, env)[job]["status"] == "running"

    again = replay(eomsg_bin, env, *args)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"job_id": job, "status": "done", "rows": N}
    if sink == "parquet":
        got, want = pq.read_table(root / job), pq.read_table(root / clean_id)
        assert got.to_pylist() == want.to_pylist()
    else:

        def rows(name: str) -> list[tuple[int, int]]:
            with duckdb.connect(str(root / f"{name}.duckdb")) as conn:
                return conn.execute("SELECT seq, n FROM t ORDER BY seq").fetchall()

        assert rows(job) == rows(clean_id) and len(rows(job)) == N
    found = jobs(eomsg_bin, env)
    assert found[job]["status"] == found[clean_id]["status"] == "done"
    assert found[job]["digest"] == found[clean_id]["digest"]  # the same files, byte for byte


def jobs(eomsg_bin: str, env: dict[str, str]) -> dict[str, dict[str, object]]:
    out = subprocess.run(
        [eomsg_bin, "inspect", "jobs", "--json"], env=env, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return {j["job_id"]: j for j in json.loads(out)}


def test_at_a_terminal_the_tasks_show_as_a_bar(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    import pty

    controller, terminal = pty.openpty()
    run = subprocess.Popen(
        [eomsg_bin, "spark-replay", "--master", "local[2]", "--topic", "orders/>",
         "--partitions", "4", "--sink", f"parquet:{tmp_path / 'out'}"],
        env={**cli_env, "COLUMNS": "100"}, stdout=subprocess.PIPE, stderr=terminal,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other end closed: the run is over
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    assert run.wait(300) == 0
    text = seen.decode(errors="replace")
    assert "Spark tasks" in text and "/4" in text, text  # the bar, counting the 4 tasks
    assert "WARN" not in text and "log4j" not in text, text


def test_a_replay_waits_for_a_directory_another_command_lends_for_looking(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """While ``eomsg consume`` holds the directory (lending it for looking only), the
    replay plans through it, then waits to record the job — and runs once it is gone."""
    from tests.conftest import eventually
    from tests.test_cli_habits import UNTIL_GO

    for step in (["queue", "create", "held", "--subscribe", "held/>"], ["publish", "held/x", "x"]):
        subprocess.run([eomsg_bin, *step], env=cli_env, check=True, capture_output=True)
    holder = subprocess.Popen([eomsg_bin, "consume", "held", "--exec", UNTIL_GO],
                              env=cli_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert eventually(lambda: (filled / "eomsg.sock").exists())
        run = subprocess.Popen(
            [eomsg_bin, "spark-replay", "--master", "local[2]", "--topic", "orders/>",
             "--sink", f"parquet:{tmp_path / 'out'}"],
            env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert run.stderr is not None
        said = []  # its steps, until it says it waits (or it ends: EOF)
        while (line := run.stderr.readline()) and "waiting for the data directory" not in line:
            said.append(line)
        assert "which another command holds (at most 60 s)" in line, said
        assert run.poll() is None  # waiting, not failed
    finally:
        (tmp_path / "go").touch()
        holder.wait(60)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert out.startswith(f"replayed {N} rows into parquet:{tmp_path / 'out'} (job "), out


def test_a_replay_reads_another_nodes_log_over_tls(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """From a machine that holds no data directory: the log of a node reached at
    tls://, with its token and CA, read by Spark's tasks through that node; the job is
    recorded there, so a second run is skipped."""
    pki = Pki(tmp_path)
    cert, key = pki.issue("node")
    node = NodeProcess(eomsg_bin, filled, cli_env, "--tls-cert", str(cert), "--tls-key", str(key))
    node.start()
    try:
        here = tmp_path / "elsewhere"
        here.mkdir()
        env = {**cli_env, "EOMSG_DATA": str(here / "no-data"), "EOMSG_INIT": "0"}
        out = here / "out"
        args = (
            "--broker", node.tcp, "--token", node.token, "--tls-ca", str(pki.ca_file),
            "--topic", "orders/1", "--sink", f"parquet:{out}", "--job-id", "remote",
        )  # fmt: skip
        r = replay(eomsg_bin, env, *args, cwd=here)
        assert (r.returncode, r.stdout) == (
            0, f"replayed {N // 2} rows into parquet:{out} (job remote)\n"
        ), r.stderr  # fmt: skip
        assert sorted(pq.read_table(out).column("seq").to_pylist()) == list(range(2, N + 1, 2))
        r = replay(eomsg_bin, env, *args, cwd=here)
        assert (r.returncode, r.stdout) == (
            0, f"job remote is already done ({N // 2} rows): nothing to do (use --force to run it "
            "again)\n",
        ), r.stderr  # fmt: skip
        r = replay(eomsg_bin, env, *args[:4], *args[6:], cwd=here)  # no --tls-ca
        assert r.returncode == 10
        assert "its certificate is not trusted here" in r.stderr
        assert not (here / "no-data").exists()
    finally:
        node.kill()
