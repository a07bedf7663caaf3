"""Interest and routes across linked nodes (seed 004): which nodes want a topic, and by
which neighbour each is reached.

Every node *announces its interest*: the topic patterns of its queues, with a version
that grows at each change. Announcements spread hop by hop as *routes*: a neighbour
tells this node "node N wants these patterns, and I reach it by this path". A path lists
the nodes an announcement went through, N first and the neighbour last, so a node never
takes a route that passes through itself — routes never loop, in any topology (a chain,
a fan-out, a ring, a mesh).

Each neighbour offers at most one route per node (its own best: a new one replaces the
old; a withdrawal removes it). A link that is *cut* forgets nothing: what its neighbour
offered stays, so messages for the nodes behind it wait for it to come back rather than
being routed nowhere (a cut is a pause, not a change of topology); when it is back, each
side sends the other its whole table, which replaces what the other kept. Only a link
*removed* forgets its neighbour's offers. For each node this side then keeps:

- the **patterns** of the freshest version any neighbour offers (a stale version may
  still come by a shorter path, but it is not the node's interest any more);
- the **next hop**: the neighbour with the shortest path, ties broken by name, so every
  node picks the same hop for the same offers.

An announcement names the node's queues too, so every node knows where each queue
lives (:meth:`Routes.locate`): a consumer connected anywhere reaches a queue through
its own node, hop by hop toward the node that holds it (:meth:`Routes.hop`).

A published message goes to the nodes whose patterns match its topic — its *targets*,
grouped by next hop: a hop is sent the message once, with the targets it is responsible
for (:meth:`Routes.targets`). A node receiving it delivers to its own queues if it is a
target and forwards the rest the same way (:meth:`Routes.forward`), so each target gets
one copy whatever the topology: a target is reached along one path, never two.

Pure state: no I/O, no clock. Changes return :class:`Update` effects — what to tell
which neighbour — for the caller to send.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from eomsg.core.links import NAME
from eomsg.core.queues import validate_queue_name
from eomsg.core.topics import Matcher, validate_pattern
from eomsg.errors import InvalidInput

MAX_PATH = 32  # nodes an announcement may pass through: a longer path is refused


@dataclass(frozen=True)
class Route:
    """``node`` wants ``patterns`` and holds ``queues`` (as of ``version``); ``path`` is
    how it is reached: ``node`` first, the neighbour that sent the route last."""

    node: str
    version: int
    patterns: frozenset[str]
    path: tuple[str, ...]
    queues: frozenset[str] = frozenset()

    def check(self) -> Route:
        """This route, if well formed, else InvalidInput naming what is wrong."""
        if not self.path or self.path[0] != self.node:
            raise InvalidInput(f"route for node {self.node!r}: its path must start with it")
        if len(self.path) > MAX_PATH:
            raise InvalidInput(f"route for node {self.node!r}: path longer than {MAX_PATH}")
        if len(set(self.path)) != len(self.path):
            raise InvalidInput(f"route for node {self.node!r}: its path repeats a node")
        if self.version < 0:
            raise InvalidInput(f"route for node {self.node!r}: negative version")
        for name in self.path:
            if not NAME.fullmatch(name):
                raise InvalidInput(f"route for node {self.node!r}: {name!r} is not a node name")
        for p in self.patterns:
            validate_pattern(p)
        for q in self.queues:
            validate_queue_name(q)
        return self


@dataclass(frozen=True)
class Withdraw:
    """The neighbour that sent this no longer reaches ``node``."""

    node: str


@dataclass(frozen=True)
class Update:
    """Tell ``neighbour`` these routes and withdrawals, in order; ``full``: they are the
    whole table, replacing everything it kept from this node (:meth:`Routes.heard_all`)."""

    neighbour: str
    moves: tuple[Route | Withdraw, ...]
    full: bool = False


@dataclass
class _Best:
    version: int
    patterns: frozenset[str]
    hop: str
    path: tuple[str, ...]  # the path as this node advertises it: ends with this node
    queues: frozenset[str] = frozenset()


@dataclass
class Routes:
    """The routing view of node ``me``: its own interest, its neighbours' offers, and
    for every node it reaches, that node's patterns and the next hop toward it."""

    me: str
    _version: int = 0
    _patterns: frozenset[str] = frozenset()
    _queues: frozenset[str] = frozenset()
    _neighbours: set[str] = field(default_factory=set)
    _offers: dict[str, dict[str, Route]] = field(default_factory=dict)  # neighbour → node →
    _best: dict[str, _Best] = field(default_factory=dict)
    _matcher: Matcher[str] = field(default_factory=Matcher)

    # -- stimuli ---------------------------------------------------------------------------

    def set_interest(
        self, patterns: Iterable[str], version: int, queues: Iterable[str] = ()
    ) -> list[Update]:
        """This node's queues (named ``queues``) now want ``patterns``; ``version`` must
        exceed every version it announced before (the caller keeps it across restarts,
        e.g. the time in microseconds). Every neighbour is told."""
        if version <= self._version:
            raise InvalidInput(f"interest version {version} is not above {self._version}")
        self._patterns = frozenset(validate_pattern(p) for p in patterns)
        self._queues = frozenset(queues)
        self._version = version
        own = self._own()
        return [Update(n, (own,)) for n in sorted(self._neighbours)]

    def link_up(self, neighbour: str) -> list[Update]:
        """A link to ``neighbour`` is (back) up: it is told everything this node reaches
        (its own interest first) as a whole table, since what it kept may be stale."""
        self._neighbours.add(neighbour)
        self._offers.setdefault(neighbour, {})
        moves: list[Route | Withdraw] = [self._own()]
        for node in sorted(self._best):
            advert = self._advert(node, neighbour)
            if advert is not None:
                moves.append(advert)
        return [Update(neighbour, tuple(moves), full=True)]

    def unlink(self, neighbour: str) -> list[Update]:
        """The link to ``neighbour`` is removed: what it offered is forgotten, and the
        other neighbours hear of every node whose route changed. (A link merely cut
        changes nothing here.)"""
        self._neighbours.discard(neighbour)
        offers = self._offers.pop(neighbour, {})
        return self._recompute(set(offers))

    def restore(self, neighbour: str, routes: Iterable[Route]) -> None:
        """At start: ``neighbour`` is linked and last offered ``routes`` (as
        :meth:`offers` gave them). Nothing is announced: each link sends its whole table
        when it comes up."""
        self._neighbours.add(neighbour)
        self._offers[neighbour] = {}
        self.heard_all(neighbour, routes)

    def offers(self, neighbour: str) -> tuple[Route, ...]:
        """What ``neighbour`` offers now, to keep across restarts."""
        return tuple(r for _, r in sorted(self._offers.get(neighbour, {}).items()))

    def heard_all(self, neighbour: str, routes: Iterable[Route]) -> list[Update]:
        """``neighbour`` sent its whole table: it replaces everything it offered."""
        if neighbour not in self._neighbours:
            raise InvalidInput(f"no link to {neighbour!r} is up")
        before = self._offers[neighbour]
        after: dict[str, Route] = {}
        for r in routes:
            if self.me not in _offered(r, neighbour).path:
                after[r.node] = r
        self._offers[neighbour] = after
        return self._recompute({n for n in (*before, *after) if before.get(n) != after.get(n)})

    def heard(self, neighbour: str, move: Route | Withdraw) -> list[Update]:
        """``neighbour`` sent a route or a withdrawal. A route through this node, or
        about it, is a loop and ignored (as a withdrawal: the neighbour no longer offers
        anything else for that node). Returns what the other neighbours must hear."""
        if neighbour not in self._neighbours:
            raise InvalidInput(f"no link to {neighbour!r} is up")
        if isinstance(move, Route):
            _offered(move, neighbour)
        offers = self._offers[neighbour]
        if isinstance(move, Withdraw) or self.me in move.path:
            if offers.pop(move.node, None) is None:
                return []
        elif offers.get(move.node) == move:
            return []
        else:
            offers[move.node] = move
        return self._recompute({move.node})

    # -- reading ---------------------------------------------------------------------------

    def targets(self, topic: str) -> dict[str, frozenset[str]]:
        """The nodes other than this one that want ``topic``, by next hop."""
        return self._by_hop(self._matcher.match(topic))

    def forward(self, targets: Iterable[str]) -> tuple[bool, dict[str, frozenset[str]], set[str]]:
        """A message arrived for ``targets``: whether this node is one, the others by
        next hop, and those it has no route to (yet)."""
        wanted = set(targets)
        here = self.me in wanted
        wanted.discard(self.me)
        unreachable = {t for t in wanted if t not in self._best}
        return here, self._by_hop(wanted - unreachable), unreachable

    def hop(self, node: str) -> str | None:
        """The neighbour toward ``node``, or None if no route reaches it."""
        best = self._best.get(node)
        return None if best is None else best.hop

    def locate(self, queue: str) -> str | None:
        """The node holding ``queue``: this one if it does, else the nearest that
        announces it (ties by name), else None."""
        if queue in self._queues:
            return self.me
        holders = [(len(b.path), n) for n, b in self._best.items() if queue in b.queues]
        return min(holders)[1] if holders else None

    def known(self) -> Mapping[str, tuple[frozenset[str], str, tuple[str, ...]]]:
        """Each node reached: its patterns, next hop and path (for ``inspect links``)."""
        return {n: (b.patterns, b.hop, b.path) for n, b in sorted(self._best.items())}

    # -- internals -------------------------------------------------------------------------

    def _own(self) -> Route:
        return Route(self.me, self._version, self._patterns, (self.me,), self._queues)

    def _by_hop(self, nodes: Iterable[str]) -> dict[str, frozenset[str]]:
        grouped: dict[str, set[str]] = {}
        for node in nodes:
            best = self._best.get(node)
            if best is not None:
                grouped.setdefault(best.hop, set()).add(node)
        return {hop: frozenset(ns) for hop, ns in sorted(grouped.items())}

    def _advert(self, node: str, neighbour: str) -> Route | None:
        """The route to ``node`` as ``neighbour`` should hear it, or None when it would
        pass through the neighbour (it would ignore it: a loop)."""
        best = self._best[node]
        if neighbour in best.path:
            return None
        return Route(node, best.version, best.patterns, best.path, best.queues)

    def _recompute(self, nodes: set[str]) -> list[Update]:
        """Choose again the route to each of ``nodes``; tell the neighbours of each
        change (a new route, or a withdrawal where the neighbour may no longer use it)."""
        moves: dict[str, list[Route | Withdraw]] = {n: [] for n in self._neighbours}
        for node in sorted(nodes):
            before = self._best.get(node)
            after = self._choose(node)
            if after == before:
                continue
            if before is not None:
                for p in before.patterns:
                    self._matcher.remove(p, node)
            if after is None:
                del self._best[node]
            else:
                self._best[node] = after
                for p in after.patterns:
                    self._matcher.add(p, node)
            for n in self._neighbours:
                advert = None if after is None else self._advert(node, n)
                if advert is not None:
                    moves[n].append(advert)
                elif before is not None and n not in before.path:
                    moves[n].append(Withdraw(node))  # it had the old route: take it back
        return [Update(n, tuple(m)) for n, m in sorted(moves.items()) if m]

    def _choose(self, node: str) -> _Best | None:
        # A route as long as it may be cannot be passed on with this node added.
        offers = [
            (n, o[node])
            for n, o in self._offers.items()
            if node in o and len(o[node].path) < MAX_PATH
        ]
        if not offers:
            return None
        freshest = max(r.version for _, r in offers)
        latest = next(r for _, r in offers if r.version == freshest)
        hop, route = min(offers, key=lambda nr: (len(nr[1].path), nr[0]))
        return _Best(freshest, latest.patterns, hop, (*route.path, self.me), latest.queues)


def _offered(route: Route, neighbour: str) -> Route:
    """``route`` as ``neighbour`` may offer it (well formed, its path ending with the
    neighbour), else InvalidInput."""
    if route.check().path[-1] != neighbour:
        raise InvalidInput(f"route for node {route.node!r} from {neighbour!r} does not end with it")
    return route
