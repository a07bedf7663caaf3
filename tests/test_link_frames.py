"""One agreed frame limit on a link too (issue 35, item 4 where it meets links): each side
of a link holds the other to the largest frame its side of the handshake said; what a
link carries goes in as many frames as that needs; a message that fits no frame the peer
takes is refused and passed over on both nodes, never a link that reconnects for ever
behind it; and a max-payload changed while a node serves reaches its links at once.
Through real `eomsg serve` processes, but for the wire's rules."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

import eomsg
from eomsg.core.message import Batch, Carried
from eomsg.core.queues import QueueConfig
from eomsg.errors import FrameTooLarge, RemoteProtocolError
from eomsg.wire import link_events as lev
from eomsg.wire.protocol import Connection, Role, State
from tests.conftest import NodeProcess, eventually
from tests.linkcli import Nodes
from tests.linknet import MakeNet

MiB = 1 << 20


@pytest.fixture
def nodes(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Nodes]:
    made = Nodes(eomsg_bin, tmp_path, cli_env)
    yield made
    made.close()


# -- the wire ------------------------------------------------------------------------------


def test_each_side_of_a_link_holds_the_other_to_the_limit_it_said() -> None:
    """Before, the dialling side took frames as large as the larger of the two limits,
    and the dialled side held the dialler to its hello's limit only because the link's
    code copied it over by hand."""
    dialler, dialled = Connection(Role.CLIENT, 1 * MiB), Connection(Role.SERVER, 8 * MiB)
    hello = lev.LinkHello(lev.LINK_VERSION, "a", "i" * 16, "", 0, 1 * MiB, "n1")
    dialled.receive_data(dialler.send(hello))
    assert dialled.next_event() == hello
    welcome = lev.LinkWelcome(lev.LINK_VERSION, "b", "j" * 16, 0, 8 * MiB, 5.0, ("p",), "n2")
    dialler.receive_data(dialled.send(welcome))
    assert dialler.next_event() == welcome
    assert (dialler.max_frame, dialler.peer_max_frame) == (1 * MiB, 8 * MiB)
    assert (dialled.max_frame, dialled.peer_max_frame) == (8 * MiB, 1 * MiB)

    dialled.state = dialler.state = State.LINKED  # (the proof, left out here)
    big = lev.Transfer(0, _batch(1, b"x" * (2 * MiB)))
    with pytest.raises(FrameTooLarge, match="exceeds the peer's frame limit of 1048576 bytes"):
        dialled.send(big)
    passed = lev.Oversize(0, 1, 2 * MiB)  # what goes in its place
    dialler.receive_data(dialled.send(passed))
    assert dialler.next_event() == passed
    header = len(msgpack.packb(big.to_wire())).to_bytes(4, "big")
    dialler.receive_data(header)  # a peer that does not keep to it: refused by its length
    with pytest.raises(FrameTooLarge, match="exceeds the limit of 1048576 bytes"):
        dialler.next_event()


def test_a_link_handshake_saying_a_frame_limit_below_the_least_is_refused() -> None:
    dialled = Connection(Role.SERVER, 8 * MiB)
    tiny = [lev.LinkHello.TYPE, lev.LINK_VERSION, "a", "i" * 16, "", 0, 1000, "n1"]
    body = msgpack.packb(tiny)
    dialled.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(RemoteProtocolError, match="a frame limit of 1000 bytes is below"):
        dialled.next_event()


def test_a_transfer_bound_is_never_below_its_frame() -> None:
    """What a link splits its frames by is at least what the frame takes, however its
    text is made: so a frame packed within it fits the peer's limit."""
    text = "é€😀" * 60
    headers = {f"h{j}": text for j in range(20)}
    heavy = [
        Carried(2**40 + i, text, b"p" * 100, text, 1.5, headers, (text, "b"), text, text)
        for i in range(5)
    ]
    light = [Carried(i, "t", b"", None, None, {}, ("b",), "a", str(i)) for i in range(1, 300)]
    mixed = [*light[:3], heavy[0], Carried(9, "t", b"x", "id", None, {}, ("c",), "a", "9")]
    for messages in (heavy, light, mixed, light[:1]):
        batch = Batch.of(messages)
        packed = msgpack.packb(lev.Transfer(2**62, batch).to_wire(), use_bin_type=True)
        assert lev.transfer_bound(batch) >= len(packed)


