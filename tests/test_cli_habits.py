"""Habits of a good command line, through real ``eomsg`` processes: global options before
or after the command, usage errors on one line, plain help with examples, no activity
lines where nothing elects, no data directory made by a typo, and a fast start that
loads neither the store nor Spark when a node runs."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.cli.app import COMMANDS, VALUED, build, command_named
from eomsg.errors import ExitCode
from tests.conftest import Cli, eventually

HEAVY = ("duckdb", "pyarrow", "psycopg", "pyspark", "pandas", "pydantic")


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
        b"Error: wrong or missing token; pass the node's token (eomsg.token in its data "
        b"directory) or a principal's (eomsg user add) with --token or EOMSG_TOKEN\n"
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


@pytest.mark.parametrize(
    "command",
    [["publish", "t/x", "p"], ["inspect", "queues"], ["queue", "list"]],
    ids=lambda c: " ".join(c),
)
def test_a_quick_embedded_command_loads_no_event_loop_tls_or_server(
    cli: Cli, command: list[str]
) -> None:
    """Embedded, a command done before it would lend the directory (0.5 s) needs neither
    asyncio, uvloop, ssl nor the server it would lend it through."""
    cli("queue", "create", "q", "--subscribe", "t/>")
    r = cli(*command, env={"PYTHONPROFILEIMPORTTIME": "1"})
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.decode().splitlines()}
    assert "eomsg.node.node" in loaded  # embedded: the node opened here
    unwanted = {"asyncio", "uvloop", "ssl", "eomsg.server.server", "eomsg.client.aio"}
    assert not loaded & unwanted, sorted(loaded & unwanted)


@pytest.mark.parametrize(
    "command",
    [["publish", "t/x", "p", "--id", "a1"], ["inspect", "queues"], ["consume", "q", "--max", "1"]],
    ids=lambda c: " ".join(c),
)
def test_an_embedded_command_on_a_store_of_few_ids_loads_no_numpy_or_arrow(
    cli: Cli, command: list[str]
) -> None:
    """A data directory holding few live publish ids opens with them read as rows:
    numpy and Arrow (≈ 0.1 s together) wait for a store that needs runs of ids."""
    cli("queue", "create", "q", "--subscribe", "t/>")
    cli("publish", "t/x", "p", "--id", "a1")
    cli("publish", "t/x", "p", "--id", "a2", "--ttl", "1h")
    r = cli(*command, env={"PYTHONPROFILEIMPORTTIME": "1"})
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.decode().splitlines()}
    assert "eomsg.node.node" in loaded  # embedded: the node opened here
    assert not loaded & {"numpy", "pyarrow"}, sorted(loaded & {"numpy", "pyarrow"})
    if command[0] == "publish":  # and the id read back as a row is still known
        assert r.stdout == b"duplicate of seq 1 (id a1): stored once\n"


def test_only_the_command_that_runs_is_built(cli: Cli, serve: Callable[..., Any]) -> None:
    """``eomsg publish`` imports no other command's module."""
    serve()
    r = cli("publish", "t/x", "p", env={"PYTHONPROFILEIMPORTTIME": "1"})
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.decode().splitlines()}
    # (every command reads the context it reaches the node by from eomsg.cli.context)
    others = {m for m, _ in COMMANDS.values()} - {"eomsg.cli.publish", "eomsg.cli.context"}
    assert "eomsg.cli.publish" in loaded and not loaded & others, sorted(loaded & others)


def _coerced_parameters() -> list[tuple[Any, Any]]:
    """A (command, parameter) of each kind among every command's parameters."""
    import typer.main
    from typer.core import TyperArgument, TyperGroup, TyperOption

    found: list[tuple[Any, Any]] = []

    def walk(command: Any) -> None:
        found.extend(
            (command, p) for p in command.params if isinstance(p, TyperArgument | TyperOption)
        )
        if isinstance(command, TyperGroup):
            for sub in command.commands.values():
                walk(sub)

    walk(typer.main.get_command(build()))
    kinds: dict[tuple[Any, ...], tuple[Any, Any]] = {}
    for command, p in found:  # one of each kind, so every kind is drawn often
        info = p.type_descriptor.parameter_info
        kind = (
            repr(p.type_descriptor.annotation), info.min, info.max, info.clamp, info.exists,
            info.file_okay, info.dir_okay, info.readable, info.writable, info.resolve_path,
            info.parser, p.multiple, p.nargs,
        )  # fmt: skip
        kinds.setdefault(kind, (command, p))
    return list(kinds.values())


