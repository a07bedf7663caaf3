"""The broker as users run it: a real ``eomsg serve`` process, real clients, real sockets.

Concurrent producers and consumers, restarts (graceful and SIGKILL), and clients that
misbehave — each misbehaving one gets its error and the node keeps serving the others.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

import eomsg
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import AuthenticationFailed, Overloaded, QueueNotFound, Unavailable, UsageError
from eomsg.wire import events as ev
from tests.conftest import NodeProcess, RawClient, messages

Serve = Callable[..., NodeProcess]


def frame(body: object) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


def still_serves(data_dir: Path, queue: str = "q") -> None:
    with eomsg.connect(data_dir) as client:
        r = client.publish("t/still", b"alive")
        assert not r.duplicate
        assert any(s.name == queue for s in client.stats())


@pytest.fixture
def node(serve: Serve, data_dir: Path) -> NodeProcess:
    proc = serve()
    with eomsg.connect(data_dir) as client:
        client.create_queue(QueueConfig("q", ("t/>",)))
    return proc


def test_concurrent_producers_and_consumers_get_each_message_once(
    node: NodeProcess, data_dir: Path
) -> None:
    producers, per_producer, consumers = 4, 1500, 3
    acked: list[int] = []
    received: list[list[int]] = [[] for _ in range(consumers)]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(p: int) -> None:
        try:
            with eomsg.connect(data_dir) as client:
                futures = [
                    client.publish_async(f"t/{p}", f"{p}-{i}".encode(), id=f"{p}-{i}")
                    for i in range(per_producer)
                ]
                seqs = [f.result().seq for f in futures]
            with lock:
                acked.extend(seqs)
        except BaseException as e:
            errors.append(e)

    def consume(c: int) -> None:
        try:
            with (
                eomsg.connect(data_dir) as client,
                client.consumer("q", prefetch=64, idle_timeout=3) as consumer,
            ):
                for msg in consumer:
                    received[c].append(msg.seq)
                    msg.delete()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    threads += [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    everything = [s for r in received for s in r]
    assert len(acked) == producers * per_producer
    assert sorted(everything) == sorted(acked)  # every message, and each exactly once
    assert sum(1 for r in received if r) >= 2  # the work was shared
    with eomsg.connect(data_dir) as client:
        (stats,) = client.stats()
        assert (stats.depth, stats.in_flight, stats.deleted) == (0, 0, len(acked))


def test_graceful_restart_keeps_pending_messages_and_gives_back_held_ones(
    node: NodeProcess, serve: Serve, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as client:
        client.publish_batch([Outgoing("t/a", str(i).encode()) for i in range(100)])
        held = client.fetch("q", 5)
        code, out, err = node.stop()
        assert code == 0, err
        assert json.loads(out.splitlines()[-1])["event"] == "stopped"
        with pytest.raises(Unavailable):
            client.fetch("q", 1)
    assert not (data_dir / "eomsg.sock").exists()
    serve()
    with eomsg.connect(data_dir) as client:
        got = client.fetch("q", 1000)
        assert len(got) == 100  # held ones are back at once, not after the ack timeout
        attempts = {d.seq: d.attempt for d in got}
        assert all(attempts[d.seq] == 2 for d in held)
        assert sorted(int(d.message.payload) for d in got) == list(range(100))


def test_acked_publishes_survive_sigkill_of_the_node(
    node: NodeProcess, serve: Serve, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as client:
        futures = [client.publish_async("t/k", b"x", id=f"k{i}") for i in range(3000)]
        acked = {f.result().id for f in futures}
    node.kill()
    serve()
    with eomsg.connect(data_dir) as client:
        ids = {d.message.id for d in client.fetch("q", 10_000)}
        assert ids == acked


def test_a_consumer_that_goes_away_gives_its_messages_back_at_once(
    node: NodeProcess, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as client:
        client.publish_batch([Outgoing("t/a", b"m") for _ in range(5)])
    with eomsg.connect(data_dir) as first:
        taken = first.fetch("q", 5)
        assert len(taken) == 5
    with eomsg.connect(data_dir) as second:
        again = second.fetch("q", 5, wait=5)  # the ack timeout is 30 s
        assert sorted(d.seq for d in again) == sorted(d.seq for d in taken)
        assert {d.attempt for d in again} == {2}


def test_malformed_frame_cuts_off_that_client_only(node: NodeProcess, data_dir: Path) -> None:
    with eomsg.connect(data_dir) as good:
        raw = RawClient(data_dir)
        assert isinstance(raw.hello(), ev.Welcome)
        raw.sock.sendall(frame({"this": "is not an event"}))
        error = raw.next()
        assert isinstance(error, ev.Error) and error.code == "protocol" and error.rid == 0
        assert raw.next() is None  # and the node hung up
        raw.close()
        assert not good.publish("t/x", b"fine").duplicate
    for garbage in (
        b"\x00\x00\x00\x03\xc1\xc1\xc1",  # not msgpack
        b"\x00\x00\x00\x02\x91\x63",  # [99]: no such event
        frame([ev.Welcome.TYPE, 1, "me", 1, 1.0, 1]),  # a server's event
        frame([ev.Publish.TYPE, 1, [["t/x", "text, not bytes", None, None, None]]]),
        b"\xff\xff\xff\xff" + os.urandom(60),
    ):
        raw = RawClient(data_dir)
        raw.hello()
        raw.sock.sendall(garbage)
        events = []
        while (event := raw.next()) is not None:
            events.append(event)
        assert isinstance(events[-1], ev.Error) and events[-1].rid == 0, garbage
        raw.close()
    still_serves(data_dir)


def test_oversize_frame_is_refused_before_its_body(node: NodeProcess, data_dir: Path) -> None:
    raw = RawClient(data_dir)
    raw.hello()
    raw.sock.sendall(struct.pack(">I", 100 << 20) + b"\x00" * 1024)  # claims 100 MiB
    error = raw.next()
    assert isinstance(error, ev.Error) and error.code == "frame_too_large"
    assert "exceeds the limit of 4194304 bytes" in error.message
    assert raw.next() is None
    raw.close()
    still_serves(data_dir)


def test_tcp_needs_the_token(node: NodeProcess, data_dir: Path) -> None:
    for token in ("wrong", None):
        with pytest.raises(AuthenticationFailed, match="wrong or missing token"):
            eomsg.connect(node.tcp, token=token)
    with eomsg.connect(node.tcp, token=node.token) as client:
        assert client.queue_names() == ["q"]
    assert (data_dir / "eomsg.token").stat().st_mode & 0o777 == 0o600
    assert (data_dir / "eomsg.sock").stat().st_mode & 0o777 == 0o600
    still_serves(data_dir)


def test_a_silent_client_is_cut_off_after_the_handshake_timeout(
    serve: Serve, data_dir: Path
) -> None:
    serve("--handshake-timeout", "0.5")
    raw = RawClient(data_dir)
    started = time.monotonic()
    error = raw.next()
    assert isinstance(error, ev.Error) and "no handshake within 0.5 s" in error.message
    assert time.monotonic() - started < 5
    raw.close()
    with eomsg.connect(data_dir) as client:
        client.create_queue(QueueConfig("q"))
    still_serves(data_dir)


def test_connections_beyond_the_limit_are_refused(serve: Serve, data_dir: Path) -> None:
    serve("--max-connections", "2")
    with eomsg.connect(data_dir) as a, eomsg.connect(data_dir):
        with pytest.raises(Overloaded, match="connection limit"):
            eomsg.connect(data_dir)
        a.create_queue(QueueConfig("q"))
    still_serves(data_dir)


def test_errors_travel_typed_and_leave_the_connection_usable(
    node: NodeProcess, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as client:
        with pytest.raises(QueueNotFound, match="queue 'nope' does not exist"):
            client.fetch("nope", 1)
        with pytest.raises(QueueNotFound), client.consumer("nope"):
            pass
        with pytest.raises(eomsg.errors.InvalidTopic):
            client.publish("bad//topic", b"x")
        columns, rows = client.query("SELECT count(*) AS n FROM queues")
        assert columns == ["n"] and rows == [(1,)]
        with pytest.raises(eomsg.errors.InvalidQuery, match="read-only"):
            client.query("DELETE FROM messages")
        with pytest.raises(eomsg.errors.InvalidQuery):
            client.query("SELECT * FROM read_text('/etc/hostname')")
        assert not client.publish("t/ok", b"ok").duplicate


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), 1e308, -1.0])
def test_a_release_delay_out_of_range_is_refused_and_the_delivery_stays(
    node: NodeProcess, data_dir: Path, delay: float
) -> None:
    with eomsg.connect(data_dir) as client:
        client.publish("t/x", b"x")
        (d,) = client.fetch("q", 1)
        with pytest.raises(eomsg.errors.InvalidInput, match="release delay is 0 to"):
            client.release("q", [d.key], delay=delay)
        assert client.delete("q", [d.key]) == [True]  # still this client's, in flight


def test_a_delivery_named_twice_in_one_delete_is_deleted_once(
    node: NodeProcess, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as client:
        client.publish("t/x", b"x")
        (d,) = client.fetch("q", 1)
        assert client.delete("q", [d.key, d.key]) == [True, False]
        assert not client.publish("t/ok", b"ok").duplicate  # the connection still serves
        with client.consumer("q", prefetch=1, until_empty=True) as consumer:
            assert [m.payload for m in consumer] == [b"ok"]  # and its window refills


def test_second_serve_names_the_running_one(
    node: NodeProcess, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    result = subprocess.run(
        [eomsg_bin, "serve", "--data", str(data_dir)],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 6
    assert node.proc is not None and f"pid {node.proc.pid}" in result.stderr
    still_serves(data_dir)


def test_cli_commands_go_through_the_running_node(
    node: NodeProcess, eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    def run(*args: str, env: dict[str, str] = cli_env) -> str:
        result = subprocess.run(
            [eomsg_bin, *args], env=env, capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    # Embedded mode would fail: the node holds the data directory.
    assert json.loads(run("publish", "t/cli", "hello", "--json"))["queues"] == 1
    (stats,) = json.loads(run("inspect", "queues", "--json"))
    assert stats["depth"] == 1
    tcp_env = {**cli_env, "EOMSG_BROKER": node.tcp, "EOMSG_TOKEN": node.token}
    (line,) = messages(run("consume", "q", "--json", env=tcp_env))
    assert line["payload"] == "hello" and line["attempt"] == 1
    bad = subprocess.run(
        [eomsg_bin, "queue", "list"],
        env={**tcp_env, "EOMSG_TOKEN": "nope"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 10 and bad.stderr.startswith("Error: wrong or missing token")


def test_consume_follow_waits_for_new_messages(
    node: NodeProcess, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    follower = subprocess.Popen(
        [eomsg_bin, "consume", "q", "--follow", "--json"],
        env=cli_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None  # a shared queue: messages only, no activity
        with eomsg.connect(data_dir) as client:
            for i in range(3):  # each published once the one before was handled
                client.publish("t/f", f"m{i}".encode())
                assert json.loads(follower.stdout.readline())["payload"] == f"m{i}"
    finally:
        follower.terminate()
        follower.wait(10)
    with eomsg.connect(data_dir) as client:
        (stats,) = client.stats()
        assert stats.deleted == 3


def test_follow_without_a_node_says_so(eomsg_bin: str, cli_env: dict[str, str]) -> None:
    result = subprocess.run(
        [eomsg_bin, "consume", "q", "--follow"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--follow needs a running node" in result.stderr


def test_serve_refuses_a_public_address_without_allow_remote(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    result = subprocess.run(
        [eomsg_bin, "serve", "--listen", "tcp://0.0.0.0:0"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 3
    assert "not a loopback address; add --allow-remote" in result.stderr
    assert not data_dir.exists()  # refused before touching the data directory


def test_a_consumer_iterated_without_with_says_so_at_once(
    node: NodeProcess, data_dir: Path
) -> None:
    with (
        eomsg.connect(data_dir) as client,
        pytest.raises(UsageError, match="use it in a `with` block"),
    ):
        next(iter(client.consumer("q")))

    async def main() -> None:
        async with await eomsg.connect_async(data_dir) as aclient:
            with pytest.raises(UsageError, match="use it in a `with` block"):
                aiter = aclient.consumer("q").__aiter__()
                await aiter.__anext__()

    asyncio.run(main())


def test_asyncio_client(node: NodeProcess, data_dir: Path) -> None:
    async def main() -> list[bytes]:
        async with await eomsg.connect_async(data_dir) as client:
            futures = [await client.publish_async("t/aio", str(i).encode()) for i in range(50)]
            await asyncio.gather(*futures)
            got = []
            async with client.consumer("q", prefetch=8, idle_timeout=1) as consumer:
                async for msg in consumer:
                    got.append(msg.payload)
                    msg.delete()
            (stats,) = await client.stats()
            assert stats.deleted == 50
            return got

    assert asyncio.run(main()) == [str(i).encode() for i in range(50)]
