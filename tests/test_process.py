"""Real ``eomsg`` processes: exit codes, a held data directory, and crashes by SIGKILL."""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from eomsg.errors import ExitCode
from eomsg.node.node import Node, NodeSettings
from tests.conftest import Cli, NodeProcess, messages


def eomsg(
    bin: str,
    env: dict[str, str],
    *args: str,
    input: bytes | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [bin, *args],
        input=input,
        capture_output=True,
        timeout=120,
        env={**env, **(extra_env or {})},
        check=False,
    )


# Publish each stdin line with the id m<line number>, printing one JSON ack per message.
PUBLISH_WITH_IDS = ("publish", "orders/x", "--stdin", "--id-prefix", "m", "--json")


def log_ids(data_dir: Path) -> list[str]:
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        return [m.id or "" for m in node.inspection.log(limit=1_000_000)]


def test_cli_subprocess_walkthrough(eomsg_bin: str, cli_env: dict[str, str]) -> None:
    r = eomsg(eomsg_bin, cli_env, "queue", "create", "orders", "--subscribe", "orders/>")
    assert (r.returncode, r.stdout) == (0, b"created queue orders\n")
    r = eomsg(
        eomsg_bin,
        cli_env,
        "publish",
        "orders/us/new",
        "--stdin",
        "--json",
        input=b"".join(b"%d\n" % i for i in range(1, 1001)),
    )
    acks = [json.loads(line) for line in r.stdout.splitlines()]
    assert [a["seq"] for a in acks] == list(range(1, 1001))
    r = eomsg(eomsg_bin, cli_env, "consume", "orders", "--json")
    assert [m["payload"] for m in messages(r.stdout)] == [str(i) for i in range(1, 1001)]
    r = eomsg(eomsg_bin, cli_env, "consume", "orders", "--json")
    assert (r.returncode, messages(r.stdout)) == (0, [])
    r = eomsg(eomsg_bin, cli_env, "publish", "bad topic", "x")
    assert r.returncode == ExitCode.INVALID_INPUT and r.stderr.startswith(b"Error: topic")
    r = eomsg(eomsg_bin, cli_env, "--version")
    assert r.stdout.startswith(b"eomsg ")


