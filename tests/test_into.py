"""``eomsg consume --into KIND:PATH:TABLE``: each message inserted exactly once into a
table of the application's database, however often the command is killed."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

import eomsg
from eomsg.cli.app import app as cli
from tests.conftest import NodeProcess, queue_depth, running_until_depth


@pytest.fixture
def run(data_dir: Path) -> Callable[..., Any]:
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Any:
        result = runner.invoke(cli, [*args], env={"EOMSG_DATA": str(data_dir), "EOMSG_INIT": "1"})
        assert result.exit_code == code, (result.output, result.stderr)
        return result

    return invoke


def rows(kind: str, path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn: Any = duckdb.connect(str(path)) if kind == "duckdb" else sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["duckdb", "sqlite"])
def test_into_creates_the_table_and_inserts_each_message_once(
    run: Callable[..., Any], data_dir: Path, tmp_path: Path, kind: str
) -> None:
    app = tmp_path / f"app.{kind}"
    run("queue", "create", "orders", "-s", "orders/>")
    run("publish", "orders/eu", '{"n": 1}', "--id", "o-1", "--header", "k=v")
    run("publish", "orders/us", '{"n": 2}')
    run("publish", "orders/eu", '{"n": 3}')
    target = f"{kind}:{app}:orders"
    r = run("consume", "orders", "--into", target, "--batch", "2")
    assert r.stdout == "inserted 3 messages into orders (0 already there, 0 expired)\n"
    got = rows(kind, app, "SELECT seq, id, topic, payload, headers, queue FROM orders ORDER BY seq")
    assert got == [
        (1, "o-1", "orders/eu", b'{"n": 1}', '{"k": "v"}', "orders"),
        (2, None, "orders/us", b'{"n": 2}', "{}", "orders"),
        (3, None, "orders/eu", b'{"n": 3}', "{}", "orders"),
    ]
    (published,) = rows(kind, app, "SELECT published_at FROM orders WHERE seq = 1")
    assert published[0] is not None
    run("publish", "orders/eu", '{"n": 4}')
    r = run("consume", "orders", "--into", target, "--json")
    assert json.loads(r.stdout.splitlines()[-1]) == {
        "table": "orders",
        "inserted": 1,
        "duplicates": 0,
        "expired": 0,
    }
    assert rows(kind, app, "SELECT count(*) FROM orders") == [(4,)]
    assert rows(kind, app, "SELECT count(*) FROM eomsg_inbox") == [(4,)]


def test_into_refuses_what_it_cannot_do(
    run: Callable[..., Any], data_dir: Path, tmp_path: Path
) -> None:
    run("queue", "create", "orders", "-s", "orders/>")
    run("publish", "orders/eu", "x")
    r = run("consume", "orders", "--into", f"duckdb:{tmp_path / 'a.duckdb'}", code=3)
    assert r.stderr == (
        f"Error: --into 'duckdb:{tmp_path / 'a.duckdb'}': expected duckdb:PATH:TABLE or "
        "sqlite:PATH:TABLE\n"
    )
    r = run("consume", "orders", "--into", "duckdb:a.duckdb:t", "--exec", "true", code=2)
    assert r.stderr == "Error: --into and --exec do not combine (use one)\n"
    with duckdb.connect(str(tmp_path / "b.duckdb")) as db:
        db.execute("CREATE TABLE orders (seq BIGINT, payload BLOB)")
    r = run("consume", "orders", "--into", f"duckdb:{tmp_path / 'b.duckdb'}:orders", code=3)
    assert r.stderr == (
        "Error: table orders exists without the columns headers, id, published_at, queue, topic\n"
    )
    missing = tmp_path / "no" / "such" / "dir.duckdb"
    r = run("consume", "orders", "--into", f"duckdb:{missing}:orders", code=3)
    assert r.stderr.startswith(f"Error: --into 'duckdb:{missing}:orders': cannot open the database")
    r = run("consume", "orders", "--into", f"sqlite:{missing}:orders", code=3)
    assert r.stderr.startswith(f"Error: --into 'sqlite:{missing}:orders': cannot open the database")
    r = run("consume", "orders", "--into", f"duckdb:{tmp_path / 'c.duckdb'}:bad-name", code=3)
    assert (
        r.stderr == "Error: table 'bad-name': use letters, digits and '_', starting with a letter\n"
    )
    assert not (tmp_path / "c.duckdb").exists()  # refused before any file was made
    r = run("consume", "orders", "--max", "1", "--json")  # nothing was taken meanwhile
    assert [json.loads(x).get("payload") for x in r.stdout.splitlines()][-1] == "x"


@pytest.mark.slow
def test_into_under_repeated_sigkills(
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    cli_env: dict[str, str],
    data_dir: Path,
    tmp_path: Path,
) -> None:
    """Killed mid-batch again and again — before, during and after its commits — the
    consumer still leaves every message in the table exactly once."""
    n = 20_000
    rng = random.Random(1)
    app = tmp_path / "app.duckdb"
    serve()
    with eomsg.connect(data_dir) as client:
        client.create_queue(eomsg.QueueConfig("orders", subscriptions=("orders/>",)))
        for i in range(0, n, 5000):
            client.publish_batch(
                [eomsg.Outgoing("orders/eu", f"{j}".encode()) for j in range(i, i + 5000)]
            )
    cmd = [eomsg_bin, "consume", "orders", "--into", f"duckdb:{app}:orders", "--batch", "10"]
    left_at_kills = []
    for _ in range(8):  # each kill mid-stream: 8 of at most 1,500 leave work to do
        left = queue_depth(data_dir, "orders") - rng.randint(500, 1500)
        proc = running_until_depth(
            lambda: subprocess.Popen(
                cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            ),
            data_dir,
            "orders",
            left,
        )
        assert proc.poll() is None  # still consuming when killed
        proc.kill()
        proc.communicate(timeout=60)
        left_at_kills.append(queue_depth(data_dir, "orders"))
    assert all(left_at_kills), left_at_kills
    done = subprocess.run([*cmd, "--json"], env=cli_env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = rows(
        "duckdb", app, "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM orders"
    )
    assert got == [(n, n, 1, n)]
