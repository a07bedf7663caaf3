"""The events linked nodes send each other (seeds 000, 003, 004 across machines), and
their strict msgpack shape: the dialling node first LinkHello, the dialled one
LinkWelcome, the dialler LinkProof; then both ways Interest, Transfer, Oversize, Taken,
Channel, ChannelClose, ChannelPause — and Ping, Pong, Goodbye of
:mod:`eomsg.wire.events`, which both protocols share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from eomsg.core.message import Batch
from eomsg.core.routing import Route, Withdraw
from eomsg.errors import RemoteProtocolError
from eomsg.wire.codec import (
    ITEM_OVERHEAD,
    MAX_BATCH,
    MAX_NAME,
    Event,
    _bool,
    _bytes,
    _fields,
    _frame_limit,
    _headers,
    _headers_bound,
    _int,
    _list,
    _num,
    _opt_num,
    _opt_str,
    _str,
)

LINK_VERSION = 6  # 6: Oversize; each side holds the other to the frame limit it said
MAX_TARGETS = 1024  # nodes one transferred message is for


def _names(value: object, what: str, limit: int = MAX_TARGETS) -> tuple[str, ...]:
    return tuple(_str(v, what) for v in _list(value, what, limit))


def _link_fields(body: list[Any], n: int, name: str) -> list[Any]:
    """:func:`_fields` of a link handshake frame — whose shape changes with the link
    protocol's version, so another version is said to be one before its shape is."""
    if len(body) != n + 1 and len(body) > 1 and type(body[1]) is int and body[1] != LINK_VERSION:
        raise RemoteProtocolError(
            f"link protocol version {body[1]} is not supported; this node speaks version "
            f"{LINK_VERSION} (upgrade the older node)"
        )
    return _fields(body, n, name)


@dataclass(frozen=True, slots=True)
class LinkHello(Event):
    """A node dialling a linked peer: who it is (``node``, and ``incarnation``: its data
    directory's identity, so a peer notices a node rebuilt from nothing), how far it has
    taken the peer's messages (``read``, as of the peer's incarnation
    ``peer_incarnation``; "" if never), ``max_frame``: the largest frame it accepts (the
    peer never sends a larger one), and a ``nonce`` the peer's welcome answers with a
    proof that it knows the link's token (which never travels)."""

    TYPE: ClassVar[int] = 21
    version: int
    node: str
    incarnation: str
    peer_incarnation: str
    read: int
    max_frame: int
    nonce: str

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.version,
            self.node,
            self.incarnation,
            self.peer_incarnation,
            self.read,
            self.max_frame,
            self.nonce,
        ]

    @classmethod
    def from_wire(cls, body: list[Any]) -> LinkHello:
        _, version, node, inc, peer_inc, read, max_frame, nonce = _link_fields(
            body, 7, "link hello"
        )
        return cls(
            _int(version, "version"),
            _str(node, "node"),
            _str(inc, "incarnation"),
            _str(peer_inc, "peer incarnation"),
            _int(read, "read"),
            _frame_limit(max_frame),
            _str(nonce, "nonce"),
        )


@dataclass(frozen=True, slots=True)
class LinkWelcome(Event):
    """The dialled node answers: who it is, how far it has taken the dialling node's
    messages, the largest frame it accepts (the dialler never sends a larger one), its
    ping interval, its ``proofs`` that it knows the link's token
    (:func:`eomsg.core.links.link_proof` of the hello's nonce, one per key it would
    accept), and a ``nonce`` of its own for the dialler to answer the same way
    (:class:`LinkProof`) before anything else is taken."""

    TYPE: ClassVar[int] = 22
    version: int
    node: str
    incarnation: str
    read: int
    max_frame: int
    heartbeat: float
    proofs: tuple[str, ...]
    nonce: str

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.version,
            self.node,
            self.incarnation,
            self.read,
            self.max_frame,
            self.heartbeat,
            list(self.proofs),
            self.nonce,
        ]

    @classmethod
    def from_wire(cls, body: list[Any]) -> LinkWelcome:
        _, version, node, inc, read, max_frame, heartbeat, proofs, nonce = _link_fields(
            body, 8, "link welcome"
        )
        return cls(
            _int(version, "version"),
            _str(node, "node"),
            _str(inc, "incarnation"),
            _int(read, "read"),
            _frame_limit(max_frame),
            _num(heartbeat, "heartbeat"),
            _names(proofs, "proofs", 4),
            _str(nonce, "nonce"),
        )