COERCED = _coerced_parameters()
# what a command line or the environment gives a parameter, beside any text and digits
WORDS = [
    "",
    "-",
    ".",
    "/",
    "~/x",
    "\0",
    "a\0b",
    " 1",
    "1 ",
    "+1",
    "1_0",
    "007",
    "\uff11",
    "²",
    "0x1f",
    "1e3",
]
WORDS += ["1", "0", "true", "TRUE", "Yes", " on ", "off", "no", "F", "2", "enable"]
WORDS += ["x/", "./x", "a//x", "/nonexistent/x", "/dev/null", "/", "\udcff"]
# what a default or the library gives a parameter instead of a text
VALUES = [0, 1, -1, 5000, 10**30, 1.5, float("nan"), True, False, Path("x/"), b"x", ["a"]]


def _same_coercion(command: Any, param: Any, value: Any) -> None:
    """Where eomsg's coercion skips typer's pydantic adapter, it gives what the adapter
    gives (the same value of the same type, or the same error)."""
    from typer._click import Context
    from typer._click.exceptions import BadParameter
    from typer._coercion import build_runtime_param

    from eomsg.cli.root import _TYPERS, _without_pydantic

    ctx = Context(command)
    many = bool(param.multiple or param.nargs == -1)

    def outcome(coerce: Callable[[], Any]) -> tuple[str, Any]:
        try:
            return ("value", coerce())
        except BadParameter as e:
            return ("error", e.format_message())

    ours = outcome(lambda: _without_pydantic(value, param, ctx, many))
    if ours == ("value", _TYPERS):
        return
    runtime = build_runtime_param(param.type_descriptor)
    typers = outcome(lambda: runtime.coerce(value, param=param, ctx=ctx))
    assert (ours, type(ours[1])) == (typers, type(typers[1])), (param.name, value)


@pytest.mark.parametrize("chosen", COERCED, ids=lambda c: f"{c[0].name}-{c[1].name}")
@settings(max_examples=40, deadline=None)
@given(
    value=st.one_of(st.text(max_size=12), st.integers(0, 10**40).map(str)),
    many=st.lists(st.text(max_size=6), max_size=3),
)
def test_a_value_coerced_without_pydantic_is_typers_own(
    chosen: tuple[Any, Any], value: str, many: list[str]
) -> None:
    """eomsg's coercion of text, paths, digits and flags (tests/test_cli_habits.py) is
    typer's, for a parameter of each kind; each word that could fool it is tried too."""
    command, param = chosen
    if param.multiple or param.nargs == -1:
        _same_coercion(command, param, tuple(many))
    else:
        _same_coercion(command, param, value)
        for given in [*WORDS, *VALUES]:
            _same_coercion(command, param, given)


def test_help_reaches_for_no_node(cli: Cli) -> None:
    """``eomsg --help`` builds every command but imports no client connection (asyncio,
    the wire's events): only a command that runs reaches a node."""
    r = cli("--help", env={"PYTHONPROFILEIMPORTTIME": "1"})
    loaded = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.decode().splitlines()}
    assert "eomsg.cli.queue" in loaded  # every command was built
    assert not loaded & {"eomsg.client.sync", "eomsg.client.aio", "eomsg.wire.events"}


def test_the_clients_names_are_there_when_asked_for() -> None:
    """``eomsg.client`` imports each of its names when first asked for, every one."""
    import eomsg.client

    for name in eomsg.client.__all__:
        assert getattr(eomsg.client, name).__name__ == name
        assert name in dir(eomsg.client)
    assert eomsg.client.sync.connect is eomsg.client.connect  # its modules, as before
    with pytest.raises(AttributeError):
        eomsg.client.nosuch  # noqa: B018


def test_the_root_options_that_take_a_value_are_the_ones_skipped() -> None:
    """The command's name is the first word that is not a root option or its value (a
    value never taken for a name: ``--data queue publish``)."""
    import typer.main

    group = typer.main.get_command(build())
    valued = {o for p in group.params if not getattr(p, "is_flag", True) for o in p.opts}
    assert valued == set(VALUED)
    assert list(group.commands) == list(COMMANDS)  # each command, in the table's order
    for words, named in [
        (["publish", "t/x"], "publish"),
        (["--data", "publish", "queue", "list"], "queue"),
        (["--data=d", "--json", "--init", "inspect", "queues"], "inspect"),
        (["--context", "prod", "nosuch"], None),
        (["--help", "publish"], None),
        (["--show-completion", "bash"], None),
        ([], None),
    ]:
        assert command_named(words) == named, words


def test_version_and_shell_completion(cli: Cli) -> None:
    from importlib.metadata import version

    assert cli("--version").stdout == f"eomsg {version('eomsg')}\n".encode()
    script = cli("--show-completion", "bash", env={"SHELL": "/bin/bash"}).stdout.decode()
    assert "_EOMSG_COMPLETE=complete_bash" in script and "complete " in script
    done = cli(
        env={"_EOMSG_COMPLETE": "complete_bash", "COMP_WORDS": "eomsg que", "COMP_CWORD": "1"}
    )
    assert done.stdout.decode().split() == ["queue"]


