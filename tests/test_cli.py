"""The ``eomsg`` command through typer's runner: exact output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from eomsg.cli.app import app
from eomsg.errors import ExitCode
from tests.conftest import messages


@pytest.fixture
def run(data_dir: Path):  # type: ignore[no-untyped-def]
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None, code: int = 0, init: bool = True):  # type: ignore[no-untyped-def]
        env = {"EOMSG_DATA": str(data_dir), "EOMSG_INIT": "1" if init else "0"}
        result = runner.invoke(app, [*args], input=input, env=env)
        assert result.exit_code == code, (result.output, result.stderr)
        return result

    return invoke


def test_the_issue_walkthrough(run) -> None:  # type: ignore[no-untyped-def]
    r = run(
        "queue",
        "create",
        "orders",
        "--subscribe",
        "orders/>",
        "--max-redeliveries",
        "5",
        "--dead-letter",
        "orders-dlq",
    )
    assert r.stdout == "created queue orders\n"
    r = run("publish", "orders/eu/new", '{"order": 1}', "--id", "order-1", "--ttl", "1h")
    assert r.stdout == "published seq 1\n"
    r = run("publish", "orders/eu/new", '{"order": 1}', "--id", "order-1")
    assert r.stdout == "duplicate of seq 1 (id order-1): stored once\n"
    r = run("publish", "orders/us/new", "--stdin", input="".join(f"{i}\n" for i in range(1, 1001)))
    assert r.stdout == "published 1000 messages (seq 2..1001), 0 duplicates\n"
    r = run("consume", "orders", "--max", "10", "--json")
    lines = messages(r.stdout)
    assert [m["seq"] for m in lines] == list(range(1, 11))
    assert lines[0] | {"published_at": 0, "expires_at": 0} == {
        "seq": 1,
        "id": "order-1",
        "topic": "orders/eu/new",
        "headers": {},
        "payload": '{"order": 1}',
        "queue": "orders",
        "attempt": 1,
        "published_at": 0,
        "expires_at": 0,
    }
    stats = json.loads(run("inspect", "queues", "--json").stdout)
    assert [
        (s["name"], s["depth"], s["in_flight"], s["deleted"], s["dead_lettered"]) for s in stats
    ] == [("orders", 991, 0, 10, 0), ("orders-dlq", 0, 0, 0, 0)]
    r = run("inspect", "log", "--topic", "orders/>", "--from-seq", "10", "--limit", "2", "--json")
    assert [json.loads(line)["seq"] for line in r.stdout.splitlines()] == [10, 11]
    r = run(
        "inspect",
        "sql",
        "SELECT topic, count(*) AS n FROM messages GROUP BY 1 ORDER BY 1",
        "--json",
    )
    assert json.loads(r.stdout) == [
        {"topic": "orders/eu/new", "n": 1},
        {"topic": "orders/us/new", "n": 1000},
    ]


def test_publish_json_contract(run) -> None:  # type: ignore[no-untyped-def]
    run("queue", "create", "q", "-s", "t")
    r = run("publish", "t", "x", "--id", "a", "--json")
    assert json.loads(r.stdout) == {"seq": 1, "id": "a", "duplicate": False, "queues": 1}
    r = run("publish", "t", "--stdin", "--id-prefix", "line-", "--json", input="a\nb\n")
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"seq": 2, "id": "line-1", "duplicate": False, "queues": 1},
        {"seq": 3, "id": "line-2", "duplicate": False, "queues": 1},
    ]
    r = run("publish", "t", "--stdin", "--id-prefix", "line-", input="a\nb\nc\n")
    assert r.stdout == "published 1 message (seq 4), 2 duplicates\n"


def test_binary_payload_is_base64(run) -> None:  # type: ignore[no-untyped-def]
    run("queue", "create", "q", "-s", "t")
    run("publish", "t", "-", input=b"\xff\x00binary")
    (out,) = messages(run("consume", "q", "--json").stdout)
    assert out["payload_b64"] == "/wBiaW5hcnk=" and "payload" not in out


def test_consume_exec_deletes_only_on_success(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run("queue", "create", "q", "-s", "t")
    run("publish", "t", "one")
    run("publish", "t", "two")
    seen = tmp_path / "seen"
    r = run(
        "consume",
        "q",
        "--exec",
        f'cat >> {seen}; echo "$EOMSG_SEQ" >> {seen}; exit 3',
        code=ExitCode.HANDLER_FAILED,
    )
    assert r.stderr == (  # a shared queue: no activity lines (exclusive and limited ones have)
        "Error: handler exited 3 on message 1 (attempt 1); it was released for redelivery\n"
    )
    run("consume", "q", "--exec", f'cat >> {seen}; echo " $EOMSG_ATTEMPT" >> {seen}')
    assert seen.read_text() == "one1\none 2\ntwo 1\n"
    assert json.loads(run("inspect", "queues", "--json").stdout)[0]["depth"] == 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["publish", "bad topic", "x"], ExitCode.INVALID_INPUT, "topic 'bad topic': level"),
        (["publish", "t", "x", "--ttl", "soon"], ExitCode.INVALID_INPUT, "duration 'soon'"),
        (["publish", "t", "x", "-H", "nokey"], ExitCode.INVALID_INPUT, "header 'nokey'"),
        (["consume", "nope"], ExitCode.NOT_FOUND, "queue 'nope' does not exist"),
        (["queue", "create", "q", "-s", "a/>/b"], ExitCode.INVALID_INPUT, "'>' may only"),
        (
            ["queue", "create", "q", "--max-redeliveries", "2"],
            ExitCode.INVALID_INPUT,
            "needs --dead-letter",
        ),
        (
            ["queue", "create", "q", "--max-active", "20000"],
            ExitCode.INVALID_INPUT,
            "--max-active must be between 0 (no limit) and 10000",
        ),
        (["consume", "q", "--priority", str(2**40)], ExitCode.INVALID_INPUT, "32 bits"),
        (["queue", "unbind", "q", "1"], ExitCode.USAGE, "unbind needs a running node"),
        (["publish", "t"], ExitCode.USAGE, "give a payload"),
        (["publish", "t", "x", "--stdin"], ExitCode.USAGE, "with --stdin"),
    ],
)
def test_bad_input_is_one_clear_line(run, args, code, message) -> None:  # type: ignore[no-untyped-def]
    if args[:2] in (["consume", "q"], ["queue", "unbind"]):
        run("queue", "create", "q")
    r = run(*args, code=code)
    assert r.stderr.startswith("Error: ") and message in r.stderr
    assert r.stderr.count("\n") == 1


def test_only_init_or_serve_creates_a_data_directory(run, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    for args in (["inspect", "queues"], ["publish", "t/x", "p"], ["queue", "create", "q"]):
        r = run(*args, code=ExitCode.DATA_DIR, init=False)
        assert r.stderr == (
            f"Error: no eomsg data in {data_dir} yet (check --data; `eomsg serve` or --init "
            "creates it)\n"
        )
        assert not data_dir.exists()


def test_inspect_sql_is_read_only(run) -> None:  # type: ignore[no-untyped-def]
    run("publish", "t", "x")
    r = run("inspect", "sql", "DELETE FROM messages", code=ExitCode.INVALID_INPUT)
    assert r.stderr.startswith("Error: inspect sql is read-only")
    r = run("inspect", "sql", "COPY messages TO '/tmp/x.csv'", code=ExitCode.INVALID_INPUT)
    assert "read-only" in r.stderr
    r = run("inspect", "sql", "SELEC 1", code=ExitCode.INVALID_INPUT)
    assert r.stderr.startswith("Error: query failed: Parser Error")
    assert run("inspect", "sql", "SELECT count(*) AS n FROM messages", "--json").stdout == (
        '[{"n": 1}]\n'
    )


def test_queue_commands(run) -> None:  # type: ignore[no-untyped-def]
    run("queue", "create", "q", "-s", "a")
    assert run("queue", "create", "q", "-s", "a").stdout == "exists: queue q\n"
    run("queue", "create", "q", "-s", "b", code=ExitCode.CONFLICT)
    assert run("queue", "subscribe", "q", "b/>").stdout == "subscribed q to b/>\n"
    run("publish", "b/1", "x")
    r = run("queue", "delete", "q", "--yes", code=ExitCode.CONFLICT)
    assert r.stderr == "Error: queue 'q' holds 1 messages; purge it or use --force\n"
    assert run("queue", "purge", "q", "--yes").stdout == "purged 1 messages from q\n"
    assert json.loads(run("queue", "list", "--json").stdout)[0]["subscriptions"] == ["a", "b/>"]
    assert run("queue", "unsubscribe", "q", "a").stdout == "unsubscribed q from a\n"
    assert run("queue", "delete", "q", "-y").stdout == "deleted queue q (0 messages dropped)\n"


def test_config_is_saved_in_the_data_dir(run) -> None:  # type: ignore[no-untyped-def]
    assert json.loads(run("config", "set", "retention", "7d", "--json").stdout) == {
        "retention": 604800
    }
    assert run("config", "set", "max-payload", "64KiB").stdout == (
        "max-payload = 64.0 KiB (65536 bytes)\n"
    )
    assert json.loads(run("config", "show", "--json").stdout) == {
        "retention": 604800,
        "gc-interval": 60,
        "max-payload": 65536,
        "disk-reserve": 128 << 20,
    }
    shown = run("config", "show").stdout
    assert "7d00h (604800 s)" in shown and "128.0 MiB (134217728 bytes)" in shown
    assert run("config", "set", "max-payload", "60kB").stdout == (  # SI, as written
        "max-payload = 58.6 KiB (60000 bytes)\n"
    )
    run("config", "set", "max-payload", "64KiB")
    r = run("publish", "t", "x" * 65537, code=ExitCode.INVALID_INPUT)
    assert "exceeds the limit of 65536 bytes" in r.stderr
    r = run("config", "set", "colour", "blue", code=ExitCode.INVALID_INPUT)
    assert r.stderr == (
        "Error: unknown setting 'colour'; known: retention, gc-interval, max-payload, "
        "disk-reserve\n"
    )
    run("config", "set", "max-payload", "1GiB", code=ExitCode.INVALID_INPUT)
    r = run("config", "set", "disk-reserve", "lots", code=ExitCode.INVALID_INPUT)
    assert r.stderr.startswith("Error: size 'lots' is not understood") and r.stderr.count("\n") == 1
    assert run("config", "set", "disk-reserve", "1GiB").stdout == (
        f"disk-reserve = 1.0 GiB ({1 << 30} bytes)\n"
    )
    assert run("config", "set", "disk-reserve", "0").stdout == "disk-reserve = 0 (none)\n"
    beyond = run("config", "set", "disk-reserve", "900TB")  # saved, and said to be too much
    assert beyond.stderr.startswith("warning: the disk holding the data directory has ")
    assert "every publish is refused until more is free" in beyond.stderr
    run("config", "set", "disk-reserve", "0")


def test_compact_and_salvage_on_a_missing_directory(run, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    for command in ("compact", "salvage"):
        r = run(command, code=ExitCode.DATA_DIR)
        assert r.stderr == f"Error: no eomsg data in {data_dir} yet (check --data)\n"
    assert not data_dir.exists()


def test_recover_refuses_a_malformed_app_and_reports_an_unreachable_one(
    run: Any, tmp_path: Path
) -> None:
    """A descriptor that cannot be right is bad input (exit 3); one whose database is
    down is a person's to see to (exit 12). Neither changes anything."""
    cli = run
    cli("publish", "x/y", "hi")
    bad = cli("recover", "--app", "foo:bar", code=3)
    assert bad.stderr == (
        "Error: foo:bar#eomsg_txns: unknown kind of database 'foo' "
        "(use duckdb, sqlite or postgresql)\n"
    )
    bad = cli("recover", "--app", "postgresql:host=/x#bad;name", code=3)
    assert bad.stderr.startswith("Error: postgresql:host=/x#bad;name: table 'bad;name': use ")
    down = cli("recover", "--app", f"postgresql:host={tmp_path} dbname=shop", code=12)
    assert down.stderr.startswith(f"Error: cannot read postgresql:host={tmp_path} dbname=shop")
    assert cli("recover").stdout == "nothing in doubt\n"