@dataclass(frozen=True, slots=True)
class LinkProof(Event):
    """The dialling node's proof that it knows the link's token: its answer to the
    welcome's nonce. The dialled node takes nothing of the link before it checks it."""

    TYPE: ClassVar[int] = 29
    proof: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.proof]

    @classmethod
    def from_wire(cls, body: list[Any]) -> LinkProof:
        _, proof = _fields(body, 1, "link proof")
        return cls(_str(proof, "proof"))


def _move(item: object) -> Route | Withdraw:
    fields = _list(item, "a route", 5)
    if len(fields) == 1:
        return Withdraw(_str(fields[0], "node"))
    if len(fields) != 5:
        raise RemoteProtocolError("malformed frame: a route has 1 or 5 fields")
    node, version, patterns, path, queues = fields
    return Route(
        _str(node, "node"),
        _int(version, "version"),
        frozenset(_names(patterns, "patterns", MAX_BATCH)),
        _names(path, "path"),
        frozenset(_names(queues, "queues", MAX_BATCH)),
    )


@dataclass(frozen=True, slots=True)
class Interest(Event):
    """Routes and withdrawals (see :mod:`eomsg.core.routing`); ``full``: the sender's
    whole table, replacing what the receiver kept from it."""

    TYPE: ClassVar[int] = 23
    full: bool
    moves: tuple[Route | Withdraw, ...]

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.full,
            [
                [m.node]
                if isinstance(m, Withdraw)
                else [m.node, m.version, sorted(m.patterns), list(m.path), sorted(m.queues)]
                for m in self.moves
            ],
        ]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Interest:
        _, full, moves = _fields(body, 2, "interest")
        return cls(_bool(full, "full"), tuple(map(_move, _list(moves, "moves"))))


def _column(value: object, n: int, what: str) -> list[Any]:
    """One column of a transfer: a list of ``n`` values."""
    column = _list(value, what)
    if len(column) != n:
        raise RemoteProtocolError(f"malformed frame: {len(column)} {what} for {n} messages")
    return column


def _batch(origin: object, *columns: object) -> Batch:
    """A transfer's messages, every value checked. Columns of the usual kinds pass one
    test each, at C speed where it can be (a link carries every message through here);
    any other goes through the checks that convert or say what is wrong."""
    seqs, topics, payloads, ids, ttls, headers, sources, routes, route_of = columns
    seqs = _list(seqs, "seqs")
    n = len(seqs)
    if not n:
        raise RemoteProtocolError("malformed frame: a transfer carries no message")
    if not all(type(s) is int for s in seqs):
        seqs = [_int(s, "seq") for s in seqs]
    topics = _column(topics, n, "topics")
    if not all(type(t) is str and len(t) <= MAX_NAME for t in topics):
        topics = [_str(t, "topic") for t in topics]
    payloads = _column(payloads, n, "payloads")
    if not all(type(p) is bytes for p in payloads):
        payloads = [_bytes(p, "payload") for p in payloads]
    ids = _column(ids, n, "ids")
    if not all(i is None or (type(i) is str and len(i) <= MAX_NAME) for i in ids):
        ids = [_opt_str(i, "id") for i in ids]
    if ttls is not None:
        ttls = [_opt_num(t, "ttl") for t in _column(ttls, n, "ttls")]
    if headers is not None:
        headers = tuple(_headers(h) for h in _column(headers, n, "headers"))
    if sources is not None:
        sources = tuple(_source(s) for s in _column(sources, n, "sources"))
    table = tuple(_names(r, "targets") for r in _list(routes, "routes", MAX_TARGETS))
    if not table:
        raise RemoteProtocolError("malformed frame: a transfer names no route")
    if route_of is not None:
        route_of = _column(route_of, n, "route indexes")
        if not all(type(i) is int and 0 <= i < len(table) for i in route_of):
            raise RemoteProtocolError("malformed frame: a route index names no route")
        route_of = tuple(route_of)
    return Batch(
        _str(origin, "origin"),
        tuple(seqs),
        tuple(topics),
        tuple(payloads),
        tuple(ids),
        None if ttls is None else tuple(ttls),
        headers,
        sources,
        table,
        route_of,
    )


def _source(value: object) -> tuple[str, str] | None:
    """Where a relayed message was first published: None (the sender), or its origin
    and its seq there."""
    if value is None:
        return None
    pair = _list(value, "a source", 2)
    if len(pair) != 2:
        raise RemoteProtocolError("malformed frame: a source is [origin, origin seq]")
    return _str(pair[0], "origin"), _str(pair[1], "origin seq")


