"""A replay job's record always describes its output (issue 35, item 9), through
``eomsg spark-replay`` on real Spark ``local[2]``, as a user runs it: a refused run
changes nothing in the record; a record is marked done only with output its own run
made — not after a crash left other output behind, nor for output another log's run
made; a done job whose output is gone says so; a topic, which cannot take back what it
was given, keeps the options that published into it."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from eomsg.core.message import Outgoing
from eomsg.node.node import Node, NodeSettings
from tests.conftest import spark_or_skip
from tests.test_spark_cli import jobs, replay

pytestmark = pytest.mark.spark

WIDE, NARROW = 300, 7  # orders/0..2 messages, then orders/x/rare ones: 307 in all


def fill(data: Path, wide: int = WIDE) -> None:
    with Node.open(data, NodeSettings(tick=None)) as node:
        node.ingress.publish_batch([Outgoing(f"orders/{i % 3}", b"o%d" % i) for i in range(wide)])
        node.ingress.publish_batch([Outgoing("orders/x/rare", b"r%d" % i) for i in range(NARROW)])


@pytest.fixture
def filled(data_dir: Path) -> Path:
    spark_or_skip()
    fill(data_dir)
    return data_dir


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def record(eomsg_bin: str, env: dict[str, str], job: str) -> dict[str, object]:
    """The job's record as ``inspect jobs --json`` shows it, but for when it was made."""
    found = dict(jobs(eomsg_bin, env)[job])
    del found["recorded_at"]
    return found


