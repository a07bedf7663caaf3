"""One client connection to the node: the sans-IO protocol on an asyncio transport.

The session drives the connection — frames in, dispatched; frames out, within the
client's limit; the connection's end — and holds what it is made of, each an object
that owns its state (the event loop's only):

- :mod:`~eomsg.server.handshake`: the hello — the token checked, the client welcomed,
  relayed on over a link (``via``), or handed to a link (a ``LinkHello``);
- :class:`~eomsg.server.guard.Guard` (``guard``): the principal proved at the hello, and
  every request checked against the node's grants before it runs;
- :class:`~eomsg.server.requests.Requests` (``requests``): publish, delete, fetch,
  release and the declared operations, and what the client fetched;
- :class:`~eomsg.server.pump.Subscriptions` (``subscriptions``): the flows (seed 002),
  their FlowChanged frames and the pumps that push their messages;
- :class:`~eomsg.server.backpressure.Backpressure` (``backpressure``): flow control — no
  reading while too many publish bytes are unacknowledged, no pushing while the client
  does not read;
- :class:`~eomsg.server.keepalive.KeepAlive` (``keepalive``): the handshake's deadline,
  the heartbeat, the watchdog, the FlowChanged resends.

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
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

from eomsg.core import access
from eomsg.core.message import Deliveries
from eomsg.core.operations import OPERATIONS
from eomsg.errors import (
    DataDirLocked,
    EomsgError,
    FrameTooLarge,
    LocalProtocolError,
    Overloaded,
    ProtocolError,
    one_line,
)
from eomsg.server import handshake
from eomsg.server.backpressure import Backpressure
from eomsg.server.guard import Guard
from eomsg.server.keepalive import KeepAlive
from eomsg.server.pump import Subscriptions
from eomsg.server.requests import Requests
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.codec import FRAME_SLACK, Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role, State

if TYPE_CHECKING:
    from eomsg.server.server import Server

log = logging.getLogger("eomsg.server")

_session_ids = itertools.count(1)


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
        self.client_name = ""
        self.closing = False
        self.draining = False
        self.guard = Guard(self, through)
        self.backpressure = Backpressure(self)
        self.keepalive = KeepAlive(self)
        self.subscriptions = Subscriptions(self)
        self.requests = Requests(self)

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = self.transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"{peer[0]}:{peer[1]}"
        else:
            self.peer = peer if isinstance(peer, str) and peer else "unix"
        if not self.server.admit(self):
            self.fail(Overloaded("the node is at its connection limit; retry later"))
            return
        self.keepalive.expect_hello()

    def data_received(self, data: bytes) -> None:
        self.keepalive.heard()
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
        self.keepalive.cancel_all()
        subscriptions = self.subscriptions.take_all()
        held = self.requests.take_held()
        self.server.forget(self)
        self.backpressure.can_write.set()  # nothing waits to write any more
        for sub in subscriptions:
            self.subscriptions.stop(sub)
            self.spawn(self.subscriptions.unbind(sub))
        for queue, items in held:
            if items:
                self.spawn(self.requests.release_held(queue, items))
        if self.requests.owns_txns:  # its prepared transactions now wait for recovery
            self.spawn(self.server.blocking(self.node.participant.disown_txns, self.owner))

    def pause_writing(self) -> None:
        self.backpressure.pause_writing()

    def resume_writing(self) -> None:
        self.backpressure.resume_writing()
        self.subscriptions.wake_all()

    # -- frames in ---------------------------------------------------------------------------

    def _process(self) -> None:
        while not self.closing:
            try:
                event = self.conn.next_event()
            except ProtocolError as e:
                self.fail(e)
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
                self.fail(EomsgError(f"internal error handling {type(event).__name__}: {e}"))
                return

    def _dispatch(self, event: Event) -> None:
        if self.server.looking_only is not None and not _looks(event):
            error = DataDirLocked(self.server.looking_only)
            self.send(ev.Error(getattr(event, "rid", 0), error.code, error.message))
            return
        guard, requests, subscriptions = self.guard, self.requests, self.subscriptions
        match event:
            case ev.Publish():
                topics = (m.topic for m in event.messages)
                if guard.permits(event.rid, "publish", lambda: access.publishing(topics)):
                    requests.publish(event)
            case ev.Delete():
                if guard.consumes(event.rid, event.queue, "delete from"):
                    requests.delete(event)
            case ev.Fetch():
                if guard.consumes(event.rid, event.queue, "fetch from"):
                    self.start(event.rid, requests.fetch(event))
            case ev.Subscribe():
                if guard.consumes(event.rid, event.queue, "subscribe to"):
                    subscriptions.subscribe(event)
            case ev.Cancel():
                self.start(event.rid, subscriptions.cancel(event))
            case ev.Release():
                if guard.consumes(event.rid, event.queue, "give back to"):
                    self.start(event.rid, requests.release(event))
            case ev.Call():
                self.start(event.rid, requests.call(event))
            case ev.FlowAck():
                subscriptions.acked(event)
            case ev.Ping():
                self.send(ev.Pong(event.nonce, self.node.clock()))
            case ev.Pong():
                pass
            case ev.Hello():
                handshake.hello(self, event)
            case lev.LinkHello():
                handshake.hand_over(self, event)
            case ev.Goodbye():
                self._close()
            case _:  # TRANSITIONS let it through, so a handler is missing here
                raise LocalProtocolError(
                    f"the node has no handler for {type(event).__name__} "
                    f"in state {self.conn.state.value}"
                )

    # -- running what a frame asks -------------------------------------------------------------

    def start(self, rid: int, work: Coroutine[Any, Any, None]) -> None:
        """Run a request's coroutine; its EomsgError becomes an Error frame for ``rid``."""
        self.backpressure.begin()

        async def run() -> None:
            try:
                await work
            except EomsgError as e:
                self.send(ev.Error(rid, e.code, e.message))
            except Exception as e:
                log.exception("session %s: request %d failed", self.peer, rid)
                self.send(ev.Error(rid, EomsgError.code, f"internal error: {e}"))
            finally:
                self.backpressure.done_one()

        self.spawn(run())

    def from_writer(self, handler: Callable[..., None], *args: Any) -> Callable[[Any], None]:
        """A future callback (run on the writer thread) that hands ``handler`` over to
        the event loop."""
        loop = self.loop

        def callback(f: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed: the process is exiting
                loop.call_soon_threadsafe(functools.partial(self.safely, handler, *args, f))

        return callback

    def safely(self, handler: Callable[..., None], *args: Any) -> None:
        """Run a callback handed to the loop; one that fails is logged and ends the
        connection with the reason (a bug must cost one connection, not go unseen)."""
        try:
            handler(*args)
        except Exception as e:
            log.exception("session %s: %s failed", self.peer, handler.__name__)
            self.fail(EomsgError(f"internal error: {one_line(e)}"))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``work`` as a server task of this connection's; if it fails, the server
        logs it and the connection ends with the reason."""
        return self.server.spawn(work, on_error=self._task_failed)

    def _task_failed(self, error: BaseException) -> None:
        if not self.closing:
            self.fail(EomsgError(f"internal error: {one_line(error)}"))

    # -- frames out ----------------------------------------------------------------------------

    def send_deliveries(self, rid: int, taken: Deliveries, *, final: bool, epoch: int = 0) -> None:
        """Deliver frames of ``taken``, each within the client's frame limit (one, but for
        a take of large messages); a Fetch's last one has ``more`` False. FrameTooLarge,
        naming the message, if one alone does not fit (the frames before it are
        sent)."""
        budget = self.conn.peer_max_frame - FRAME_SLACK
        now = self.node.clock()
        queue = taken.queue
        if not taken and not final:
            return
        if ev.deliveries_bound(taken) <= budget:
            self._deliver(ev.Deliver(rid, queue, taken, False, epoch, now))
            return
        start, size = 0, 0
        for i, n in enumerate(ev.delivery_bounds(taken)):
            if i > start and size + n > budget:
                self._deliver(ev.Deliver(rid, queue, taken[start:i], final, epoch, now))
                start, size = i, 0
            size += n
        self._deliver(ev.Deliver(rid, queue, taken[start:], False, epoch, now))

    def _deliver(self, event: ev.Deliver) -> None:
        try:
            self.send(event)
        except FrameTooLarge as e:  # one message alone (each frame's bound fits the limit)
            seq = event.deliveries[0].message.seq
            raise FrameTooLarge(
                f"message {seq} of queue {event.queue!r} cannot reach this client: "
                f"{e.message} (the limit its hello said)"
            ) from None

    def send(self, event: Event) -> None:
        """Send ``event``, unless the connection is closing or closed (then nothing)."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.conn.state is State.CLOSED:
            return
        self.transport.writelines(self.conn.send_parts(event))

    def send_error(self, rid: int, error: BaseException) -> None:
        if isinstance(error, EomsgError):
            self.send(ev.Error(rid, error.code, error.message))
        else:
            self.send(ev.Error(rid, EomsgError.code, f"internal error: {error}"))

    # -- the end ---------------------------------------------------------------------------------

    def fail(self, error: EomsgError) -> None:
        """Tell the client why, then hang up: the stream can no longer be trusted."""
        log.info("closing %s (%s): %s", self.peer, self.client_name or "no hello", error)
        if self.transport is None:
            return
        if not self.transport.is_closing():
            self.transport.write(self.conn.send_fatal(ev.Error(0, error.code, error.message)))
        self._close()

    def dismiss(self, error: EomsgError) -> None:
        """The node is going away (its store failed): tell the client why and hang up
        (what it held is given back as for any lost connection, as far as the failing
        node still can)."""
        self.fail(error)

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            self.keepalive.abort_after_grace(self.transport)

    async def drain(self, goodbye: str) -> None:
        """Graceful shutdown of this session: take no new requests and push nothing new,
        answer what is in flight, say goodbye and hang up."""
        if self.transport is None or self.closing:
            return
        self.draining = True
        self.backpressure.stop_reading()
        pumps = []
        for sub in self.subscriptions.open.values():
            self.subscriptions.stop(sub)
            if sub.task is not None:
                pumps.append(sub.task)
        await asyncio.gather(*pumps, return_exceptions=True)
        await self.backpressure.idle.wait()
        # The client can no longer delete what it holds: make it deliverable again now
        # rather than after the ack timeout of the restarted node.
        subscriptions = self.subscriptions.take_all()
        held = self.requests.take_held()
        for sub in subscriptions:
            await self.subscriptions.unbind(sub)
        for queue, items in held:
            await self.requests.release_held(queue, items)
        with contextlib.suppress(ProtocolError):
            self.send(ev.Goodbye(goodbye))
        self._close()


def _looks(event: Event) -> bool:
    """Whether ``event`` changes nothing: the handshake, keep-alives, and the calls of
    operations declared reads_only (what a data directory lent for looking serves)."""
    if isinstance(event, ev.Call):
        op = OPERATIONS.get(event.op)
        return op is not None and op.reads_only
    return isinstance(event, ev.Hello | ev.Goodbye | ev.Ping | ev.Pong)
