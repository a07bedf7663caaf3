"""``eomsg consume --follow`` rides out its node's restarts, and ``--timeout`` stops a
waiting consumer after a quiet spell (issue 36, item 5): real ``eomsg`` processes, a real
node killed with SIGKILL mid-stream."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

import eomsg
from tests.conftest import Cli, NodeProcess, eventually, queue_depth

pytestmark = pytest.mark.slow


def _publish(data_dir: Path, first: int, count: int) -> None:
    with eomsg.connect(data_dir) as client:
        client.publish_batch(
            [eomsg.Outgoing("q/x", b"m%d" % i, id=f"m{i}") for i in range(first, first + count)]
        )


def test_follow_survives_two_node_kills_with_every_message_handled_once(
    cli: Cli,
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    cli_env: dict[str, str],
    data_dir: Path,
    tmp_path: Path,
) -> None:
    """Into a DuckDB table (a handler that keeps exactly once): 3 times 400 messages, the node
    SIGKILLed twice while the consumer is between batches or inside one. After each kill
    the consumer says it lost the node, connects again once it is back, and carries on;
    what it held comes again after the ack timeout and is not inserted twice."""
    cli("queue", "create", "q", "--subscribe", "q/>", "--ack-timeout", "1s")
    app = tmp_path / "app.duckdb"
    node = serve()
    follower = subprocess.Popen(
        [eomsg_bin, "consume", "q", "--follow", "--batch", "10",
         "--into", f"duckdb:{app}:copied"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for round_ in range(3):
            _publish(data_dir, round_ * 400, 400)
            if round_ == 2:
                break
            # killed mid-stream: after measured progress, never after a guessed time
            assert eventually(lambda: queue_depth(data_dir, "q") < 300, 120)
            assert node.proc is not None
            node.proc.kill()
            node.proc.wait(30)
            assert follower.poll() is None  # it waits for the node to come back
            node = serve()
        assert eventually(lambda: queue_depth(data_dir, "q") == 0, 120)
        follower.send_signal(signal.SIGTERM)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 143, err
    assert err.count("warning: lost the node (") == 2, err
    assert err.count(f"connected again to the node at unix://{data_dir}/eomsg.sock") == 2, err
    with duckdb.connect(str(app)) as db:
        ids = [r[0] for r in db.execute("SELECT id FROM copied").fetchall()]
    assert sorted(ids) == sorted(f"m{i}" for i in range(1200))  # each once
    (stats,) = json.loads(cli("inspect", "queues", "--json").stdout)
    assert (stats["depth"], stats["deleted"]) == (0, 1200)


def test_a_follower_whose_node_never_answered_fails_at_once(cli: Cli, data_dir: Path) -> None:
    cli("--init", "queue", "create", "q", "--subscribe", "q/>")
    done = cli("--broker", "tcp://127.0.0.1:9", "--token", "x", "consume", "q", "--follow", code=9)
    assert done.stderr.startswith(b"Error: ")


def test_timeout_stops_a_waiting_consumer_after_a_quiet_spell(
    cli: Cli, serve: Callable[..., NodeProcess], data_dir: Path
) -> None:
    cli("queue", "create", "q", "--subscribe", "q/>")
    cli("consume", "q", "--timeout", "1", code=2)  # waiting needs a running node
    serve()
    _publish(data_dir, 0, 3)
    started = time.monotonic()
    done = cli("consume", "q", "--timeout", "1", "--json")
    assert [json.loads(x)["payload"] for x in done.stdout.splitlines()] == ["m0", "m1", "m2"]
    assert time.monotonic() - started >= 1  # it waited for more before it stopped
    assert cli("consume", "q", "--timeout", "0.2").stdout == b""


def test_timeout_also_bounds_the_wait_for_a_node_that_went_away(
    cli: Cli, serve: Callable[..., NodeProcess], eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    cli("queue", "create", "q", "--subscribe", "q/>")
    node = serve()
    waiting = subprocess.Popen(
        [eomsg_bin, "consume", "q", "--timeout", "2"], env=cli_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert eventually(
            lambda: json.loads(cli("inspect", "queues", "--json").stdout)[0]["flows"] == 1
        )
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait(30)
        _, err = waiting.communicate(timeout=60)  # not for ever: the node stays away
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 9, err
    assert err.startswith("warning: lost the node (") and err.count("Error: ") == 1
