"""The events of the wire protocol: frozen values, and their strict msgpack shape.

Each frame body is a msgpack array ``[type, field, …]``. Decoding checks every field's
type and every length, so an event that leaves this module is well formed: the server and
the client never look at raw msgpack. Anything else raises :class:`RemoteProtocolError`.

Client → node: Hello, Publish, Fetch, Subscribe, Cancel, Delete, Release, Call, FlowAck,
Ping, Pong, Goodbye. Node → client: Welcome, Published, Deliver, Deleted, Result, Error,
FlowChanged, Unbound, Ping, Pong, Goodbye. Linked nodes' own events are in
:mod:`eomsg.wire.link_events` (they also say Ping, Pong and Goodbye); the frame's shape and
the field checks in :mod:`eomsg.wire.codec`; :data:`EVENT_TYPES` here holds both
protocols' events, as one stream may carry either. A request carries a request id
(``rid``) chosen by the client, unique among its requests in flight; the reply carries
the same id, so requests can be pipelined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, ClassVar

from eomsg.core.columns import Columns
from eomsg.core.limits import DEFAULT_MAX_FRAME
from eomsg.core.message import Delivered, Deliveries, Key, Message, Outgoing, PublishResult
from eomsg.errors import RemoteProtocolError
from eomsg.wire import link_events as lev
from eomsg.wire.codec import (
    ITEM_OVERHEAD,
    MAX_NAME,
    Event,
    _bad,
    _bool,
    _bytes,
    _fields,
    _frame_limit,
    _headers,
    _headers_bound,
    _int,
    _list,
    _num,
    _opt_int,
    _opt_num,
    _opt_str,
    _plain,
    _str,
)

PROTOCOL_VERSION = 5  # 5: the hello says the client's frame limit; a Result may continue

# -- the client's events ----------------------------------------------------------------


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


def message_bound(m: Message | Outgoing) -> int:
    """At most the bytes ``m`` takes in a Publish or Deliver frame: its payload, its text
    counted at 4 bytes a character (UTF-8 never takes more), and the framing of its
    fields. A frame's own fields besides its messages take a few KiB at most (a queue
    name of 1024 characters is the largest)."""
    size = len(m.payload) + 4 * (len(m.topic) + len(m.id or "")) + ITEM_OVERHEAD
    if m.headers:
        size += _headers_bound(m.headers)
    return size


def deliveries_bound(deliveries: Deliveries) -> int:
    """At most the bytes ``deliveries`` take in a Deliver frame: the sum of each one's
    :func:`message_bound`, a column at a time."""
    ids = deliveries.ids
    size = (
        sum(map(len, deliveries.payloads))
        + 4 * (sum(map(len, deliveries.topics)) + sum(map(len, filter(None, ids))))
        + ITEM_OVERHEAD * len(ids)
    )
    if deliveries.headers is not None:
        size += sum(_headers_bound(h) for h in deliveries.headers if h)
    return size


def delivery_bounds(deliveries: Deliveries) -> list[int]:
    """Each delivery's :func:`message_bound` (for a take too large for one frame)."""
    headers = deliveries.headers or repeat(None)
    return [
        len(payload)
        + 4 * (len(topic) + len(msg_id or ""))
        + ITEM_OVERHEAD
        + (_headers_bound(h) if h else 0)
        for payload, topic, msg_id, h in zip(
            deliveries.payloads, deliveries.topics, deliveries.ids, headers, strict=False
        )
    ]


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


_NONE = type(None)
_MESSAGES, _DELIVERIES = Columns(Message), Columns(Delivered)


