"""Linked nodes, in process (node/links.py): interest reaches the nodes that route to it,
a message published anywhere lands once in each subscribed queue of every node, in
per-origin order, whatever the links do to the frames — drops, repeats, reorders, cuts
— and across restarts of any node. The frames travel through a test network here; the
server carries them over TCP in tests/test_network.py."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from eomsg.core.message import Carried
from eomsg.core.queues import QueueConfig
from eomsg.errors import InvalidConfig, LinkNotFound
from eomsg.node.node import Node, NodeSettings

T = TypeVar("T")


@dataclass
class Wire:
    """One direction of a connection: frames in flight, and the faults applied to them."""

    frames: list[tuple[int, tuple[Carried, ...]]] = field(default_factory=list)
    acks: list[tuple[int, bool]] = field(default_factory=list)


class Net:
    """Nodes opened on ``tmp``, linked as told; :meth:`run` carries routes, frames and
    acknowledgements until all is quiet, with faults drawn from ``rng``."""

    def __init__(self, tmp: Path, names: str, rng: random.Random, faults: float = 0.0) -> None:
        self.tmp, self.rng, self.faults = tmp, rng, faults
        self.nodes: dict[str, Node] = {n: self._open(n) for n in names}
        self.links: set[tuple[str, str]] = set()  # (a, b) with a < b
        self.up: set[tuple[str, str]] = set()
        self.wires: dict[tuple[str, str], Wire] = {}

    def _open(self, name: str) -> Node:
        return Node.open(self.tmp / name, NodeSettings(tick=None, node_name=name))

    def link(self, a: str, b: str) -> None:
        self.nodes[a].add_link(b, None, None)
        self.nodes[b].add_link(a, None, None)
        self.links.add((min(a, b), max(a, b)))
        self.connect(a, b)

    def connect(self, a: str, b: str) -> None:
        na, nb = self.nodes[a], self.nodes[b]
        read_by_b = nb.link_hello(a, na.incarnation)
        read_by_a = na.link_hello(b, nb.incarnation)
        for x, y, read in ((a, b, read_by_b), (b, a, read_by_a)):
            self.wires[(x, y)] = Wire()
            update = self.nodes[x].link_connected(y, read, lambda: None)  # a connection
            self.nodes[y].link_heard(x, update.full, update.moves)
        self.up.add((min(a, b), max(a, b)))

    def cut(self, a: str, b: str) -> None:
        key = (min(a, b), max(a, b))
        if key not in self.up:
            return
        self.up.discard(key)
        for x, y in ((a, b), (b, a)):
            self.wires.pop((x, y), None)
            wake = self.nodes[x]._links[y].wake
            assert wake is not None
            self.nodes[x].link_disconnected(y, wake)

    def restart(self, name: str) -> None:
        for a, b in list(self.up):
            if name in (a, b):
                self.cut(a, b)
        self.nodes[name].close()
        self.nodes[name] = self._open(name)

    def heal(self) -> None:
        for a, b in sorted(self.links - self.up):
            self.connect(a, b)

    def _faulty(self, items: list[T]) -> list[T]:
        out: list[T] = []
        for item in items:
            r = self.rng.random()
            if r < self.faults:
                continue  # dropped
            out.append(item)
            if r < 2 * self.faults:
                out.append(item)  # repeated
        if self.rng.random() < self.faults and len(out) > 1:
            i = self.rng.randrange(len(out) - 1)
            out[i], out[i + 1] = out[i + 1], out[i]  # reordered
        return out

    def step(self) -> bool:
        """One round on every connection; whether anything moved."""
        moved = False
        for (x, y), wire in list(self.wires.items()):
            nx, ny = self.nodes[x], self.nodes[y]
            for u in nx.link_updates(y):
                ny.link_heard(x, u.full, u.moves)
                moved = True
            wire.frames.extend((prev, tuple(m)) for prev, m in nx.link_frames(y))
            frames, wire.frames = self._faulty(wire.frames), []
            for prev, messages in frames:
                wire.acks.append(ny.accept_transfer(x, prev, messages).result())
                moved = True
            acks, wire.acks = self._faulty(wire.acks), []
            for read, gap in acks:
                nx.link_taken(y, read, gap)
        return moved

    def run(self) -> None:
        """Until nothing is owed anywhere: quiet rounds fire the resend timers."""
        for _ in range(5000):
            if not self.step():
                owed = any(i.pending for n in self.nodes.values() for i in n.link_info())
                if not owed and not any(w.frames or w.acks for w in self.wires.values()):
                    return
                for x, y in list(self.wires):
                    link = self.nodes[x]._links[y]
                    link.outbox.sender.tick(float("inf"))  # the timer ran out
        raise AssertionError("the network never went quiet")

    def drain(self, node: str, queue: str) -> list[tuple[str, str]]:
        """Every message in ``queue`` as (origin, payload), deleted."""
        out: list[tuple[str, str]] = []
        n = self.nodes[node]
        while batch := n.fetch(queue, 1000):
            out.extend(
                (m.message.headers.get("eomsg-origin", node), m.message.payload.decode())
                for m in batch
            )
            n.delete(queue, [m.key for m in batch])
        return out

    def close(self) -> None:
        for n in self.nodes.values():
            n.close()


MakeNet = Callable[..., Net]


@pytest.fixture
def net(tmp_path: Path) -> Iterator[MakeNet]:
    nets: list[Net] = []

    def make(names: str, seed: int = 0, faults: float = 0.0) -> Net:
        nets.append(Net(tmp_path, names, random.Random(seed), faults))
        return nets[-1]

    yield make
    for n in nets:
        n.close()


def test_a_chain_carries_a_message_to_the_interested_node_once(net: MakeNet) -> None:
    n = net("abc")
    n.link("a", "b")
    n.link("b", "c")
    n.nodes["c"].create_queue(QueueConfig("audit", subscriptions=("orders/>",)))
    n.run()
    assert n.nodes["a"].link_info()[0].reaches == ("b", "c")
    result = n.nodes["a"].publish("orders/eu/new", b"1")
    assert result.queues == 1  # the link toward c
    n.run()
    assert n.drain("c", "audit") == [("a", "1")]
    assert [i.pending for i in n.nodes["a"].link_info()] == [0]
    assert n.nodes["b"].queue_names() == []  # b only forwarded


@pytest.mark.parametrize("seed", range(4))
def test_every_message_lands_once_in_order_through_faults_cuts_and_restarts(
    net: MakeNet, seed: int
) -> None:
    rng = random.Random(seed)
    n = net("abcd", seed=seed, faults=0.1)
    for a, b in (("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")):  # a ring
        n.link(a, b)
    for node in "bcd":
        n.nodes[node].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    sent: dict[str, list[str]] = {name: [] for name in n.nodes}
    for i in range(300):
        origin = rng.choice("abcd")
        payload = f"{origin}-{i}"
        n.nodes[origin].publish(f"t/{origin}", payload.encode())
        sent[origin].append(payload)
        n.step()
        r = rng.random()
        if r < 0.03:
            a, b = rng.choice(sorted(n.links))
            n.cut(a, b)
        elif r < 0.06:
            n.heal()
        elif r < 0.08:
            n.restart(rng.choice("abcd"))
    n.heal()
    n.run()
    for node in "bcd":
        got = n.drain(node, "q")
        for origin, payloads in sent.items():
            mine = [p for o, p in got if o == origin]
            assert mine == payloads, (node, origin)  # each once, in the order published
        assert len(got) == sum(map(len, sent.values()))


def test_a_queue_deleted_withdraws_its_interest(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    assert n.nodes["a"].publish("t/1", b"x").queues == 1
    n.run()
    n.nodes["b"].purge("q")
    n.nodes["b"].delete_queue("q")
    n.run()
    assert n.nodes["a"].publish("t/2", b"y").queues == 0


def test_publish_ids_dedup_across_the_network(net: MakeNet) -> None:
    n = net("abc")
    n.link("a", "b")
    n.link("b", "c")
    n.nodes["c"].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    n.nodes["a"].publish("t/x", b"once", id="order-1")
    n.nodes["b"].publish("t/x", b"once", id="order-1")  # a retry sent to another node
    n.run()
    assert [p for _, p in n.drain("c", "q")] == ["once"]


def test_links_are_checked(net: MakeNet) -> None:
    n = net("a")
    a = n.nodes["a"]
    with pytest.raises(InvalidConfig, match="own name"):
        a.add_link("a", None, None)
    with pytest.raises(InvalidConfig, match="node name 'x y'"):
        a.add_link("x y", None, None)
    with pytest.raises(InvalidConfig, match="needs a token"):
        a.add_link("b", "tcp://127.0.0.1:1", None)
    with pytest.raises(InvalidConfig, match="needs a tls:// address"):
        a.add_link("b", "tcp://127.0.0.1:1", "t", "-----BEGIN CERTIFICATE-----")
    with pytest.raises(InvalidConfig, match="for the side that dials"):
        a.add_link("b", None, "t", "-----BEGIN CERTIFICATE-----")
    assert a.add_link("b", "tcp://127.0.0.1:1", "t")
    assert not a.add_link("b", "tcp://127.0.0.1:1", "t")
    with pytest.raises(InvalidConfig, match="other settings"):
        a.add_link("b", "tcp://127.0.0.1:2", "t")
    with pytest.raises(InvalidConfig, match="other settings"):
        a.add_link("b", "tcp://127.0.0.1:1", "u")
    with pytest.raises(LinkNotFound, match="no link to 'c'"):
        a.remove_link("c")
    assert a.remove_link("b") == 0
    assert a.link_info() == []


def test_a_receiver_that_lost_its_state_gets_what_follows(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    n.nodes["a"].publish("t/1", b"1")
    n.run()
    n.cut("a", "b")
    n.nodes["b"].remove_link("a")  # b forgets how far it had taken a's messages
    n.nodes["b"].add_link("a", None, None)
    n.connect("a", "b")
    n.run()
    n.nodes["a"].publish("t/2", b"2")
    n.run()
    assert n.drain("b", "q") == [("a", "1"), ("a", "2")]


def test_a_message_the_receiver_cannot_take_is_refused_not_a_wedge(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.nodes["b"].configure("max-payload", "1KiB")
    n.run()
    n.nodes["a"].publish("t/big", b"x" * 4096)
    n.nodes["a"].publish("t/small", b"after")
    n.run()
    assert n.drain("b", "q") == [("a", "after")]
    (info,) = n.nodes["b"].link_info()
    assert info.refused == 1


def test_an_acknowledgement_of_what_was_never_sent_settles_nothing(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    for i in range(5):
        n.nodes["a"].publish("t/x", str(i).encode())  # owed, not sent yet
    n.nodes["a"].link_taken("b", 10**12, False)  # a lying (or confused) peer
    assert n.nodes["a"].link_info()[0].pending == 5
    n.run()
    assert [p for _, p in n.drain("b", "q")] == ["0", "1", "2", "3", "4"]


def test_a_message_for_a_node_out_of_reach_is_counted_not_a_wedge(net: MakeNet) -> None:
    n = net("ab")
    n.link("a", "b")
    n.nodes["b"].create_queue(QueueConfig("q", subscriptions=("t/>",)))
    n.run()
    nowhere = Carried(1, "t/x", b"p", None, None, {}, ("b", "zz"))
    assert n.nodes["b"].accept_transfer("a", 0, [nowhere]).result() == (1, False)
    (info,) = n.nodes["b"].link_info()
    assert info.unroutable == 1
    assert [p for _, p in n.drain("b", "q")] == ["p"]