def test_a_message_passed_over_takes_its_place_in_the_links_sequence(
    net: MakeNet, caplog: pytest.LogCaptureFixture
) -> None:
    """What b does with a's word that it passed over message 2 (as a's link connection
    says it): taken as refused — counted and logged once, however often it comes — and
    acknowledged in its place, so a settles it and what follows is taken."""
    n = net("ab")
    n.link("a", "b")
    a, b = n.nodes["a"], n.nodes["b"]
    b.admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    for payload in (b"one", b"two", b"three"):
        a.ingress.publish("t/x", payload)
    ((prev, batch),) = a.transfer.link_frames("b")
    one, two, three = batch.carried()

    assert b.intake.accept_transfer("a", prev, [one]).result() == (one.seq, False)
    gap = b.intake.accept_oversize("a", two.seq, three.seq, 50_000_000, 4 * MiB).result()
    assert gap == (one.seq, True)  # after 2, which did not come: say it again
    for _ in range(2):  # said again (the link went back): taken once
        taken = b.intake.accept_oversize("a", one.seq, two.seq, 50_000_000, 4 * MiB).result()
        assert taken == (two.seq, False)
    assert b.intake.accept_transfer("a", two.seq, [three]).result() == (three.seq, False)
    assert [p for _, p in n.drain("b", "q")] == ["one", "three"]
    (seen,) = b.links.link_info()
    assert (seen.refused, seen.received) == (1, 2)
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] == [
        f"link to a: message {two.seq} refused: its payload of 50000000 bytes fits no frame "
        "this node takes (at most 4194304 bytes; its max-payload is 1048576 bytes): a passed "
        "it over"
    ]

    a.transfer.link_taken("b", three.seq, False)
    a.transfer.link_passed_over("b", two.seq, 50_000_000, 4 * MiB)
    (seen,) = a.links.link_info()
    assert (seen.pending, seen.refused) == (0, 1)


def _batch(seq: int, payload: bytes) -> Batch:
    return Batch.of([Carried(seq, "t/x", payload, None, None, {}, ("b",), "a", str(seq))])


# -- real nodes ------------------------------------------------------------------------------


def _make(nodes: Nodes, name: str, max_payload: str | None) -> None:
    """Data directory ``name``, named so, with ``max_payload`` saved (None: the default)."""
    setting = ("config", "set", "max-payload", max_payload) if max_payload else ("config", "show")
    nodes.run("--init", "--node-name", name, *setting, "--data", nodes.dir(name))


def _link(nodes: Nodes, dialler: str, dialled: NodeProcess, dialled_name: str) -> None:
    """``dialler`` dials ``dialled_name`` with a token made for it; up both ways, each
    knowing the other's queues."""
    token = str(nodes.tmp / f"{dialler}.token")
    nodes.run("link", "add", dialler, "--token-file", token, "--data", nodes.dir(dialled_name))
    nodes.run("link", "add", dialled_name, dialled.tcp, "--token-file", token,
              "--data", nodes.dir(dialler))  # fmt: skip

    def up(name: str, peer: str) -> bool:
        return [(x["state"], x["reaches"]) for x in nodes.links(name)] == [("up", [peer])]

    assert eventually(lambda: up(dialler, dialled_name), 120)
    assert eventually(lambda: up(dialled_name, dialler), 120)


def _serve(nodes: Nodes, name: str) -> NodeProcess:
    """``eomsg serve`` on ``name``, saying each connection in its log (-v); a link is cut
    after 15 s of silence (not 3: a loaded machine moving megabytes is no cut link)."""
    return nodes.start(name, "--node-name", name, "-v", "--heartbeat", "5")


def _drain(data_dir: str, queue: str, want: int, timeout: float = 120) -> list[bytes]:
    """``want`` messages consumed from ``queue`` of the node serving ``data_dir``."""
    got: list[bytes] = []
    with eomsg.connect(Path(data_dir)) as client:

        def more() -> bool:
            batch = client.fetch(queue, 10)
            got.extend(m.message.payload for m in batch)
            if batch:
                client.delete(queue, [m.key for m in batch])
            return len(got) >= want

        assert eventually(more, timeout), f"{len(got)} of {want} arrived"
    return got


def _connections(log: str, peer: str) -> int:
    return len(re.findall(rf"INFO eomsg\.link: link to {peer}: connected$", log, re.M))


def _stop(proc: NodeProcess) -> str:
    code, _, log = proc.stop()
    assert code == 0, log
    return log


def _linked(nodes: Nodes, b_payload: str | None, dialler: str) -> tuple[NodeProcess, NodeProcess]:
    """a (max-payload 8MiB) and b (``b_payload``) served and linked, dialled by the
    sender (a) or the receiver (b), with b's queue audit taking orders/>."""
    _make(nodes, "a", "8MiB")
    _make(nodes, "b", b_payload)
    a, b = _serve(nodes, "a"), _serve(nodes, "b")
    nodes.run("queue", "create", "audit", "--subscribe", "orders/>", "--data", nodes.dir("b"))
    if dialler == "sender":
        _link(nodes, "a", b, "b")
    else:
        _link(nodes, "b", a, "a")
    return a, b


