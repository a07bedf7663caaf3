"""Limits that agree (issue 35, item 4): a node's frame limit and its max-payload.

Each end says in its handshake the largest frame it takes, and no frame is sent over it:
every message a node holds is consumed and browsed through it whole, and a publish
within max-payload goes through it, however large. Settings that cannot work together
are refused when they are set, each naming the option to change. All through the doors
a user has — the CLI against a real ``eomsg serve`` — and nothing the node runs dies
unobserved on the way.
"""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from eomsg.errors import ExitCode
from eomsg.wire import events as ev
from eomsg.wire.protocol import Connection, Role
from tests.conftest import Cli, NodeProcess, RawClient

Serve = Callable[..., NodeProcess]
MB = 1000 * 1000


def payload_of(size: int) -> bytes:
    """``size`` random bytes without a newline (so ``consume --raw`` can print it)."""
    return os.urandom(size).replace(b"\n", b"\x00")


def consumed(cli: Cli, queue: str) -> tuple[int, bytes]:
    """The seq and payload ``eomsg consume QUEUE --json --max 1`` prints (and deletes)."""
    out = cli("consume", queue, "--json", "--max", "1").stdout
    assert out.count(b"\n") == 1, out[:200]
    line = json.loads(out)
    return line["seq"], base64.b64decode(line["payload_b64"])


def browsed(cli: Cli, queue: str) -> list[tuple[int, bytes]]:
    """The seqs and payloads ``eomsg browse QUEUE --json`` prints."""
    lines = cli("browse", queue, "--json").stdout.decode().splitlines()
    return [(m["seq"], base64.b64decode(m["payload_b64"])) for m in map(json.loads, lines)]


def unobserved(stderr: str) -> list[str]:
    """What a process's stderr says died unseen: asyncio's own complaints, tracebacks."""
    said = ("never retrieved", "Traceback", "Exception in callback", "was destroyed")
    return [line for line in stderr.splitlines() if any(s in line for s in said)]


def test_a_50mb_message_is_consumed_browsed_and_published_through_the_node(
    cli: Cli, serve: Serve
) -> None:
    """The issue's steps: max-payload raised, a 50 MB file published embedded, then the
    node serving it with frames that follow max-payload. It is browsed and consumed
    through the node byte for byte, and another published through it too (before: the
    consumer waited for ever, browse and publish failed with exit 1)."""
    big = payload_of(50 * MB)
    assert cli("config", "set", "max-payload", "64MiB").stdout == (
        b"max-payload = 64.0 MiB (67108864 bytes)\n"
    )
    cli("queue", "create", "bigq", "-s", "big")
    assert cli("publish", "big", "-", input=big).stdout == b"published seq 1\n"
    node = serve()
    assert browsed(cli, "bigq") == [(1, big)]
    assert consumed(cli, "bigq") == (1, big)
    assert cli("publish", "big", "-", input=big).stdout == b"published seq 2\n"
    assert browsed(cli, "bigq") == [(2, big)]
    assert cli("consume", "bigq", "--raw", "--max", "1").stdout == big + b"\n"
    assert cli("browse", "bigq", "--json").stdout == b""
    code, _, err = node.stop()
    assert code == 0 and unobserved(err) == []


def test_limits_that_cannot_work_together_are_refused_when_set(cli: Cli, serve: Serve) -> None:
    """A max-payload the node's --max-frame cannot carry is refused when it is set, and
    so is a --max-frame that cannot carry the saved max-payload: one line each, naming
    the option to change, and nothing changed."""
    node = serve("--max-frame", "8MiB")
    r = cli("config", "set", "max-payload", "64MiB", code=ExitCode.INVALID_INPUT)
    assert r.stderr == (
        b"Error: max-payload 64 MiB does not fit in frames of --max-frame 8 MiB (such a "
        b"payload needs frames of 65 MiB): give --max-frame 65MiB or more (or leave it out: "
        b"frames then follow max-payload), or set max-payload 7 MiB or less\n"
    )
    assert json.loads(cli("config", "show", "--json").stdout)["max-payload"] == 1 << 20
    assert cli("config", "set", "max-payload", "7MiB").stdout == (
        b"max-payload = 7.0 MiB (7340032 bytes)\n"
    )
    cli("queue", "create", "q", "-s", "t")
    largest = payload_of(7 << 20)
    assert cli("publish", "t", "-", input=largest).stdout == b"published seq 1\n"
    assert consumed(cli, "q") == (1, largest)
    code, _, err = node.stop()
    assert code == 0 and unobserved(err) == []

    assert cli("config", "set", "max-payload", "64MiB").stdout == (
        b"max-payload = 64.0 MiB (67108864 bytes)\n"
    )
    r = cli("serve", "--max-frame", "64MiB", code=ExitCode.INVALID_INPUT)
    assert r.stdout == b""
    assert r.stderr == (
        b"Error: max-payload 64 MiB does not fit in frames of --max-frame 64 MiB (such a "
        b"payload needs frames of 65 MiB): give --max-frame 65MiB or more (or leave it out: "
        b"frames then follow max-payload), or set max-payload 63 MiB or less\n"
    )
    r = cli("serve", "--max-frame", "2GiB", code=ExitCode.INVALID_INPUT)
    assert r.stderr == b"Error: size '2GiB' must be between 64 KiB and 1 GiB\n"
    assert json.loads(cli("config", "show", "--json").stdout)["max-payload"] == 64 << 20
    serve("--max-frame", "65MiB").stop()


