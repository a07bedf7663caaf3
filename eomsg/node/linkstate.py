"""A link's runtime state (:class:`LinkState`), a route out over it (:class:`HopRoute`),
and the frames built from the log for it: what :mod:`eomsg.node.links`,
:mod:`eomsg.node.transfer` and :mod:`eomsg.node.intake` share.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eomsg.core.links import LinkConfig
from eomsg.core.message import ORIGIN, ORIGIN_SEQ, Batch
from eomsg.core.routing import Route, Update
from eomsg.core.topics import Matcher
from eomsg.core.transfer import Outbox, Receiver
from eomsg.node.egress import Held
from eomsg.store.store import US, MessageRow

Wake = Callable[[], None]


class HopRoute:
    """A route out over one link: the messages the peer is to carry to ``targets``.
    Identity-hashed, a :class:`~eomsg.node.state.Destination`."""

    __slots__ = ("id", "link", "targets")

    def __init__(self, route_id: int, link: LinkState, targets: frozenset[str]) -> None:
        self.id = route_id
        self.link = link
        self.targets = targets

    def extend(self, seqs: list[int], expiry: list[float | None]) -> None:
        self.link.outbox.add(self.id, seqs)


@dataclass(eq=False)
class LinkState:
    """One link's runtime state; identity-hashed."""

    config: LinkConfig
    outbox: Outbox
    receiver: Receiver
    peer_incarnation: str = ""  # whose sequence ``receiver.read`` counts
    taken_through: int = 0  # the highest of this node's seqs the peer durably took
    connected: bool = False
    wake: Wake | None = None  # the server's connection, told when there is work
    updates: list[Update] = field(default_factory=list)  # routes to tell the peer
    routes: dict[frozenset[str], HopRoute] = field(default_factory=dict)
    taken: int = 0  # messages the peer took, since start (for rates)
    received: int = 0  # messages taken from the peer, since start
    last_taken_at: float = 0.0
    connected_at: float = 0.0
    error: str | None = None  # why the last attempt to connect failed
    refusal: bool = False  # … and whether it was refused (by either side)
    # Messages refused, since start: from the peer, that this node could not take, and
    # to it, that fit no frame it takes (passed over).
    refused: int = 0
    unroutable: int = 0  # messages from the peer for nodes this node has no route to
    # Egress in memory (node/egress.py): the peer's messages held now, by the peer's
    # seq (ascending); the last acknowledgement sent; the first peer seq of each frame
    # being stored, whose commit is not durable yet (ascending).
    held: dict[int, Held] = field(default_factory=dict)
    ack_sent: int = 0
    storing: deque[int] = field(default_factory=deque)
    carries: Matcher[bool] | None = None  # the topics it may carry (None: every topic)
    withheld: int = 0  # messages from the peer, or carried on, not the link's (since start)
    # Why the node last could not take a frame from the peer, as its log said; None once
    # the link moved on since (see Intake.not_taken_is_news).
    not_taken: str | None = None

    def allows(self, topic: str) -> bool:
        return self.carries is None or bool(self.carries.match(topic))

    def ack_point(self) -> int:
        """How far the peer's messages may be acknowledged: what this node took, short
        of the first frame whose commit is not durable yet and of the first message
        still held (or being written). Under ``lock``."""
        point = self.receiver.accepted
        if self.storing:
            point = min(point, self.storing[0] - 1)
        for peer_seq in self.held:  # ascending: the first is the lowest
            return min(point, peer_seq - 1)
        return point

    def acked(self) -> int:
        """The acknowledgement to send now (noted as sent). Under ``lock``."""
        point = self.ack_point()
        self.ack_sent = max(self.ack_sent, point)
        return point


def frame_batch(
    origin: str,
    rows: Sequence[MessageRow | None],
    now_us: int,
    routes: tuple[tuple[str, ...], ...],
    route_of: list[int] | None,
) -> Batch:
    """A frame's messages from their log rows, as columns: one transposition, and a
    look at each message only for what some have (a time to live, headers, an origin
    elsewhere — where the node that sent it here put it in its headers)."""
    seqs, topics, ids, _, expires, texts, payloads = zip(*rows, strict=True)
    n = len(seqs)
    ttls = None
    if expires.count(None) != n:
        ttls = tuple(None if e is None else max(e - now_us, 1000) / US for e in expires)
    headers = sources = None
    if texts.count(None) != n:
        each: list[dict[str, str]] = []
        came: list[tuple[str, str] | None] = []
        for text in texts:
            h = json.loads(text) if text else {}
            came.append(
                (h.pop(ORIGIN), h.pop(ORIGIN_SEQ)) if ORIGIN in h and ORIGIN_SEQ in h else None
            )
            each.append(h)
        headers = tuple(each) if any(each) else None
        sources = tuple(came) if came.count(None) != n else None
    if not all(type(p) is bytes for p in payloads):
        payloads = tuple(bytes(p) for p in payloads)
    return Batch(
        origin, seqs, topics, payloads, ids, ttls, headers, sources, routes,
        None if route_of is None else tuple(route_of),
    )  # fmt: skip


def route_json(r: Route) -> list[Any]:
    return [r.node, r.version, sorted(r.patterns), list(r.path), sorted(r.queues)]


def route_of_json(data: list[Any]) -> Route:
    node, version, patterns, path, *queues = data  # (routes kept before queues: none)
    return Route(node, int(version), frozenset(patterns), tuple(path), frozenset(*queues))
