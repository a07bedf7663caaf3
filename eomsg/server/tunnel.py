"""Connections tunnelled over links: a client of one node talking, through it, to another
node of the network — where the queue it consumes lives (issue 19: "a queue lives on one
node and its consumers may connect to it from anywhere through their own node").

The client says ``via=NODE`` in its hello. Its own node checks its token as for any
client, finds the linked peer toward ``NODE`` and opens a *channel* on that link: from
then on it relays the connection's bytes both ways without reading them (a
:class:`Relay`). The node at the other end serves the channel as it serves a socket — a
:class:`~eomsg.server.session.Session` on a :class:`ChannelTransport` — or, if it is not
``NODE`` either, relays it one hop further. So flows, epochs, active/inactive notices,
pings and deletes all hold end to end: the session that decides them is on the node
that holds the queue, and it hears the client's own answers.

What ends one end ends the other: a client that goes away closes its channel (its flows
unbind and what it held is given back at once); a session that cuts off a silent client
closes the client's socket; a link that goes down ends every channel on it, and each
client learns at once that its connection is gone (and so that it is no longer active).

Backpressure crosses the link per channel, never for the whole link: a session that
stops reading (a producer over its in-flight bytes) asks the relay to stop reading its
client, and a client that stops reading makes the relay ask the session to stop sending
(and its keep-alive then cuts it off as it would a stuck socket). A link whose socket is
full pauses every channel on it until it drains.

A client that comes through a link has the rights a linked node has on the far node: it
publishes, consumes, runs transactions and looks; it cannot change that node's
configuration (operations declared ``admin``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from eomsg.wire import link_events as lev

if TYPE_CHECKING:
    from eomsg.server.link import LinkConnection

CHUNK = 64 << 10  # bytes of a tunnelled connection in one Channel frame, at most
CLOSE_GRACE = 2.0  # seconds a client's socket may take to flush the far node's last words


class ChannelEnd(Protocol):
    """What a link connection tells each end of a channel it carries, and the frames of
    it the link has sent and taken in order (see :class:`~eomsg.wire.link_events.Channel`)."""

    sent: int
    taken: int

    def feed(self, data: bytes) -> None:
        """Bytes that came over the channel."""

    def peer_paused(self, paused: bool) -> None:
        """The other end can take no more for now (``paused``), or can again."""

    def link_writable(self, writable: bool) -> None:
        """The link's socket is full (False) or has drained (True)."""

    def ended(self, reason: str) -> None:
        """The channel is over (the other end closed it, or the link went down)."""


class ChannelTransport(asyncio.Transport):
    """The far end of a channel, as a transport: what its protocol (a session, or a
    relay one hop further) writes goes over the link in Channel frames."""

    def __init__(self, link: LinkConnection, channel: int) -> None:
        super().__init__()
        self.link = link
        self.channel = channel
        self.sent = self.taken = 0
        self._protocol: asyncio.Protocol | None = None
        self._closed = False
        self._reading = True
        self._pending = bytearray()  # what came while reading was paused
        self._peer_paused = False
        self._link_writable = True
        self._writing_paused = False

    # -- asyncio.Transport --------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return f"via {self.link.peer}" if name == "peername" else default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closed

    def is_reading(self) -> bool:
        return self._reading and not self._closed

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closed:
            self.link.channels.send(self.channel, bytes(data))

    def get_write_buffer_size(self) -> int:
        # Held back by the other end or a full link: nothing drains meanwhile.
        return 1 if self._writing_paused else 0

    def pause_reading(self) -> None:
        if self._reading and not self._closed:
            self._reading = False
            self.link.send(lev.ChannelPause(self.channel, True))

    def resume_reading(self) -> None:
        if self._reading or self._closed:
            return
        self._reading = True
        self.link.send(lev.ChannelPause(self.channel, False))
        if self._pending:
            data, self._pending = bytes(self._pending), bytearray()
            self.feed(data)

    def close(self) -> None:
        self._end("closed by the far node")

    def abort(self) -> None:
        self._end("cut off by the far node")

    def _end(self, reason: str) -> None:
        if not self._closed:
            self.link.channels.close(self.channel, reason)
            self.ended(reason)

    # -- ChannelEnd ---------------------------------------------------------------------

    def start(self, protocol: asyncio.Protocol) -> None:
        self._protocol = protocol
        protocol.connection_made(self)

    def feed(self, data: bytes) -> None:
        if self._closed or self._protocol is None:
            return
        if not self._reading:
            self._pending += data
            return
        self._protocol.data_received(data)

    def peer_paused(self, paused: bool) -> None:
        self._peer_paused = paused
        self._writing_changed()

    def link_writable(self, writable: bool) -> None:
        self._link_writable = writable
        self._writing_changed()

    def _writing_changed(self) -> None:
        paused = self._peer_paused or not self._link_writable
        if paused == self._writing_paused or self._closed or self._protocol is None:
            return
        self._writing_paused = paused
        if paused:
            self._protocol.pause_writing()
        else:
            self._protocol.resume_writing()

    def ended(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self.link.channels.forget(self.channel)
        if self._protocol is not None:
            protocol = self._protocol
            self.link.loop.call_soon(protocol.connection_lost, None)


class Relay(asyncio.Protocol):
    """The near end of a channel: the client's connection (a socket, or a channel one
    hop back), its bytes relayed both ways unread."""

    def __init__(self, link: LinkConnection, channel: int, client: asyncio.Transport) -> None:
        self.link = link
        self.channel = channel
        self.client = client
        self.sent = self.taken = 0
        self._closed = False
        self._peer_paused = False
        self._link_writable = True
        self._reading_paused = False

    # -- asyncio.Protocol: the client's side ---------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._closed:
            self.link.channels.send(self.channel, data)

    def eof_received(self) -> bool | None:
        self._end("the client closed its connection")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._end("the client's connection is gone")

    def pause_writing(self) -> None:  # the client is not reading
        if not self._closed:
            self.link.send(lev.ChannelPause(self.channel, True))

    def resume_writing(self) -> None:
        if not self._closed:
            self.link.send(lev.ChannelPause(self.channel, False))

    def _end(self, reason: str) -> None:
        if not self._closed:
            self.link.channels.close(self.channel, reason)
            self.ended(reason)

    # -- ChannelEnd: the far node's side -------------------------------------------------

    def feed(self, data: bytes) -> None:
        if not self._closed:
            self.client.write(data)

    def peer_paused(self, paused: bool) -> None:
        self._peer_paused = paused
        self._reading_changed()

    def link_writable(self, writable: bool) -> None:
        self._link_writable = writable
        self._reading_changed()

    def _reading_changed(self) -> None:
        paused = self._peer_paused or not self._link_writable
        if paused == self._reading_paused or self._closed:
            return
        self._reading_paused = paused
        with contextlib.suppress(RuntimeError):  # the client's socket is closing
            if paused:
                self.client.pause_reading()
            else:
                self.client.resume_reading()

    def ended(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self.link.channels.forget(self.channel)
        self.client.close()
        # close() waits for the socket to drain, which a client that does not read never
        # lets happen: past a grace period, drop what it holds.
        self.link.loop.call_later(CLOSE_GRACE, self.client.abort)