def _plainly_typed(rows: list[Any]) -> tuple[tuple[Any, ...], ...] | None:
    """The columns of a Deliver frame's ``rows`` when every row has the shape a node
    gives it — nine fields: an int seq, a text topic, bytes, an id that is None or text,
    a float publication time, an expiry None or a float, headers None or a map, an int
    attempt and a float deadline, no text over :data:`MAX_NAME` — checked a column at
    a time; else None. (Header maps are checked as they are taken.)"""
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {9}:
        return None
    columns = tuple(zip(*rows, strict=True))
    kinds = [set(map(type, column)) for column in columns]
    topics, ids = columns[1], columns[3]
    if (
        kinds[0] != {int}
        or kinds[1] != {str}
        or kinds[2] != {bytes}
        or not kinds[3] <= {str, _NONE}
        or kinds[4] != {float}
        or not kinds[5] <= {float, _NONE}
        or not kinds[6] <= {dict, _NONE}
        or kinds[7] != {int}
        or kinds[8] != {float}
        or max(map(len, topics)) > MAX_NAME
        or max(map(len, filter(None, ids)), default=0) > MAX_NAME
    ):
        return None
    return columns


def _deliveries(queue: str, epoch: int, rows: list[Any]) -> tuple[Delivered, ...]:
    """The deliveries a Deliver frame's ``rows`` hold, every field checked (the same
    values, or the same error, as decoding each row by itself). Rows of the shape a
    node sends (:func:`_plainly_typed`) are checked and made a column at a time, with
    no call per message: a consumer's connection reads every message through here.
    Any other shape is decoded row by row, which names what is wrong."""
    columns = _plainly_typed(rows) if rows else None
    if columns is None:
        return tuple(map(_delivered(queue, epoch), rows))
    seqs, topics, payloads, ids, published, expires, headers, attempts, deadlines = columns
    n = len(rows)
    maps = [{} for _ in rows] if headers.count(None) == n else list(map(_headers, headers))
    messages = _MESSAGES.make(n, seqs, topics, payloads, ids, published, expires, maps)
    made = _DELIVERIES.make(n, repeat(queue), messages, attempts, deadlines, repeat(epoch))
    return tuple(made)


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
    deliveries: Sequence[Delivered]  # a node sends Deliveries: its columns go as rows
    more: bool = False
    epoch: int = 0
    now: float = 0.0

    def to_wire(self) -> list[Any]:
        d = self.deliveries
        if isinstance(d, Deliveries):
            n = len(d)
            rows: list[Any] = list(
                zip(
                    d.seqs,
                    d.topics,
                    d.payloads,
                    d.ids,
                    d.published,
                    repeat(None, n) if d.expires is None else d.expires,
                    repeat(None, n) if d.headers is None else [h or None for h in d.headers],
                    d.attempts,
                    d.deadlines,
                    strict=True,
                )
            )
        else:
            rows = [[*message_to_wire(x.message), x.attempt, x.deadline] for x in d]
        return [self.TYPE, self.rid, self.queue, rows, self.more, self.epoch, self.now]

    @classmethod
    def from_wire(cls, body: list[Any]) -> Deliver:
        _, rid, queue, rows, more, epoch, now = _fields(body, 6, "deliver")
        queue = _str(queue, "queue")
        epoch = _int(epoch, "epoch")
        deliveries = _deliveries(queue, epoch, _list(rows, "rows"))
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
    return [list(map(_first, keys)), list(map(_second, keys))]


_first, _second = itemgetter(0), itemgetter(1)


def _all_of(values: list[Any], kind: type) -> bool:
    """Whether every one of ``values`` is exactly of type ``kind`` (looked at in one
    pass, no call per value: a frame's columns of seqs, attempts or flags)."""
    return set(map(type, values)) <= {kind}


def _keys(value: object) -> tuple[Key, ...]:
    seqs, attempts = _list(value, "deliveries", 2)
    seqs, attempts = _list(seqs, "seqs"), _list(attempts, "attempts")
    if len(seqs) != len(attempts):
        raise RemoteProtocolError("malformed frame: as many attempts as seqs are needed")
    if not _all_of(seqs, int):
        for s in seqs:
            _int(s, "a seq")
    if not _all_of(attempts, int):
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
        if not _all_of(flags, bool):
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
        lev.LinkHello,
        lev.LinkWelcome,
        lev.Interest,
        lev.Transfer,
        lev.Taken,
        lev.Channel,
        lev.ChannelClose,
        lev.ChannelPause,
        lev.LinkProof,
        lev.Oversize,
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
