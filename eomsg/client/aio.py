"""The asyncio client: one connection to a node, requests pipelined over it.

Publishes and deletes made one message at a time are gathered into batch frames: each
call adds to an outbox, and the outbox goes out as one frame on the next turn of the
event loop, so a producer that does not wait for each acknowledgement gets batching for
free. A result resolves only when the node has committed it.

Frames: the client's hello says it accepts :data:`~eomsg.core.limits.MAX_FRAME`, so
whatever the node holds can reach it; what it sends is split to fit the frame limit the
node's welcome said (a batch goes in as many Publish frames as it needs). Nothing it runs
on its loop fails unobserved: a request's failure is its caller's, and the connection's
reaches every request and subscription on it.

The synchronous :class:`~eomsg.client.sync.Client` runs this client on a thread of its
own, so both flavours share every rule here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar

from eomsg.client.completion import Completion, concat
from eomsg.client.consumer import AsyncConsumer, Item, Pushed
from eomsg.client.subscription import Subscription
from eomsg.core.durations import ttl_seconds
from eomsg.core.election import FlowEvent
from eomsg.core.limits import MAX_FRAME, Limits, check_outgoing
from eomsg.core.message import Delivered, Key, Outgoing, PublishResult, check_keys
from eomsg.core.operations import Operation, Operations
from eomsg.errors import (
    EomsgError,
    FrameTooLarge,
    InvalidConfig,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    StaleDelivery,
    Unavailable,
    Unbound,
    from_code,
)
from eomsg.transport.address import Address, parse_address, socket_path, unix_address
from eomsg.transport.tls import ClientTls, tls_refused
from eomsg.wire import events as ev
from eomsg.wire.calls import decode_result, encode_args
from eomsg.wire.codec import FRAME_SLACK, MAX_BATCH, Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role

DEFAULT_WINDOW = 10_000  # messages published and not yet acknowledged
LEASE = 2.0  # heartbeats a consumer hands out messages for without hearing the node
_first, _second, _queue_epoch = itemgetter(0), itemgetter(1), itemgetter(0, 2)


def resolve(target: str | Path) -> Address:
    """``unix://…`` and ``tcp://…`` as given; anything else is a data directory, whose
    node listens on ``DIR/eomsg.sock``."""
    text = str(target)
    if "://" in text:
        return parse_address(text)
    return unix_address(socket_path(Path(text)))


class _Wire(asyncio.Protocol):
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client._receive(data)

    def eof_received(self) -> bool | None:
        self.client._receive(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        client = self.client
        if isinstance(exc, ssl.SSLError):
            client._lost(tls_refused(f"the node at {client.address}", exc))
        elif not client._welcome.done():
            client._lost(client._closed_early())
        else:
            client._lost(Unavailable(f"lost the connection to the node at {client.address}"))


class AsyncClient(Operations):
    """A connection to one node. Make one with :func:`connect_async`."""

    def __init__(self, address: Address, window: int) -> None:
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.conn = Connection(Role.CLIENT, MAX_FRAME)
        self.limits = Limits()
        self.node = ""
        self._transport: asyncio.Transport | None = None
        self._rids = itertools.count(1)
        # rid -> (its future, what its answer's frames brought so far: the deliveries of
        # a Fetch, the items of a Result that continues; None while nothing is collected)
        self._requests: dict[int, tuple[asyncio.Future[Any], list[Any] | None]] = {}
        self._subscriptions: dict[int, Subscription] = {}
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

    async def _open(
        self,
        name: str,
        token: str | None,
        timeout: float,
        tls: ClientTls | None,
        via: str | None = None,
    ) -> None:
        address = self.address
        try:
            if address.is_unix:
                transport, _ = await asyncio.wait_for(
                    self.loop.create_unix_connection(lambda: _Wire(self), address.path), timeout
                )
            else:
                context = None
                if address.is_tls:
                    context = (tls or ClientTls.from_env()).context()
                transport, _ = await asyncio.wait_for(
                    self.loop.create_connection(
                        lambda: _Wire(self),
                        address.host,
                        address.port,
                        ssl=context,
                        server_hostname=address.host if context is not None else None,
                    ),
                    timeout,
                )
        except ssl.SSLError as e:
            raise tls_refused(f"the node at {address}", e) from e
        except (OSError, TimeoutError) as e:
            reason = getattr(e, "strerror", None) or "timed out"
            raise Unavailable(f"no node answers at {address} ({reason})") from e
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._send(ev.Hello(ev.PROTOCOL_VERSION, name, token, via, self.conn.max_frame))
        except Unavailable:
            raise self._failed or self._closed_early() from None
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
        self._keeper.add_done_callback(self._keeper_ended)

    async def _keep_alive(self) -> None:
        """Ping the node every heartbeat, so the lease stays fresh (and the node hears
        from this client even while it only reads). A ping not answered in time ends
        the connection (:meth:`ping`)."""
        with contextlib.suppress(EomsgError):
            while self._failed is None:
                await asyncio.sleep(self.heartbeat)
                await self.ping()

    def _keeper_ended(self, task: asyncio.Task[None]) -> None:
        """The keep-alive never fails unobserved: what ended it ends the connection."""
        if not task.cancelled() and (error := task.exception()) is not None:
            self._lost(EomsgError(f"the client's keep-alive failed: {error!r}"))

    async def close(self) -> None:
        """Wait for what is in flight, say goodbye and close. Idempotent."""
        self.flush()
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
        ttl: float | str | None = None,
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
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> asyncio.Future[PublishResult]:
        """Queue one message for the next batch frame and return a future for its
        acknowledgement. Waits while the window of unacknowledged messages is full.
        Invalid input raises here, before anything is sent."""
        message = check_outgoing(
            Outgoing(topic, payload, id, ttl_seconds(ttl), headers or {}), self.limits
        )
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
        """Send a batch now; the future resolves once all of it is durable. Invalid
        input raises here, before anything is sent."""
        limits = self.limits
        for m in messages:
            check_outgoing(m, limits)
        return self.send_checked(messages)

    def send_checked(self, messages: Sequence[Outgoing]) -> asyncio.Future[list[PublishResult]]:
        """:meth:`publish_batch_async` of messages already checked against
        :attr:`limits` (``check_outgoing``) — by the synchronous client, in its caller's
        thread — so that each is checked once on its way."""
        self.check_open()
        parts = [
            self._request(functools.partial(ev.Publish, messages=chunk))
            for chunk in self._frames(messages)
        ]
        return concat(self.loop, parts)

    def _frames(self, messages: Sequence[Outgoing]) -> list[tuple[Outgoing, ...]]:
        """``messages`` in runs that each fit a Publish frame the node accepts (one
        message that fits none alone: the node's frame limit cannot carry it)."""
        budget = self.conn.peer_max_frame - FRAME_SLACK
        frames: list[tuple[Outgoing, ...]] = []
        start, size = 0, 0
        for i, m in enumerate(messages):
            n = ev.message_bound(m)
            if i > start and (size + n > budget or i - start >= MAX_BATCH):
                frames.append(tuple(messages[start:i]))
                start, size = i, 0
            size += n
        if start < len(messages):
            frames.append(tuple(messages[start:]))
        return frames

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """On the loop: send what the outboxes hold now as batch frames (done by itself
        once per loop turn after a publish_async or delete_later)."""
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
                for i in range(0, len(items), MAX_BATCH):
                    part = items[i : i + MAX_BATCH]
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
        self._outbox.extend(publishes)
        for (queue, epoch), group in itertools.groupby(deletes, _queue_epoch):
            items = self._deletes.setdefault((queue, epoch), [])
            items.extend((key, done) for _, key, _, done in group)
        if self._failed is not None:
            self._lost(self._failed)
        else:
            self.flush()

    def _send_publish(
        self, chunk: tuple[Outgoing, ...], futures: list[Completion[PublishResult]]
    ) -> None:
        self._fan_out(functools.partial(ev.Publish, messages=chunk), futures)

    def _send_delete(
        self, queue: str, epoch: int, items: list[tuple[Key, Completion[bool]]]
    ) -> None:
        keys = tuple(map(_first, items))

        def one_by_one() -> None:  # so each message gets its own verdict
            for item in items:
                self._send_delete(queue, epoch, [item])

        self._fan_out(
            lambda rid: ev.Delete(rid, queue, keys, epoch),
            list(map(_second, items)),
            on_stale=one_by_one if len(items) > 1 else None,
        )

    def _fan_out(
        self,
        make: Callable[[int], Event],
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
            if error is not None:
                for f in futures:
                    if not f.done():
                        f.set_exception(error)
                return
            for f, result in zip(futures, r.result(), strict=True):
                if not f.done():
                    f.set_result(result)

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

    async def ping(self) -> float:
        """A round trip to the node, in seconds; once it returns, the lease runs from when
        the ping was sent, and the node's clock is known to within half the round trip. A
        node that does not answer within three heartbeats is taken for gone: Unavailable."""
        self.check_open()
        nonce = next(self._nonces)
        future: asyncio.Future[None] = self.loop.create_future()
        sent = time.monotonic()
        self._pings[nonce] = (sent, future)
        try:
            self._send(ev.Ping(nonce))
            await asyncio.wait_for(asyncio.shield(future), 3 * self.heartbeat)
            return time.monotonic() - sent
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
        self._subscriptions[rid] = Subscription(rid, queue, sink)
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
        self, make: Callable[[int], Event], *, collect: bool = False
    ) -> asyncio.Future[Any]:
        rid = next(self._rids)
        future: asyncio.Future[Any] = self.loop.create_future()
        try:
            self._send(make(rid))  # nothing registered if it raises
        except FrameTooLarge as e:  # one message the node's frame limit cannot carry
            raise FrameTooLarge(
                f"{e.message}: the node at {self.address} takes no larger (its eomsg serve "
                "--max-frame)"
            ) from None
        self._requests[rid] = (future, [] if collect else None)
        return future

    def _send(self, event: Event) -> None:
        if self._transport is None or self._transport.is_closing():
            raise self._failed or Unavailable(f"not connected to the node at {self.address}")
        self._transport.writelines(self.conn.send_parts(event))

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
                if self._welcome.done():
                    self._lost(Unavailable(f"the node at {self.address} closed the connection"))
                else:
                    self._lost(self._closed_early())
                return
            assert isinstance(event, Event)
            try:
                self._on_event(event)
            except LocalProtocolError as e:
                self._lost(e)
                return

    def _on_event(self, event: Event) -> None:
        """Handle one event of the node's, by its type (:attr:`_HANDLERS`)."""
        handler = self._HANDLERS.get(type(event))
        if handler is None:  # TRANSITIONS let it through, so a handler is missing here
            raise LocalProtocolError(
                f"the client has no handler for {type(event).__name__} "
                f"in state {self.conn.state.value}"
            )
        handler(self, event)

    def _on_published(self, event: ev.Published) -> None:
        """A publish request committed: its results."""
        self._resolve(event.rid, list(event.results))

    def _on_deleted(self, event: ev.Deleted) -> None:
        """A delete request's verdicts, one per key."""
        self._resolve(event.rid, list(event.done))

    def _on_result(self, event: ev.Result) -> None:
        """A request's answer; a list answer may come in parts, each but the last saying
        ``more``, and resolves as their concatenation. A subscription's first answer is
        its bind's: the flow's state."""
        rid, value = event.rid, event.value
        entry = self._requests.get(rid)
        if event.more:  # a part of a list answer: more follows
            if entry is not None:
                parts = [] if entry[1] is None else entry[1]
                parts.extend(value)
                self._requests[rid] = (entry[0], parts)
            return
        if entry is not None and entry[1] and isinstance(value, list):
            value = [*entry[1], *value]  # the last part of a list answer
        sub = self._subscriptions.get(rid)
        if sub is not None and not sub.bound and isinstance(value, dict):
            sub.bind(value)
        self._resolve(rid, value)

    def _on_flow_changed(self, event: ev.FlowChanged) -> None:
        """A subscription's flow became active or inactive: acknowledged, and applied."""
        with contextlib.suppress(EomsgError):
            self._send(ev.FlowAck(event.rid, event.active, event.epoch))
        sub = self._subscriptions.get(event.rid)
        if sub is not None:
            sub.change(event.active, event.epoch)

    def _on_unbound(self, event: ev.Unbound) -> None:
        """The node ended a subscription's flow: the subscription ends with Unbound."""
        sub = self._subscriptions.pop(event.rid, None)
        if sub is not None:
            sub.end(Unbound(f"flow {event.flow} of queue {sub.queue!r}: {event.reason}"))

    def _on_deliver(self, event: ev.Deliver) -> None:
        """Messages: pushed to a subscription, or collected for a fetch, which resolves
        with the frame that says no ``more`` follow."""
        sub = self._subscriptions.get(event.rid)
        if sub is not None:
            sub.sink(Pushed(list(event.deliveries), event.now))
            return
        entry = self._requests.get(event.rid)
        if entry is not None and entry[1] is not None:
            entry[1].extend(event.deliveries)
            if not event.more:
                self._resolve(event.rid, entry[1])

    def _on_error(self, event: ev.Error) -> None:
        """A request failed, or a subscription ended (its error, once bound); rid 0:
        the connection failed."""
        error = from_code(event.code, event.message)
        if event.rid == 0:
            self._lost(error)
            return
        sub = self._subscriptions.pop(event.rid, None)
        if sub is not None and event.rid not in self._requests:
            sub.end(error)
            return
        entry = self._requests.pop(event.rid, None)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(error)

    def _on_ping(self, event: ev.Ping) -> None:
        """The node's ping: answered with this side's clock."""
        with contextlib.suppress(EomsgError):
            self._send(ev.Pong(event.nonce, time.time()))

    def _on_pong(self, event: ev.Pong) -> None:
        """The answer to a ping of this client's: the lease runs from when it was sent,
        and the node's clock is read against this one's."""
        ping = self._pings.pop(event.nonce, None)
        if ping is not None and not ping[1].done():
            sent, received = ping[0], time.monotonic()
            self.lease_from = max(self.lease_from, sent)
            self.clock_offset = event.now - (sent + received) / 2
            ping[1].set_result(None)

    def _on_welcome(self, event: ev.Welcome) -> None:
        """The handshake's answer."""
        if not self._welcome.done():
            self._welcome.set_result(event)

    def _on_goodbye(self, event: ev.Goodbye) -> None:
        """The node closes the connection."""
        self._lost(Unavailable(f"the node closed the connection: {event.reason}"))

    # What the node may send a client (wire.protocol's TRANSITIONS) → its handler.
    _HANDLERS: ClassVar[dict[type[Event], Callable[[AsyncClient, Any], None]]] = {
        ev.Published: _on_published,
        ev.Deleted: _on_deleted,
        ev.Result: _on_result,
        ev.FlowChanged: _on_flow_changed,
        ev.Unbound: _on_unbound,
        ev.Deliver: _on_deliver,
        ev.Error: _on_error,
        ev.Ping: _on_ping,
        ev.Pong: _on_pong,
        ev.Welcome: _on_welcome,
        ev.Goodbye: _on_goodbye,
    }

    def _resolve(self, rid: int, value: Any) -> None:
        entry = self._requests.pop(rid, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(value)

    def _closed_early(self) -> Unavailable:
        """What a connection that ended before the node's welcome says, with what may
        be wrong on this side."""
        why = f"the node at {self.address} closed the connection before the handshake"
        if self.address.scheme == "tcp":
            why += " (if it serves TLS, use tls://)"
        elif self.address.is_tls:
            why += (
                " (if it asks for a client certificate, give one its CA signed: env "
                "EOMSG_TLS_CERT and EOMSG_TLS_KEY)"
            )
        return Unavailable(why)

    def _lost(self, error: EomsgError) -> None:
        """The connection is over: fail everything still waiting, once. Requests in
        flight get Unavailable, whatever ended the connection: they may or may not
        have taken effect (retry idempotently); subscriptions get the cause itself, and
        the handshake the first cause (a refused token, not the close after it)."""
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
                pong.exception()  # retrieved: a ping that timed out waits on it no more
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
            sub.end(error)
        # Last: closing may call this protocol back at once (an SSL transport says its
        # end of stream), and what ended the connection must be said first.
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


async def connect_async(
    target: str | Path | None = None,
    *,
    token: str | None = None,
    name: str | None = None,
    timeout: float = 10.0,
    window: int = DEFAULT_WINDOW,
    tls: ClientTls | None = None,
    via: str | None = None,
) -> AsyncClient:
    """Connect to the node at ``target``: a data directory, ``unix://PATH``,
    ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (default: env ``EOMSG_BROKER``, else
    ``./eomsg-data``). TCP needs the node's token (``token=`` or env ``EOMSG_TOKEN``);
    TLS checks the node's certificate against ``tls.ca`` (default
    :meth:`ClientTls.from_env`: env ``EOMSG_TLS_CA``, else the system's CAs). ``via``
    names another node of the network to talk to, through this one: the node that
    holds the queues to consume (the connection is relayed over the links; that node
    decides flows and epochs, and admin operations are refused there)."""
    address = resolve(target or os.environ.get("EOMSG_BROKER") or "eomsg-data")
    if tls is not None and not address.is_tls:
        raise InvalidConfig(f"TLS settings are given but {address} is not a tls:// address")
    client = AsyncClient(address, window)
    await client._open(
        name or f"python:{os.getpid()}",
        token or os.environ.get("EOMSG_TOKEN"),
        timeout,
        tls,
        via,
    )
    return client
