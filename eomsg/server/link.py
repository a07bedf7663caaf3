"""The connections of links between nodes: the node (:mod:`eomsg.node.links`) decides
and keeps; this carries routes, messages and acknowledgements over a socket.

A link is one connection, dialled by the node that has the peer's address (``eomsg link
add``) and accepted by the other, which learns of the link then. How the two prove who
they are, and how the dialler keeps dialling, is the server's links'
(:mod:`eomsg.server.links`); a :class:`LinkConnection` is one connection of a link, on
either side, and holds what it is made of, each an object that owns its state:

- :class:`~eomsg.server.carrier.Carrier` (``carrier``): once the link is made, what it
  carries both ways — route tables and changes, the messages it owes and their
  acknowledgements — and the pings and watchdog that keep it honest;
- :class:`~eomsg.server.channels.Channels` (``channels``): the clients' connections
  tunnelled over it (:mod:`eomsg.server.tunnel`).

Nothing of the link is taken before both sides proved who they are: a frame of the
link's traffic before that ends the connection. The dialling side starts its end of
the link when the dialled node does — its first frame after the proof (its route table)
— so a link refused after the proof (a token made for another name) never counts as up
anywhere.

Frame limits: each side says in its hello or welcome the largest frame it takes — the
node's :attr:`~eomsg.node.settings.NodeSettings.frame_limit` as it connects — and holds
the other to it. A cut connection loses nothing: what the link owes waits in the node
and goes on the next connection, from the read sequence the peer then names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, cast

from eomsg.errors import (
    AuthenticationFailed,
    EomsgError,
    LinkNotFound,
    ProtocolError,
    RemoteProtocolError,
)
from eomsg.server.carrier import Carrier
from eomsg.server.channels import Channels
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role, State

if TYPE_CHECKING:
    from eomsg.node.node import Node
    from eomsg.server.server import Server

log = logging.getLogger("eomsg.link")

# Refusals of a link as it is (its name, token or existence), not of a moment (a store
# being reopened): redialled after the longer backoff.
REFUSALS = (AuthenticationFailed.code, LinkNotFound.code)
# What only a made link carries: nothing of it is taken before both sides proved who they are.
LINK_TRAFFIC = (lev.Transfer, lev.Oversize, lev.Taken, lev.Interest, lev.Channel, lev.ChannelClose,
                lev.ChannelPause)  # fmt: skip
LARGE_FRAME = 1 << 20  # a frame body from this size on is written apart from its header


class LinkConnection(asyncio.Protocol):
    """One connection of a link, on either side, once the peer is known."""

    def __init__(self, server: Server, peer: str, conn: Connection) -> None:
        self.server = server
        self.node: Node = server.node
        self.loop = server.loop
        self.peer = peer
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()
        self.started = asyncio.Event()  # the handshake is done
        self.linked = False
        self.was_linked = False
        self.ending = False  # failed, closed or aborted: what still comes is dropped
        # On the dialled side, between the welcome and the dialler's proof: its hello,
        # the keys offered and the nonce to answer; then, while the link is taken on,
        # what the dialler sent waits (``proving``).
        self.awaiting: tuple[lev.LinkHello, list[tuple[str, str]], str] | None = None
        self.proving = False
        # On the dialling side, after its proof: the peer's incarnation and how far it
        # holds this node's messages, until the peer's first frame of the link starts it.
        self.accepted: tuple[str, int] | None = None
        self.refused = False  # this connection ended with a refusal, by either side
        self.last_heard = self.loop.time()
        self.key = ""  # the link token's hash, on the dialling side: checks the welcome
        self.nonce = ""  # … and what it asked the peer to prove it with
        self.writable = asyncio.Event()  # clear while the transport's buffer is full
        self.writable.set()
        self.carrier = Carrier(self)
        self.channels = Channels(self)

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self.loop.time()
        self.conn.receive_data(data)
        self.process()

    def eof_received(self) -> bool | None:
        self.conn.receive_data(b"")
        self.process()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.send_failed()
        if self.linked:
            self.linked = False
            self.node.transfer.link_disconnected(self.peer, self.carrier.wake)
            log.info("link to %s: disconnected", self.peer)
        self.carrier.stop()
        self.channels.link_down()
        self.closed.set()
        self.started.set()  # nothing more to wait for

    def pause_writing(self) -> None:
        self.writable.clear()
        self.channels.link_writable(False)

    def resume_writing(self) -> None:
        self.writable.set()
        self.channels.link_writable(True)

    # -- the link -------------------------------------------------------------------------

    def start(self, read: int) -> None:
        """The handshake is done and the peer holds this node's messages up to
        ``read``: send the route table, then keep the link going."""
        update = self.node.transfer.link_connected(self.peer, read, self.carrier.wake)
        self.linked = self.was_linked = True
        if self.server.metrics is not None:
            self.server.metrics.link_connects.labels(self.peer).inc()
        self.started.set()
        log.info("link to %s: connected", self.peer)
        self.send(lev.Interest(update.full, update.moves))
        self.carrier.start()  # what the link owes from before goes now

    def process(self) -> None:
        while not self.closed.is_set() and not self.ending and not self.proving:
            try:
                event = self.conn.next_event()
            except ProtocolError as e:
                self.fail(e)
                return
            if event is NEED_DATA:
                return
            if event is PEER_CLOSED:
                self.close()
                return
            assert isinstance(event, Event)
            try:
                self._dispatch(event)
            except EomsgError as e:  # the peer's mistake (a bad route, message, name)
                self.fail(e)
                return
            except Exception as e:  # a bug here must cost one connection, not the node
                log.exception("link to %s: error handling %s", self.peer, type(event).__name__)
                self.fail(EomsgError(f"internal error handling {type(event).__name__}: {e}"))
                return

    def _dispatch(self, event: Event) -> None:
        if not self.linked and isinstance(event, LINK_TRAFFIC):
            if self.accepted is None:
                raise RemoteProtocolError(
                    f"{type(event).__name__} before the link was made (no welcome, or one refused)"
                )
            incarnation, read = self.accepted  # the dialled node took the link on
            self.accepted = None
            self.node.transfer.link_hello(self.peer, incarnation)
            self.start(read)
        match event:
            case lev.Transfer():
                self.carrier.transfer(event)
            case lev.Oversize():
                self.carrier.oversize(event)
            case lev.Taken():
                self.carrier.taken(event)
            case lev.Interest():
                self.node.transfer.link_heard(self.peer, event.full, event.moves)
            case lev.Channel():
                self.channels.data(event)
            case lev.ChannelClose():
                self.channels.peer_closed(event)
            case lev.ChannelPause():
                self.channels.peer_paused(event)
            case ev.Ping():
                self.send(ev.Pong(event.nonce, self.node.clock()))
            case ev.Pong():
                pass
            case lev.LinkWelcome():
                self.server.links.welcomed(self, event)
            case lev.LinkProof():
                self.server.links.proven(self, event)
            case ev.Error():  # the dialled node refused the link
                log.warning("link to %s refused by it: %s", self.peer, event.message)
                self.refused = event.code in REFUSALS
                self.node.transfer.link_failed(
                    self.peer, f"refused by {self.peer}: {event.message}", refused=self.refused
                )
                self.close()
            case ev.Goodbye():
                if self.awaiting is not None:  # the dialler did not believe the welcome
                    self.server.links.given_up(self, event.reason)
                self.close()
            case _:  # TRANSITIONS let it through, so a handler is missing here
                raise RemoteProtocolError(
                    f"no handler for {type(event).__name__} in state {self.conn.state.value}"
                )

    # -- sending and ending -----------------------------------------------------------------

    def send(self, event: Event) -> None:
        if self.transport is None or self.closed.is_set() or self.conn.state is State.CLOSED:
            return
        header, body = self.conn.send_parts(event)
        if len(body) < LARGE_FRAME:
            self.transport.write(header + body)
        else:  # a large body is not copied to be put behind its header
            self.transport.write(header)
            self.transport.write(body)

    def fail(self, error: EomsgError) -> None:
        """End the connection for ``error``, which the peer is told: the dialled node
        answers with it, the dialler says it in its goodbye."""
        side = "from" if self.conn.our_role is Role.SERVER else "to"
        log.warning("link %s %s: %s", side, self.peer, error.message)
        self.ending = True  # nothing more it sent is acted on
        if self.transport is not None and not self.closed.is_set():
            with contextlib.suppress(ProtocolError):
                if self.conn.our_role is Role.SERVER:
                    last = ev.Error(0, error.code, error.message)
                    self.transport.write(self.conn.send_fatal(last))
                else:
                    self.transport.write(self.conn.send(ev.Goodbye(error.message[:500])))
            self.transport.close()

    def close(self, reason: str = "closing") -> None:
        """End the connection, saying ``reason`` in a goodbye (the link connects again)."""
        self.ending = True
        if self.transport is not None:
            if self.conn.state not in (State.CLOSED,):
                with contextlib.suppress(ProtocolError):
                    self.transport.write(self.conn.send(ev.Goodbye(reason[:500])))
            self.transport.close()

    def abort(self) -> None:
        self.ending = True
        if self.transport is not None:
            self.transport.abort()
