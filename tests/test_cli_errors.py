"""Bad input to the command line, through real ``eomsg`` processes: one line on stderr, a
documented exit code, nothing changed — never a traceback, never a stopped store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eomsg.cli.app import app
from eomsg.errors import ExitCode
from tests.conftest import Cli

NOT_UTF8 = os.fsdecode(b"\xff")  # what Python makes of an argument in another encoding


def test_a_payload_argument_is_published_as_the_bytes_given(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    assert cli("publish", "t/x", b"p\xff").stdout == b"published seq 1\n"
    assert cli("consume", "q", "--raw").stdout == b"p\xff\n"


def test_text_that_is_not_utf8_is_refused_as_invalid_input(cli: Cli, tmp_path: Path) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    cases = [
        (("publish", b"t/\xff", "x"), b"Error: topic 't/\\udcff' is not UTF-8 text\n"),
        (("queue", "subscribe", "q", b"t/\xff"), b"Error: pattern 't/\\udcff' is not UTF-8 text\n"),
        (
            ("queue", "create", "q2", "--subscribe", b"\xff/>"),
            b"Error: pattern '\\udcff/>' is not UTF-8 text\n",
        ),
        (
            ("publish", "t/x", "x", "-H", b"a=\xff"),
            b"Error: header 'a' must have a UTF-8 text value\n",
        ),
        (("inspect", "log", "--topic", b"\xff"), b"Error: pattern '\\udcff' is not UTF-8 text\n"),
        (("inspect", "sql", b"SELECT '\xff'"), b"Error: the query is not UTF-8 text\n"),
    ]
    for args, said in cases:
        r = cli(*args, code=ExitCode.INVALID_INPUT)
        assert (r.stdout, r.stderr) == (b"", said), args
    # Nothing was stored, and the store still takes writes.
    assert cli("publish", "t/x", "after").stdout == b"published seq 1\n"
    queues = json.loads(cli("queue", "list", "--json").stdout)
    assert [(q["name"], q["subscriptions"]) for q in queues] == [("q", ["t/>"])]


def test_into_a_file_that_is_no_database_is_a_one_line_error(cli: Cli, tmp_path: Path) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    cli("publish", "t/x", "kept")
    text = tmp_path / "notes.txt"
    text.write_bytes(b"not a database, and it must stay as it is\n" * 100)
    r = cli("consume", "q", "--into", f"sqlite:{text}:t", code=ExitCode.INVALID_INPUT)
    assert r.stderr == (
        f"Error: --into 'sqlite:{text}:t': cannot use the database: file is not a "
        "database\n".encode()
    )
    assert text.read_bytes() == b"not a database, and it must stay as it is\n" * 100
    assert json.loads(cli("inspect", "queues", "--json").stdout)[0]["depth"] == 1


HOSTILE = ["", "-", "[/]", ":x:", "\x1b[2J", NOT_UTF8, "x" * 5000, "'; DROP TABLE messages; --"]
COMMANDS = [
    ["publish", "{}", "payload"],
    ["publish", "t/x", "{}"],
    ["publish", "t/x", "p", "--id", "{}"],
    ["publish", "t/x", "p", "--ttl", "{}"],
    ["publish", "t/x", "p", "-H", "{}"],
    ["queue", "create", "{}"],
    ["queue", "create", "n", "--subscribe", "{}"],
    ["queue", "create", "n", "--ack-timeout", "{}"],
    ["queue", "create", "n", "--dead-letter", "{}"],
    ["queue", "subscribe", "q", "{}"],
    ["queue", "purge", "{}", "--yes"],
    ["queue", "delete", "{}", "--yes"],
    ["queue", "requeue", "{}"],
    ["queue", "requeue", "q", "--to", "{}"],
    ["browse", "{}"],
    ["consume", "{}"],
    ["consume", "q", "--into", "{}"],
    ["consume", "q", "--raw", "--delimiter", "{}"],
    ["config", "set", "retention", "{}"],
    ["config", "set", "{}", "1s"],
    ["inspect", "log", "--topic", "{}"],
    ["inspect", "sql", "{}"],
    ["inspect", "flows", "{}"],
    ["recover", "--app", "{}"],
    ["recover", "--abort-older-than", "{}"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_hostile_values_get_a_one_line_error_or_work(command: list[str], data_dir: Path) -> None:
    """Every hostile value in every place: a documented exit code and at most one line on
    stderr — never a traceback (exit 1) — and the store still takes writes after it."""
    runner = CliRunner()
    env = {"EOMSG_DATA": str(data_dir), "EOMSG_INIT": "1"}
    assert runner.invoke(app, ["queue", "create", "q", "-s", "t/>"], env=env).exit_code == 0
    for value in HOSTILE:
        args = [a.replace("{}", value) for a in command]
        r = runner.invoke(app, args, env=env)
        assert r.exit_code in {int(c) for c in ExitCode} - {ExitCode.FAILURE}, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
        assert len(r.stderr.splitlines()) <= 1, (args, r.stderr)
        if r.exit_code:
            assert r.stderr.startswith("Error: "), (args, r.stderr)
    assert runner.invoke(app, ["publish", "t/x", "still works"], env=env).exit_code == 0


def test_query_values_json_has_no_form_for_come_as_text(cli: Cli) -> None:
    cli("queue", "create", "q")
    query = (
        "SELECT 1.5::DECIMAL(10,2) AS d, 'nan'::DOUBLE AS n, INTERVAL 2 HOUR AS i, "
        "['\\xFF'::BLOB] AS l, 170141183460469231731687303715884105727::HUGEINT AS h, "
        "'00000000-0000-0000-0000-000000000001'::UUID AS u"
    )
    (row,) = json.loads(cli("inspect", "sql", query, "--json").stdout)
    assert row == {
        "d": "1.50",
        "n": "nan",
        "i": "2:00:00",
        "l": ["/w=="],
        "h": "170141183460469231731687303715884105727",
        "u": "00000000-0000-0000-0000-000000000001",
    }


def test_more_hostile_places_are_one_line_errors(cli: Cli, tmp_path: Path) -> None:
    cli("queue", "create", "q")
    r = cli("publish", "z/\u202eabc", "x", code=ExitCode.INVALID_INPUT)
    assert r.stderr.startswith(b"Error: topic 'z/\\u202eabc': level '\\u202eabc' may not contain")
    r = cli("--broker", f"tcp://{'a' * 64}:1", "queue", "list", code=ExitCode.INVALID_INPUT)
    assert r.stderr.startswith(b"Error: address 'tcp://aaaa") and r.stderr.count(b"\n") == 1
    odd = tmp_path / os.fsdecode(b"d\xff")
    r = cli("--data", str(odd), "--init", "queue", "list", code=ExitCode.DATA_DIR)
    assert r.stderr.startswith(b"Error: data directory ") and b"is not a UTF-8 path" in r.stderr
    assert not odd.exists()
    r = cli("browse", "q", "--from-seq", str(1 << 64), code=ExitCode.USAGE)
    assert r.stderr.count(b"\n") == 1
    r = cli("queue", code=ExitCode.USAGE)  # a group alone: its help, as it is
    assert r.stdout.startswith(b"Usage: eomsg queue [OPTIONS] COMMAND [ARGS]...\n") and not r.stderr


def test_consume_max_takes_ahead_no_more_than_it_hands_out(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    cli("publish", "t/x", "--stdin", input=b"".join(b"%d\n" % i for i in range(500)))
    for _ in range(3):
        cli("consume", "q", "--max", "1")
    handed_out = """SELECT (SELECT count(*) FROM deliveries)
                           + (SELECT coalesce(sum(last_seq - first_seq + 1), 0)
                              FROM delivery_runs) AS n"""  # one queue: every seq is its
    r = cli("inspect", "sql", handed_out, "--json")
    assert json.loads(r.stdout) == [{"n": 3}]
