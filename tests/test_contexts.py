"""``eomsg context``: named ways to reach a node, in the user's owner-only config file,
chosen with ``--context``, ``EOMSG_CONTEXT`` or ``context use`` (issue 36, item 3) — real
``eomsg`` processes and a real node over TCP."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import NodeProcess


@pytest.fixture
def ctx(
    eomsg_bin: str, cli_env: dict[str, str], tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``eomsg ARGS`` with a config directory of the test's own and no data directory
    of its own: only a context (or an option) says where the node is."""
    env = {**cli_env, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("EOMSG_INIT")
    env.pop("EOMSG_DATA")  # ./eomsg-data, which does not exist where they run
    (tmp_path / "cwd").mkdir()

    def run(*args: str, code: int = 0, **more: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [eomsg_bin, *args], env={**env, **more}, capture_output=True, text=True,
            timeout=60, cwd=tmp_path / "cwd",
        )  # fmt: skip
        assert done.returncode == code, (args, done.stdout, done.stderr)
        return done

    return run


def owner_file(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return path


def test_a_context_reaches_its_node_without_options(
    ctx: Callable[..., subprocess.CompletedProcess[str]],
    serve: Callable[..., NodeProcess],
    tmp_path: Path,
    data_dir: Path,
) -> None:
    node = serve("--node-name", "prod")
    token = owner_file(tmp_path / "prod.token", node.token)
    done = ctx("context", "add", "prod", "--broker", node.tcp, "--token-file", str(token))
    assert done.stdout == "added context prod\n"
    ctx("ping", code=9)  # none in use yet: the (missing) data directory's node
    assert ctx("--context", "prod", "ping").stdout.startswith("pong from prod at tcp://")
    assert ctx("ping", EOMSG_CONTEXT="prod").stdout.startswith("pong from prod")
    assert ctx("context", "use", "prod").stdout == "using context prod\n"
    ctx("queue", "create", "q", "--subscribe", "q/>")
    assert ctx("publish", "q/a", "hi").stdout == "published seq 1\n"
    assert json.loads(ctx("inspect", "queues", "--json").stdout)[0]["depth"] == 1
    listed = json.loads(ctx("context", "list", "--json").stdout)
    assert listed == [
        {"name": "prod", "current": True, "broker": node.tcp, "token_file": str(token),
         "tls_ca": None, "via": None},
    ]  # fmt: skip
    # What the command line says wins over the context.
    wrong = ctx("--token", "not-it", "ping", code=10)
    assert wrong.stderr.startswith("Error: ")
    # The file and its directory are the user's alone; the token is not in the file.
    config = tmp_path / "config" / "eomsg"
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    assert stat.S_IMODE((config / "contexts.json").stat().st_mode) == 0o600
    assert node.token not in (config / "contexts.json").read_text()
    # A directory named on the command line or in the environment is that directory's
    # node, not the current context's.
    through = ctx("--data", str(data_dir), "ping").stdout  # the directory's socket
    assert through.startswith(f"pong from prod at unix://{data_dir}/eomsg.sock")
    assert ctx("ping").stdout.startswith("pong from prod at tcp://")  # the context's
    assert ctx("ping", EOMSG_DATA=str(tmp_path / "elsewhere"), code=9).stderr.startswith(
        f"Error: no node serves {tmp_path / 'elsewhere'}"
    )
    assert ctx("context", "use", "--none").stdout == "using no context\n"
    ctx("ping", code=9)
    assert ctx("context", "remove", "prod").stdout == "removed context prod\n"
    assert json.loads(ctx("context", "list", "--json").stdout) == []


def test_what_a_context_cannot_be_is_refused_in_one_line(
    ctx: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    token = owner_file(tmp_path / "t.token", "secret")
    assert ctx("--context", "nope", "ping", code=4).stderr == (
        "Error: no context 'nope' (see `eomsg context list`)\n"
    )
    ctx("context", "use", "nope", code=4)
    done = ctx("context", "add", "x", "--broker", "127.0.0.1:7420", code=3)
    assert done.stderr.startswith("Error: address '127.0.0.1:7420' must start with")
    ctx("context", "add", "bad name", "--broker", "tcp://127.0.0.1:1", code=3)
    token.chmod(0o644)
    done = ctx("context", "add", "x", "--broker", "tcp://127.0.0.1:1", "--token-file", str(token),
               code=3)  # fmt: skip
    assert "is open to other users" in done.stderr
    token.chmod(0o600)
    ctx("context", "add", "x", "--broker", "tcp://127.0.0.1:1", "--token-file", str(token), "--use")
    token.chmod(0o640)  # opened up later: refused when used, not sent
    assert "is open to other users" in ctx("ping", code=3).stderr
    token.chmod(0o600)
    contexts = tmp_path / "config" / "eomsg" / "contexts.json"
    contexts.chmod(0o644)
    assert "the contexts file" in ctx("context", "list", code=3).stderr
    contexts.chmod(0o600)
    for damaged in (
        "{not json",
        '{"current": ["x"], "contexts": {}}',
        '{"current": "x", "contexts": {"x": {"broker": 5}}}',
        '{"current": null, "contexts": {"x": {"broker": "tcp://h:1", "via": 9}}}',
        '{"current": "y", "contexts": {}}',
        "[" * 100_000,
    ):
        contexts.write_text(damaged)
        for args in (("context", "list"), ("ping",)):
            assert ctx(*args, code=3).stderr.startswith(
                f"Error: the contexts file {contexts} is not one eomsg wrote"
            ), damaged[:40]
    ctx("context", "use", code=2)  # a name or --none
