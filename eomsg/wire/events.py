"""The events of the wire protocol: frozen values, and their strict msgpack shape.

Each frame body is a msgpack array ``[type, field, …]``. Decoding checks every field's
type and every length, so an event that leaves this module is well formed: the server and
the client never look at raw msgpack. Anything else raises :class:`RemoteProtocolError`.

Client → node: Hello, Publish, Fetch, Subscribe, Cancel, Delete, Release, Call, FlowAck,
Ping, Pong, Goodbye. Node → client: Welcome, Published, Deliver, Deleted, Result, Error,
FlowChanged, Unbound, Ping, Pong, Goodbye. Between linked nodes (the dialling one first):
LinkHello, LinkWelcome, LinkProof, then both ways Interest, Transfer, Oversize, Taken,
Channel, ChannelClose, ChannelPause, Ping, Pong, Goodbye. A request carries a request id
(``rid``) chosen by the client, unique among its requests in flight; the reply carries
the same id, so requests can be pipelined.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from eomsg.core.limits import DEFAULT_MAX_FRAME, MAX_FRAME, MIN_FRAME
from eomsg.core.message import Batch, Delivered, Key, Message, Outgoing, PublishResult
from eomsg.core.routing import Route, Withdraw
from eomsg.errors import RemoteProtocolError

PROTOCOL_VERSION = 5  # 5: the hello says the client's frame limit; a Result may continue
MAX_BATCH = 100_000  # items in one publish, deliver or delete frame
MAX_NAME = 1024  # characters in a name, topic, id, op or error code
MAX_ARGS_DEPTH = 8  # nesting of a Call's arguments or a Result's value


# -- field checks: each returns the value or raises RemoteProtocolError ----------------


def _bad(what: str, value: object) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed frame: {what} must not be {type(value).__name__}")


def _int(value: object, what: str) -> int:
    if type(value) is not int:
        raise _bad(what, value)
    return value


def _opt_int(value: object, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _bool(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise _bad(what, value)
    return value


def _num(value: object, what: str) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _bad(what, value)


def _opt_num(value: object, what: str) -> float | None:
    return None if value is None else _num(value, what)


def _str(value: object, what: str, limit: int = MAX_NAME) -> str:
    if type(value) is not str:
        raise _bad(what, value)
    if len(value) > limit:
        raise RemoteProtocolError(f"malformed frame: {what} is longer than {limit} characters")
    return value


def _opt_str(value: object, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise _bad(what, value)
    return value


def _list(value: object, what: str, limit: int = MAX_BATCH) -> list[Any]:
    if type(value) is not list:
        raise _bad(what, value)
    if len(value) > limit:
        raise RemoteProtocolError(f"malformed frame: more than {limit} items in {what}")
    return value


def _frame_limit(value: object) -> int:
    """A frame limit a peer says: at least :data:`MIN_FRAME` (an error must fit), and
    never taken for more than :data:`MAX_FRAME`."""
    limit = _int(value, "max frame")
    if limit < MIN_FRAME:
        raise RemoteProtocolError(
            f"malformed frame: a frame limit of {limit} bytes is below the {MIN_FRAME} "
            "every end must accept"
        )
    return min(limit, MAX_FRAME)


def _headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise _bad("headers", value)
    for k, v in value.items():
        _str(k, "a header name")
        _str(v, "a header value", 1 << 20)
    return value


def _plain(value: object, depth: int = 0) -> Any:
    """A JSON-like value (None, bool, int, float, str, bytes, list, str-keyed map)."""
    if depth > MAX_ARGS_DEPTH:
        raise RemoteProtocolError(f"malformed frame: values nest deeper than {MAX_ARGS_DEPTH}")
    kind = type(value)
    if value is None or kind in (bool, int, float, str, bytes):
        return value
    if kind is list:
        return [_plain(v, depth + 1) for v in value]  # type: ignore[attr-defined]
    if kind is dict:
        return {_str(k, "a key"): _plain(v, depth + 1) for k, v in value.items()}  # type: ignore[attr-defined]
    raise _bad("a value", value)


def _fields(body: list[Any], n: int, name: str) -> list[Any]:
    if len(body) != n + 1:
        raise RemoteProtocolError(f"malformed frame: {name} has {len(body) - 1} fields, not {n}")
    return body


# -- events -------------------------------------------------------------------------------


class Event(abc.ABC):
    """Base class of every protocol event."""

    __slots__ = ()
    TYPE: ClassVar[int]

    @abc.abstractmethod
    def to_wire(self) -> list[Any]:
        """The frame body: ``[TYPE, field, …]``."""

    @classmethod
    @abc.abstractmethod
    def from_wire(cls, body: list[Any]) -> Event:
        """The event a frame body of this TYPE holds, every field checked."""


@dataclass(frozen=True, slots=True)
class Hello(Event):
    """The client's first frame: protocol version, a name for logs, its token, ``via``:
    the node to reach through this one (None: this one), for a queue that lives there,
    and ``max_frame``: the largest frame it accepts (the node never sends a larger
    one)."""

    TYPE: ClassVar[int] = 1
    version: int
    name: str
    token: str | None = None
    via: str | None = None
    max_frame: int = DEFAULT_MAX_FRAME

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.version, self.name, self.token, self.via, self.max_frame]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Hello:
        if len(body) > 1 and type(body[1]) is int and body[1] != PROTOCOL_VERSION:
            # Said before the shape is looked at: another version's hello has another.
            older = "client" if body[1] < PROTOCOL_VERSION else "node"
            raise RemoteProtocolError(
                f"protocol version {body[1]} is not supported; this node speaks version "
                f"{PROTOCOL_VERSION} (upgrade the {older})"
            )
        _, version, name, token, via, max_frame = _fields(body, 5, "hello")
        return cls(
            _int(version, "version"),
            _str(name, "client name"),
            _opt_str(token, "token"),
            _opt_str(via, "via"),
            _frame_limit(max_frame),
        )


@dataclass(frozen=True, slots=True)
class Welcome(Event):
    """The node accepts the client: its version, id, the largest frame it accepts (the
    client never sends a larger one), its ping interval and the largest payload it
    takes (so a client can refuse one before sending it)."""

    TYPE: ClassVar[int] = 2
    version: int
    node: str
    max_frame: int
    heartbeat: float
    max_payload: int

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.version,
            self.node,
            self.max_frame,
            self.heartbeat,
            self.max_payload,
        ]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Welcome:
        _, version, node, max_frame, heartbeat, max_payload = _fields(body, 5, "welcome")
        return cls(
            _int(version, "version"),
            _str(node, "node"),
            _frame_limit(max_frame),
            _num(heartbeat, "heartbeat"),
            _int(max_payload, "max payload"),
        )


def outgoing_to_wire(m: Outgoing) -> list[Any]:
    """A message to publish in its wire form (see :func:`outgoing_from_wire`)."""
    return [m.topic, m.payload, m.id, m.ttl, m.headers or None]


def outgoing_from_wire(item: object) -> Outgoing:
    """A message to publish from its wire form ``[topic, payload, id, ttl, headers]``."""
    topic, payload, msg_id, ttl, headers = _list(item, "a message", 5)
    # The common case (text topic and id, bytes payload, no ttl or headers) is checked
    # inline: this runs once per published message on the node's event loop.
    if type(topic) is not str or len(topic) > MAX_NAME:
        _str(topic, "topic")
    if type(payload) is not bytes:
        _bytes(payload, "payload")
    if msg_id is not None:
        _str(msg_id, "id")
    return Outgoing(
        topic,
        payload,
        msg_id,
        None if ttl is None else _num(ttl, "ttl"),
        {} if headers is None else _headers(headers),
    )


@dataclass(frozen=True, slots=True)
class Publish(Event):
    """Publish messages atomically; answered by Published once they are durable."""

    TYPE: ClassVar[int] = 3
    rid: int
    messages: tuple[Outgoing, ...]

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.rid,
            [outgoing_to_wire(m) for m in self.messages],
        ]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Publish:
        _, rid, messages = _fields(body, 2, "publish")
        return cls(_int(rid, "rid"), tuple(map(outgoing_from_wire, _list(messages, "messages"))))


def _result(item: object) -> PublishResult:
    seq, msg_id, duplicate, queues = _list(item, "a result", 4)
    return PublishResult(
        _int(seq, "seq"),
        _opt_str(msg_id, "id"),
        _bool(duplicate, "duplicate"),
        _opt_int(queues, "queues"),
    )


@dataclass(frozen=True, slots=True)
class Published(Event):
    """The publish ``rid`` is durable: one result per message, in order."""

    TYPE: ClassVar[int] = 4
    rid: int
    results: tuple[PublishResult, ...]

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.rid,
            [[r.seq, r.id, r.duplicate, r.queues] for r in self.results],
        ]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Published:
        _, rid, results = _fields(body, 2, "published")
        return cls(_int(rid, "rid"), tuple(map(_result, _list(results, "results"))))


@dataclass(frozen=True, slots=True)
class Fetch(Event):
    """Deliver up to ``max`` messages of ``queue``, waiting up to ``wait`` seconds for
    one when the queue has none ready; answered by one Deliver (maybe empty)."""

    TYPE: ClassVar[int] = 5
    rid: int
    queue: str
    max: int
    wait: float = 0.0

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.queue, self.max, self.wait]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Fetch:
        _, rid, queue, max_, wait = _fields(body, 4, "fetch")
        return cls(_int(rid, "rid"), _str(queue, "queue"), _int(max_, "max"), _num(wait, "wait"))


ITEM_OVERHEAD = 96  # bytes of one message's fields in a frame besides its text and payload
FRAME_SLACK = 8 << 10  # room in a frame for its own fields, besides the items it carries


def _headers_bound(headers: Mapping[str, str]) -> int:
    """At most the bytes ``headers`` take in a frame (text at 4 bytes a character)."""
    return sum(4 * (len(k) + len(v)) + 10 for k, v in headers.items())


def message_bound(m: Message | Outgoing) -> int:
    """At most the bytes ``m`` takes in a Publish or Deliver frame: its payload, its text
    counted at 4 bytes a character (UTF-8 never takes more), and the framing of its
    fields. A frame's own fields besides its messages take a few KiB at most (a queue
    name of 1024 characters is the largest)."""
    size = len(m.payload) + 4 * (len(m.topic) + len(m.id or "")) + ITEM_OVERHEAD
    if m.headers:
        size += _headers_bound(m.headers)
    return size


def value_bound(value: object) -> int:
    """At most the bytes plain data (None, bool, int, float, str, bytes, lists and
    str-keyed maps of them) takes in a frame."""
    if isinstance(value, bytes):
        return len(value) + 5
    if isinstance(value, str):
        return 4 * len(value) + 5
    if isinstance(value, list):
        return 5 + sum(map(value_bound, value))
    if isinstance(value, dict):
        return 5 + sum(value_bound(k) + value_bound(v) for k, v in value.items())
    return 9


def message_to_wire(m: Message) -> list[Any]:
    """A logged message as ``[seq, topic, payload, id, published_at, expires_at, headers]``."""
    return [m.seq, m.topic, m.payload, m.id, m.published_at, m.expires_at, m.headers or None]


def message_from_wire(item: object) -> Message:
    """The inverse of :func:`message_to_wire`, checking every field."""
    seq, topic, payload, msg_id, published, expires, headers = _list(item, "a message", 7)
    return Message(
        _int(seq, "seq"),
        _str(topic, "topic"),
        _bytes(payload, "payload"),
        _opt_str(msg_id, "id"),
        _num(published, "published_at"),
        _opt_num(expires, "expires_at"),
        _headers(headers),
    )


def _delivered(queue: str, epoch: int) -> Any:
    def decode(item: object) -> Delivered:
        *message, attempt, deadline = _list(item, "a delivery", 9)
        return Delivered(
            queue,
            message_from_wire(message),
            _int(attempt, "attempt"),
            _num(deadline, "deadline"),
            epoch,
        )

    return decode


@dataclass(frozen=True, slots=True)
class Deliver(Event):
    """Messages of ``queue`` for the Fetch or Subscribe ``rid``, all delivered under
    ``epoch`` (the subscription's flow's; 0 for a Fetch). Each must be deleted or
    released before its deadline, or the queue delivers it again; ``now`` is the node's
    clock when it sent them, so a client on another clock knows how long it has. A
    Fetch's answer may take several frames (each within the frame limit): all but the
    last say ``more``."""

    TYPE: ClassVar[int] = 6
    rid: int
    queue: str
    deliveries: tuple[Delivered, ...]
    more: bool = False
    epoch: int = 0
    now: float = 0.0

    def to_wire(self) -> list[Any]:
        rows = [[*message_to_wire(d.message), d.attempt, d.deadline] for d in self.deliveries]
        return [self.TYPE, self.rid, self.queue, rows, self.more, self.epoch, self.now]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Deliver:
        _, rid, queue, rows, more, epoch, now = _fields(body, 6, "deliver")
        queue = _str(queue, "queue")
        epoch = _int(epoch, "epoch")
        deliveries = tuple(map(_delivered(queue, epoch), _list(rows, "rows")))
        return cls(
            _int(rid, "rid"), queue, deliveries, _bool(more, "more"), epoch, _num(now, "now")
        )


@dataclass(frozen=True, slots=True)
class Subscribe(Event):
    """Bind to ``queue`` as a flow with ``priority`` (seed 002) and have its messages
    pushed as Deliver frames tagged ``rid`` while the flow is active, at most
    ``prefetch`` undeleted at a time. Answered by a Result ``{flow, active, epoch}``;
    later changes come as FlowChanged."""

    TYPE: ClassVar[int] = 7
    rid: int
    queue: str
    prefetch: int
    priority: int = 0

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.queue, self.prefetch, self.priority]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Subscribe:
        _, rid, queue, prefetch, priority = _fields(body, 4, "subscribe")
        return cls(
            _int(rid, "rid"),
            _str(queue, "queue"),
            _int(prefetch, "prefetch"),
            _int(priority, "priority"),
        )


def _keys_to_wire(keys: tuple[Key, ...]) -> list[list[int]]:
    """Deliveries as two parallel lists, ``[seqs, attempts]``: cheaper to pack and check
    than a list of pairs."""
    return [[k[0] for k in keys], [k[1] for k in keys]]


def _keys(value: object) -> tuple[Key, ...]:
    seqs, attempts = _list(value, "deliveries", 2)
    seqs, attempts = _list(seqs, "seqs"), _list(attempts, "attempts")
    if len(seqs) != len(attempts):
        raise RemoteProtocolError("malformed frame: as many attempts as seqs are needed")
    for s in seqs:
        _int(s, "a seq")
    for a in attempts:
        _int(a, "an attempt")
    return tuple(zip(seqs, attempts, strict=True))


@dataclass(frozen=True, slots=True)
class Cancel(Event):
    """Stop the subscription ``subscription``. ``seen`` lists the deliveries the client
    handed to its application and did not settle; the node takes back every other
    undeleted one un-counted (it sat in the client's prefetch buffer), and these
    counted."""

    TYPE: ClassVar[int] = 8
    rid: int
    subscription: int
    seen: tuple[Key, ...] = ()

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.subscription, _keys_to_wire(self.seen)]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Cancel:
        _, rid, subscription, seen = _fields(body, 3, "cancel")
        return cls(_int(rid, "rid"), _int(subscription, "subscription"), _keys(seen))


@dataclass(frozen=True, slots=True)
class Delete(Event):
    """Delete the deliveries ``keys`` (``(seq, attempt)``) of ``queue``, made to this
    connection under ``epoch``; answered by Deleted once durable, or by an Error
    (``stale_delivery``, ``stale_epoch``) if one of them is over."""

    TYPE: ClassVar[int] = 9
    rid: int
    queue: str
    keys: tuple[Key, ...]
    epoch: int = 0

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.queue, _keys_to_wire(self.keys), self.epoch]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Delete:
        _, rid, queue, keys, epoch = _fields(body, 4, "delete")
        return cls(_int(rid, "rid"), _str(queue, "queue"), _keys(keys), _int(epoch, "epoch"))


@dataclass(frozen=True, slots=True)
class Deleted(Event):
    """The delete ``rid`` is durable: True per message deleted now, False if it was
    settled already."""

    TYPE: ClassVar[int] = 10
    rid: int
    done: tuple[bool, ...]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, list(self.done)]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Deleted:
        _, rid, done = _fields(body, 2, "deleted")
        flags = _list(done, "done")
        for f in flags:
            _bool(f, "a done flag")
        return cls(_int(rid, "rid"), tuple(flags))


@dataclass(frozen=True, slots=True)
class Release(Event):
    """Give the deliveries ``keys`` made under ``epoch`` back for redelivery after
    ``delay`` seconds. With ``unseen`` the client never handed them to its application:
    the node takes them back un-counted (and ignores those no longer this client's)."""

    TYPE: ClassVar[int] = 11
    rid: int
    queue: str
    keys: tuple[Key, ...]
    delay: float = 0.0
    epoch: int = 0
    unseen: bool = False

    def to_wire(self) -> list[Any]:
        keys = _keys_to_wire(self.keys)
        return [self.TYPE, self.rid, self.queue, keys, self.delay, self.epoch, self.unseen]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Release:
        _, rid, queue, keys, delay, epoch, unseen = _fields(body, 6, "release")
        return cls(
            _int(rid, "rid"),
            _str(queue, "queue"),
            _keys(keys),
            _num(delay, "delay"),
            _int(epoch, "epoch"),
            _bool(unseen, "unseen"),
        )


@dataclass(frozen=True, slots=True)
class Call(Event):
    """Run the node operation ``op`` (queue admin, inspection, settings) with ``args``."""

    TYPE: ClassVar[int] = 12
    rid: int
    op: str
    args: dict[str, Any]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.op, self.args]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Call:
        _, rid, op, args = _fields(body, 3, "call")
        if type(args) is not dict:
            raise _bad("call arguments", args)
        return cls(_int(rid, "rid"), _str(op, "op"), _plain(args))


@dataclass(frozen=True, slots=True)
class Result(Event):
    """The successful answer to the request ``rid`` (a Call, Subscribe, Cancel or
    Release); ``value`` is plain data. An answer that is a list too large for one frame
    takes several: each but the last says ``more``, and the answer is their lists
    joined."""

    TYPE: ClassVar[int] = 13
    rid: int
    value: Any = None
    more: bool = False

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.value, self.more]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Result:
        _, rid, value, more = _fields(body, 3, "result")
        more = _bool(more, "more")
        if more and type(value) is not list:
            raise RemoteProtocolError("malformed frame: only a list answer may continue")
        return cls(_int(rid, "rid"), _plain(value), more)