def test_held_data_dir_is_a_clear_error(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    with Node.open(data_dir, NodeSettings(tick=None)):
        r = eomsg(eomsg_bin, cli_env, "publish", "t", "x")
    assert r.returncode == ExitCode.DATA_DIR
    assert r.stderr.decode().startswith(f"Error: data directory {data_dir} is in use by pid ")
    assert r.stderr.count(b"\n") == 1


def test_consume_stops_quietly_when_the_reader_goes(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    eomsg(eomsg_bin, cli_env, "queue", "create", "q", "-s", "t")
    eomsg(eomsg_bin, cli_env, "publish", "t", "--stdin", input=b"x\n" * 20000)
    consumer = subprocess.Popen(
        [eomsg_bin, "consume", "q", "--batch", "5000"],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert consumer.stdout is not None
    consumer.stdout.read(10)
    consumer.stdout.close()  # like `| head`: the rest of the batch is never read
    consumer.wait(timeout=60)
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        stats = node.inspection.stats()[0]
    assert stats.depth > 0 and stats.in_flight == 0  # the unread batch was given back


def publish_and_kill(
    bin: str, env: dict[str, str], lines: list[bytes], kill_after: int, rng: random.Random
) -> set[str]:
    """Feed lines to a publishing process, SIGKILL it once ``kill_after`` acks arrived,
    and return the ids it acknowledged. Asserts that the kill landed mid-publish: the
    process was still running and had not acknowledged every line. (That is certain,
    not lucky, while ``kill_after`` plus what the pipe and the publisher's own buffers
    hold — under 96 KiB, some 1,700 ack lines — is less than ``len(lines)``: a
    publisher whose acks are not read stops.)"""
    proc = subprocess.Popen(
        [
            bin,
            "publish",
            "orders/x",
            "--stdin",
            "--id-prefix",
            "m",
            "--json",
            "--batch",
            str(rng.choice([1, 7, 50])),
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    acked: set[str] = set()
    try:
        proc.stdin.write(b"".join(lines))
        proc.stdin.flush()
    except BrokenPipeError:
        pass
    while len(acked) < kill_after:
        line = proc.stdout.readline()
        assert line, "the publisher ended before the kill"
        acked.add(json.loads(line)["id"])
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed, not finished
    for line in proc.stdout.read().splitlines():  # acks already written before the kill
        acked.add(json.loads(line)["id"])
    assert kill_after <= len(acked) < len(lines), "the kill did not land mid-publish"
    return acked


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_while_publishing_loses_and_duplicates_nothing(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path, seed: int
) -> None:
    rng = random.Random(seed)
    eomsg(eomsg_bin, cli_env, "queue", "create", "orders", "-s", "orders/>")
    n = 3000
    lines = [b"payload-%d\n" % i for i in range(1, n + 1)]
    acked = publish_and_kill(eomsg_bin, cli_env, lines, rng.randrange(50, 1200), rng)
    stored = log_ids(data_dir)
    assert len(stored) == len(set(stored)), "a message was stored twice"
    assert acked <= set(stored), "an acknowledged message was lost"
    # The producer retries everything: ids make the retry exactly-once.
    r = eomsg(
        eomsg_bin,
        cli_env,
        *PUBLISH_WITH_IDS,
        input=b"".join(lines),
    )
    again = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(again) == n
    assert {a["id"] for a in again if a["duplicate"]} == set(stored)  # acked ones included
    r = eomsg(eomsg_bin, cli_env, "consume", "orders", "--json")
    got = messages(r.stdout)
    assert sorted(m["id"] for m in got) == sorted(f"m{i}" for i in range(1, n + 1))
    assert all(m["payload"] == f"payload-{m['id'][1:]}" for m in got)


def test_crash_between_commit_and_ack(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    eomsg(eomsg_bin, cli_env, "queue", "create", "orders", "-s", "orders/>")
    lines = b"".join(b"%d\n" % i for i in range(1, 31))
    r = eomsg(
        eomsg_bin,
        cli_env,
        *PUBLISH_WITH_IDS,
        "--batch",
        "10",
        input=lines,
        extra_env={"EOMSG_FAILPOINTS": "publish.after_commit=crash@2"},
    )
    assert r.returncode == -signal.SIGKILL
    acked = {json.loads(x)["id"] for x in r.stdout.splitlines()}
    assert acked <= {f"m{i}" for i in range(1, 11)}  # the second batch was never acked
    assert sorted(log_ids(data_dir)) == sorted(f"m{i}" for i in range(1, 21))
    r = eomsg(
        eomsg_bin,
        cli_env,
        *PUBLISH_WITH_IDS,
        input=lines,
    )
    dup = [json.loads(x)["duplicate"] for x in r.stdout.splitlines()]
    assert dup == [True] * 20 + [False] * 10
    assert sorted(log_ids(data_dir)) == sorted(f"m{i}" for i in range(1, 31))


def test_crash_before_delete_redelivers(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    eomsg(eomsg_bin, cli_env, "queue", "create", "q", "-s", "t", "--ack-timeout", "1s")
    eomsg(eomsg_bin, cli_env, "publish", "t", "--stdin", input=b"a\nb\n")
    r = eomsg(
        eomsg_bin,
        cli_env,
        "consume",
        "q",
        "--json",
        extra_env={"EOMSG_FAILPOINTS": "delete.before_commit=crash"},
    )
    assert r.returncode == -signal.SIGKILL and len(messages(r.stdout)) == 2
    # The node died with its consumer: the next one to open it gets them again at once.
    r = eomsg(eomsg_bin, cli_env, "consume", "q", "--json")
    assert [(m["payload"], m["attempt"]) for m in messages(r.stdout)] == [
        ("a", 2),
        ("b", 2),
    ]


@pytest.mark.slow
def test_sigkill_loop_many_rounds(eomsg_bin: str, cli_env: dict[str, str], data_dir: Path) -> None:
    """Kill the publisher again and again over one growing log; every ack survives."""
    rng = random.Random(7)
    eomsg(eomsg_bin, cli_env, "queue", "create", "orders", "-s", "orders/>")
    lines = [b"p%d\n" % i for i in range(1, 4001)]
    acked: set[str] = set()
    for _ in range(8):
        acked |= publish_and_kill(eomsg_bin, cli_env, lines, rng.randrange(1, 2000), rng)
        stored = log_ids(data_dir)
        assert len(stored) == len(set(stored)), "a message was stored twice"
        assert acked <= set(stored), "an acknowledged message was lost"
    r = eomsg(eomsg_bin, cli_env, *PUBLISH_WITH_IDS, input=b"".join(lines))  # retry it all
    assert r.returncode == 0
    assert sorted(log_ids(data_dir)) == sorted(f"m{i}" for i in range(1, 4001))


def test_crash_during_garbage_collection_keeps_a_consistent_store(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    eomsg(eomsg_bin, cli_env, "queue", "create", "q", "-s", "t")
    eomsg(eomsg_bin, cli_env, "config", "set", "retention", "0")
    eomsg(eomsg_bin, cli_env, "config", "set", "gc-interval", "0")  # collect at every close
    eomsg(eomsg_bin, cli_env, "publish", "t", "--stdin", "--id-prefix", "m", input=b"a\nb\nc\n")
    # consume reserves epochs (job 1) and deletes; closing runs garbage collection (job 2),
    # killed before it commits.
    r = eomsg(
        eomsg_bin,
        cli_env,
        "consume",
        "q",
        "--max",
        "2",
        extra_env={"EOMSG_FAILPOINTS": "store.job.before_commit=crash@2"},
    )
    assert r.returncode == -signal.SIGKILL and r.stdout == b"1 t a\n2 t b\n"
    assert log_ids(data_dir) == ["m1", "m2", "m3"]  # the collection rolled back whole
    r = eomsg(eomsg_bin, cli_env, "consume", "q", "--json")
    assert [m["id"] for m in messages(r.stdout)] == ["m3"]  # 1, 2 deleted
    stats = json.loads(eomsg(eomsg_bin, cli_env, "inspect", "queues", "--json").stdout)[0]
    assert (stats["depth"], stats["deleted"]) == (0, 3)


@pytest.mark.skipif(
    importlib.util.find_spec("pandas") is None, reason="no pandas installed: none to keep out"
)
def test_the_daemon_converts_to_arrow_without_importing_pandas(
    cli: Cli, serve: Callable[..., NodeProcess]
) -> None:
    """pyarrow's first conversion would import pandas, when installed, to ask whether a
    list is a pandas object (0.6 s on the GIL): the daemon applies batches of publishes
    (their rows converted to Arrow: without the daemon's guard this finds pandas mapped)
    without it, on a new store and again after a restart."""
    for started in (1, 2):
        node = serve()
        lines = b"".join(b"%d\n" % i for i in range(2000))
        cli("publish", "t/x", "--stdin", "--id-prefix", f"r{started}-", input=lines)
        counted = cli("inspect", "sql", "SELECT count(*) AS n FROM messages", "--json").stdout
        assert json.loads(counted) == [{"n": 2000 * started}]  # applied: in DuckDB
        assert node.proc is not None
        maps = Path(f"/proc/{node.proc.pid}/maps").read_text()
        assert "/pyarrow/" in maps and "/pandas/" not in maps
        assert node.stop()[0] == 0
