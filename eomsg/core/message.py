"""Messages and what publishing or consuming one returns: immutable values, no
behaviour."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, NamedTuple, Protocol

from eomsg.errors import InvalidInput

Key = tuple[int, int]
"""A delivery: ``(seq, attempt)`` (:attr:`Delivered.key`)."""

ORIGIN = "eomsg-origin"  # the header naming the node a message was first published on
ORIGIN_SEQ = "eomsg-origin-seq"  # … and its sequence there


def check_keys(keys: Iterable[Key]) -> tuple[Key, ...]:
    """Deliveries as ``(seq, attempt)`` pairs of ints; InvalidInput for anything else,
    before anything is sent or changed."""
    out = tuple(keys)
    for key in out:
        if type(key) is not tuple or len(key) != 2 or not all(type(x) is int for x in key):
            raise InvalidInput(
                f"a delivery is named by (seq, attempt), as Delivered.key gives it, not {key!r}"
            )
    return out


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


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The acknowledgement of a publish: durable once returned. ``duplicate`` says the id
    was already published and ``seq`` is the original's; ``queues`` counts the queues it
    was routed to (None for a duplicate)."""

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
    its fields are also its wire form, in order (:class:`~eomsg.wire.events.Transfer`).
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