@pytest.mark.parametrize("dialler", ["sender", "receiver"])
def test_a_message_no_frame_of_the_peer_carries_is_refused_and_the_link_goes_on(
    nodes: Nodes, dialler: str
) -> None:
    """a (max-payload 8MiB) sends b (3MiB: frames of 4 MiB) two messages that fit b's
    frames one at a time, one that fits none, and one after it. Before, a aborted the
    connection on the third and sent it again on the next, for ever: the fourth never
    came, and neither node counted anything as refused."""
    a, b = _linked(nodes, "3MiB", dialler)
    fit = [os.urandom(3 * MiB), os.urandom(3 * MiB - 100)]
    with eomsg.connect(Path(nodes.dir("a"))) as client:
        for i, payload in enumerate(fit):
            client.publish(f"orders/fit/{i}", payload)
        client.publish("orders/big", os.urandom(5 * MiB))  # seq 3
        client.publish("orders/after", b"after the big one")

    assert _drain(nodes.dir("b"), "audit", 3) == [*fit, b"after the big one"]
    # a holds nothing for b: the one passed over was acknowledged in its place.
    assert eventually(lambda: nodes.links("a")[0]["pending"] == 0, 60)
    (seen_by_a,), (seen_by_b,) = nodes.links("a"), nodes.links("b")
    assert seen_by_a["refused"] == 1
    assert (seen_by_b["refused"], seen_by_b["received"]) == (1, 3)

    a_log, b_log = _stop(a), _stop(b)
    assert (
        "WARNING eomsg.link: link to b: message 3 refused: its payload of 5242880 bytes fits "
        "no frame b takes (at most 4194304 bytes): passed over\n"
    ) in a_log
    assert (
        "WARNING eomsg.link: link to a: message 3 refused: its payload of 5242880 bytes fits "
        "no frame this node takes (at most 4194304 bytes; its max-payload is 3145728 "
        "bytes): a passed it over\n"
    ) in b_log
    assert a_log.count("message 3 refused") == b_log.count("message 3 refused") == 1
    # One connection all along: never a link that reconnects behind a message.
    assert (_connections(a_log, "b"), _connections(b_log, "a")) == (1, 1), a_log


@pytest.mark.parametrize("dialler", ["sender", "receiver"])
def test_a_max_payload_raised_while_serving_reaches_the_links_at_once(
    nodes: Nodes, dialler: str
) -> None:
    """b serves with the default max-payload (frames of 4 MiB); raised to 8MiB, its links
    say so at once, and a 5 MB message a publishes just after is carried whole. Before,
    b's links kept its frame limit from when it started until it restarted, and a's
    message was stuck."""
    a, b = _linked(nodes, None, dialler)

    done = nodes.run("config", "set", "max-payload", "8MiB", "--data", nodes.dir("b"))
    assert done.stdout == "max-payload = 8.0 MiB (8388608 bytes)\n"
    big = os.urandom(5 * MiB)
    with eomsg.connect(Path(nodes.dir("a"))) as client:
        client.publish("orders/big", big)
        client.publish("orders/after", b"after")

    assert _drain(nodes.dir("b"), "audit", 2) == [big, b"after"]
    assert [x["refused"] for x in nodes.links("a") + nodes.links("b")] == [0, 0]
    a_log, b_log = _stop(a), _stop(b)
    assert (
        "INFO eomsg.link: link to a: this node takes frames of 9437184 bytes now, not 4194304: "
        "connecting again to say so\n"
    ) in b_log
    # The one new connection that says it, and no more.
    assert (_connections(a_log, "b"), _connections(b_log, "a")) == (2, 2), b_log


@pytest.mark.slow
def test_a_50_mb_message_crosses_a_link_whose_limits_agree_both_ways(nodes: Nodes) -> None:
    """The issue's step across a link: max-payload 64MiB on both nodes (b's set while it
    serves), a 50 MB message published on each for the other's queue, consumed there byte
    for byte."""
    _make(nodes, "a", "64MiB")
    _make(nodes, "b", None)
    a, b = _serve(nodes, "a"), _serve(nodes, "b")
    for name in "ab":
        nodes.run("queue", "create", f"for-{name}", "--subscribe", f"to/{name}/>",
                  "--data", nodes.dir(name))  # fmt: skip
    _link(nodes, "a", b, "b")
    nodes.run("config", "set", "max-payload", "64MiB", "--data", nodes.dir("b"))
    payload = {name: os.urandom(50_000_000) for name in "ab"}
    for sender, receiver in ("ab", "ba"):
        with eomsg.connect(Path(nodes.dir(sender))) as client:
            assert eventually(lambda: client.link_info()[0].connected, 60)
            client.publish(f"to/{receiver}/big", payload[sender])

    for sender, receiver in ("ab", "ba"):
        (got,) = _drain(nodes.dir(receiver), f"for-{receiver}", 1, 300)
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload[sender]).digest()
        assert got == payload[sender]
    assert [x["refused"] for x in nodes.links("a") + nodes.links("b")] == [0, 0]
    a_log, b_log = _stop(a), _stop(b)
    assert (_connections(a_log, "b"), _connections(b_log, "a")) == (2, 2), b_log