def test_browse_peeks_without_consuming(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    for payload in ("one", "[bold]two[/]", "three"):
        cli("publish", "t/x", payload)
    r = cli("browse", "q", "--from-seq", "2", "--json")
    assert [(m["seq"], m["payload"]) for m in map(json.loads, r.stdout.splitlines())] == [
        (2, "[bold]two[/]"),
        (3, "three"),
    ]
    table = cli("browse", "q", "--limit", "2").stdout.decode()
    assert [line.split("│")[6].strip() for line in table.splitlines() if "│ t/x" in line] == [
        "one",
        "[bold]two[/]",
    ]
    r = cli("consume", "q", "--json")  # all three, none counted by the looks
    assert [(m["seq"], m["attempt"]) for m in map(json.loads, r.stdout.splitlines())] == [
        (1, 1),
        (2, 1),
        (3, 1),
    ]
    assert cli("browse", "nosuch", code=ExitCode.NOT_FOUND).stderr.startswith(
        b"Error: queue 'nosuch' does not exist"
    )


def test_requeue_moves_a_dead_letter_queue_back(cli: Cli) -> None:
    cli("queue", "create", "q", "-s", "t/>", "--max-redeliveries", "0", "--dead-letter", "q-dlq")
    for payload in ("one", "two"):
        cli("publish", "t/x", payload)
    cli("consume", "q", "--exec", "exit 1", code=ExitCode.HANDLER_FAILED)
    cli("consume", "q", "--exec", "exit 1", code=ExitCode.HANDLER_FAILED)
    assert cli("browse", "q-dlq", "--json").stdout.count(b"\n") == 2
    assert cli("queue", "requeue", "q-dlq").stdout == b"requeued 2 messages from q-dlq to q\n"
    r = cli("consume", "q", "--json")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(m["payload"], m["headers"]["eomsg-requeued-from"]) for m in lines] == [
        ("one", "1"),
        ("two", "2"),
    ]
    r = cli("queue", "requeue", "q", code=ExitCode.INVALID_INPUT)
    assert r.stderr == (
        b"Error: no queue dead-letter into 'q': say where its messages go (use --to)\n"
    )


def test_purge_and_delete_ask_first(cli: Cli, eomsg_bin: str, cli_env: dict[str, str]) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    cli("publish", "t/x", "kept until asked")
    r = cli("queue", "purge", "q", code=ExitCode.USAGE)
    assert r.stderr == b"Error: purge drops every message waiting in q: confirm with --yes\n"
    r = cli("queue", "delete", "q", "--force", code=ExitCode.USAGE)
    assert r.stderr == b"Error: delete queue q and its records: confirm with --yes\n"
    assert json.loads(cli("inspect", "queues", "--json").stdout)[0]["depth"] == 1
    # At a terminal the question is asked: "n" changes nothing, "y" goes on.
    for answer, code, depth in ((b"n\n", ExitCode.USAGE, 1), (b"y\n", ExitCode.OK, 0)):
        controller, terminal = pty.openpty()
        os.write(controller, answer)
        done = subprocess.run(
            [eomsg_bin, "queue", "purge", "q"], stdin=terminal, capture_output=True,
            env=cli_env, timeout=60, check=False,
        )  # fmt: skip
        os.close(controller)
        os.close(terminal)
        assert done.returncode == code, done.stderr
        assert done.stdout == b"purge drops every message waiting in q? [y/N]: " + (
            b"purged 1 messages from q\n" if answer == b"y\n" else b""
        )
        assert json.loads(cli("inspect", "queues", "--json").stdout)[0]["depth"] == depth
    assert cli("queue", "delete", "q", "-y").stdout == b"deleted queue q (0 messages dropped)\n"


