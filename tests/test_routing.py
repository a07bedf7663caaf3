"""Routes across linked nodes (core/routing.py): in any topology, after any sequence of
links cut and restored and interest changed, every node reaches every other node of its
part of the network by a loop-free path, knows its current interest, and a message sent
anywhere reaches each node that wants it exactly once."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.core.routing import Route, Routes, Update, Withdraw
from eomsg.errors import InvalidInput, InvalidPattern

NAMES = "abcdef"
PATTERNS = ["orders/>", "orders/eu/*", "billing/>", "*/eu/new", "audit"]
TOPICS = ["orders/eu/new", "orders/us/new", "billing/invoice", "audit", "other"]


class Network:
    """Nodes joined by links that carry updates in order (as a connection does). A link
    is up, cut (what it carried is lost, and it carries nothing until it is back up) or
    removed."""

    def __init__(self, n: int) -> None:
        self.nodes = {name: Routes(name) for name in NAMES[:n]}
        self.links: set[frozenset[str]] = set()
        self.cut_links: set[frozenset[str]] = set()
        self.wire: dict[tuple[str, str], deque[Update]] = {}
        self.interest: dict[str, frozenset[str]] = {name: frozenset() for name in self.nodes}
        self.version = dict.fromkeys(self.nodes, 0)

    def send(self, sender: str, updates: list[Update]) -> None:
        for u in updates:
            if frozenset((sender, u.neighbour)) not in self.cut_links:
                self.wire.setdefault((sender, u.neighbour), deque()).append(u)

    def up(self, a: str, b: str) -> None:
        """Link a and b, or bring their cut link back: each sends its whole table."""
        link = frozenset((a, b))
        if a == b or (link in self.links and link not in self.cut_links):
            return
        self.links.add(link)
        self.cut_links.discard(link)
        self.send(a, self.nodes[a].link_up(b))
        self.send(b, self.nodes[b].link_up(a))

    def cut(self, a: str, b: str) -> None:
        link = frozenset((a, b))
        if link in self.links:
            self.cut_links.add(link)
            self.wire.pop((a, b), None)
            self.wire.pop((b, a), None)

    def down(self, a: str, b: str) -> None:
        """Remove the link."""
        link = frozenset((a, b))
        if link not in self.links:
            return
        self.links.discard(link)
        self.cut_links.discard(link)
        self.wire.pop((a, b), None)
        self.wire.pop((b, a), None)
        self.send(a, self.nodes[a].unlink(b))
        self.send(b, self.nodes[b].unlink(a))

    def heal(self) -> None:
        for link in sorted(self.cut_links, key=sorted):
            self.up(*sorted(link))

    def want(self, node: str, patterns: frozenset[str]) -> None:
        self.version[node] += 1
        self.interest[node] = patterns
        self.send(node, self.nodes[node].set_interest(patterns, self.version[node]))

    def settle(self, rng: random.Random) -> None:
        """Deliver what the links carry, in an arbitrary interleaving, until quiet."""
        for _ in range(100_000):
            busy = [k for k, q in self.wire.items() if q]
            if not busy:
                return
            sender, receiver = rng.choice(busy)
            update = self.wire[(sender, receiver)].popleft()
            routes = self.nodes[receiver]
            if update.full:
                moves = [u for u in update.moves if isinstance(u, Route)]
                self.send(receiver, routes.heard_all(sender, moves))
            else:
                for move in update.moves:
                    self.send(receiver, routes.heard(sender, move))
        raise AssertionError("the routes never settled")

    def part(self, node: str) -> set[str]:
        """The nodes ``node`` can reach over the links that are up."""
        seen, todo = {node}, [node]
        while todo:
            here = todo.pop()
            for link in self.links:
                if here in link:
                    (other,) = link - {here}
                    if other not in seen:
                        seen.add(other)
                        todo.append(other)
        return seen

    def deliveries(self, origin: str, topic: str) -> dict[str, int]:
        """Carry a message published at ``origin`` hop by hop: how often each node took it."""
        got: dict[str, int] = {}
        todo = [(hop, targets) for hop, targets in self.nodes[origin].targets(topic).items()]
        hops = 0
        while todo:
            node, targets = todo.pop()
            hops += 1
            assert hops < 100, "a message went round in circles"
            here, onward, unreachable = self.nodes[node].forward(targets)
            assert not unreachable
            if here:
                got[node] = got.get(node, 0) + 1
            todo.extend(onward.items())
        return got


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 6),
    seed=st.integers(0, 2**32),
    moves=st.lists(
        st.tuples(
            st.sampled_from(["up", "up", "cut", "down", "want"]),
            st.integers(0, 5),
            st.integers(0, 5),
            st.frozensets(st.sampled_from(PATTERNS), max_size=2),
        ),
        max_size=40,
    ),
)
def test_routes_settle_loop_free_and_each_wanting_node_gets_one_copy(
    n: int, seed: int, moves: list[tuple[str, int, int, frozenset[str]]]
) -> None:
    rng = random.Random(seed)
    net = Network(n)
    names = list(net.nodes)
    for kind, i, j, patterns in moves:
        a, b = names[i % n], names[j % n]
        if kind == "up":
            net.up(a, b)
        elif kind == "cut":
            net.cut(a, b)
        elif kind == "down":
            net.down(a, b)
        else:
            net.want(a, patterns)
        if rng.random() < 0.5:  # some changes overlap, some settle first
            net.settle(rng)
    net.settle(rng)
    net.heal()
    net.settle(rng)
    for name, routes in net.nodes.items():
        part = net.part(name)
        known = routes.known()
        assert set(known) == part - {name}
        for other, (patterns, hop, path) in known.items():
            assert patterns == net.interest[other]
            assert path[0] == other and path[-2:] == (hop, name) and len(set(path)) == len(path)
            walked, here = [name], name
            while here != other:  # following next hops reaches it, never twice through one
                nxt = net.nodes[here].hop(other)
                assert nxt is not None and nxt not in walked
                walked.append(nxt)
                here = nxt
        for topic in TOPICS:
            wanting = {o for o in part - {name} if any(_matches(p, topic) for p in net.interest[o])}
            assert net.deliveries(name, topic) == dict.fromkeys(wanting, 1)


def _matches(pattern: str, topic: str) -> bool:
    from eomsg.core.topics import Matcher

    m: Matcher[str] = Matcher()
    m.add(pattern, "x")
    return bool(m.match(topic))


def test_a_ring_routes_the_short_way_and_around_a_removed_link() -> None:
    net = Network(4)
    for a, b in ("ab", "bc", "cd", "da"):
        net.up(a, b)
    net.want("c", frozenset({"orders/>"}))
    net.settle(random.Random(0))
    assert net.nodes["a"].hop("c") == "b"  # two hops either way: the lower name
    assert net.nodes["a"].targets("orders/eu/new") == {"b": frozenset({"c"})}
    net.cut("b", "c")  # a cut changes no route: messages for c wait at b
    net.want("c", frozenset({"orders/eu/*"}))  # c's news comes round the other way
    net.settle(random.Random(0))
    assert net.nodes["a"].known()["c"][:2] == (frozenset({"orders/eu/*"}), "b")
    assert net.nodes["a"].targets("orders/us/new") == {}
    net.heal()
    net.settle(random.Random(0))
    assert net.nodes["a"].known()["c"][:2] == (frozenset({"orders/eu/*"}), "b")
    net.down("b", "c")
    net.settle(random.Random(0))
    assert net.nodes["a"].known()["c"][1:] == ("d", ("c", "d", "a"))
    assert net.deliveries("b", "orders/eu/x") == {"c": 1}  # b → a → d → c


def test_bad_routes_and_versions_are_refused() -> None:
    r = Routes("a")
    r.link_up("b")
    for route, why in (
        (Route("c", 1, frozenset(), ("b",)), "must start with it"),
        (Route("c", 1, frozenset(), ("c", "b", "c", "b")), "repeats a node"),
        (Route("c", 1, frozenset(), ("c", "x")), "does not end with it"),
        (Route("c", 1, frozenset(), tuple(f"n{i}" for i in range(40))), "must start with it"),
        (Route("c", 1, frozenset(), ("c", *(f"n{i}" for i in range(40)), "b")), "longer than"),
        (Route("x y", 1, frozenset(), ("x y", "b")), "'x y' is not a node name"),
    ):
        with pytest.raises(InvalidInput, match=why):
            r.heard("b", route)
    with pytest.raises(InvalidPattern):
        r.heard("b", Route("c", 1, frozenset({"a//b"}), ("c", "b")))
    with pytest.raises(InvalidInput, match="no link to 'x'"):
        r.heard("x", Withdraw("c"))
    r.set_interest(["orders/>"], 5)
    with pytest.raises(InvalidInput, match="not above 5"):
        r.set_interest([], 5)
    assert r.known() == {}  # nothing refused was taken


def test_a_restarted_node_routes_by_the_offers_it_kept() -> None:
    net = Network(3)
    net.up("a", "b")
    net.up("b", "c")
    net.want("c", frozenset({"orders/>"}))
    net.settle(random.Random(0))
    kept = net.nodes["a"].offers("b")
    again = Routes("a")
    again.restore("b", kept)
    assert again.targets("orders/x") == {"b": frozenset({"c"})}
    assert again.known() == net.nodes["a"].known()


def test_a_whole_table_drops_what_it_no_longer_offers() -> None:
    r = Routes("a")
    r.link_up("b")
    r.heard("b", Route("c", 1, frozenset({"x"}), ("c", "b")))
    r.heard("b", Route("d", 1, frozenset({"x"}), ("d", "b")))
    r.link_up("e")
    updates = r.heard_all("b", [Route("c", 2, frozenset({"y"}), ("c", "b"))])
    assert r.targets("x") == {} and r.targets("y") == {"b": frozenset({"c"})}
    assert updates == [
        Update("e", (Route("c", 2, frozenset({"y"}), ("c", "b", "a")), Withdraw("d")))
    ]
