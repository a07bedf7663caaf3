"""The asyncio client: one connection to a node, requests pipelined over it.

Publishes and deletes made one message at a time are gathered into batch frames: each
call adds to an outbox, and the outbox goes out as one frame on the next turn of the
event loop, so a producer that does not wait for each acknowledgement gets batching for
free. A result resolves only when the node has committed it.

The synchronous :class:`~eomsg.client.sync.Client` runs this client on a thread of its
own, so both flavours share every rule here.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import functools
import itertools
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from eomsg.client.prefetch import Prefetch
from eomsg.core.election import FlowEvent
from eomsg.core.limits import Limits, check_outgoing
from eomsg.core.message import Delivered, Key, Message, Outgoing, PublishResult, check_keys
from eomsg.core.operations import Operation, Operations
from eomsg.errors import (
    EomsgError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    StaleDelivery,
    Unavailable,
    Unbound,
    UsageError,
    from_code,
)
from eomsg.wire import events as ev
from eomsg.wire.address import Address, parse_address, socket_path, unix_address
from eomsg.wire.calls import decode_result, encode_args
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
DEFAULT_WINDOW = 10_000  # messages published and not yet acknowledged
FRAME_SLACK = 64 << 10
LEASE = 2.0  # heartbeats a consumer hands out messages for without hearing the node


class Completion(Protocol[T_contra]):
    """Where one batched publish or delete's verdict goes: an asyncio future, or the
    synchronous client's :class:`~eomsg.client.sync.Ack`."""

    def done(self) -> bool: ...
    def set_result(self, value: T_contra, /) -> None: ...
    def set_exception(self, error: BaseException, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Pushed:
    """Deliveries a node pushed to a subscription (none: nothing is ready for it now),
    and the node's clock when it sent them."""

    deliveries: list[Delivered]
    node_now: float


Item = Pushed | FlowEvent | BaseException
"""What a subscription's sink receives, in wire order: deliveries, a change of its
flow's activity, or the error that ended it."""


class Renew(enum.Enum):
    """What a consumer's buffer says when it may hand nothing out before the node has
    been heard from again."""

    LEASE = "lease"


def resolve(target: str | Path) -> Address:
    """``unix://…`` and ``tcp://…`` as given; anything else is a data directory, whose
    node listens on ``DIR/eomsg.sock``."""
    text = str(target)
    if "://" in text:
        return parse_address(text)
    return unix_address(socket_path(Path(text)))


class Received:
    """A delivered message in a consumer's hands: read it, then :meth:`delete` it (or
    :meth:`release` it to have it delivered again)."""

    __slots__ = ("_settle", "delivered")

    def __init__(self, delivered: Delivered, settle: Callable[[str, Delivered, float | None], Any]):
        self.delivered = delivered
        self._settle = settle

    @property
    def message(self) -> Message:
        return self.delivered.message

    @property
    def seq(self) -> int:
        return self.delivered.message.seq

    @property
    def topic(self) -> str:
        return self.delivered.message.topic

    @property
    def payload(self) -> bytes:
        return self.delivered.message.payload

    @property
    def id(self) -> str | None:
        return self.delivered.message.id

    @property
    def headers(self) -> dict[str, str]:
        return self.delivered.message.headers

    @property
    def attempt(self) -> int:
        return self.delivered.attempt

    @property
    def queue(self) -> str:
        return self.delivered.queue

    @property
    def epoch(self) -> int:
        return self.delivered.epoch

    def delete(self) -> Any:
        """Delete the message from its queue. Returns a future (of the flavour of the
        client) that resolves once the deletion is durable — or fails with StaleDelivery
        (StaleEpoch) if this delivery is over: it timed out and was handed out again, or
        this consumer lost activity since and the message went to another. The
        consumer's exit waits for all of them."""
        return self._settle("delete", self.delivered, None)

    def release(self, delay: float = 0.0) -> Any:
        """Give the message back, to be delivered again after ``delay`` seconds."""
        return self._settle("release", self.delivered, delay)

    def __repr__(self) -> str:
        return f"Received(queue={self.queue!r}, seq={self.seq}, topic={self.topic!r})"


class _Wire(asyncio.Protocol):
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client._receive(data)

    def eof_received(self) -> bool | None:
        self.client._receive(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(Unavailable(f"lost the connection to the node at {self.client.address}"))


class _Subscription:
    def __init__(self, rid: int, queue: str, sink: Callable[[Item], None]):
        self.rid = rid
        self.queue = queue
        self.sink = sink
        self.flow = 0
        self.epoch = 0  # the latest epoch heard of
        self.active = False
        self.bound = False

    def change(self, active: bool, epoch: int) -> None:
        """Apply a change of activity once: resends, and anything older, are ignored."""
        if epoch > self.epoch or (epoch == self.epoch and self.active and not active):
            self.epoch, self.active = epoch, active
            kind = "active" if active else "inactive"
            self.sink(FlowEvent(self.queue, self.flow, kind, active, epoch))


class AsyncClient(Operations):
    """A connection to one node. Make one with :func:`connect_async`."""

    def __init__(self, address: Address, window: int) -> None:
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.conn = Connection(Role.CLIENT)
        self.limits = Limits()
        self.node = ""
        self._transport: asyncio.Transport | None = None
        self._rids = itertools.count(1)
        self._requests: dict[int, tuple[asyncio.Future[Any], list[Delivered] | None]] = {}
        self._subscriptions: dict[int, _Subscription] = {}
        self._window = asyncio.Semaphore(window)
        self._outbox: list[tuple[Outgoing, Completion[PublishResult]]] = []
        self._deletes: dict[tuple[str, int], list[tuple[Key, Completion[bool]]]] = {}
        self._flush_scheduled = False
        self._failed: EomsgError | None = None
        self._welcome: asyncio.Future[ev.Welcome] = self.loop.create_future()
        self._pings: dict[int, tuple[float, asyncio.Future[None]]] = {}  # nonce -> sent
        self._nonces = itertools.count(1)
        self._keeper: asyncio.Task[None] | None = None
        self.heartbeat = 10.0  # the node's, from its Welcome
        # The lease: when this client sent the last ping the node answered (monotonic).
        # Only an answer to its own ping proves the node had its connection then; a
        # frame read late (sent before the node cut it off) proves nothing.
        self.lease_from = 0.0
        self.clock_offset: float | None = None  # the node's clock minus monotonic here

    # -- connecting ----------------------------------------------------------------------

    async def _open(self, name: str, token: str | None, timeout: float) -> None:
        address = self.address
        try:
            if address.is_unix:
                transport, _ = await asyncio.wait_for(
                    self.loop.create_unix_connection(lambda: _Wire(self), address.path), timeout
                )
            else:
                transport, _ = await asyncio.wait_for(
                    self.loop.create_connection(lambda: _Wire(self), address.host, address.port),
                    timeout,
                )
        except (OSError, TimeoutError) as e:
            reason = getattr(e, "strerror", None) or "timed out"
            raise Unavailable(f"no node answers at {address} ({reason})") from e
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send(ev.Hello(ev.PROTOCOL_VERSION, name, token))
        try:
            welcome = await asyncio.wait_for(asyncio.shield(self._welcome), timeout)
        except TimeoutError as e:
            transport.abort()
            raise Unavailable(f"the node at {address} did not answer the handshake") from e
        self.limits = Limits(welcome.max_payload)
        self.node = welcome.node
        self.heartbeat = welcome.heartbeat
        await self.ping()  # the first lease and the node's clock
        self._keeper = self.loop.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        """Ping the node every heartbeat, so the lease stays fresh (and the node hears
        from this client even while it only reads)."""
        with contextlib.suppress(EomsgError):
            while self._failed is None:
                await asyncio.sleep(self.heartbeat)
                await self.ping()

    async def close(self) -> None:
        """Wait for what is in flight, say goodbye and close. Idempotent."""
        self._flush()
        pending = [f for f, _ in self._requests.values()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._transport is not None and not self._transport.is_closing():
            with contextlib.suppress(ProtocolError):
                self._send(ev.Goodbye("client closing"))
            self._transport.close()
        self._lost(Unavailable("the client is closed"))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- publishing ------------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> PublishResult:
        """Publish one message; returns once it is durable on the node."""
        return await (await self.publish_async(topic, payload, id=id, ttl=ttl, headers=headers))

    async def publish_async(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> asyncio.Future[PublishResult]:
        """Queue one message for the next batch frame and return a future for its
        acknowledgement. Waits while the window of unacknowledged messages is full.
        Invalid input raises here, before anything is sent."""
        message = check_outgoing(Outgoing(topic, payload, id, ttl, headers or {}), self.limits)
        self.check_open()
        await self._window.acquire()
        future: asyncio.Future[PublishResult] = self.loop.create_future()
        future.add_done_callback(lambda _: self._window.release())
        self._outbox.append((message, future))
        self._schedule_flush()
        return future

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish messages in order; each frame of the batch commits atomically."""
        return await self.publish_batch_async(messages)

    def publish_batch_async(
        self, messages: Sequence[Outgoing]
    ) -> asyncio.Future[list[PublishResult]]:
        """Send a batch now; the future resolves once all of it is durable."""
        limits = self.limits
        for m in messages:
            check_outgoing(m, limits)
        self.check_open()
        parts = [
            self._request(functools.partial(ev.Publish, messages=chunk))
            for chunk in self._frames(messages)
        ]
        return _concat(self.loop, parts)

    def _frames(self, messages: Sequence[Outgoing]) -> list[tuple[Outgoing, ...]]:
        budget = self.conn.peer_max_frame - FRAME_SLACK
        frames: list[tuple[Outgoing, ...]] = []
        start, size = 0, 0
        for i, m in enumerate(messages):
            n = len(m.payload) + len(m.topic) + 48 + (len(m.id) if m.id else 0)
            if m.headers:
                n += sum(len(k) + len(v) + 8 for k, v in m.headers.items())
            if i > start and (size + n > budget or i - start >= ev.MAX_BATCH):
                frames.append(tuple(messages[start:i]))
                start, size = i, 0
            size += n
        if start < len(messages):
            frames.append(tuple(messages[start:]))
        return frames

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send the outboxes as batch frames (on the loop, once per turn)."""
        self._flush_scheduled = False
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            for chunk in self._frames([m for m, _ in outbox]):
                waiting = outbox[: len(chunk)]
                del outbox[: len(chunk)]
                self._send_publish(chunk, [f for _, f in waiting])
        if self._deletes:
            deletes, self._deletes = self._deletes, {}
            for (queue, epoch), items in deletes.items():
                for i in range(0, len(items), ev.MAX_BATCH):
                    part = items[i : i + ev.MAX_BATCH]
                    self._send_delete(queue, epoch, part)

    def enqueue(
        self,
        publishes: Iterable[tuple[Outgoing, Completion[PublishResult]]],
        deletes: Iterable[tuple[str, Key, int, Completion[bool]]],
    ) -> None:
        """On the loop: add checked publishes and ``(queue, key, epoch, ·)`` deletes to
        this turn's batch frames, and send them now. Each verdict goes to its
        completion; on a connection that has ended, every one fails at once with
        Unavailable (the reason it ended)."""
        for item in publishes:
            self._outbox.append(item)
        for queue, key, epoch, done in deletes:
            self._deletes.setdefault((queue, epoch), []).append((key, done))
        if self._failed is not None:
            self._lost(self._failed)
        else:
            self._flush()

    def _send_publish(
        self, chunk: tuple[Outgoing, ...], futures: list[Completion[PublishResult]]
    ) -> None:
        self._fan_out(functools.partial(ev.Publish, messages=chunk), futures)

    def _send_delete(
        self, queue: str, epoch: int, items: list[tuple[Key, Completion[bool]]]
    ) -> None:
        keys = tuple(k for k, _ in items)

        def one_by_one() -> None:  # so each message gets its own verdict
            for item in items:
                self._send_delete(queue, epoch, [item])

        self._fan_out(
            lambda rid: ev.Delete(rid, queue, keys, epoch),
            [f for _, f in items],
            on_stale=one_by_one if len(items) > 1 else None,
        )

    def _fan_out(
        self,
        make: Callable[[int], ev.Event],
        futures: Sequence[Any],
        on_stale: Callable[[], None] | None = None,
    ) -> None:
        """Send one batch request; its i-th result (or its error) goes to ``futures[i]``.
        A batch refused as a whole for a stale delivery is handed to ``on_stale``
        instead."""
        try:
            reply = self._request(make)
        except EomsgError as e:
            for f in futures:
                if not f.done():
                    f.set_exception(e)
            return

        def done(r: asyncio.Future[list[Any]]) -> None:
            error = None if r.cancelled() else r.exception()
            if isinstance(error, StaleDelivery) and on_stale is not None and self._failed is None:
                on_stale()
                return
            results = r.result() if error is None else None
            for i, f in enumerate(futures):
                if f.done():
                    continue
                if results is None:
                    f.set_exception(error)
                else:
                    f.set_result(results[i])

        reply.add_done_callback(done)

    # -- consuming -------------------------------------------------------------------------

    async def fetch(
        self, queue: str, max_messages: int = 100, wait: float = 0.0
    ) -> list[Delivered]:
        """Take up to ``max_messages`` from ``queue``, waiting up to ``wait`` seconds
        for the first. Delete (or release) each before its deadline."""
        self.check_open()
        result: list[Delivered] = await self._request(
            lambda rid: ev.Fetch(rid, queue, max_messages, wait), collect=True
        )
        return result

    async def delete(self, queue: str, keys: Sequence[Key], *, epoch: int = 0) -> list[bool]:
        """Delete the deliveries ``keys`` (``(seq, attempt)``, :attr:`Delivered.key`)
        made to this client under ``epoch`` (0: fetched without a flow); True for each
        deleted now. Durable on return."""
        return await self.delete_async(queue, keys, epoch=epoch)

    def delete_async(
        self, queue: str, keys: Sequence[Key], *, epoch: int = 0
    ) -> asyncio.Future[list[bool]]:
        self.check_open()
        return self._request(lambda rid: ev.Delete(rid, queue, check_keys(keys), epoch))

    def delete_later(self, queue: str, key: Key, epoch: int = 0) -> asyncio.Future[bool]:
        """Queue the deletion of one delivery for the next batch frame."""
        self.check_open()
        future: asyncio.Future[bool] = self.loop.create_future()
        self._deletes.setdefault((queue, epoch), []).append((key, future))
        self._schedule_flush()
        return future

    async def release(
        self, queue: str, keys: Sequence[Key], delay: float = 0.0, *, epoch: int = 0
    ) -> None:
        """Give deliveries back for redelivery after ``delay`` seconds."""
        self.check_open()
        await self._request(lambda rid: ev.Release(rid, queue, check_keys(keys), delay, epoch))

    async def return_unseen(self, queue: str, keys: Sequence[Key], *, epoch: int = 0) -> None:
        """Give back deliveries never handed to the application: the node un-counts
        them (and ignores those no longer this client's)."""
        self.check_open()
        await self._request(
            lambda rid: ev.Release(rid, queue, check_keys(keys), 0.0, epoch, unseen=True)
        )

    def lease_valid(self) -> bool:
        """Whether the node surely still counts this client as alive: it answered a ping
        this client sent less than :data:`LEASE` heartbeats ago (the node cuts off a
        client it has not heard from for three; the client pings every one)."""
        return time.monotonic() - self.lease_from < LEASE * self.heartbeat

    async def ping(self) -> None:
        """A round trip to the node; once it returns, the lease runs from when the ping
        was sent, and the node's clock is known to within half the round trip. A node
        that does not answer within three heartbeats is taken for gone: Unavailable."""
        self.check_open()
        nonce = next(self._nonces)
        future: asyncio.Future[None] = self.loop.create_future()
        self._pings[nonce] = (time.monotonic(), future)
        try:
            self._send(ev.Ping(nonce))
            await asyncio.wait_for(asyncio.shield(future), 3 * self.heartbeat)
        except TimeoutError:
            error = Unavailable(f"the node at {self.address} did not answer a ping in time")
            self._lost(error)
            raise error from None
        finally:
            self._pings.pop(nonce, None)

    def consumer(
        self,
        queue: str,
        prefetch: int = 256,
        idle_timeout: float | None = None,
        *,
        priority: int = 0,
        on_active: Callable[[FlowEvent], Any] | None = None,
        on_inactive: Callable[[FlowEvent], Any] | None = None,
        until_empty: bool = False,
    ) -> AsyncConsumer:
        """Bind to ``queue`` with ``priority`` and receive its messages while active, at
        most ``prefetch`` undeleted at a time; iteration ends after ``idle_timeout``
        seconds without one (never if None), or with ``until_empty`` as soon as the node
        has nothing ready for this consumer. ``on_active`` / ``on_inactive`` hear each
        change of activity (on the event loop: they must not block)."""
        return AsyncConsumer(
            self, queue, prefetch, idle_timeout, priority, on_active, on_inactive, until_empty
        )

    async def subscribe_raw(
        self, queue: str, prefetch: int, sink: Callable[[Item], None], priority: int = 0
    ) -> int:
        """Bind a flow to ``queue`` and have its messages pushed. ``sink`` gets, on the
        loop and in order: the flow's state at bind (a FlowEvent), each batch, each later
        change of activity, and the error that ends it (after an ``inactive`` event if
        it was active). Returns its id for :meth:`cancel`."""
        self.check_open()
        rid = next(self._rids)
        self._subscriptions[rid] = _Subscription(rid, queue, sink)
        future: asyncio.Future[Any] = self.loop.create_future()
        self._requests[rid] = (future, None)
        try:
            self._send(ev.Subscribe(rid, queue, prefetch, priority))
            await future
        except BaseException:
            self._subscriptions.pop(rid, None)
            raise
        return rid

    async def cancel(self, subscription: int, seen: Sequence[Key] = ()) -> int:
        """Stop a subscription; the node takes back what it delivered and was not
        deleted — counted if listed in ``seen`` (handed to the application), else
        un-counted."""
        self._subscriptions.pop(subscription, None)
        if self._failed is not None:
            return 0
        released: int = await self._request(
            lambda rid: ev.Cancel(rid, subscription, check_keys(seen))
        )
        return released

    # -- administration ------------------------------------------------------------------

    async def run_operation_async(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any:
        """Run a declared operation (:class:`~eomsg.core.operations.Operations`, which
        this client's methods of the same names call) with a Call frame."""
        self.check_open()
        wire_args = encode_args(op, args)
        value = await self._request(lambda rid: ev.Call(rid, op.name, wire_args))
        return decode_result(op, value, RemoteProtocolError)

    # -- the connection --------------------------------------------------------------------

    @property
    def failure(self) -> EomsgError | None:
        """Why the connection ended, or None while it is open."""
        return self._failed

    def check_open(self) -> None:
        """Raise the reason the connection ended, if it has."""
        if self._failed is not None:
            raise self._failed

    def _request(
        self, make: Callable[[int], ev.Event], *, collect: bool = False
    ) -> asyncio.Future[Any]:
        rid = next(self._rids)
        future: asyncio.Future[Any] = self.loop.create_future()
        self._send(make(rid))  # may raise FrameTooLarge, having registered nothing
        self._requests[rid] = (future, [] if collect else None)
        return future

    def _send(self, event: ev.Event) -> None:
        if self._transport is None or self._transport.is_closing():
            raise self._failed or Unavailable(f"not connected to the node at {self.address}")
        self._transport.write(self.conn.send(event))

    def _receive(self, data: bytes) -> None:
        self.conn.receive_data(data)
        while True:
            try:
                event = self.conn.next_event()
            except ProtocolError as e:
                self._lost(RemoteProtocolError(f"the node sent a bad frame: {e.message}"))
                return
            if event is NEED_DATA:
                return
            if event is PEER_CLOSED:
                self._lost(Unavailable(f"the node at {self.address} closed the connection"))
                return
            assert isinstance(event, ev.Event)
            try:
                self._on_event(event)
            except LocalProtocolError as e:
                self._lost(e)
                return

    def _on_event(self, event: ev.Event) -> None:
        match event:
            case ev.Published(rid, results):
                self._resolve(rid, list(results))
            case ev.Deleted(rid, done):
                self._resolve(rid, list(done))
            case ev.Result(rid, value):
                sub = self._subscriptions.get(rid)
                if sub is not None and not sub.bound and isinstance(value, dict):
                    # the bind's answer: the flow's first state, before any change of it
                    sub.bound, sub.flow = True, value.get("flow", 0)
                    active, epoch = bool(value.get("active")), value.get("epoch", 0)
                    sub.epoch, sub.active = epoch, active
                    kind = "active" if active else "inactive"
                    sub.sink(FlowEvent(sub.queue, sub.flow, kind, active, epoch))
                self._resolve(rid, value)
            case ev.FlowChanged(rid, _, active, epoch):
                with contextlib.suppress(EomsgError):
                    self._send(ev.FlowAck(rid, active, epoch))
                sub = self._subscriptions.get(rid)
                if sub is not None:
                    sub.change(active, epoch)
            case ev.Unbound(rid, flow, reason):
                sub = self._subscriptions.pop(rid, None)
                if sub is not None:
                    sub.change(False, sub.epoch)
                    sub.sink(Unbound(f"flow {flow} of queue {sub.queue!r}: {reason}"))
            case ev.Deliver(rid, _, deliveries, more, _, node_now):
                sub = self._subscriptions.get(rid)
                if sub is not None:
                    sub.sink(Pushed(list(deliveries), node_now))
                    return
                entry = self._requests.get(rid)
                if entry is not None and entry[1] is not None:
                    entry[1].extend(deliveries)
                    if not more:
                        self._resolve(rid, entry[1])
            case ev.Error(0, code, message):
                self._lost(from_code(code, message))
            case ev.Error(rid, code, message):
                error = from_code(code, message)
                sub = self._subscriptions.pop(rid, None)
                if sub is not None and rid not in self._requests:
                    sub.change(False, sub.epoch)
                    sub.sink(error)
                    return
                entry = self._requests.pop(rid, None)
                if entry is not None and not entry[0].done():
                    entry[0].set_exception(error)
            case ev.Ping(nonce):
                with contextlib.suppress(EomsgError):
                    self._send(ev.Pong(nonce, time.time()))
            case ev.Pong(nonce, node_now):
                ping = self._pings.pop(nonce, None)
                if ping is not None and not ping[1].done():
                    sent, received = ping[0], time.monotonic()
                    self.lease_from = max(self.lease_from, sent)
                    self.clock_offset = node_now - (sent + received) / 2
                    ping[1].set_result(None)
            case ev.Welcome():
                if not self._welcome.done():
                    self._welcome.set_result(event)
            case ev.Goodbye(reason):
                self._lost(Unavailable(f"the node closed the connection: {reason}"))
            case _:  # TRANSITIONS let it through, so a handler is missing here
                raise LocalProtocolError(
                    f"the client has no handler for {type(event).__name__} "
                    f"in state {self.conn.state.value}"
                )

    def _resolve(self, rid: int, value: Any) -> None:
        entry = self._requests.pop(rid, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(value)

    def _lost(self, error: EomsgError) -> None:
        """The connection is over: fail everything still waiting, once. Requests in
        flight get Unavailable, whatever ended the connection: they may or may not
        have taken effect (retry idempotently); subscriptions get the cause itself."""
        if self._failed is None:
            self._failed = error
        unknown = (
            error
            if isinstance(error, Unavailable)
            else Unavailable(
                f"{error.message} (a request in flight may or may not have taken effect: "
                "retry it with the same ids)"
            )
        )
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if not self._welcome.done():
            self._welcome.set_exception(error)
            self._welcome.exception()  # retrieved: no "never retrieved" warning
        requests, self._requests = self._requests, {}
        for future, _ in requests.values():
            if not future.done():
                future.set_exception(unknown)
        pings, self._pings = self._pings, {}
        for _, pong in pings.values():
            if not pong.done():
                pong.set_exception(error)
        if self._keeper is not None:
            self._keeper.cancel()
        outbox, self._outbox = self._outbox, []
        for _, f in outbox:
            if not f.done():
                f.set_exception(unknown)
        deletes, self._deletes = self._deletes, {}
        for items in deletes.values():
            for _, d in items:
                if not d.done():
                    d.set_exception(unknown)
        subscriptions, self._subscriptions = self._subscriptions, {}
        for sub in subscriptions.values():
            # Seed 002: cut off from the node, the consumer is no longer active — say so
            # now rather than wait for a node that cannot tell it.
            sub.change(False, sub.epoch)
            sub.sink(error)


def _concat(
    loop: asyncio.AbstractEventLoop, parts: list[asyncio.Future[list[T]]]
) -> asyncio.Future[list[T]]:
    """One future for the concatenated results of ``parts`` (the first error wins)."""
    out: asyncio.Future[list[T]] = loop.create_future()
    if not parts:
        out.set_result([])
        return out
    left = [len(parts)]

    def done(_: asyncio.Future[list[T]]) -> None:
        left[0] -= 1
        if out.done():
            return
        for p in parts:
            if p.done() and not p.cancelled() and p.exception() is not None:
                out.set_exception(p.exception())  # type: ignore[arg-type]
                return
        if left[0] == 0:
            out.set_result([r for p in parts for r in p.result()])

    for p in parts:
        p.add_done_callback(done)
    return out


class Activity:
    """The activity of a consumer's flow as its application sees it (seed 002), fed the
    FlowEvents of the subscription in order. ``dispatch`` runs the application's
    callbacks — on the loop for the asyncio consumer, on a thread of their own for the
    synchronous one, so a slow callback never stalls the connection."""

    __slots__ = ("_dispatch", "_on_active", "_on_inactive", "active", "epoch", "flow")

    def __init__(
        self,
        on_active: Callable[[FlowEvent], Any] | None,
        on_inactive: Callable[[FlowEvent], Any] | None,
        dispatch: Callable[[Callable[[FlowEvent], Any], FlowEvent], None],
    ) -> None:
        self.flow = 0
        self.active = False
        self.epoch = 0
        self._on_active = on_active
        self._on_inactive = on_inactive
        self._dispatch = dispatch

    @property
    def has_callbacks(self) -> bool:
        return self._on_active is not None or self._on_inactive is not None

    def apply(self, event: FlowEvent) -> None:
        self.flow, self.active, self.epoch = event.flow, event.active, event.epoch
        callback = self._on_active if event.active else self._on_inactive
        if callback is not None:
            self._dispatch(callback, event)

    def current(self, d: Delivered) -> bool:
        """False for a delivery of an epoch that is over: the node took it back when the
        flow lost activity, and the active flow gets it; the application must not."""
        return self.active and d.epoch == self.epoch


class BaseConsumer(abc.ABC):
    """What both flavours of consumer share: the binding's settings, the activity of its
    flow, its prefetch buffer (see :mod:`eomsg.client.prefetch`), and how the items of
    its inbox are read. The flavours differ only in how they wait for the next item,
    renew their lease and settle a message."""

    def __init__(
        self,
        queue: str,
        prefetch: int,
        idle_timeout: float | None,
        priority: int,
        until_empty: bool,
        activity: Activity,
    ) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self.idle_timeout = idle_timeout
        self.priority = priority
        self.until_empty = until_empty
        self.activity = activity
        self._batch: list[Delivered] = []
        self._subscription: int | None = None
        self._buffer = Prefetch()
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_due = float("inf")  # monotonic time the timer fires at

    @property
    def active(self) -> bool:
        """Whether this consumer's flow is active (False once the connection is lost)."""
        return self.activity.active

    @property
    def epoch(self) -> int:
        return self.activity.epoch

    @property
    def flow(self) -> int:
        return self.activity.flow

    @property
    @abc.abstractmethod
    def _connection(self) -> AsyncClient:
        """The asyncio client this consumer's subscription lives on."""

    def _check_bound(self) -> None:
        if self._subscription is None:
            raise UsageError(
                f"the consumer of {self.queue!r} is not open: use it in a `with` block "
                "(or call open()) before iterating"
            )

    def _next_buffered(self) -> Delivered | Renew | None:
        """The next buffered delivery the application may have now (it counts as seen),
        None when the buffer is empty, or :attr:`Renew.LEASE` when the lease must be
        renewed first (the node may have cut this consumer off: ask it before handing
        anything out).
        Skips deliveries of an epoch that is over (the node took them back for the
        active flow), superseded ones and those too close to their deadline."""
        while self._batch:
            d = self._batch[-1]
            if not self.activity.current(d):
                self._batch.pop()
                continue
            if not self._connection.lease_valid():
                return Renew.LEASE
            self._batch.pop()
            if self._buffer.claim(d, time.monotonic()):
                return d
        return None

    def _step(self, item: Item) -> FlowEvent | bool:
        """Take one inbox item: raise the error that ended the subscription, return a
        change of activity to hand out, True to read on, or False to stop (an
        ``until_empty`` consumer told that nothing is ready for it)."""
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, FlowEvent):
            return item
        if not item.deliveries:
            return not self.until_empty
        self._batch = item.deliveries
        self._batch.reverse()
        return True

    def _on_loop(self, item: Item) -> None:
        """On the connection's loop, as each item arrives: note pushed deliveries in the
        buffer and arm the timer that gives back those not handed out in time; forget
        the buffer when the node took it back."""
        if isinstance(item, Pushed):
            if item.deliveries:
                self._buffer.arrived(
                    item.deliveries,
                    item.node_now,
                    time.monotonic(),
                    self._connection.clock_offset,
                )
                self._arm()
        elif isinstance(item, BaseException) or not item.active:
            self._buffer.drop()

    def _arm(self) -> None:
        due = self._buffer.next_expiry()
        if due >= self._expiry_due:
            return  # none pending, or an earlier timer re-arms itself
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_due = due
        self._expiry = self._connection.loop.call_later(
            max(0.0, due - time.monotonic()), self._expire
        )

    def _expire(self) -> None:
        """Give back, unseen, the deliveries not handed out before their hand-out-by
        time (the node un-counts them and hands them out again)."""
        self._expiry, self._expiry_due = None, float("inf")
        late = self._buffer.expire(time.monotonic())
        client = self._connection
        if late and client._failed is None and self._subscription is not None:
            epoch = self.activity.epoch
            task = client.loop.create_task(client.return_unseen(self.queue, late, epoch=epoch))
            task.add_done_callback(_ignore_error)
        self._arm()

    def _unseen_on_close(self) -> list[Key]:
        """Stop the expiry timer; the deliveries handed out and not settled (the node
        takes back the rest un-counted)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry, self._expiry_due = None, float("inf")
        return self._buffer.seen()

    @abc.abstractmethod
    def _settle(self, how: str, d: Delivered, delay: float | None) -> Any:
        """Delete or release one received message, as this flavour's client does."""


def _ignore_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a give-back that failed is redelivered by timeout


class AsyncConsumer(BaseConsumer):
    """``async with client.consumer(queue) as consumer: async for msg in consumer``."""

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        prefetch: int,
        idle_timeout: float | None,
        priority: int = 0,
        on_active: Callable[[FlowEvent], Any] | None = None,
        on_inactive: Callable[[FlowEvent], Any] | None = None,
        until_empty: bool = False,
    ) -> None:
        activity = Activity(on_active, on_inactive, lambda fn, e: fn(e))
        super().__init__(queue, prefetch, idle_timeout, priority, until_empty, activity)
        self.client = client
        self._inbox: asyncio.Queue[Item] = asyncio.Queue()
        self._became_active = asyncio.Event()
        self._pending: set[asyncio.Future[Any]] = set()

    @property
    def _connection(self) -> AsyncClient:
        return self.client

    async def wait_active(self, timeout: float | None = None) -> bool:
        """Wait until the flow is active; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._became_active.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _sink(self, item: Item) -> None:
        self._on_loop(item)
        if isinstance(item, FlowEvent):
            self.activity.apply(item)
            if item.active:
                self._became_active.set()
            else:
                self._became_active.clear()
        self._inbox.put_nowait(item)

    async def __aenter__(self) -> AsyncConsumer:
        self._subscription = await self.client.subscribe_raw(
            self.queue, self.prefetch, self._sink, self.priority
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Wait until every deletion made through this consumer is durable, then unbind
        (undeleted messages go back to the queue, for the next active flow; those never
        handed out un-counted)."""
        self.client._flush()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        seen = self._unseen_on_close()
        if self._subscription is not None:
            with contextlib.suppress(EomsgError):
                await self.client.cancel(self._subscription, seen)
            self._subscription = None

    def __aiter__(self) -> AsyncIterator[Received]:
        self._check_bound()
        return self._messages()

    async def _messages(self) -> AsyncIterator[Received]:
        async for item in self.events():
            if isinstance(item, Received):
                yield item

    async def events(self) -> AsyncIterator[Received | FlowEvent]:
        """Messages and changes of activity, in the order the node sent them."""
        self._check_bound()
        while True:
            while (d := self._next_buffered()) is not None:
                if d is Renew.LEASE:
                    with contextlib.suppress(EomsgError):  # lost: the activity says so
                        await self.client.ping()
                    continue
                yield Received(d, self._settle)
            try:
                item = await asyncio.wait_for(self._inbox.get(), self.idle_timeout)
            except TimeoutError:
                return
            step = self._step(item)
            if step is False:
                return
            if isinstance(step, FlowEvent):
                yield step

    def _settle(self, how: str, d: Delivered, delay: float | None) -> asyncio.Future[Any]:
        self._buffer.settled(d.key)
        future: asyncio.Future[Any]
        if how == "delete":
            future = self.client.delete_later(self.queue, d.key, d.epoch)
        else:
            future = asyncio.ensure_future(
                self.client.release(self.queue, [d.key], delay or 0.0, epoch=d.epoch)
            )
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future


async def connect_async(
    target: str | Path | None = None,
    *,
    token: str | None = None,
    name: str | None = None,
    timeout: float = 10.0,
    window: int = DEFAULT_WINDOW,
) -> AsyncClient:
    """Connect to the node at ``target``: a data directory, ``unix://PATH`` or
    ``tcp://HOST:PORT`` (default: env ``EOMSG_BROKER``, else ``./eomsg-data``). TCP
    needs the node's token (``token=`` or env ``EOMSG_TOKEN``)."""
    address = resolve(target or os.environ.get("EOMSG_BROKER") or "eomsg-data")
    client = AsyncClient(address, window)
    await client._open(
        name or f"python:{os.getpid()}", token or os.environ.get("EOMSG_TOKEN"), timeout
    )
    return client
