"""The tunnelled connections over one link connection (:mod:`eomsg.server.tunnel`):
each a numbered *channel*, whose bytes go in numbered frames within the peer's limit.

The dialler numbers the channels it opens odd, the dialled node even; a channel the
peer opens must be numbered above every one it opened before (one not open and not
above is over). A channel's frames are taken in order only: one seen before is dropped,
and a channel missing one ends — its bytes read past a hole would be another
connection's frames, or garbage.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from eomsg.server.session import Session
from eomsg.server.tunnel import CHUNK, ChannelEnd, ChannelTransport, Relay
from eomsg.wire import link_events as lev
from eomsg.wire.protocol import Role

if TYPE_CHECKING:
    from eomsg.server.link import LinkConnection

CHANNEL_BROKEN = "the link lost part of this tunnelled connection"


class Channels:
    """The channels of one link connection, by number (the event loop's only)."""

    def __init__(self, link: LinkConnection) -> None:
        self.link = link
        self.ends: dict[int, ChannelEnd] = {}
        self._next = 1 if link.conn.our_role is Role.CLIENT else 2
        self._theirs = 0  # the highest the peer opened

    def data(self, event: lev.Channel) -> None:
        """The next bytes of a channel, in order; a frame seen before is dropped, and a
        channel missing one (lost, or behind) ends. A channel whose first frame is not
        the first to come is never served."""
        end = self.ends.get(event.channel)
        if end is None:
            theirs = 2 if self.link.conn.our_role is Role.CLIENT else 1
            if event.channel % 2 != theirs % 2 or event.channel <= self._theirs:
                return  # one that is over (its close crossed this data), or ours: dropped
            self._theirs = event.channel
            if event.n != 0:
                self.link.send(lev.ChannelClose(event.channel, CHANNEL_BROKEN))
                return
            end = self._serve(event.channel)
        if event.n < end.taken:
            return  # repeated on the way: its bytes are in already
        if event.n > end.taken:
            self.close(event.channel, CHANNEL_BROKEN)
            end.ended(CHANNEL_BROKEN)
            return
        end.taken += 1
        end.feed(event.data)

    def peer_closed(self, event: lev.ChannelClose) -> None:
        """The peer ended a channel: its end here ends too."""
        end = self.ends.pop(event.channel, None)
        if end is not None:
            end.ended(event.reason)

    def peer_paused(self, event: lev.ChannelPause) -> None:
        end = self.ends.get(event.channel)
        if end is not None:
            end.peer_paused(event.paused)

    def link_writable(self, writable: bool) -> None:
        """The link's transport can write again, or cannot: every channel is told."""
        for end in list(self.ends.values()):
            end.link_writable(writable)

    def link_down(self) -> None:
        """The link's connection is lost: every channel over it ends."""
        for end in list(self.ends.values()):
            end.ended(f"the link to {self.link.peer} went down")

    def _serve(self, channel: int) -> ChannelTransport:
        """The peer opened ``channel``: a client reaching this node (or one further)
        through it, served as any connection is, with a linked node's rights."""
        link = self.link
        transport = ChannelTransport(link, channel)
        self.ends[channel] = transport
        transport.start(Session(link.server, needs_token=False, through=link.peer))
        if not link.writable.is_set():
            transport.link_writable(False)
        return transport

    def open_relay(self, client: asyncio.Transport, first: bytes) -> Relay:
        """A channel to the peer for the connection ``client``, whose first bytes
        (``first``: its hello, rewritten, and what followed it) go at once."""
        channel = self._next
        self._next += 2
        relay = Relay(self.link, channel, client)
        self.ends[channel] = relay
        client.set_protocol(relay)
        self.send(channel, first)
        if not self.link.writable.is_set():
            relay.link_writable(False)
        return relay

    def send(self, channel: int, data: bytes) -> None:
        """``data`` of ``channel``, in numbered frames within the peer's limit (nothing
        once the channel is over)."""
        end = self.ends.get(channel)
        if end is None:
            return
        step = max(1, min(CHUNK, self.link.conn.peer_max_frame - 64))
        for at in range(0, len(data), step):
            self.link.send(lev.Channel(channel, end.sent, data[at : at + step]))
            end.sent += 1

    def close(self, channel: int, reason: str) -> None:
        """This side ends ``channel``: the peer is told (the caller ends its own end)."""
        if self.ends.pop(channel, None) is not None:
            self.link.send(lev.ChannelClose(channel, reason[:200]))

    def forget(self, channel: int) -> None:
        """``channel`` ended at this side's end (the peer was told, or told this side):
        idempotent."""
        self.ends.pop(channel, None)
