"""Habits of a good command line, through real ``eomsg`` processes: global options before
or after the command, usage errors on one line, plain help with examples, no activity
lines where nothing elects, no data directory made by a typo, and a fast start that
loads neither the store nor Spark when a node runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eomsg.errors import ExitCode
from tests.conftest import Cli

HEAVY = ("duckdb", "pyarrow", "psycopg", "pyspark", "pandas")


def test_global_options_go_before_or_after_the_command(cli: Cli, tmp_path: Path) -> None:
    other = tmp_path / "other"
    cli("--data", str(other), "queue", "create", "q")
    listed = cli("--data", str(other), "--json", "queue", "list").stdout
    assert [q["name"] for q in json.loads(listed)] == ["q"]
    assert cli("queue", "list", "--json", "--data", str(other)).stdout == listed
    # Given in both places, the one after the command's name counts.
    assert cli("--data", "nowhere", "queue", "list", "--data", str(other), "--json").stdout == (
        listed
    )


def test_broker_and_token_go_before_or_after_the_command(
    cli: Cli, serve: Callable[..., Any]
) -> None:
    node = serve()
    url = node.tcp
    before = cli("--broker", url, "--token", node.token, "queue", "create", "q")
    assert before.stdout == b"created queue q\n"
    after = cli("inspect", "queues", "--json", "--broker", url, "--token", node.token)
    assert [q["name"] for q in json.loads(after.stdout)] == ["q"]
    r = cli("inspect", "queues", "--broker", url, "--token", "wrong", code=ExitCode.AUTH)
    assert r.stderr == (
        b"Error: wrong or missing token; pass the token from the node's data directory "
        b"(eomsg.token) with --token or EOMSG_TOKEN\n"
    )


def test_usage_errors_are_one_line(cli: Cli) -> None:
    cases = [
        (("queue", "create"), "Error: Missing argument 'NAME'. (see eomsg queue create --help)"),
        (
            ("queue", "list", "--jsn"),
            "Error: No such option: --jsn (Possible options: --json) (see eomsg queue list --help)",
        ),
        (("nosuch",), "Error: No such command 'nosuch'. (see eomsg --help)"),
        (
            ("consume", "q", "--batch", "0"),
            "Error: Invalid value for '--batch': Input should be greater than or equal to 1 "
            "(see eomsg consume --help)",
        ),
    ]
    for args, said in cases:
        r = cli(*args, code=ExitCode.USAGE)
        assert (r.stdout, r.stderr.decode()) == (b"", said + "\n"), args


def test_a_value_may_start_with_a_dash(cli: Cli) -> None:
    cli("queue", "create", "q")
    r = cli("config", "set", "retention", "-1", code=ExitCode.INVALID_INPUT)
    assert r.stderr == b"Error: duration '-1' must be greater than zero\n"


def test_help_is_plain_text_with_examples_and_h_asks_for_it(cli: Cli) -> None:
    for command in (
        ["publish"], ["consume"], ["queue", "create"], ["inspect", "log"], ["inspect", "sql"],
        ["serve"], ["spark-replay"], ["top"], ["recover"], ["config", "set"],
    ):  # fmt: skip
        text = cli(*command, "-h").stdout.decode()
        assert text == cli(*command, "--help").stdout.decode()
        assert text.startswith(f"Usage: eomsg {' '.join(command)} [OPTIONS]")
        assert "\n  Examples:\n    eomsg " in text, command
        for typer_ism in ("<bool>", "<str>", "<int", "{"):
            assert typer_ism not in text.split("Options:")[0].split("Examples:")[0], command
            assert typer_ism not in text.split("Options:")[1], (command, typer_ism)
    text = cli("publish", "-h").stdout.decode()
    assert "Usage: eomsg publish [OPTIONS] TOPIC [PAYLOAD]\n" in text
    assert "  --ttl DURATION " in text and "  --stdin " in text and "  --json " in text


def test_activity_lines_belong_to_queues_that_elect(cli: Cli) -> None:
    cli("queue", "create", "shared", "--subscribe", "s/>")
    cli("queue", "create", "excl", "--subscribe", "e/>", "--max-active", "1")
    cli("publish", "s/x", "one")
    cli("publish", "e/x", "one")
    r = cli("consume", "shared", "--json")
    assert [json.loads(line)["payload"] for line in r.stdout.splitlines()] == ["one"]
    assert r.stderr == b""
    assert cli("consume", "shared").stderr == b""
    r = cli("consume", "excl", "--json")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x.get("event") or x["payload"] for x in lines] == ["active", "one"]
    cli("publish", "s/x", "two")
    r = cli("consume", "shared", "--activity")
    assert r.stdout == b"3 s/x two\n" and r.stderr.startswith(b"active: flow ")


def test_a_mistyped_data_directory_is_never_created(cli: Cli, tmp_path: Path) -> None:
    typo = tmp_path / "typo" / "dir"
    for args in (("publish", "t/x", "p"), ("queue", "create", "q"), ("inspect", "queues")):
        r = cli("--data", str(typo), *args, code=ExitCode.DATA_DIR, env={"EOMSG_INIT": ""})
        assert r.stderr.decode() == (
            f"Error: no eomsg data in {typo} yet (check --data; `eomsg serve` or --init "
            "creates it)\n"
        )
        assert not typo.parent.exists()
    cli("--data", str(typo), "--init", "queue", "create", "q", env={"EOMSG_INIT": ""})
    assert cli("--data", str(typo), "publish", "t/x", "p", env={"EOMSG_INIT": ""}).stdout == (
        b"published seq 1\n"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["publish", "t/x", "p"],
        ["inspect", "queues"],
        ["queue", "list"],
        ["top", "-n", "1"],
    ],
    ids=lambda c: " ".join(c),
)
def test_a_command_through_a_node_loads_no_store_spark_or_driver(
    cli: Cli, serve: Callable[..., Any], command: list[str]
) -> None:
    serve()
    r = cli(*command, env={"PYTHONPROFILEIMPORTTIME": "1"})
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.decode().splitlines()}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    assert "eomsg.cli.app" in loaded  # the import log is there to read