def test_inspect_log_follows_the_log(
    cli: Cli, serve: Callable[..., Any], eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    serve()
    cli("publish", "t/x", "before")
    follower = subprocess.Popen(
        [eomsg_bin, "inspect", "log", "--follow", "--topic", "t/>"], env=cli_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == b"1 t/x before\n"
        cli("publish", "u/x", "not followed")
        cli("publish", "t/x", "-", input=b"two\nlines")
        cli("publish", "t/y", "-", input=b"\xff")
        assert follower.stdout.readline() == b"3 t/x two\\nlines\n"
        assert follower.stdout.readline() == b"4 t/y \\xff\n"
    finally:
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=30)
    assert (follower.returncode, out, err) == (0, b"", b"")


def test_a_signal_while_following_ends_after_the_look_under_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM (or Ctrl-C) arriving during a call to the node lets the call finish: raised
    inside it, the interruption abandoned the call's coroutine ("never awaited"). A
    second one ends following at once, the call unfinished."""
    from eomsg.cli.inspect import _follow

    class Node:
        looks = finished = 0

        def log(self, topic: str | None, after: int, limit: int) -> list[Any]:
            self.looks += 1
            os.kill(os.getpid(), signal.SIGTERM)  # handled before this call returns
            self.finished += 1
            return []

    class Hung(Node):
        def log(self, topic: str | None, after: int, limit: int) -> list[Any]:
            self.looks += 1
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)  # a second: a node that no longer answers
            self.finished += 1
            return []

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for node, finished in ((Node(), 1), (Hung(), 0)):
            _follow(node, None, [], 0, False)  # type: ignore[arg-type]
            assert (node.looks, node.finished) == (1, finished)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert capsys.readouterr() == ("", "")


def test_inspect_queues_and_top_show_bytes_and_rates(cli: Cli, serve: Callable[..., Any]) -> None:
    serve()
    cli("queue", "create", "q", "--subscribe", "t/>")

    def stats() -> dict[str, Any]:
        return dict(json.loads(cli("inspect", "queues", "--json").stdout)[0])

    assert eventually(lambda: stats()["in_rate"] is not None)  # the node has noted a second
    cli("publish", "t/x", "--stdin", input=b"".join(b"%05d\n" % i for i in range(40)))
    assert eventually(lambda: (stats()["in_rate"] or 0) > 0)
    now = stats()
    assert (now["depth"], now["bytes"], now["out_rate"]) == (40, 200, 0.0)
    header = cli("inspect", "queues").stdout.decode().splitlines()[1]
    assert [c.strip() for c in header.split("┃")[-4:-1]] == ["bytes", "in/s", "out/s"]
    frame = json.loads(cli("top", "-n", "1", "--json", "--interval", "0.1").stdout)
    assert frame["queues"][0]["bytes"] == 200


# A handler that holds its message until the test says ``go`` (a file in its directory):
# the consume command holds the data directory meanwhile, for as long as the test needs.
UNTIL_GO = "while [ ! -e go ]; do sleep 0.05; done"


def test_a_command_holding_the_directory_lets_others_look_but_not_change(
    cli: Cli, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path, tmp_path: Path
) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    cli("publish", "t/x", "waiting")
    holder = subprocess.Popen(  # no node runs: consume holds the directory in-process
        [eomsg_bin, "consume", "q", "--exec", UNTIL_GO], env=cli_env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert eventually(lambda: (data_dir / "eomsg.sock").exists())
        stats = json.loads(cli("inspect", "queues", "--json").stdout)
        assert [(s["name"], s["depth"], s["in_flight"]) for s in stats] == [("q", 1, 1)]
        assert json.loads(cli("browse", "q", "--json").stdout)["payload"] == "waiting"
        assert cli("queue", "list").stdout.count(b"\n") == 5
        said = (
            f"Error: data directory {data_dir} is in use by pid {holder.pid} (eomsg consume), "
            "which lets other commands look at it but not change it; wait for it to finish\n"
        ).encode()
        for change in (("publish", "t/x", "p"), ("queue", "purge", "q", "--yes"), ("consume", "q")):
            r = cli(*change, code=ExitCode.DATA_DIR)
            assert (r.stdout, r.stderr) == (b"", said), change
    finally:
        (tmp_path / "go").touch()
        _, err = holder.communicate(timeout=60)
    assert (holder.returncode, err) == (0, b"")
    assert not (data_dir / "eomsg.sock").exists()  # lending ended with the command
    assert cli("publish", "t/x", "p").stdout == b"published seq 2\n"


def test_a_view_holding_the_directory_never_stops_its_writers(
    cli: Cli, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    """Embedded ``eomsg top`` only looks: it lends the directory whole, so publishing,
    consuming and purging go through it while it runs — from its first moment on."""
    cli("queue", "create", "q", "--subscribe", "t/>")
    holder = subprocess.Popen(
        [eomsg_bin, "top", "--interval", "0.2", "--json"], env=cli_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert cli("publish", "t/x", "first").stdout == b"published seq 1\n"  # as it starts
        assert eventually(lambda: (data_dir / "eomsg.sock").exists())
        cli("publish", "t/x", "--stdin", input=b"a\nb\nc\n")
        assert cli("consume", "q", "--max", "2").stdout == b"1 t/x first\n2 t/x a\n"
        assert cli("queue", "purge", "q", "--yes").returncode == 0
        assert holder.poll() is None
    finally:
        holder.send_signal(signal.SIGINT)
        out, err = holder.communicate(timeout=60)
    assert (holder.returncode, err) == (0, b"")
    assert json.loads(out.splitlines()[-1])["queues"][0]["name"] == "q"  # it showed them
    (q,) = json.loads(cli("inspect", "queues", "--json").stdout)
    assert (q["deleted"], q["purged"]) == (2, 2)
    assert not (data_dir / "eomsg.sock").exists()
    assert cli("publish", "t/x", "p").stdout == b"published seq 5\n"