@dataclass(frozen=True, slots=True)
class Error(Event):
    """The request ``rid`` failed with the eomsg error ``code``; ``rid`` 0 means the
    connection itself failed and the node is closing it."""

    TYPE: ClassVar[int] = 14
    rid: int
    code: str
    message: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.code, self.message]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Error:
        _, rid, code, message = _fields(body, 3, "error")
        return cls(_int(rid, "rid"), _str(code, "code"), _str(message, "message", 1 << 16))


@dataclass(frozen=True, slots=True)
class Ping(Event):
    """Keep-alive: the peer answers with a Pong carrying the same nonce."""

    TYPE: ClassVar[int] = 15
    nonce: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.nonce]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Ping:
        return cls(_int(_fields(body, 1, "ping")[1], "nonce"))


@dataclass(frozen=True, slots=True)
class Pong(Event):
    """The answer to a Ping, with the sender's clock when it answered (a client learns
    how the node's clock stands to its own from it)."""

    TYPE: ClassVar[int] = 16
    nonce: int
    now: float = 0.0

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.nonce, self.now]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Pong:
        _, nonce, now = _fields(body, 2, "pong")
        return cls(_int(nonce, "nonce"), _num(now, "now"))


@dataclass(frozen=True, slots=True)
class Goodbye(Event):
    """The sender closes the connection after this frame (it has answered everything it
    will answer)."""

    TYPE: ClassVar[int] = 17
    reason: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.reason]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Goodbye:
        return cls(_str(_fields(body, 1, "goodbye")[1], "reason"))


