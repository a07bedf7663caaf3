"""``eomsg ping`` and ``eomsg node info`` through the user's door: real ``eomsg``
processes, a real node (issue 36, item 2)."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from eomsg.wire.events import PROTOCOL_VERSION
from tests.conftest import Cli, NodeProcess


def test_ping_without_a_node_says_so_and_makes_nothing(cli: Cli, data_dir: Path) -> None:
    done = cli("ping", code=9)
    assert done.stdout == b""
    assert done.stderr.decode() == (
        f"Error: no node serves {data_dir} (start one with `eomsg serve`, or give --broker)\n"
    )
    assert not data_dir.exists()  # a health check never opens (or makes) the directory
    cli("ping", "--count", "0", code=2)


def test_ping_times_round_trips_to_the_running_node(
    cli: Cli, serve: Callable[..., NodeProcess], data_dir: Path
) -> None:
    node = serve("--node-name", "alpha")
    lines = cli("ping", "-c", "3", "--interval", "0", "--json").stdout.splitlines()
    pongs = [json.loads(x) for x in lines]
    assert [(p["node"], p["address"]) for p in pongs] == [
        ("alpha", f"unix://{data_dir}/eomsg.sock")
    ] * 3
    assert all(0 < p["rtt_ms"] < 10_000 for p in pongs)
    text = cli("ping").stdout.decode()
    assert text.startswith(f"pong from alpha at unix://{data_dir}/eomsg.sock in ")
    assert text.endswith(" ms\n")
    tcp = ["--broker", node.tcp]
    assert cli(*tcp, "--token", node.token, "ping").stdout.startswith(b"pong from alpha at tcp://")
    refused = cli(*tcp, "--token", "not-the-token", "ping", code=10)
    assert refused.stderr.startswith(b"Error: ")


def test_a_paused_node_fails_its_ping(cli: Cli, serve: Callable[..., NodeProcess]) -> None:
    node = serve()
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        done = cli("ping", code=9)
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    assert b"did not answer" in done.stderr
    cli("ping")  # answering again


def test_node_info_says_who_the_node_is_served_or_embedded(
    cli: Cli, serve: Callable[..., NodeProcess], data_dir: Path
) -> None:
    cli("queue", "create", "q", "--subscribe", "q/>")
    embedded = json.loads(cli("node", "info", "--json").stdout)
    assert embedded["listening"] == [] and embedded["protocol_version"] == 0
    assert embedded["data_dir"] == str(data_dir.resolve()) and embedded["queues"] == 1
    assert "nothing (opened by this command)" in cli("node", "info").stdout.decode()

    node = serve()
    assert node.proc is not None
    served = json.loads(cli("node", "info", "--json").stdout)
    assert served["name"] == embedded["name"]  # the same node, kept in its directory
    assert served["pid"] == node.proc.pid
    assert served["listening"] == [f"unix://{data_dir}/eomsg.sock", node.tcp]
    assert served["protocol_version"] == PROTOCOL_VERSION
    assert served["schema_version"] == embedded["schema_version"] > 0
    assert (served["links"], served["links_up"], served["in_doubt"]) == (0, 0, 0)
    assert served["disk_free"] > 0 and served["disk_reserve"] >= 0
    assert 0 <= served["uptime"] < 600
    text = cli("node", "info").stdout.decode()
    assert served["name"] in text and node.tcp in text
    assert re.search(rf"protocol +│ {PROTOCOL_VERSION} ", text)


def test_inspect_log_takes_the_last_n_and_ends_at_a_seq_or_a_time(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "q/>")
    cli("publish", "q/a", "--stdin", input=b"".join(b"m%d\n" % i for i in range(1, 31)))

    def seqs(*args: str) -> list[int]:
        out = cli("inspect", "log", "--json", *args).stdout
        return [json.loads(x)["seq"] for x in out.splitlines()]

    assert seqs() == list(range(1, 21))  # the first 20 unless told
    assert seqs("--last", "3") == [28, 29, 30]  # oldest first, as tail -n 3
    assert seqs("--to-seq", "12", "--last", "2") == [11, 12]
    assert seqs("--from-seq", "5", "--to-seq", "7") == [5, 6, 7]
    assert seqs("--until", "2000-01-01") == []
    assert seqs("--until", "2999-01-01", "--limit", "2") == [1, 2]
    assert seqs("--until", "1h") == []  # published before an hour ago: none
    bad = cli("inspect", "log", "--last", "2", "--limit", "2", code=2)
    assert bad.stderr == b"Error: --last N and --limit N do not combine (--last is the last N)\n"
    bad = cli("inspect", "log", "--follow", "--to-seq", "3", code=2)
    assert b"--follow has no end" in bad.stderr
    bad = cli("inspect", "log", "--until", "soon", code=3)
    assert bad.stderr.startswith(b"Error: time 'soon' is not understood")


def test_a_broker_without_a_scheme_is_told_what_to_give(cli: Cli, data_dir: Path) -> None:
    done = cli("--broker", "127.0.0.1:47502", "inspect", "queues", code=3)
    assert done.stderr == (
        b"Error: --broker '127.0.0.1:47502' is not a URL (tcp://127.0.0.1:47502?): give "
        b"tcp://HOST:PORT, tls://HOST:PORT or unix://PATH (a data directory is --data)\n"
    )
    assert cli("ping", "--broker", "somewhere", code=3).stderr.startswith(
        b"Error: --broker 'somewhere' is not a URL: give"
    )
    assert not data_dir.exists()


def test_declining_a_delete_at_the_terminal_says_nothing_changed(
    cli: Cli, eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    cli("queue", "create", "q", "--subscribe", "q/>")
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [eomsg_bin, "queue", "delete", "q"], env=cli_env, stdin=terminal,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        os.write(controller, b"n\n")
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(controller)
        os.close(terminal)
    assert (proc.returncode, err) == (2, b"Error: not confirmed: nothing changed\n")
    assert json.loads(cli("queue", "list", "--json").stdout)[0]["name"] == "q"


def test_a_delimiter_goes_with_raw(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "q/>")
    cli("publish", "q/a", "x")
    done = cli("consume", "q", "--delimiter", "", code=2)
    assert done.stderr == (
        b"Error: --delimiter goes with --raw (text and JSON lines end with a newline)\n"
    )
    assert cli("consume", "q", "--raw", "--delimiter", "\\0").stdout == b"x\0"


def test_under_json_an_error_is_a_json_line(cli: Cli) -> None:
    cli("queue", "list")  # made
    for args in (("consume", "nope", "--json"), ("--json", "consume", "nope")):
        done = cli(*args, code=4)
        assert done.stdout == b""
        assert json.loads(done.stderr) == {
            "error": "queue_not_found",
            "message": "queue 'nope' does not exist; create it with `eomsg queue create nope`",
            "exit_code": 4,
        }
    plain = cli("consume", "nope", code=4)
    assert plain.stderr.startswith(b"Error: queue 'nope' does not exist")


def test_version_is_answered_without_loading_the_commands(eomsg_bin: str) -> None:
    from importlib.metadata import version

    done = subprocess.run([eomsg_bin, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout == f"eomsg {version('eomsg')}\n"
    probe = (
        "import sys; sys.argv = ['eomsg', '--version']; from eomsg.cli import main; main(); "
        "print(sorted(m for m in sys.modules if m.startswith(('eomsg.cli.', 'typer', 'rich'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"


def test_completion_for_a_shell_typer_does_not_know_is_refused(eomsg_bin: str) -> None:
    for args in (["--show-completion", "tcsh"], ["--install-completion=csh"]):
        done = subprocess.run([eomsg_bin, *args], capture_output=True, text=True)
        shell = args[-1].split("=")[-1]
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (
            f"Error: no completion for {shell!r}: bash, zsh, fish, powershell, pwsh\n"
        )
    bash = subprocess.run([eomsg_bin, "--show-completion", "bash"], capture_output=True, text=True)
    assert bash.returncode == 0 and "_eomsg_completion" in bash.stdout


def test_open_dir_finds_the_node_as_the_command_line_does(
    serve: Callable[..., NodeProcess], data_dir: Path
) -> None:
    import eomsg
    from eomsg.errors import DataDirError

    with pytest.raises(DataDirError):  # made only when asked
        eomsg.open_dir(data_dir)
    with eomsg.open_dir(data_dir, create=True) as here:  # no node: embedded
        assert here.embedded
        here.create_queue(eomsg.QueueConfig("q", subscriptions=("q/>",)))
        here.publish("q/a", b"1", ttl="1h")
    serve()
    with eomsg.open_dir(data_dir) as served:  # a node serves it: through the node
        assert not served.embedded
        assert [d.message.payload for d in served.fetch("q", 5)] == [b"1"]


def test_queue_names_complete_from_the_running_node_only(
    cli: Cli,
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    cli_env: dict[str, str],
    data_dir: Path,
) -> None:
    cli("queue", "create", "orders", "--subscribe", "o/>")
    cli("queue", "create", "audit", "--subscribe", "a/>")

    def complete(words: str) -> list[str]:
        env = {**cli_env, "_EOMSG_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split(" ")) - 1)}  # fmt: skip
        done = subprocess.run([eomsg_bin], env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stderr) == (0, "")
        return done.stdout.split()

    assert complete("eomsg consume o") == []  # no node: the directory is never opened here
    node = serve()
    assert complete("eomsg consume o") == ["orders"]
    assert sorted(complete("eomsg queue purge ")) == ["audit", "orders"]
    assert complete("eomsg browse x") == []
    node.stop()
    assert complete("eomsg inspect flows ") == []  # a node gone: nothing, and no trace