@dataclass(frozen=True, slots=True)
class Transfer(Event):
    """Messages on a link, continuing from the sender's sequence ``prev``; they travel
    as the columns of a :class:`~eomsg.core.message.Batch`."""

    TYPE: ClassVar[int] = 24
    prev: int
    batch: Batch

    def to_wire(self) -> list[Any]:
        b = self.batch
        return [
            self.TYPE, self.prev, b.origin, b.seqs, b.topics, b.payloads, b.ids, b.ttls,
            b.headers, b.sources, b.routes, b.route_of,
        ]  # fmt: skip

    @classmethod
    def from_wire(cls, body: list[Any]) -> Transfer:
        _, prev, origin, *columns = _fields(body, 11, "transfer")
        return cls(_int(prev, "prev"), _batch(origin, *columns))


def transfer_bound(batch: Batch) -> int:
    """At most the bytes a :class:`Transfer` of ``batch`` takes in a frame (what a sender
    splits by, so that a frame it packs fits the peer's limit): its payloads, its text
    counted at 4 bytes a character (UTF-8 never takes more), and the framing of every
    field and of the frame."""
    size = 128 + 4 * len(batch.origin) + (ITEM_OVERHEAD + 15) * len(batch.seqs)
    size += sum(map(len, batch.payloads))
    size += 4 * (sum(map(len, batch.topics)) + sum(len(i) for i in batch.ids if i is not None))
    size += sum(5 + sum(4 * len(t) + 5 for t in targets) for targets in batch.routes)
    if batch.headers is not None:
        size += sum(map(_headers_bound, batch.headers))
    if batch.sources is not None:
        size += sum(4 * (len(s[0]) + len(s[1])) for s in batch.sources if s is not None)
    return size


@dataclass(frozen=True, slots=True)
class Oversize(Event):
    """The link's message ``seq``, continuing from the sender's sequence ``prev``, fits
    no frame the receiver takes (the frame limit its side of the handshake said): its
    payload is of ``size`` bytes. The sender passes it over — this takes its place in
    the link's sequence, as a Transfer of it would — and the receiver counts it as
    refused, as it does a message over its max-payload, and acknowledges it: nothing
    behind it waits. (A receiver whose frame limit changed since it said it connects
    again instead, to say the new one: the message is sent again under it.)"""

    TYPE: ClassVar[int] = 30
    prev: int
    seq: int
    size: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.prev, self.seq, self.size]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Oversize:
        _, prev, seq, size = _fields(body, 3, "oversize")
        return cls(_int(prev, "prev"), _int(seq, "seq"), _int(size, "size"))


@dataclass(frozen=True, slots=True)
class Taken(Event):
    """The receiver holds, durably, every message of the link up to ``read``; ``gap``: a
    frame came that did not follow it, so send again what follows it."""

    TYPE: ClassVar[int] = 25
    read: int
    gap: bool

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.read, self.gap]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Taken:
        _, read, gap = _fields(body, 2, "taken")
        return cls(_int(read, "read"), _bool(gap, "gap"))


@dataclass(frozen=True, slots=True)
class Channel(Event):
    """Bytes of the connection tunnelled as ``channel`` over a link: a client connected
    to one node and talking, through it, to the node at the link's other end (or
    further). The first frame of a channel opens it; the node that opens a channel
    numbers it odd if it dialled the link, even if it was dialled. Each side numbers its
    frames of a channel from 0 (``n``), so a frame the link lost, repeated or reordered
    is seen rather than read as the connection's bytes."""

    TYPE: ClassVar[int] = 26
    channel: int
    n: int
    data: bytes

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.channel, self.n, self.data]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Channel:
        _, channel, n, data = _fields(body, 3, "channel")
        return cls(_int(channel, "channel"), _int(n, "n"), _bytes(data, "data"))


@dataclass(frozen=True, slots=True)
class ChannelClose(Event):
    """The tunnelled connection ``channel`` is over, and why (either side may say so)."""

    TYPE: ClassVar[int] = 27
    channel: int
    reason: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.channel, self.reason]

    @classmethod
    def from_wire(cls, body: list[Any]) -> ChannelClose:
        _, channel, reason = _fields(body, 2, "channel close")
        return cls(_int(channel, "channel"), _str(reason, "reason"))


@dataclass(frozen=True, slots=True)
class ChannelPause(Event):
    """The sender can take no more of ``channel`` for now (``paused``), or can again."""

    TYPE: ClassVar[int] = 28
    channel: int
    paused: bool

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.channel, self.paused]

    @classmethod
    def from_wire(cls, body: list[Any]) -> ChannelPause:
        _, channel, paused = _fields(body, 2, "channel pause")
        return cls(_int(channel, "channel"), _bool(paused, "paused"))
