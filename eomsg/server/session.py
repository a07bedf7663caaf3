"""One client connection to the node: the sans-IO protocol on an asyncio transport.

Every answer that acknowledges a write (Published, Deleted) is sent only after the writer
thread's commit holding it returned. Work that blocks — a fetch waits for its delivery
records to commit, then reads payloads; admin calls wait for their own commit — runs on
the server's thread pool, never on the event loop.

Flow control: a session stops reading from its socket while the bytes of its
unacknowledged publishes exceed ``max_inflight_bytes`` (so a writer that falls behind
slows producers down instead of filling memory); a subscription pushes at most
``prefetch`` undeleted messages, and nothing while the client is not reading.

Each subscription is a flow (seed 002): the node's election decides whether it is active,
and the session pushes the changes as FlowChanged frames, resending each every
``resend`` seconds until the client acknowledges it. A flow is unbound when its
subscription is cancelled, when the client disconnects or falls silent past the keep-alive,
or by an administrator; what it held in flight goes to the next active flow.

Any misbehaviour of the client — a malformed or oversize frame, a move the protocol
forbids, a wrong token, silence during the handshake — ends this session with an Error
frame; the node and every other session carry on. Messages the client held when it went
away are released for redelivery at once.

Frames: the session accepts the node's frame limit as the client connects (its Welcome
says it) and sends none over the limit the client's Hello said: deliveries go in as many
Deliver frames as they need, and an answer that is a list in as many Result frames. One
message that no frame the client accepts could carry fails its request (or ends its
subscription, what it held given back) with an error saying so, never the connection.
Nothing this session runs dies unobserved: a task or callback that fails is logged and
ends the connection with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from eomsg.core import access
from eomsg.core.access import OWNER, Need, link_principal
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, PublishResult
from eomsg.core.operations import OPERATIONS, Operation
from eomsg.errors import (
    AuthenticationFailed,
    DataDirLocked,
    EomsgError,
    FrameTooLarge,
    InvalidConfig,
    LocalProtocolError,
    NotAllowed,
    Overloaded,
    ProtocolError,
    RemoteProtocolError,
    StorageError,
    Unavailable,
    one_line,
)
from eomsg.server import calls
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.calls import listed_result
from eomsg.wire.codec import FRAME_SLACK, Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role, State

if TYPE_CHECKING:
    from eomsg.server.server import Server

log = logging.getLogger("eomsg.server")

MAX_PREFETCH = 100_000
FETCH_CHUNK = 1000  # messages fetched from the node at a time
ANSWER_SLACK = 64 << 10  # room left in an answer the node sizes by estimate (read_log)
CLOSE_GRACE = 2.0  # seconds a closing connection may take to flush its last frames
LOGGED_DENIALS = 20  # denied requests logged per connection


_session_ids = itertools.count(1)


@dataclass(eq=False)
class _Subscription:
    rid: int
    queue: str
    prefetch: int
    priority: int
    flow: int = 0  # 0 until the node has bound it
    epoch: int = 0  # the flow's current epoch; 0 while it is not active
    held: dict[int, int] = field(default_factory=dict)  # seq -> attempt
    unacked: list[ev.FlowChanged] = field(default_factory=list)
    dry: bool = False  # told the client it has nothing more for now (an empty Deliver)
    more: bool = True  # the queue held more than the last fetch took
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    closed: bool = False


class Session(asyncio.Protocol):
    """The server side of one connection."""

    def __init__(self, server: Server, *, needs_token: bool, through: str | None = None) -> None:
        self.server = server
        self.node = server.node
        self.loop = server.loop
        self.needs_token = needs_token
        # The linked node this client came through (server/tunnel.py), if it did: it may
        # not run admin operations here.
        self.through = through
        self.conn = Connection(Role.SERVER, self.node.settings.frame_limit)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.holder = next(_session_ids)  # the node settles a delivery for its holder only
        self.owner = f"session-{self.holder}"  # names it as a coordinator
        self.owns_txns = False  # prepared a transaction: disown them when it ends
        self.client_name = ""
        # Who the client proved to be at its hello (eomsg.core.access): every request is
        # checked against the node's grants for it.
        self.principal = OWNER if through is None else link_principal(through)
        self.denied = 0  # requests refused for want of a right
        self.inflight_bytes = 0
        self.pending = 0  # requests received and not yet answered
        self.reading_paused = False
        self.writable = True  # False while the transport's write buffer is full
        self.blocked_since = 0.0  # since when it has been full without draining
        self.blocked_size = 0  # how full it was then
        self.closing = False
        self.subscriptions: dict[int, _Subscription] = {}
        self.fetched: dict[str, dict[int, int]] = {}  # queue -> seq -> attempt (Fetch)
        self.last_heard = self.loop.time()
        self.draining = False
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._can_write = asyncio.Event()  # clear while the transport's buffer is full
        self._can_write.set()

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = self.transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"{peer[0]}:{peer[1]}"
        else:
            self.peer = peer if isinstance(peer, str) and peer else "unix"
        if not self.server.admit(self):
            self._fail(Overloaded("the node is at its connection limit; retry later"))
            return
        self._timers["handshake"] = self.loop.call_later(
            self.server.settings.handshake_timeout, self._handshake_timeout
        )

    def data_received(self, data: bytes) -> None:
        self.last_heard = self.loop.time()
        self.conn.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self._process()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """Disconnected, or cut off for silence: unbind every flow (the election moves
        on and their messages go to the next active flows) and give back fetched ones."""
        self.closing = True
        self.conn.send_failed()  # nothing more can reach the client
        for timer in self._timers.values():
            timer.cancel()
        subscriptions = list(self.subscriptions.values())
        held = [(q, list(h.items())) for q, h in self.fetched.items()]
        self.subscriptions.clear()
        self.fetched.clear()
        self.server.forget(self)
        self._can_write.set()  # nothing waits to write any more
        for sub in subscriptions:
            self._stop_subscription(sub)
            self._spawn(self._unbind(sub))
        for queue, items in held:
            if items:
                self._spawn(self._release_held(queue, items))
        if self.owns_txns:  # its prepared transactions now wait for recovery
            self._spawn(self.server.blocking(self.node.participant.disown_txns, self.owner))

    def pause_writing(self) -> None:
        self.writable = False
        self._can_write.clear()
        self.blocked_since = self.loop.time()
        self.blocked_size = self._buffered()

    def resume_writing(self) -> None:
        self.writable = True
        self._can_write.set()
        for sub in self.subscriptions.values():
            sub.wake.set()

    # -- frames in ---------------------------------------------------------------------------

    def _process(self) -> None:
        while not self.closing:
            try:
                event = self.conn.next_event()
            except ProtocolError as e:
                self._fail(e)
                return
            if event is NEED_DATA:
                return
            if event is PEER_CLOSED:
                self._close()
                return
            assert isinstance(event, Event)
            try:
                self._dispatch(event)
            except Exception as e:  # a bug here must cost one connection, not the node
                log.exception("session %s: error handling %s", self.peer, type(event).__name__)
                self._fail(EomsgError(f"internal error handling {type(event).__name__}: {e}"))
                return

    def _dispatch(self, event: Event) -> None:
        if self.server.looking_only is not None and not _looks(event):
            error = DataDirLocked(self.server.looking_only)
            self._send(ev.Error(getattr(event, "rid", 0), error.code, error.message))
            return
        match event:
            case ev.Publish():
                topics = (m.topic for m in event.messages)
                if self._permits(event.rid, "publish", lambda: access.publishing(topics)):
                    self._publish(event)
            case ev.Delete():
                if self._consumes(event.rid, event.queue, "delete from"):
                    self._delete(event)
            case ev.Fetch():
                if self._consumes(event.rid, event.queue, "fetch from"):
                    self._start(event.rid, self._fetch(event))
            case ev.Subscribe():
                if self._consumes(event.rid, event.queue, "subscribe to"):
                    self._subscribe(event)
            case ev.Cancel():
                self._start(event.rid, self._cancel(event))
            case ev.Release():
                if self._consumes(event.rid, event.queue, "give back to"):
                    self._start(event.rid, self._release(event))
            case ev.Call():
                self._start(event.rid, self._call(event))
            case ev.FlowAck():
                self._flow_acked(event)
            case ev.Ping():
                self._send(ev.Pong(event.nonce, self.node.clock()))
            case ev.Pong():
                pass
            case ev.Hello():
                self._hello(event)
            case lev.LinkHello():
                self._hand_over(event)
            case ev.Goodbye():
                self._close()
            case _:  # TRANSITIONS let it through, so a handler is missing here
                raise LocalProtocolError(
                    f"the node has no handler for {type(event).__name__} "
                    f"in state {self.conn.state.value}"
                )

    def _hello(self, hello: ev.Hello) -> None:
        if self.server.down is not None:
            self._fail(StorageError(self.server.down))
            return
        self.node = self.server.node  # reopened since this connection was made, perhaps
        # (A hello of another protocol version was refused as it was read: wire.events.)
        if self.through is None:
            principal = self._authenticate(hello.token)
            if principal is None:
                self._fail(
                    AuthenticationFailed(
                        "wrong or missing token; pass the node's token (eomsg.token in its "
                        "data directory) or a principal's (eomsg user add) with --token or "
                        "EOMSG_TOKEN"
                    )
                )
                return
            self.principal = principal
        self.client_name = hello.name
        if hello.via is not None and hello.via != self.server.node_name:
            self._relay(hello)
            return
        s = self.server.settings
        welcome = ev.Welcome(
            ev.PROTOCOL_VERSION,
            self.server.node_name,
            self.conn.max_frame,
            s.heartbeat,
            self.node.settings.limits.max_payload,
        )
        self._send(welcome)
        self._timers["handshake"].cancel()
        self._timers["heartbeat"] = self.loop.call_later(s.heartbeat, self._heartbeat)
        self._timers["watchdog"] = self.loop.call_later(3 * s.heartbeat, self._watchdog)
        self._timers["resend"] = self.loop.call_later(s.resend, self._resend)

    def _authenticate(self, token: str | None) -> str | None:
        """The principal ``token`` proves, or None: the node's own token (or none at all
        on the owner-only Unix socket) is the owner's; any other must be a principal's."""
        if not token:
            return None if self.needs_token else OWNER
        if hmac.compare_digest(token.encode(), self.server.token.encode()):
            return OWNER
        return self.node.access.principal_of(token)

    def _permits(self, rid: int, doing: str, needs: Callable[[], list[Need]]) -> bool:
        """Whether the client's principal holds what ``needs()`` lists (not computed for
        the owner); if not, the request is answered NotAllowed and logged."""
        try:
            self._check(doing, needs)
        except NotAllowed as e:
            self._send(ev.Error(rid, e.code, e.message))
            return False
        return True

    def _check(self, doing: str, needs: Callable[[], list[Need]]) -> None:
        """NotAllowed (logged) unless the principal holds what ``needs()`` lists; a
        principal removed since the hello is cut off."""
        if self.principal == OWNER:
            return
        policy = self.node.access.policy
        if not (self.principal.startswith("@") or self.node.access.has_principal(self.principal)):
            gone = f"principal {self.principal} was removed"
            self.loop.call_soon(self._fail, AuthenticationFailed(gone))  # after its answer
            raise NotAllowed(gone)
        try:
            policy.check(self.principal, needs(), doing)
        except NotAllowed as e:
            self.denied += 1
            if self.denied <= LOGGED_DENIALS:  # a client cannot flood the log with them
                more = " (further denials of this connection are not logged)"
                log.warning(
                    "denied %s (%s, %s): %s%s",
                    self.peer,
                    self.client_name or "?",
                    self.principal,
                    e,
                    more if self.denied == LOGGED_DENIALS else "",
                )
            raise

    def _consumes(self, rid: int, queue: str, doing: str) -> bool:
        return self._permits(rid, f"{doing} queue {queue}", lambda: access.consuming(queue))

    def _relay(self, hello: ev.Hello) -> None:
        """The client reaches node ``hello.via`` through this one: its connection goes
        on as a channel over the link toward it (server/tunnel.py), and this session
        ends here. Unavailable if no link toward that node is up."""
        try:
            hop = self.server.links.toward(hello.via or "")
            if hop.peer == self.through:  # routes changing under it: never ping-pong
                raise Unavailable(
                    f"node {hello.via!r} is reached back through {hop.peer!r}, which sent "
                    "this connection: the routes are changing; try again shortly"
                )
        except EomsgError as e:
            self._fail(e)
            return
        onward = ev.Hello(
            hello.version,
            hello.name,
            None,  # this node vouches for it: its token stays here
            None if hello.via == hop.peer else hello.via,
            hello.max_frame,
        )
        first = Connection(Role.CLIENT).send(onward) + self.conn.hand_over()
        self._end_here()
        assert self.transport is not None
        hop.open_relay(self.transport, first)

    def _end_here(self) -> None:
        """The connection goes on elsewhere (a link, a channel): this session is over
        without a word, and without giving anything back (it took nothing)."""
        self.closing = True
        for timer in self._timers.values():
            timer.cancel()
        self.server.forget(self)

    def _hand_over(self, hello: lev.LinkHello) -> None:
        """Another node dialled: the connection is a link's, not a client's. This
        session ends here (without a word: the link answers)."""
        if self.server.down is not None:
            self._fail(StorageError(self.server.down))
            return
        if self.through is not None:
            self._fail(RemoteProtocolError("a link cannot be made through another link"))
            return
        self._end_here()
        self.server.spawn(self.server.links.accept(self, hello))  # the link's, from now on

    # -- requests ---------------------------------------------------------------------------

    def _publish(self, event: ev.Publish) -> None:
        size = sum(len(m.payload) for m in event.messages) + 64 * len(event.messages)
        arrived = self.loop.time()
        try:
            committed = self.node.ingress.publish_batch_async(event.messages)
        except EomsgError as e:
            self._send(ev.Error(event.rid, e.code, e.message))
            return
        self._track(size)
        committed.add_done_callback(self._from_writer(self._published, event.rid, size, arrived))

    def _published(
        self, rid: int, size: int, arrived: float, f: Future[list[PublishResult]]
    ) -> None:
        self._untrack(size)
        error = f.exception()
        if error is not None:
            self._send_error(rid, error)
            return
        self._send(ev.Published(rid, tuple(f.result())))
        metrics = self.server.metrics
        if metrics is not None:
            metrics.publish_latency.observe(self.loop.time() - arrived)

    def _delete(self, event: ev.Delete) -> None:
        arrived = self.loop.time()
        try:
            committed = self.node.delivery.delete_async(
                event.queue, event.keys, epoch=event.epoch, holder=self.holder
            )
        except EomsgError as e:
            self._send(ev.Error(event.rid, e.code, e.message))
            return
        self._settled(event.queue, event.keys)
        self._track(0)
        committed.add_done_callback(self._from_writer(self._deleted, event.rid, arrived))

    def _deleted(self, rid: int, arrived: float, f: Future[list[bool]]) -> None:
        self._untrack(0)
        error = f.exception()
        if error is not None:
            self._send_error(rid, error)
            return
        self._send(ev.Deleted(rid, tuple(f.result())))
        metrics = self.server.metrics
        if metrics is not None:
            metrics.delete_latency.observe(self.loop.time() - arrived)

    async def _fetch(self, event: ev.Fetch) -> None:
        if not 1 <= event.max <= MAX_PREFETCH:
            raise InvalidConfig(f"fetch max must be between 1 and {MAX_PREFETCH}")
        if not 0 <= event.wait <= 3600:
            raise InvalidConfig("fetch wait must be between 0 and 3600 seconds")
        deadline = self.loop.time() + event.wait
        while True:
            # Each round: a right revoked while it waits ends the wait (NotAllowed).
            self._check(f"fetch from queue {event.queue}", lambda: access.consuming(event.queue))
            ready = self.server.ready_waiter(event.queue)
            taken = await self.server.blocking(
                self.node.delivery.fetch, event.queue, event.max, holder=self.holder
            )
            remaining = deadline - self.loop.time()
            if taken or remaining <= 0 or self.closing or self.draining:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready, min(remaining, self.server.settings.poll))
        if self.closing:
            await self._release_held(event.queue, [(d.seq, d.attempt) for d in taken])
            return
        held = self.fetched.setdefault(event.queue, {})
        for d in taken:
            held[d.seq] = d.attempt
        try:
            self._send_deliveries(event.rid, event.queue, taken, final=True)
        except FrameTooLarge as e:  # the fetch fails: none of it reaches the application
            log.warning("session %s: %s", self.peer, e)
            keys = [(d.seq, d.attempt) for d in taken]
            self._settled(event.queue, tuple(keys))
            await self._release_held(event.queue, keys)
            raise

    def _subscribe(self, event: ev.Subscribe) -> None:
        if not 1 <= event.prefetch <= MAX_PREFETCH:
            self._send(
                ev.Error(
                    event.rid,
                    InvalidConfig.code,
                    f"prefetch must be between 1 and {MAX_PREFETCH}",
                )
            )
            return
        if event.rid in self.subscriptions:
            self._send(ev.Error(event.rid, InvalidConfig.code, "subscription id in use"))
            return
        sub = _Subscription(event.rid, event.queue, event.prefetch, event.priority)
        self.subscriptions[event.rid] = sub
        self._start(event.rid, self._bind(sub))

    async def _bind(self, sub: _Subscription) -> None:
        """Bind the subscription's flow. The answer (a Result with the flow's state) is
        sent by :meth:`_on_flow` when the node reports ``bound``, so that it goes out
        before any FlowChanged of the same flow."""
        notify = functools.partial(self._from_node, sub)
        owner = f"{self.client_name or '?'}@{self.peer}"
        try:
            await self.server.blocking(
                self.node.elections.bind,
                sub.queue,
                priority=sub.priority,
                owner=owner,
                notify=notify,
            )
        except BaseException:
            self.subscriptions.pop(sub.rid, None)
            raise
        if self.closing or sub.closed:  # gone while binding: connection_lost missed it
            await self._unbind(sub)

    def _from_node(self, sub: _Subscription, event: FlowEvent) -> None:
        """The node's notify callback: runs under its lock on any thread, so only hands
        the event to the loop (in order: call_soon_threadsafe is FIFO)."""
        with contextlib.suppress(RuntimeError):  # loop closed: the process is exiting
            self.loop.call_soon_threadsafe(self._safely, self._on_flow, sub, event)

    def _on_flow(self, sub: _Subscription, event: FlowEvent) -> None:
        sub.flow = event.flow
        if event.kind == "unbound":
            self.subscriptions.pop(sub.rid, None)
            self._stop_subscription(sub)
            sub.held.clear()  # the node gave them back when it unbound the flow
            self._send(ev.Unbound(sub.rid, event.flow, "unbound by an administrator"))
            return
        sub.epoch = event.epoch if event.active else 0
        if not event.active:
            sub.held.clear()  # the node gave them back when the flow lost activity
        if event.kind == "bound":
            state = {"flow": event.flow, "active": event.active, "epoch": event.epoch}
            self._send(ev.Result(sub.rid, state))
            if not sub.closed and sub.task is None:
                sub.task = self._spawn(self._pump(sub))
        elif not sub.closed:
            change = ev.FlowChanged(sub.rid, event.flow, event.active, event.epoch)
            sub.unacked.append(change)
            self._send(change)
        sub.wake.set()

    def _flow_acked(self, ack: ev.FlowAck) -> None:
        sub = self.subscriptions.get(ack.rid)
        if sub is not None:
            sub.unacked = [c for c in sub.unacked if (c.active, c.epoch) != (ack.active, ack.epoch)]

    def _resend(self) -> None:
        """Send every unacknowledged FlowChanged again, in order (seed 002: indications
        are acknowledged and retransmitted until they are)."""
        if self.closing:
            return
        for sub in self.subscriptions.values():
            for change in sub.unacked:
                self._send(change)
        self._timers["resend"] = self.loop.call_later(self.server.settings.resend, self._resend)

    async def _unbind(
        self, sub: _Subscription, seen: tuple[tuple[int, int], ...] | None = None
    ) -> int:
        """Unbind the flow; what it held goes to the next active flow (un-counted but
        for ``seen``, when the client said what it handed to its application). 0 if it
        is gone already (unbound by an administrator, its queue deleted, the node
        closing)."""
        if not sub.flow:
            return 0
        try:
            released: int = await self.server.blocking(
                self.node.elections.unbind, sub.queue, sub.flow, seen=seen
            )
        except EomsgError as e:
            log.info("could not unbind flow %d of %s: %s", sub.flow, sub.queue, e)
            return 0
        return released

    async def _pump(self, sub: _Subscription) -> None:
        """Push the queue's messages while the flow is active, the subscription has room
        and the client reads; when the queue runs dry, wait for new ones (or poll, for
        redeliveries that come due by time)."""
        poll = self.server.settings.poll
        while not sub.closed:
            room = sub.prefetch - len(sub.held)
            if room <= 0 or not self.writable or not sub.epoch:
                sub.wake.clear()  # set by a delete, a release, resume_writing, an
                if not sub.epoch:  # activation or a stop (from here on: not lost)
                    self._dry(sub)  # on standby: nothing for it
                elif room <= 0 and not sub.more:
                    self._dry(sub)  # the window holds all there was
                await sub.wake.wait()
                continue
            try:  # at each take: a right revoked since ends the subscription
                self._check(f"receive from queue {sub.queue}", lambda: access.consuming(sub.queue))
            except NotAllowed as e:
                self._send(ev.Error(sub.rid, e.code, e.message))
                self.subscriptions.pop(sub.rid, None)
                sub.closed = True
                await self._unbind(sub)  # what it held goes to the next consumer
                break
            ready = self.server.ready_waiter(sub.queue)
            try:
                taken, sub.more = await self.server.blocking(
                    self.node.delivery.take,
                    sub.queue,
                    min(room, FETCH_CHUNK),
                    flow=sub.flow,
                    holder=self.holder,
                )
            except EomsgError as e:  # the queue was deleted, or the node is closing
                if not sub.closed:
                    self._send(ev.Error(sub.rid, e.code, e.message))
                sub.closed = True
                break
            if taken and taken[0].epoch != sub.epoch:
                continue  # the flow lost that epoch meanwhile; the node took them back
            if sub.closed:
                break  # unbinding gives them back
            if not taken:
                self._dry(sub)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready, poll)
                continue
            for d in taken:
                sub.held[d.seq] = d.attempt
            sub.dry = False
            try:
                self._send_deliveries(sub.rid, sub.queue, taken, final=False, epoch=sub.epoch)
            except FrameTooLarge as e:  # the subscription ends; what it held goes back
                log.warning("session %s: %s", self.peer, e)
                self._send(ev.Error(sub.rid, e.code, e.message))
                self.subscriptions.pop(sub.rid, None)
                sub.closed = True
                await self._unbind(sub)
                break

    def _dry(self, sub: _Subscription) -> None:
        """Tell the client, once per dry spell, that nothing is ready for it now (an
        empty Deliver): a consumer that drains a queue and stops knows when to."""
        if not sub.dry and not sub.closed:
            sub.dry = True
            self._send(ev.Deliver(sub.rid, sub.queue, (), epoch=sub.epoch, now=self.node.clock()))

    async def _cancel(self, event: ev.Cancel) -> None:
        sub = self.subscriptions.pop(event.subscription, None)
        if sub is None:
            self._send(ev.Result(event.rid, 0))
            return
        self._stop_subscription(sub)
        released = await self._unbind(sub, event.seen)
        self._send(ev.Result(event.rid, released))

    async def _release(self, event: ev.Release) -> None:
        if event.unseen:
            await self.server.blocking(
                self.node.delivery.return_unseen,
                event.queue,
                event.keys,
                epoch=event.epoch,
                holder=self.holder,
            )
        else:
            await self.server.blocking(
                self.node.delivery.release,
                event.queue,
                event.keys,
                event.delay,
                epoch=event.epoch,
                holder=self.holder,
            )
        self._settled(event.queue, event.keys)
        self._send(ev.Result(event.rid, None))

    async def _call(self, event: ev.Call) -> None:
        op = calls.operation(event.op)
        limit = self.conn.peer_max_frame  # an estimated answer leaves room to spare
        budget = max(limit - ANSWER_SLACK, limit // 2)
        caller = calls.Caller(self.owner, self.holder, self.principal, budget)
        args = calls.decode(op, event.args, caller)
        if op.admin and self.through is not None:
            me = self.server.node_name
            raise NotAllowed(
                f"a client that came through node {self.through!r} may not "
                f"{access.doing(op.name, args)} on node {me!r}: that changes its set-up "
                f"(run it on {me!r} itself)"
            )
        self._check(access.doing(op.name, args), lambda: access.operation_needs(op.name, args))
        if "owner" in op.caller:
            self.owns_txns = True
        value = await self.server.blocking(calls.run, self.node, op, args)
        if "holder" in op.caller:
            if self.closing and "owner" in op.caller:  # lost while preparing: in doubt
                await self.server.blocking(self.node.participant.disown_txns, self.owner)
            by_queue: dict[str, list[tuple[int, int]]] = {}
            for queue, seq, _, attempt in args.get("deletes", ()):
                by_queue.setdefault(queue, []).append((seq, attempt))
            for queue, keys in by_queue.items():
                self._settled(queue, tuple(keys))
        await self._answer(event.rid, op, value)

    async def _answer(self, rid: int, op: Operation[Any, Any], value: Any) -> None:
        """Send a call's answer: one Result frame, or — a list that no frame the client
        accepts could carry — as many as it takes, each sent once the client has read
        the one before (so the node holds the answer, not the frames too). FrameTooLarge
        if an answer (or an item of it) alone does not fit."""
        budget = self.conn.peer_max_frame - FRAME_SLACK
        split = listed_result(op) and ev.value_bound(value) > budget
        parts = _split(value, budget) if split else [value]
        what = f"an item of the answer to {op.name}" if split else f"{op.name}'s answer"
        for i, part in enumerate(parts):
            more = i < len(parts) - 1
            try:
                self._send(ev.Result(rid, part, more))
            except FrameTooLarge as e:
                raise FrameTooLarge(
                    f"{what} cannot reach this client: {e.message} (the limit its hello said)"
                ) from None
            if more:
                await self._can_write.wait()

    # -- helpers -------------------------------------------------------------------------------

    def _start(self, rid: int, work: Any) -> None:
        """Run a request's coroutine; its EomsgError becomes an Error frame for ``rid``."""
        self.pending += 1
        self._idle.clear()

        async def run() -> None:
            try:
                await work
            except EomsgError as e:
                self._send(ev.Error(rid, e.code, e.message))
            except Exception as e:
                log.exception("session %s: request %d failed", self.peer, rid)
                self._send(ev.Error(rid, EomsgError.code, f"internal error: {e}"))
            finally:
                self._done_one()

        self._spawn(run())

    def _from_writer(self, handler: Callable[..., None], *args: Any) -> Callable[[Any], None]:
        """A future callback (run on the writer thread) that hands ``handler`` over to
        the event loop."""
        loop = self.loop

        def callback(f: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed: the process is exiting
                loop.call_soon_threadsafe(functools.partial(self._safely, handler, *args, f))

        return callback

    def _safely(self, handler: Callable[..., None], *args: Any) -> None:
        """Run a callback handed to the loop; one that fails is logged and ends the
        connection with the reason (a bug must cost one connection, not go unseen)."""
        try:
            handler(*args)
        except Exception as e:
            log.exception("session %s: %s failed", self.peer, handler.__name__)
            self._fail(EomsgError(f"internal error: {one_line(e)}"))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``work`` as a server task of this connection's; if it fails, the server
        logs it and the connection ends with the reason."""
        return self.server.spawn(work, on_error=self._task_failed)

    def _task_failed(self, error: BaseException) -> None:
        if not self.closing:
            self._fail(EomsgError(f"internal error: {one_line(error)}"))

    def _track(self, size: int) -> None:
        self.pending += 1
        self._idle.clear()
        self.inflight_bytes += size
        self.server.inflight_bytes += size
        if self.transport is not None and not self.reading_paused and self.server.over_limit(self):
            self.reading_paused = True
            self.transport.pause_reading()

    def _untrack(self, size: int) -> None:
        self.inflight_bytes -= size
        self.server.inflight_bytes -= size
        if self.reading_paused and not self.server.over_limit(self, resume=True):
            self.reading_paused = False
            if self.transport is not None and not self.closing:
                self.transport.resume_reading()
        self._done_one()

    def _done_one(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self._idle.set()

    def _settled(self, queue: str, keys: tuple[tuple[int, int], ...]) -> None:
        """Settled deliveries no longer count against prefetch windows (a newer attempt
        of the same message still does)."""
        held = self.fetched.get(queue)
        if held:
            for seq, attempt in keys:
                if held.get(seq) == attempt:
                    del held[seq]
        for sub in self.subscriptions.values():
            if sub.queue == queue and sub.held:
                before = len(sub.held)
                for seq, attempt in keys:
                    if sub.held.get(seq) == attempt:
                        del sub.held[seq]
                if len(sub.held) != before:
                    sub.wake.set()

    async def _release_held(self, queue: str, held: list[tuple[int, int]]) -> int:
        if not held:
            return 0
        try:
            released: int = await self.server.blocking(
                self.node.delivery.release_held, queue, held, self.holder
            )
        except EomsgError as e:  # queue deleted or node closing: redelivery by timeout
            log.info("could not release %d messages of %s: %s", len(held), queue, e)
            return 0
        return released

    def _stop_subscription(self, sub: _Subscription) -> None:
        """Let the pump run out by itself (within a poll interval): cancelling it could
        lose a fetch already running on the pool, whose messages it must give back."""
        sub.closed = True
        sub.wake.set()

    def _send_deliveries(
        self, rid: int, queue: str, taken: list[Delivered], *, final: bool, epoch: int = 0
    ) -> None:
        """Deliver frames, each within the client's frame limit; a Fetch's last one has
        ``more`` False. FrameTooLarge, naming the message, if one alone does not fit (the
        frames before it are sent)."""
        budget = self.conn.peer_max_frame - FRAME_SLACK
        now = self.node.clock()
        chunk: list[Delivered] = []
        size = 0
        for d in taken:
            n = ev.message_bound(d.message)
            if chunk and size + n > budget:
                self._deliver(ev.Deliver(rid, queue, tuple(chunk), final, epoch, now))
                chunk, size = [], 0
            chunk.append(d)
            size += n
        if chunk or final:
            self._deliver(ev.Deliver(rid, queue, tuple(chunk), False, epoch, now))

    def _deliver(self, event: ev.Deliver) -> None:
        try:
            self._send(event)
        except FrameTooLarge as e:  # one message alone (each frame's bound fits the limit)
            seq = event.deliveries[0].message.seq
            raise FrameTooLarge(
                f"message {seq} of queue {event.queue!r} cannot reach this client: "
                f"{e.message} (the limit its hello said)"
            ) from None

    def _send(self, event: Event) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.conn.state is State.CLOSED:
            return
        self.transport.writelines(self.conn.send_parts(event))

    def _send_error(self, rid: int, error: BaseException) -> None:
        if isinstance(error, EomsgError):
            self._send(ev.Error(rid, error.code, error.message))
        else:
            self._send(ev.Error(rid, EomsgError.code, f"internal error: {error}"))

    def _fail(self, error: EomsgError) -> None:
        """Tell the client why, then hang up: the stream can no longer be trusted."""
        log.info("closing %s (%s): %s", self.peer, self.client_name or "no hello", error)
        if self.transport is None:
            return
        if not self.transport.is_closing():
            self.transport.write(self.conn.send_fatal(ev.Error(0, error.code, error.message)))
        self._close()

    def _buffered(self) -> int:
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def dismiss(self, error: EomsgError) -> None:
        """The node is going away (its store failed): tell the client why and hang up
        (what it held is given back as for any lost connection, as far as the failing
        node still can)."""
        self._fail(error)

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            # close() waits for the write buffer to drain, which a client that does not
            # read never lets happen: past a grace period, drop what it holds.
            self._timers["abort"] = self.loop.call_later(CLOSE_GRACE, self.transport.abort)

    def _cut_off(self, why: str) -> None:
        """Keep-alive loss: drop the connection at once, whatever its buffers hold (a
        graceful close would wait for a client that does not read), so that its flows
        end now and their messages go to the next active consumer."""
        log.info("cutting off %s (%s): %s", self.peer, self.client_name or "no hello", why)
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def _handshake_timeout(self) -> None:
        if self.conn.state is not State.OPEN and not self.closing:
            self._fail(
                RemoteProtocolError(
                    f"no handshake within {self.server.settings.handshake_timeout:g} s"
                )
            )

    def _heartbeat(self) -> None:
        """Ping the client every heartbeat (a live client answers, so it is heard)."""
        if self.closing:
            return
        self._send(ev.Ping(0))
        self._timers["heartbeat"] = self.loop.call_later(
            self.server.settings.heartbeat, self._heartbeat
        )

    def _watchdog(self) -> None:
        """Cut off a client silent for three heartbeats, or one that has read nothing
        for as long (its socket buffers full and not draining), the moment that is so:
        it is gone or stuck, and its flows must end within three heartbeats. Re-armed
        for the moment that could next be true (checking progress at least every
        heartbeat)."""
        if self.closing:
            return
        limit = 3 * self.server.settings.heartbeat
        now = self.loop.time()
        silent = now - self.last_heard
        if not self.writable and (size := self._buffered()) < self.blocked_size:
            self.blocked_since, self.blocked_size = now, size  # it reads, if slowly
        blocked = 0.0 if self.writable else now - self.blocked_since
        if silent >= limit:
            self._cut_off(f"no word from the client for {silent:.3g} s")
        elif blocked >= limit:
            self._cut_off(f"the client has read nothing for {blocked:.3g} s")
        else:
            self._timers["watchdog"] = self.loop.call_later(
                min(limit - max(silent, blocked), limit / 3), self._watchdog
            )

    async def drain(self, goodbye: str) -> None:
        """Graceful shutdown of this session: take no new requests and push nothing new,
        answer what is in flight, say goodbye and hang up."""
        if self.transport is None or self.closing:
            return
        self.draining = True
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        pumps = []
        for sub in self.subscriptions.values():
            self._stop_subscription(sub)
            if sub.task is not None:
                pumps.append(sub.task)
        await asyncio.gather(*pumps, return_exceptions=True)
        await self._idle.wait()
        # The client can no longer delete what it holds: make it deliverable again now
        # rather than after the ack timeout of the restarted node.
        subscriptions = list(self.subscriptions.values())
        held = [(q, list(h.items())) for q, h in self.fetched.items()]
        self.subscriptions.clear()
        self.fetched.clear()
        for sub in subscriptions:
            await self._unbind(sub)
        for queue, items in held:
            await self._release_held(queue, items)
        with contextlib.suppress(ProtocolError):
            self._send(ev.Goodbye(goodbye))
        self._close()


def _split(items: list[Any], budget: int) -> list[list[Any]]:
    """``items`` in runs of at most ``budget`` bytes each (:func:`ev.value_bound`), in
    order; an item larger than that alone."""
    parts: list[list[Any]] = []
    part: list[Any] = []
    size = 0
    for item in items:
        n = ev.value_bound(item)
        if part and size + n > budget:
            parts.append(part)
            part, size = [], 0
        part.append(item)
        size += n
    parts.append(part)
    return parts


def _looks(event: Event) -> bool:
    """Whether ``event`` changes nothing: the handshake, keep-alives, and the calls of
    operations declared reads_only (what a data directory lent for looking serves)."""
    if isinstance(event, ev.Call):
        op = OPERATIONS.get(event.op)
        return op is not None and op.reads_only
    return isinstance(event, ev.Hello | ev.Goodbye | ev.Ping | ev.Pong)
