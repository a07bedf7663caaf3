"""Messages and what publishing or consuming one returns: immutable values, no
behaviour."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, NamedTuple, Protocol

from eomsg.errors import InvalidInput

Key = tuple[int, int]
"""A delivery: ``(seq, attempt)`` (:attr:`Delivered.key`)."""


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
    keeps — exactly what ``json.dumps`` makes of them, at under half its cost (every
    message from a linked node has headers: where it came from)."""
    return "{" + ", ".join([_quote(k) + ": " + _quote(v) for k, v in headers.items()]) + "}"


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


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message to publish. ``ttl`` is in seconds; ``id`` makes the publish idempotent."""

    topic: str
    payload: bytes
    id: str | None = None
    ttl: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


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
    it). ``ttl`` is what remained of its time to live when it was sent.

    A named tuple, not a frozen dataclass like the other values: one is made for every
    message a link carries, at both ends, and a tuple costs a third as much to make;
    its fields are also its wire form, in order (:class:`~eomsg.wire.events.Transfer`)."""

    seq: int
    topic: str
    payload: bytes
    id: str | None
    ttl: float | None
    headers: dict[str, str]
    targets: tuple[str, ...]