def test_a_refused_forced_run_changes_nothing_in_the_record(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """The issue's repro: job p1 done with 307 rows; --force with a narrower topic is
    refused (exit 5, 7 rows) and the record still says what the output is — so a plain
    run of the narrower options is refused as other options (exit 3), and one of the
    first options is done already; never 'output already committed (307 rows)' for a
    selection of 7."""
    out = tmp_path / "out"
    wide = ["--topic", "orders/>", "--sink", f"parquet:{out}", "--job-id", "p1"]
    narrow = ["--topic", "orders/x/>", "--sink", f"parquet:{out}", "--job-id", "p1"]
    r = replay(eomsg_bin, cli_env, *wide)
    assert (r.returncode, r.stdout) == (0, f"replayed 307 rows into parquet:{out} (job p1)\n")
    before, kept = record(eomsg_bin, cli_env, "p1"), files(out)
    assert (before["status"], before["rows"], before["lo"], before["hi"]) == ("done", 307, 1, 308)

    r = replay(eomsg_bin, cli_env, *narrow, "--force")
    assert (r.returncode, r.stdout) == (5, ""), r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"Error: parquet:{out} holds 307 rows of job p1; this run made 7: the output was left "
        "as it was (--allow-fewer replaces it)"
    )
    assert record(eomsg_bin, cli_env, "p1") == before and files(out) == kept

    r = replay(eomsg_bin, cli_env, *narrow)
    assert (r.returncode, r.stdout, r.stderr) == (
        3,
        "",
        "Error: job p1 was run with other options; give another --job-id (or --force to run "
        "it anew with these)\n",
    )
    r = replay(eomsg_bin, cli_env, *narrow, "--force", "--dry-run")
    assert (r.returncode, r.stdout.splitlines()[:3]) == (
        0,
        ["job        p1 (done): will run", "select     orders/x/>", "range      seq 301 .. 307 "
         "(1 partitions)"],
    )  # fmt: skip
    r = replay(eomsg_bin, cli_env, *wide)
    assert (r.returncode, r.stdout) == (
        0,
        "job p1 is already done (307 rows): nothing to do (use --force to run it again)\n",
    )
    assert record(eomsg_bin, cli_env, "p1") == before and files(out) == kept
    audit = subprocess.run([eomsg_bin, "inspect", "audit", "--json"], env=cli_env,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert [(a["action"], a["detail"]) for a in json.loads(audit) if a["target"] == "p1"] == [
        ("replay-revert", "done"),  # newest first: the refused run, put back
        ("replay-start", "running"),
        ("replay-finish", "done"),
        ("replay-start", "running"),
    ]


@pytest.mark.slow
def test_a_run_killed_before_its_commit_is_never_recorded_done_with_the_old_output(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """A forced run with other options, SIGKILLed after Spark staged its 7 rows and
    before the sink took them: the sink still holds the 307 rows of the first options.
    Run again without --force, it is not 'output already committed (307 rows)': it runs,
    and fewer rows than the sink holds are refused (exit 5) — the job failed, its rows
    none; the forced command again replaces the output and the record says 7 rows."""
    out = tmp_path / "out"
    wide = ["--topic", "orders/>", "--sink", f"parquet:{out}", "--job-id", "p1"]
    narrow = ["--topic", "orders/x/>", "--sink", f"parquet:{out}", "--job-id", "p1"]
    assert replay(eomsg_bin, cli_env, *wide).returncode == 0
    kept = files(out)
    r = replay(eomsg_bin, cli_env, *narrow, "--force", "--allow-fewer",
               failpoints="replay.staged=crash")  # fmt: skip
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert record(eomsg_bin, cli_env, "p1")["status"] == "running" and files(out) == kept

    r = replay(eomsg_bin, cli_env, *narrow)
    assert (r.returncode, r.stdout) == (5, ""), r.stderr
    assert "output already committed" not in r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"Error: parquet:{out} holds 307 rows of job p1; this run made 7: the output was left "
        "as it was (--allow-fewer replaces it)"
    )
    found = record(eomsg_bin, cli_env, "p1")
    assert (found["status"], found["lo"], found["hi"], found["rows"], found["digest"]) == (
        "failed", 301, 308, None, None,
    )  # fmt: skip
    assert files(out) == kept

    r = replay(eomsg_bin, cli_env, *narrow, "--force", "--allow-fewer", "--json")
    assert (r.returncode, json.loads(r.stdout)) == (
        0, {"job_id": "p1", "status": "done", "rows": 7},
    ), r.stderr  # fmt: skip
    assert sorted(pq.read_table(out).column("seq").to_pylist()) == list(range(301, 308))
    found = record(eomsg_bin, cli_env, "p1")
    assert (found["status"], found["rows"], found["spec"]["topic"]) == ("done", 7, "orders/x/>")


def test_a_done_job_whose_output_is_gone_says_so(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """The output directory removed after the job was done: a plain run (and its
    --dry-run) is refused, exit 5, rather than 'already done' about output that is not
    there; --force makes it again."""
    out = tmp_path / "out"
    args = ["--topic", "orders/x/>", "--sink", f"parquet:{out}", "--job-id", "gone"]
    assert replay(eomsg_bin, cli_env, *args).returncode == 0
    before = record(eomsg_bin, cli_env, "gone")
    for name in list(files(out)):
        (out / name).unlink()
    out.rmdir()
    said = (
        f"Error: job gone is recorded done (7 rows), but parquet:{out} no longer holds that "
        "output (removed, or replaced by another run): --force runs it again\n"
    )
    for extra in ([], ["--dry-run"]):
        r = replay(eomsg_bin, cli_env, *args, *extra)
        assert (r.returncode, r.stdout, r.stderr) == (5, "", said)
    assert record(eomsg_bin, cli_env, "gone") == before and not out.exists()
    r = replay(eomsg_bin, cli_env, *args, "--force")
    assert (r.returncode, r.stdout) == (0, f"replayed 7 rows into parquet:{out} (job gone)\n")
    assert pq.read_table(out).num_rows == 7 and record(eomsg_bin, cli_env, "gone") == before


def test_output_another_log_made_is_never_recorded_as_this_jobs(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """Job d1 replayed from one log into a DuckDB table; the same command on another log
    (its data directory holds fewer messages) finds d1's output in the ledger, made from
    another range: refused (exit 5), nothing recorded on that log — not 'output already
    committed (307 rows)' and done with the first log's rows."""
    sink = f"duckdb:{tmp_path / 'app.duckdb'}:t"
    args = ["--topic", "orders/>", "--sink", sink, "--job-id", "d1"]
    r = replay(eomsg_bin, cli_env, *args)
    assert (r.returncode, r.stdout) == (0, f"replayed 307 rows into {sink} (job d1)\n")
    other = {**cli_env, "EOMSG_DATA": str(tmp_path / "other")}
    fill(tmp_path / "other", wide=30)
    r = replay(eomsg_bin, other, *args)
    assert (r.returncode, r.stdout, r.stderr) == (
        5,
        "",
        f"Error: {sink} holds output of job d1 that another run made (other options, another "
        "log, or an older eomsg): give another --job-id, or --force to replace it\n",
    )
    assert jobs(eomsg_bin, other) == {}
    with duckdb.connect(str(tmp_path / "app.duckdb")) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (307,)
        assert conn.execute("SELECT rows, lo, hi FROM eomsg_replay_ledger").fetchall() == [
            (307, 1, 308)
        ]
    r = replay(eomsg_bin, other, *args, "--force", "--allow-fewer")
    assert (r.returncode, r.stdout) == (0, f"replayed 37 rows into {sink} (job d1)\n")
    assert (jobs(eomsg_bin, other)["d1"]["rows"], jobs(eomsg_bin, other)["d1"]["hi"]) == (37, 38)


def test_a_job_published_into_a_topic_keeps_its_options(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """A topic cannot take back what a job published: other options for the job are
    refused, forced or not (exit 3, nothing recorded); the same options forced publish
    nothing twice."""
    args = ["--sink", "topic:replayed", "--job-id", "t1"]
    r = replay(eomsg_bin, cli_env, "--topic", "orders/>", *args)
    assert (r.returncode, r.stdout) == (0, "replayed 307 rows into topic:replayed (job t1)\n")
    before = record(eomsg_bin, cli_env, "t1")
    r = replay(eomsg_bin, cli_env, "--topic", "orders/x/>", *args, "--force")
    assert (r.returncode, r.stdout, r.stderr) == (
        3,
        "",
        "Error: job t1 publishes its output to topic:replayed, which cannot take back what it "
        "was given: run these options under another --job-id\n",
    )
    assert record(eomsg_bin, cli_env, "t1") == before


def test_output_an_older_eomsg_committed_is_no_runs_until_forced(
    eomsg_bin: str, cli_env: dict[str, str], filled: Path, tmp_path: Path
) -> None:
    """A ledger from before it said what made each output (no spec, lo, hi): its row for
    the job is not taken for this run's (exit 5 at the plan, before Spark, nothing
    recorded); forced, the run replaces it and the ledger gains the columns."""
    db = tmp_path / "app.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute(
            """CREATE TABLE eomsg_replay_ledger (
                   job_id VARCHAR PRIMARY KEY, table_name VARCHAR NOT NULL,
                   rows BIGINT NOT NULL, digest VARCHAR NOT NULL,
                   committed_at TIMESTAMP NOT NULL)"""
        )
        conn.execute("INSERT INTO eomsg_replay_ledger VALUES ('old', 't', 7, 'd', now())")
    args = ["--topic", "orders/x/>", "--sink", f"duckdb:{db}:t", "--job-id", "old"]
    r = replay(eomsg_bin, cli_env, *args)
    assert (r.returncode, r.stderr) == (
        5,
        f"Error: duckdb:{db}:t holds output of job old that another run made (other options, "
        "another log, or an older eomsg): give another --job-id, or --force to replace it\n",
    )
    assert jobs(eomsg_bin, cli_env) == {}
    r = replay(eomsg_bin, cli_env, *args, "--force")
    assert (r.returncode, r.stdout) == (0, f"replayed 7 rows into duckdb:{db}:t (job old)\n")
    with duckdb.connect(str(db)) as conn:
        assert conn.execute("SELECT job_id, rows, lo, hi FROM eomsg_replay_ledger").fetchall() == [
            ("old", 7, 301, 308)
        ]