def test_a_message_no_frame_of_the_client_carries_fails_its_request_not_the_node(
    cli: Cli, serve: Serve, data_dir: Path
) -> None:
    """A client whose hello says it takes small frames is never sent a larger one: a
    message that cannot fit fails that client's fetch, subscription or browse with an
    error naming both sizes (what it held goes back to the queue); the connection, the
    node and the message are fine, and the node's log has no task that died unseen."""
    cli("queue", "create", "q", "-s", "t")
    cli("publish", "t", "-", input=b"m" * 100_000)
    node = serve()
    raw = RawClient(data_dir)
    raw.send(ev.Hello(ev.PROTOCOL_VERSION, "small", max_frame=64 << 10))
    assert isinstance(raw.next(), ev.Welcome)
    raw.answer_pings()
    too_large = (
        "message 1 of queue 'q' cannot reach this client: Deliver frame of 100048 bytes "
        "exceeds the peer's frame limit of 65536 bytes (the limit its hello said)"
    )
    raw.send(ev.Fetch(1, "q", 10))
    assert raw.next() == ev.Error(1, "frame_too_large", too_large)
    raw.send(ev.Subscribe(2, "q", 10))
    assert isinstance(raw.next(), ev.Result)  # bound
    assert raw.next() == ev.Error(2, "frame_too_large", too_large)
    raw.send(ev.Call(3, "browse", {"name": "q"}))
    error = raw.next()
    assert isinstance(error, ev.Error) and error.code == "frame_too_large"
    assert error.message.startswith("an item of the answer to browse cannot reach this client")
    raw.send(ev.Call(4, "stats", {}))
    assert isinstance(raw.next(), ev.Result)  # the connection goes on
    raw.close()
    assert cli("consume", "q", "--raw", "--max", "1").stdout == b"m" * 100_000 + b"\n"
    code, _, err = node.stop()
    assert code == 0 and unobserved(err) == []


def test_deliveries_and_answers_come_in_frames_the_client_takes(
    cli: Cli, serve: Serve, data_dir: Path
) -> None:
    """A client that takes frames of 1 MiB is sent nothing larger (its connection would
    refuse it): 8 messages of 300 kB come as a fetch's Deliver frames and a browse's
    Result frames, each but the last saying there is more, and add up to all of them."""
    cli("queue", "create", "q", "-s", "t")
    payloads = [bytes([ord("a") + i]) * 300_000 for i in range(8)]
    cli("publish", "t", "--stdin", input=b"\n".join(payloads) + b"\n")
    node = serve()
    raw = RawClient(data_dir)
    raw.conn = Connection(Role.CLIENT, 1 << 20)
    raw.send(ev.Hello(ev.PROTOCOL_VERSION, "small", max_frame=1 << 20))
    assert isinstance(raw.next(), ev.Welcome)
    raw.answer_pings()
    raw.send(ev.Call(1, "browse", {"name": "q"}))
    answers = [raw.next()]
    while isinstance(answers[-1], ev.Result) and answers[-1].more:
        answers.append(raw.next())
    assert len(answers) >= 3 and all(isinstance(a, ev.Result) for a in answers)
    browsed = [m for a in answers for m in a.value]  # type: ignore[union-attr]
    assert [ev.message_from_wire(m).payload for m in browsed] == payloads
    raw.send(ev.Fetch(2, "q", 100))
    frames = [raw.next()]
    while isinstance(frames[-1], ev.Deliver) and frames[-1].more:
        frames.append(raw.next())
    assert len(frames) >= 3 and all(isinstance(f, ev.Deliver) for f in frames)
    fetched = [d.message.payload for f in frames for d in f.deliveries]  # type: ignore[union-attr]
    assert fetched == payloads
    raw.close()
    code, _, err = node.stop()
    assert code == 0 and unobserved(err) == []


@pytest.mark.slow
def test_a_200mb_message_goes_through_the_node_whole(
    cli: Cli, serve: Serve, data_dir: Path
) -> None:
    """The largest the issue asks for, limits raised to fit: published embedded and
    through the node, consumed and browsed through it byte for byte, with the node
    holding no more than a few copies of it at once."""
    big = payload_of(200 * MB)
    cli("config", "set", "max-payload", "256MiB")
    cli("queue", "create", "bigq", "-s", "big")
    assert cli("publish", "big", "-", input=big).stdout == b"published seq 1\n"
    node = serve()
    assert cli("consume", "bigq", "--raw", "--max", "1").stdout == big + b"\n"
    assert cli("publish", "big", "-", input=big).stdout == b"published seq 2\n"
    assert browsed(cli, "bigq") == [(2, big)]
    assert cli("consume", "bigq", "--raw", "--max", "1").stdout == big + b"\n"
    assert node.proc is not None
    peak = int(Path(f"/proc/{node.proc.pid}/status").read_text().split("VmHWM:")[1].split()[0])
    assert peak << 10 < 12 * len(big), f"the node peaked at {peak >> 10} MiB"
    code, _, err = node.stop(signal.SIGTERM, timeout=120)
    assert code == 0 and unobserved(err) == []
