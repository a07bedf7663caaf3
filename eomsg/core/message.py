"""Messages and what publishing or consuming one returns: immutable values, no
behaviour."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, repeat
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, NamedTuple, Protocol, overload

from eomsg.core.columns import Columns
from eomsg.errors import InvalidInput

Key = tuple[int, int]
"""A delivery: ``(seq, attempt)`` (:attr:`Delivered.key`)."""

ORIGIN = "eomsg-origin"  # the header naming the node a message was first published on
ORIGIN_SEQ = "eomsg-origin-seq"  # … and its sequence there


def check_keys(keys: Iterable[Key]) -> tuple[Key, ...]:
    """Deliveries as ``(seq, attempt)`` pairs of ints; InvalidInput for anything else,
    before anything is sent or changed."""
    out = tuple(keys)
    # Sets of the types and lengths seen: a few C loops rather than a Python step a key.
    if (
        set(map(type, out)) <= _TUPLE
        and set(map(len, out)) <= _PAIR
        and set(map(type, chain.from_iterable(out))) <= _INT
    ):
        return out
    for key in out:
        if type(key) is not tuple or len(key) != 2 or not all(type(x) is int for x in key):
            break
    raise InvalidInput(
        f"a delivery is named by (seq, attempt), as Delivered.key gives it, not {key!r}"
    )


_TUPLE, _PAIR, _INT = frozenset({tuple}), frozenset({2}), frozenset({int})


@dataclass(frozen=True, slots=True)
class Message:
    """A message as the log holds it. Times are seconds since the epoch (UTC)."""

    seq: int
    topic: str
    payload: bytes
    id: str | None = None
    published_at: float = 0.0
    expires_at: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def payload_json_fields(self) -> dict[str, str]:
        """``{"payload": text}`` when the payload is UTF-8, else ``{"payload_b64": …}``."""
        try:
            return {"payload": self.payload.decode("utf-8")}
        except UnicodeDecodeError:
            return {"payload_b64": base64.b64encode(self.payload).decode("ascii")}

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "id": self.id,
            "topic": self.topic,
            "headers": self.headers,
            "published_at": self.published_at,
            "expires_at": self.expires_at,
            **self.payload_json_fields(),
        }


@dataclass(frozen=True, slots=True)
class Delivered:
    """A message handed to a consumer of ``queue``: delete it (or release it) before
    ``deadline``, or it is delivered again. ``attempt`` counts the times it was handed
    out, from 1; ``epoch`` is that of the consumer's flow (0 when fetched without one).
    A delete names the delivery (:attr:`key` and ``epoch``) and is refused once it is
    over: timed out and handed out again, or its epoch ended."""

    queue: str
    message: Message
    attempt: int
    deadline: float
    epoch: int = 0

    @property
    def seq(self) -> int:
        return self.message.seq

    @property
    def key(self) -> Key:
        """``(seq, attempt)``: this delivery, as a delete or release names it."""
        return (self.message.seq, self.attempt)

    def to_json(self) -> dict[str, Any]:
        return {**self.message.to_json(), "queue": self.queue, "attempt": self.attempt}


MessageColumns = tuple[
    Sequence[int],
    Sequence[str],
    Sequence[bytes],
    Sequence["str | None"],
    Sequence[float],
    "Sequence[float | None] | None",
    "Sequence[dict[str, str]] | None",
]
"""Messages as columns of :class:`Message`'s fields, in its order: ``expires_at`` None
when no message has one, ``headers`` None when none has any."""


def message_columns(messages: Sequence[Message]) -> MessageColumns:
    """``messages`` as :data:`MessageColumns`."""
    if not messages:
        return (), (), (), (), (), None, None
    seqs, topics, payloads, ids, published, expires, headers = zip(
        *[
            (m.seq, m.topic, m.payload, m.id, m.published_at, m.expires_at, m.headers)
            for m in messages
        ],
        strict=True,
    )
    n = len(messages)
    return (
        seqs,
        topics,
        payloads,
        ids,
        published,
        None if expires.count(None) == n else expires,
        None if not any(headers) else headers,
    )


class Deliveries(Sequence[Delivered]):
    """The deliveries of one take — messages of ``queue`` handed out under ``epoch`` —
    as columns (:data:`MessageColumns`, then each one's attempt and deadline): what a
    take reads from the log goes into a Deliver frame with no value made per message (a
    node hands out every message through here). As a sequence it gives each
    :class:`Delivered`, made when asked for. Not to be changed once made."""

    __slots__ = (
        "attempts",
        "deadlines",
        "epoch",
        "expires",
        "headers",
        "ids",
        "payloads",
        "published",
        "queue",
        "seqs",
        "topics",
    )

    def __init__(
        self,
        queue: str,
        epoch: int,
        messages: MessageColumns,
        attempts: Sequence[int],
        deadlines: Sequence[float],
    ) -> None:
        self.queue, self.epoch = queue, epoch
        (
            self.seqs,
            self.topics,
            self.payloads,
            self.ids,
            self.published,
            self.expires,
            self.headers,
        ) = messages
        self.attempts, self.deadlines = attempts, deadlines

    @classmethod
    def none(cls, queue: str, epoch: int = 0) -> Deliveries:
        return cls(queue, epoch, ((), (), (), (), (), None, None), (), ())

    def __len__(self) -> int:
        return len(self.seqs)

    @overload
    def __getitem__(self, index: int) -> Delivered: ...
    @overload
    def __getitem__(self, index: slice) -> Deliveries: ...

    def __getitem__(self, index: int | slice) -> Delivered | Deliveries:
        if isinstance(index, slice):
            return Deliveries(
                self.queue,
                self.epoch,
                (
                    self.seqs[index],
                    self.topics[index],
                    self.payloads[index],
                    self.ids[index],
                    self.published[index],
                    None if self.expires is None else self.expires[index],
                    None if self.headers is None else self.headers[index],
                ),
                self.attempts[index],
                self.deadlines[index],
            )
        return self[index : index + 1 or None].delivered()[0]

    def __iter__(self) -> Iterator[Delivered]:
        return iter(self.delivered())

    def keys(self) -> list[Key]:
        """Each delivery's :attr:`Delivered.key`."""
        return list(zip(self.seqs, self.attempts, strict=True))

    def delivered(self) -> list[Delivered]:
        """Each :class:`Delivered`, made a column at a time (:mod:`eomsg.core.columns`)."""
        n = len(self.seqs)
        expires = repeat(None) if self.expires is None else self.expires
        headers = [{} for _ in range(n)] if self.headers is None else self.headers
        messages = _MESSAGES.make(
            n, self.seqs, self.topics, self.payloads, self.ids, self.published, expires, headers
        )
        return _DELIVERED.make(
            n, repeat(self.queue), messages, self.attempts, self.deadlines, repeat(self.epoch)
        )


_MESSAGES, _DELIVERED = Columns(Message), Columns(Delivered)


def headers_json(headers: dict[str, str]) -> str:
    """``headers`` (validated: names and values are text) as the JSON object the log
    keeps — exactly what ``json.dumps`` makes of them, at under half its cost."""
    return "{" + ", ".join([_quote(k) + ": " + _quote(v) for k, v in headers.items()]) + "}"


@lru_cache(maxsize=256)
def _from_origin(origin: str) -> str:
    """The start of the headers of a message from ``origin`` that has no others: one
    string per linked node, where every message it sends begins."""
    return "{" + _quote(ORIGIN) + ": " + _quote(origin) + ", " + _quote(ORIGIN_SEQ) + ": "


class Publishable(Protocol):
    """What publishing reads of a message: an :class:`Outgoing`, or a :class:`Carried`
    taken from a linked node as it came."""

    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def id(self) -> str | None: ...
    @property
    def ttl(self) -> float | None: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def log_headers(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message to publish. ``ttl`` is in seconds; ``id`` makes the publish idempotent."""

    topic: str
    payload: bytes
    id: str | None = None
    ttl: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def log_headers(self) -> str | None:
        """The headers as the log keeps them (JSON), None if there are none."""
        return headers_json(self.headers) if self.headers else None


class PublishResult(NamedTuple):
    """The acknowledgement of a publish: durable once returned. ``duplicate`` says the id
    was already published and ``seq`` is the original's; ``queues`` counts the queues it
    was routed to (None for a duplicate).

    A named tuple, as :class:`Carried` is and for the same reason: the node makes one
    for every message published, and the client another as it reads the acknowledgement
    — a tuple costs a third of a frozen dataclass to make."""

    seq: int
    id: str | None
    duplicate: bool
    queues: int | None

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "id": self.id, "duplicate": self.duplicate, "queues": self.queues}


class Carried(NamedTuple):
    """A message on a link between nodes: its sequence on the sending node, what it is,
    and the nodes the receiver is to carry it to (itself among them if its queues want
    it). ``ttl`` is what remained of its time to live when it was sent; ``headers`` are
    its publisher's; ``origin`` names the node it was first published on and
    ``origin_seq`` its sequence there, which every node it reaches shows as the headers
    ``eomsg-origin`` and ``eomsg-origin-seq``.

    A named tuple, not a frozen dataclass like the other values: one is made for every
    message a link carries, at both ends, and a tuple costs a third as much to make;
    its fields are also its wire form, in order (:class:`~eomsg.wire.link_events.Transfer`).
    Where it came from travels as two fields, not as headers: a message with none of
    its own then costs no headers to send, check or store."""

    seq: int
    topic: str
    payload: bytes
    id: str | None
    ttl: float | None
    headers: dict[str, str]
    targets: tuple[str, ...]
    origin: str
    origin_seq: str

    def all_headers(self) -> dict[str, str]:
        """Its headers with where it came from: what a consumer here sees."""
        return {**self.headers, ORIGIN: self.origin, ORIGIN_SEQ: self.origin_seq}

    @property
    def log_headers(self) -> str:
        """:meth:`all_headers` as the log keeps them (JSON, as :func:`headers_json`)."""
        if self.headers:
            return headers_json(self.all_headers())
        return _from_origin(self.origin) + _quote(self.origin_seq) + "}"


@dataclass(frozen=True, slots=True)
class Batch:
    """The messages of one frame a link carries, as columns: what the sender reads from
    its log turns into a frame without a value made per message, and packs as a few
    lists (a link carries every message through here, and the sending node's core is
    what limits a link). :meth:`carried` gives them as :class:`Carried`.

    Columns whose values are all alike are sent once: ``ttls`` None when no message has
    a time to live, ``headers`` None when none has headers, ``sources`` None when every
    message was first published on ``origin`` (the sender) with its seq there (else, per
    message, ``(origin, origin_seq)`` or None for that default). ``routes`` are the
    target lists of the frame's messages and ``route_of`` each message's index among them
    (None: all have the first)."""

    origin: str
    seqs: tuple[int, ...]
    topics: tuple[str, ...]
    payloads: tuple[bytes, ...]
    ids: tuple[str | None, ...]
    ttls: tuple[float | None, ...] | None
    headers: tuple[dict[str, str], ...] | None
    sources: tuple[tuple[str, str] | None, ...] | None
    routes: tuple[tuple[str, ...], ...]
    route_of: tuple[int, ...] | None

    def __len__(self) -> int:
        return len(self.seqs)

    def carried(self) -> tuple[Carried, ...]:
        """The messages one by one (for the receiving node)."""
        n = len(self.seqs)
        targets = (
            repeat(self.routes[0], n)
            if self.route_of is None
            else map(self.routes.__getitem__, self.route_of)
        )
        if self.sources is None:
            origins: Iterable[str] = repeat(self.origin, n)
            origin_seqs: Iterable[str] = map(str, self.seqs)
        else:
            pairs = [
                (self.origin, str(seq)) if s is None else s
                for seq, s in zip(self.seqs, self.sources, strict=True)
            ]
            origins, origin_seqs = [p[0] for p in pairs], [p[1] for p in pairs]
        return tuple(
            map(
                Carried,
                self.seqs,
                self.topics,
                self.payloads,
                self.ids,
                repeat(None, n) if self.ttls is None else self.ttls,
                [{} for _ in range(n)] if self.headers is None else self.headers,
                targets,
                origins,
                origin_seqs,
            )
        )

    def split(self) -> tuple[Batch, Batch]:
        """Its first half and the rest (for a frame too large for the peer)."""
        half = len(self.seqs) // 2

        def cut(part: slice) -> Batch:
            return Batch(
                self.origin,
                self.seqs[part],
                self.topics[part],
                self.payloads[part],
                self.ids[part],
                None if self.ttls is None else self.ttls[part],
                None if self.headers is None else self.headers[part],
                None if self.sources is None else self.sources[part],
                self.routes,
                None if self.route_of is None else self.route_of[part],
            )

        return cut(slice(None, half)), cut(slice(half, None))

    @classmethod
    def of(cls, messages: Sequence[Carried]) -> Batch:
        """The columns of these messages (a frame's worth, at least one): for a frame
        made from values rather than from log rows — the tests', a tool's."""
        origin = messages[0].origin
        routes = list(dict.fromkeys(m.targets for m in messages))
        index = {r: i for i, r in enumerate(routes)}
        sources = tuple(
            None if (m.origin, m.origin_seq) == (origin, str(m.seq)) else (m.origin, m.origin_seq)
            for m in messages
        )
        return cls(
            origin,
            tuple(m.seq for m in messages),
            tuple(m.topic for m in messages),
            tuple(m.payload for m in messages),
            tuple(m.id for m in messages),
            None if all(m.ttl is None for m in messages) else tuple(m.ttl for m in messages),
            tuple(m.headers for m in messages) if any(m.headers for m in messages) else None,
            None if sources.count(None) == len(sources) else sources,
            tuple(routes),
            None if len(routes) == 1 else tuple(index[m.targets] for m in messages),
        )