@dataclass(frozen=True, slots=True)
class FlowChanged(Event):
    """The subscription ``rid``'s flow became active (under a new ``epoch``) or inactive
    (``epoch`` is the one that ended). Resent until the client answers with a FlowAck."""

    TYPE: ClassVar[int] = 18
    rid: int
    flow: int
    active: bool
    epoch: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.flow, self.active, self.epoch]

    @classmethod
    def from_wire(cls, body: list[Any]) -> FlowChanged:
        _, rid, flow, active, epoch = _fields(body, 4, "flowchanged")
        return cls(
            _int(rid, "rid"), _int(flow, "flow"), _bool(active, "active"), _int(epoch, "epoch")
        )


@dataclass(frozen=True, slots=True)
class FlowAck(Event):
    """The client took note of the FlowChanged with these fields."""

    TYPE: ClassVar[int] = 19
    rid: int
    active: bool
    epoch: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.active, self.epoch]

    @classmethod
    def from_wire(cls, body: list[Any]) -> FlowAck:
        _, rid, active, epoch = _fields(body, 3, "flowack")
        return cls(_int(rid, "rid"), _bool(active, "active"), _int(epoch, "epoch"))


@dataclass(frozen=True, slots=True)
class Unbound(Event):
    """The subscription ``rid``'s flow was unbound by the node (an administrator, or its
    queue was deleted): it is inactive, and the subscription is over."""

    TYPE: ClassVar[int] = 20
    rid: int
    flow: int
    reason: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.rid, self.flow, self.reason]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Unbound:
        _, rid, flow, reason = _fields(body, 3, "unbound")
        return cls(_int(rid, "rid"), _int(flow, "flow"), _str(reason, "reason"))


# -- links between nodes -----------------------------------------------------------------

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


EVENT_TYPES: dict[int, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Welcome,
        Publish,
        Published,
        Fetch,
        Deliver,
        Subscribe,
        Cancel,
        Delete,
        Deleted,
        Release,
        Call,
        Result,
        Error,
        Ping,
        Pong,
        Goodbye,
        FlowChanged,
        FlowAck,
        Unbound,
        LinkHello,
        LinkWelcome,
        Interest,
        Transfer,
        Taken,
        Channel,
        ChannelClose,
        ChannelPause,
        LinkProof,
        Oversize,
    )
}


def decode_event(body: object) -> Event:
    """The event a decoded frame body holds; RemoteProtocolError if it is not one."""
    if type(body) is not list or not body or type(body[0]) is not int:
        raise RemoteProtocolError("malformed frame: not an [event type, …] array")
    cls = EVENT_TYPES.get(body[0])
    if cls is None:
        raise RemoteProtocolError(f"malformed frame: unknown event type {body[0]}")
    try:
        return cls.from_wire(body)
    except ValueError as e:  # unpacking a list of the wrong length
        raise RemoteProtocolError(f"malformed frame: {cls.__name__.lower()}: {e}") from e
