"""The connections of links between nodes: the node (:mod:`eomsg.node.links`) decides
and keeps; this carries routes, messages and acknowledgements over a socket.

A link is one connection, dialled by the node that has the peer's address (``eomsg link
add``) and accepted by the other, which learns of the link then. The handshake proves
each side knows the link's token without sending it: the dialling node says who it is,
how far it has taken the peer's messages, and a nonce; the dialled node answers likewise
with its proofs (an HMAC of that nonce, keyed by the token's hash) and a nonce of its
own; the dialler checks them — a node that is not the peer is refused there, before it
can take anything — and answers with its proof, which the dialled node checks before it
takes anything of the link or changes anything. Then both sides, alike: each sends its whole
table of routes, then route changes as they come, the messages its link owes in
sequence order (within the window, resending when nothing is acknowledged for a while),
and an acknowledgement of its read sequence after each commit of what it took. Pings keep
the connection honest: one silent for three heartbeats is cut. The whole route table is
sent again every few heartbeats, so a change lost on the way is repaired.

The dialling side starts its end of the link when the dialled node does — its first
frame after the proof (its route table) — so a link refused after the proof (a token
made for another name) never counts as up anywhere. A refusal is named on both sides: the
dialled node answers with an error that says what does not fit, and a dialler that does
not believe the welcome (a name or proof that does not fit) says why in its goodbye,
which the dialled node logs.

Frame limits: each side says in its hello or welcome the largest frame it takes — the
node's :attr:`~eomsg.node.settings.NodeSettings.frame_limit` as it connects — and holds
the other to it. What the link owes goes in as many frames as the peer's limit needs; a
message that fits none alone is passed over (:class:`~eomsg.wire.link_events.Oversize`), which
the peer takes as a message it refused, so nothing behind it waits. A node whose frame
limit changes (its max-payload set while it serves) ends its links' connections to say
the new one on the next; so does one told of a message passed over under its old limit,
which the peer then sends again.

A cut connection loses nothing: what the link owes waits in the node and goes on the next
connection, from the read sequence the peer then names. The dialling side redials with
backoff (0.1 s doubling to 5 s, with jitter), for as long as the link exists; after a
refusal, which asking again soon would only meet again, from 5 s doubling to a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
import secrets
import ssl
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from eomsg.core.links import LinkConfig, link_proof, token_hash
from eomsg.core.message import Batch
from eomsg.errors import (
    AuthenticationFailed,
    EomsgError,
    FrameTooLarge,
    LinkNotFound,
    ProtocolError,
    RemoteProtocolError,
    Unavailable,
    one_line,
)
from eomsg.server.session import Session
from eomsg.server.tunnel import CHUNK, ChannelEnd, ChannelTransport, Relay
from eomsg.transport.address import Address, parse_address
from eomsg.transport.tls import ClientTls, tls_refused
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role, State

if TYPE_CHECKING:
    from eomsg.node.node import Node
    from eomsg.server.server import Server

log = logging.getLogger("eomsg.link")

BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0
REFUSED_FIRST, REFUSED_MAX = 5.0, 60.0  # the backoff after the dialled node said no
# Refusals of a link as it is (its name, token or existence), not of a moment (a store
# being reopened): redialled after the longer backoff.
REFUSALS = (AuthenticationFailed.code, LinkNotFound.code)
WAITING_PROOFS = 3  # at most, to a node of a name this node has no link to (see accept)
CHANNEL_BROKEN = "the link lost part of this tunnelled connection"
# What only a made link carries: nothing of it is taken before both sides proved who they are.
LINK_TRAFFIC = (lev.Transfer, lev.Oversize, lev.Taken, lev.Interest, lev.Channel, lev.ChannelClose,
                lev.ChannelPause)  # fmt: skip
TICK = 0.25  # how often the resend timer (and this node's frame limit) is looked at
LARGE_FRAME = 1 << 20  # a frame body from this size on is written apart from its header
TABLE_EVERY = 5  # heartbeats between two sendings of the whole route table


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
        # Messages passed over on this connection (too large for any frame the peer
        # takes), by seq, with their payload's size: refused once the peer acknowledges
        # them — it may instead connect again, to take them under a new frame limit.
        self._passing: dict[int, int] = {}
        self._work = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._tasks: list[asyncio.Task[Any]] = []
        # Tunnelled connections (server/tunnel.py): the dialler numbers the channels it
        # opens odd, the dialled node even; a channel the peer opens must be numbered
        # above every one it opened before (one not here and not above is over).
        self.channels: dict[int, ChannelEnd] = {}
        self._next_channel = 1 if conn.our_role is Role.CLIENT else 2
        self._their_channels = 0

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
            self.node.transfer.link_disconnected(self.peer, self.wake)
            log.info("link to %s: disconnected", self.peer)
        for task in self._tasks:
            task.cancel()
        for end in list(self.channels.values()):
            end.ended(f"the link to {self.peer} went down")
        self.closed.set()
        self.started.set()  # nothing more to wait for

    def pause_writing(self) -> None:
        self._writable.clear()
        for end in list(self.channels.values()):
            end.link_writable(False)

    def resume_writing(self) -> None:
        self._writable.set()
        for end in list(self.channels.values()):
            end.link_writable(True)

    # -- the link -------------------------------------------------------------------------

    def start(self, read: int) -> None:
        """The handshake is done and the peer holds this node's messages up to
        ``read``: send the route table, then keep the link going."""
        update = self.node.transfer.link_connected(self.peer, read, self.wake)
        self.linked = self.was_linked = True
        if self.server.metrics is not None:
            self.server.metrics.link_connects.labels(self.peer).inc()
        self.started.set()
        log.info("link to %s: connected", self.peer)
        self.send(lev.Interest(update.full, update.moves))
        self._work.set()  # what the link owes from before goes now
        self._tasks = [
            self.server.spawn(self._pump()),
            self.server.spawn(self._timers()),
        ]

    def wake(self) -> None:
        """There is work for this connection (any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop closed at exit
            self.loop.call_soon_threadsafe(self._work.set)

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
                self._transfer(event)
            case lev.Oversize():
                self._oversize(event)
            case lev.Taken():
                self.node.transfer.link_taken(self.peer, event.read, event.gap)
                if self._passing:
                    self._passed(event.read)
                self._work.set()
            case lev.Interest():
                self.node.transfer.link_heard(self.peer, event.full, event.moves)
            case lev.Channel():
                self._channel_data(event)
            case lev.ChannelClose():
                end = self.channels.pop(event.channel, None)
                if end is not None:
                    end.ended(event.reason)
            case lev.ChannelPause():
                end = self.channels.get(event.channel)
                if end is not None:
                    end.peer_paused(event.paused)
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

    def _transfer(self, event: lev.Transfer) -> None:
        self._take(self.node.intake.accept_transfer, event.prev, event.batch.carried())

    def _oversize(self, event: lev.Oversize) -> None:
        """The peer passed over a message that fits no frame this side said it takes —
        taken as refused; unless this node's frame limit changed since it said so (its
        max-payload changed): then the link connects again, to say the new one, and the
        peer sends it again under it."""
        if self._limit_changed():
            return
        self._take(
            self.node.intake.accept_oversize, event.prev, event.seq, event.size, self.conn.max_frame
        )

    def _take(self, accept: Callable[..., Future[tuple[int, bool]]], *args: Any) -> None:
        """Hand what the peer sent to the node (``accept(peer, *args)``), and acknowledge
        it once the node holds it."""
        try:
            taken = accept(self.peer, *args)
        except EomsgError as e:
            if e.code in ("invalid_input", "invalid_topic", "invalid_config", "payload_too_large"):
                raise
            # The node cannot take them now (a full disk, a store being reopened, a full
            # queue): the peer keeps them and sends them again, every few seconds while
            # it lasts — said once, and again for another reason or once the link moved on.
            why = one_line(e)
            if self.node.intake.not_taken_is_news(self.peer, why):
                log.warning("link to %s: messages not taken now: %s", self.peer, why)
            return

        def done(f: Future[tuple[int, bool]]) -> None:
            if f.exception() is None:
                read, gap = f.result()
                with contextlib.suppress(RuntimeError):
                    self.loop.call_soon_threadsafe(self._taken, read, gap)

        taken.add_done_callback(done)

    def _taken(self, read: int, gap: bool) -> None:
        if self.linked and not self.closed.is_set():
            self.send(lev.Taken(read, gap))

    async def _pump(self) -> None:
        """Send route changes and what the link owes whenever there is work. Anything
        that goes wrong costs this connection (the dialler connects again), never the
        link's sending for good."""
        await self._guarded(self._pumping())

    async def _guarded(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("link to %s: %s; connecting again", self.peer, one_line(e))
            self.abort()

    async def _pumping(self) -> None:
        while self.linked:
            await self._work.wait()
            self._work.clear()
            await self._writable.wait()
            if not self.linked:
                return
            for update in self.node.transfer.link_updates(self.peer):
                self.send(lev.Interest(update.full, update.moves))
            ack = self.node.transfer.link_ack(self.peer)  # messages held in memory, settled here
            if ack is not None:
                self.send(lev.Taken(ack, False))
            frames = self.node.transfer.link_frames(self.peer, memory_only=True)
            if frames is None:  # some must be read from the store: not on the loop
                frames = await self.server.blocking(self.node.transfer.link_frames, self.peer)
            for prev, batch in frames:
                self._send_transfer(prev, batch)

    def _send_transfer(self, prev: int, batch: Batch) -> None:
        """Send ``batch``, continuing from ``prev``, in as many frames as the peer's frame
        limit needs: halved while what it may take (:func:`~eomsg.wire.events.
        transfer_bound`) is over the limit, so a frame is packed once. A message that
        fits no frame the peer takes, alone, is passed over: the peer is told
        (:class:`~eomsg.wire.link_events.Oversize`), and it counts as refused on both sides
        once the peer acknowledges it (:meth:`_passed`)."""
        if len(batch) > 1 and lev.transfer_bound(batch) > self.conn.peer_max_frame:
            first, rest = batch.split()
            self._send_transfer(prev, first)
            self._send_transfer(first.seqs[-1], rest)
            return
        try:
            self.send(lev.Transfer(prev, batch))
        except FrameTooLarge:
            if len(batch) > 1:
                raise  # within its bound, it cannot be: a bug, which costs this connection
            seq, size = batch.seqs[0], len(batch.payloads[0])
            self._passing[seq] = size
            self.send(lev.Oversize(prev, seq, size))

    def _passed(self, read: int) -> None:
        """The peer acknowledged up to ``read``: the messages passed over up to it were
        refused there (counted and logged here too)."""
        for seq in sorted(s for s in self._passing if s <= read):
            size = self._passing.pop(seq)
            self.node.transfer.link_passed_over(self.peer, seq, size, self.conn.peer_max_frame)

    def _limit_changed(self) -> bool:
        """Whether this node's frame limit is no longer the one this side of the
        connection said (its max-payload changed, and frames follow it): if so, the
        connection ends — the link connects again at once and says the new one."""
        limit = self.node.settings.frame_limit
        if limit == self.conn.max_frame:
            return False
        log.info(
            "link to %s: this node takes frames of %d bytes now, not %d: connecting again to "
            "say so", self.peer, limit, self.conn.max_frame,
        )  # fmt: skip
        self.close(f"{self.node.node_name!r} takes frames of {limit} bytes now")
        return True

    async def _timers(self) -> None:
        """The resend timer, pings, and the watchdog for a silent peer."""
        await self._guarded(self._timing())

    async def _timing(self) -> None:
        heartbeat = self.server.settings.heartbeat
        next_ping = next_table = self.loop.time() + heartbeat
        while self.linked:
            await asyncio.sleep(TICK)
            now = self.loop.time()
            if now - self.last_heard > 3 * heartbeat:
                log.warning("link to %s: silent for %.0f s; cut", self.peer, now - self.last_heard)
                self.abort()
                return
            if now >= next_ping:
                self.send(ev.Ping(random.getrandbits(32)))
                next_ping = now + heartbeat
            if now >= next_table:
                table = self.node.transfer.link_table(self.peer)
                self.send(lev.Interest(table.full, table.moves))
                next_table = now + TABLE_EVERY * heartbeat
            if self.node.transfer.link_tick(self.peer):
                self._work.set()
            if not self.ending:  # (the watchdog above still looks after an ending one)
                self._limit_changed()

    # -- tunnelled connections (server/tunnel.py) -------------------------------------------

    def _channel_data(self, event: lev.Channel) -> None:
        """The next bytes of a channel, in order; a frame seen before is dropped, and a
        channel missing one (lost, or behind) ends — its bytes read past a hole would be
        another connection's frames, or garbage. A channel whose first frame is not the
        first to come is never served."""
        end = self.channels.get(event.channel)
        if end is None:
            theirs = 2 if self.conn.our_role is Role.CLIENT else 1
            if event.channel % 2 != theirs % 2 or event.channel <= self._their_channels:
                return  # one that is over (its close crossed this data), or ours: dropped
            self._their_channels = event.channel
            if event.n != 0:
                self.send(lev.ChannelClose(event.channel, CHANNEL_BROKEN))
                return
            end = self._serve_channel(event.channel)
        if event.n < end.taken:
            return  # repeated on the way: its bytes are in already
        if event.n > end.taken:
            self.close_channel(event.channel, CHANNEL_BROKEN)
            end.ended(CHANNEL_BROKEN)
            return
        end.taken += 1
        end.feed(event.data)

    def _serve_channel(self, channel: int) -> ChannelTransport:
        """The peer opened ``channel``: a client reaching this node (or one further)
        through it, served as any connection is, with a linked node's rights."""
        transport = ChannelTransport(self, channel)
        self.channels[channel] = transport
        transport.start(Session(self.server, needs_token=False, through=self.peer))
        if not self._writable.is_set():
            transport.link_writable(False)
        return transport

    def open_relay(self, client: asyncio.Transport, first: bytes) -> Relay:
        """A channel to the peer for the connection ``client``, whose first bytes
        (``first``: its hello, rewritten, and what followed it) go at once."""
        channel = self._next_channel
        self._next_channel += 2
        relay = Relay(self, channel, client)
        self.channels[channel] = relay
        client.set_protocol(relay)
        self.send_channel(channel, first)
        if not self._writable.is_set():
            relay.link_writable(False)
        return relay

    def send_channel(self, channel: int, data: bytes) -> None:
        """``data`` of ``channel``, in numbered frames within the peer's limit (nothing
        once the channel is over)."""
        end = self.channels.get(channel)
        if end is None:
            return
        step = max(1, min(CHUNK, self.conn.peer_max_frame - 64))
        for at in range(0, len(data), step):
            self.send(lev.Channel(channel, end.sent, data[at : at + step]))
            end.sent += 1

    def close_channel(self, channel: int, reason: str) -> None:
        """This side ends ``channel``: the peer is told (the caller ends its own end)."""
        if self.channels.pop(channel, None) is not None:
            self.send(lev.ChannelClose(channel, reason[:200]))

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


class LinkManager:
    """The server's links: a dialler per link with an address, and the connections up."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._diallers: dict[str, tuple[LinkConfig, asyncio.Task[None]]] = {}
        self.connections: dict[str, LinkConnection] = {}

    def reconcile(self) -> None:
        """Dial every link with an address that is not dialled yet; stop dialling those
        removed or changed (and drop their connections)."""
        wanted = {c.peer: c for c in self.server.node.links.link_configs() if c.address}
        for peer, (config, task) in list(self._diallers.items()):
            now = wanted.get(peer)
            if now is None or now.dialling() != config.dialling():
                task.cancel()
                del self._diallers[peer]
        known = {c.peer for c in self.server.node.links.link_configs()}
        for peer, connection in list(self.connections.items()):
            if peer not in known:
                connection.abort()
        for peer, config in wanted.items():
            if peer not in self._diallers:
                self._diallers[peer] = (config, self.server.spawn(self._dial(config)))

    def stop(self) -> None:
        for _, task in self._diallers.values():
            task.cancel()
        self._diallers.clear()
        for connection in list(self.connections.values()):
            connection.abort()

    async def _dial(self, config: LinkConfig) -> None:
        """Keep a connection to ``config.peer`` up, redialling with backoff."""
        assert config.address is not None
        wait = BACKOFF_FIRST
        while True:
            refused = False
            try:
                address = parse_address(config.address)
                connection = await self._connect(config, address)
            except (OSError, EomsgError) as e:
                why = one_line(e)
                log.info("link to %s: cannot connect to %s: %s", config.peer, config.address, why)
                self.server.node.transfer.link_failed(config.peer, f"cannot connect: {why}")
            else:
                with contextlib.suppress(TimeoutError):  # no answer: try again
                    await asyncio.wait_for(
                        connection.started.wait(), self.server.settings.handshake_timeout
                    )
                if not connection.was_linked:
                    connection.abort()
                await connection.closed.wait()
                if connection.was_linked:
                    wait = BACKOFF_FIRST
                refused = connection.refused
            if refused:  # asked again soon, it would only say no again
                wait = max(wait, REFUSED_FIRST)
            await asyncio.sleep(wait * random.uniform(0.5, 1.0))
            wait = min(wait * 2, REFUSED_MAX if refused else BACKOFF_MAX)

    async def _connect(self, config: LinkConfig, address: Address) -> LinkConnection:
        server = self.server
        node = server.node
        # What this node's frame limit is now: its max-payload may have changed since
        # it started.
        conn = Connection(Role.CLIENT, node.settings.frame_limit)
        connection = LinkConnection(server, config.peer, conn)
        assert config.token is not None  # a link that dials has one (LinkConfig.make)
        connection.key = token_hash(config.token)
        connection.nonce = secrets.token_hex(16)
        if address.is_unix:
            await server.loop.create_unix_connection(lambda: connection, address.path)
        else:
            context = None
            if address.is_tls:
                own = server.settings.tls
                tls = (
                    ClientTls(ca_pem=config.peer_ca)
                    if own is None
                    else own.as_client(config.peer_ca)
                )
                context = tls.context()
            try:
                await server.loop.create_connection(
                    lambda: connection,
                    address.host,
                    address.port,
                    ssl=context,
                    server_hostname=address.host if context is not None else None,
                    ssl_handshake_timeout=server.settings.handshake_timeout if context else None,
                )
            except ssl.SSLError as e:
                raise tls_refused(f"the node at {address}", e) from e
        peer_incarnation, read = node.transfer.link_read(config.peer)
        connection.send(
            lev.LinkHello(
                lev.LINK_VERSION,
                node.node_name,
                node.incarnation,
                peer_incarnation,
                read,
                conn.max_frame,
                connection.nonce,
            )
        )
        self._track(connection)
        return connection

    def welcomed(self, connection: LinkConnection, welcome: lev.LinkWelcome) -> None:
        """The dialled node answered: check it is the peer meant — its name, and a proof
        that it knows the link's token — then prove this side knows it too. The link
        starts when the dialled node starts it (its first frame of the link), so one it
        refuses after the proof never counted as up. What does not fit is said to the
        dialled node (in the goodbye) and kept for ``inspect links``."""
        node, me, peer = connection.node, connection.node.node_name, connection.peer
        address = self._address(peer)
        if welcome.node != peer:
            why = (
                f"{me!r} dialled {peer!r} at {address}, and the node there is {welcome.node!r}: "
                f"check the address of {me!r}'s link to {peer!r}"
            )
        else:
            expected = link_proof(connection.key, connection.nonce, me, welcome.node, "dialled")
            if any(hmac.compare_digest(p.encode(), expected.encode()) for p in welcome.proofs):
                connection.send(
                    lev.LinkProof(link_proof(connection.key, welcome.nonce, me, peer, "dialler"))
                )
                connection.accepted = (welcome.incarnation, welcome.read)
                return
            why = (
                f"{peer!r} at {address} did not prove it knows the token {me!r} dials it with: "
                f"it accepts no such token from a node named {me!r} (a wrong --token-file, "
                f"{peer!r} knowing this node by another name, or not {peer!r} at that address)"
            )
        connection.refused = True
        node.transfer.link_failed(peer, f"refused: {why}", refused=True)
        connection.fail(AuthenticationFailed(why))

    def _address(self, peer: str) -> str:
        configs = self.server.node.links.link_configs()
        return next((c.address or "?" for c in configs if c.peer == peer), "?")

    async def accept(self, session: Any, hello: lev.LinkHello) -> None:
        """A node dialled this one (on ``session``'s connection): check what it says,
        answer with this node's proofs and a nonce, and wait for its own proof
        (:meth:`proven`) before anything of the link is taken or changed. A node whose
        link this node removed is refused at once, whatever its token.

        To a node of a name this node has no link to, the welcome also proves the keys
        of a few links still waiting for their peer's first dial: if it holds one, its
        proof says which, and it is refused with both names — the mistake of a node
        started under another name than its peer knows it by."""
        server = self.server
        node = server.node
        conn: Connection = session.conn
        transport: asyncio.Transport = session.transport
        if transport.is_closing():
            return
        connection = LinkConnection(server, hello.node, conn)
        connection.transport = transport
        transport.set_protocol(connection)
        try:
            if hello.version != lev.LINK_VERSION:
                raise RemoteProtocolError(
                    f"link protocol version {hello.version} is not supported; this node "
                    f"speaks version {lev.LINK_VERSION}"
                )
            if hello.node == node.node_name:
                raise RemoteProtocolError(f"a node named {hello.node!r} dialled itself")
            if node.links.dialled_after_removal(hello.node):
                raise LinkNotFound(
                    f"{node.node_name!r} removed its link to {hello.node!r} (on "
                    f"{node.node_name!r}, `eomsg link add {hello.node}` makes it again)"
                )
            dials = {c.peer for c in node.links.link_configs() if c.address}
            if hello.node in dials and node.node_name < hello.node:
                raise EomsgError(
                    f"both {node.node_name!r} and {hello.node!r} dial this link: only "
                    f"{node.node_name!r} does (remove the address on one side)"
                )
            keys = self._keys(hello.node)
            read = node.transfer.link_peek(hello.node, hello.incarnation)  # changes nothing yet
            me, s = node.node_name, server.settings
            nonce = secrets.token_hex(16)
            proofs = tuple(link_proof(k, hello.nonce, hello.node, me, "dialled") for k, _ in keys)
            connection.awaiting = (hello, keys, nonce)
            connection.send(
                lev.LinkWelcome(
                    lev.LINK_VERSION, me, node.incarnation, read, node.settings.frame_limit,
                    s.heartbeat, proofs, nonce,
                )
            )  # fmt: skip
        except EomsgError as e:
            connection.fail(e)
            return

        def too_slow() -> None:
            if connection.awaiting is not None:
                why = (
                    f"no proof came within {server.settings.handshake_timeout:g} s of the "
                    "welcome, nor a word of why (a stuck node, or an older eomsg)"
                )
                self._refused(hello.node, why)
                connection.fail(RemoteProtocolError(why))

        server.loop.call_later(server.settings.handshake_timeout, too_slow)
        connection.process()  # what came after the hello, buffered meanwhile

    def proven(self, connection: LinkConnection, proof: lev.LinkProof) -> None:
        """The dialling node's proof: checked against the keys the welcome offered; if
        good, the link is taken on (made, if it was dialled with this node's own token
        and this side did not know it) and started. AuthenticationFailed if not. What
        the dialler sent after its proof waits meanwhile."""
        if connection.awaiting is None:
            raise RemoteProtocolError("a link proof came unasked")
        hello, keys, nonce = connection.awaiting
        connection.awaiting = None
        me = self.server.node_name
        expected = {kind: link_proof(k, nonce, hello.node, me, "dialler") for k, kind in keys}
        given = proof.proof.encode()
        good = [kind for kind, p in expected.items() if hmac.compare_digest(given, p.encode())]
        theirs = [kind.removeprefix("for:") for kind in good if kind.startswith("for:")]
        if theirs and "node" not in good:
            meant = " or ".join(repr(t) for t in theirs)
            why = (
                f"a node dialled as {hello.node!r} with the token {me!r} made for {meant}: "
                f"a link's token is good for its own name only (start that node as "
                f"--node-name {theirs[0]}, or link {hello.node!r} on {me!r})"
            )
            for name in theirs:
                self._refused(name, why)
            raise AuthenticationFailed(why)
        if not good:
            why = (
                f"wrong or missing token for a link from {hello.node!r}: give the token this "
                "node made for it (`eomsg link add` here with --token-file) or its node token "
                "(DIR/eomsg.token)"
            )
            self._refused(hello.node, why)
            raise AuthenticationFailed(why)
        # Only now may it replace a connection of that name: one that did not
        # authenticate must not be able to keep a link down.
        self._track(connection)
        connection.proving = True
        self.server.spawn(self._take_on(connection, hello, "node" in good))

    async def _take_on(
        self, connection: LinkConnection, hello: lev.LinkHello, may_make: bool
    ) -> None:
        """Take the link on for ``connection`` — made first if it proved this node's
        own token and the link is not known — and start it, unless the connection ended
        (or another replaced it) meanwhile."""
        node = self.server.node

        def gone() -> bool:
            return (
                connection.ending
                or connection.closed.is_set()
                or self.connections.get(hello.node) is not connection
            )

        try:
            if gone():
                return
            try:
                node.transfer.link_hello(hello.node, hello.incarnation)
            except LinkNotFound:
                # Its link was removed since the welcome, or (found here) since the hello.
                if not may_make or node.links.dialled_after_removal(hello.node):
                    raise
                await self.server.blocking(node.links.add_link, hello.node, None, None)
                if gone():
                    return
                node.transfer.link_hello(hello.node, hello.incarnation)
            theirs = hello.read if hello.peer_incarnation == node.incarnation else 0
            connection.start(theirs)
        except EomsgError as e:  # the node closed meanwhile
            connection.fail(e)
            return
        finally:
            connection.proving = False
        connection.process()  # what the dialler sent after its proof

    def toward(self, node: str) -> LinkConnection:
        """The link connection a client reaching ``node`` goes through now (the first
        hop of the route toward it); Unavailable if no route reaches it or its link is
        down."""
        me = self.server.node_name
        hop = self.server.node.links.link_hop(node)
        if hop is None:
            raise Unavailable(
                f"node {me!r} has no route to a node named {node!r} (see `eomsg inspect links`)"
            )
        connection = self.connections.get(hop)
        if connection is None or not connection.linked:
            via = "" if hop == node else f" is reached through {hop!r}, and"
            raise Unavailable(
                f"node {node!r}{via} the link to {hop!r} is down now; try again shortly"
                if via
                else f"the link from {me!r} to node {node!r} is down now; try again shortly"
            )
        return connection

    def given_up(self, connection: LinkConnection, reason: str) -> None:
        """The dialler left after the welcome, without its proof: it did not believe
        this node (a name or proof that did not fit), and ``reason`` says why."""
        assert connection.awaiting is not None
        hello = connection.awaiting[0]
        connection.awaiting = None
        said = "".join(c if c.isprintable() else " " for c in reason)[:500]  # its words
        why = f"{hello.node!r} gave up the link after this node's welcome, saying: {said}"
        if not any(c.peer == hello.node for c in self.server.node.links.link_configs()):
            waiting = [peer for peer, _ in self.server.node.links.links_waiting()]
            why += f" (this node has no link to {hello.node!r}" + (
                f"; links waiting for their peer here: {', '.join(waiting)})" if waiting else ")"
            )
        log.warning("link from %s: %s", hello.node, why)
        self._refused(hello.node, why)

    def _refused(self, peer: str, why: str) -> None:
        """The link to ``peer`` (if this node has one) was refused for ``why``: kept for
        ``inspect links``."""
        self.server.node.transfer.link_failed(peer, f"refused: {why}", refused=True)

    def _keys(self, peer: str) -> list[tuple[str, str]]:
        """The keys (tokens' hashes) a node dialling as ``peer`` may prove it knows, with
        what each is: the token this node made for that link, and this node's own token
        (which may also make the link). For a name this node has no link to, also the
        keys of a few links waiting for their peer (``for:PEER``: see :meth:`accept`)."""
        configs = self.server.node.links.link_configs()
        config = next((c for c in configs if c.peer == peer), None)
        keys = [] if config is None or config.accepts is None else [(config.accepts, "link")]
        if config is None:
            waiting = self.server.node.links.links_waiting()[:WAITING_PROOFS]
            keys += [(key, f"for:{name}") for name, key in waiting]
        return [*keys, (token_hash(self.server.token), "node")]

    def _track(self, connection: LinkConnection) -> None:
        old = self.connections.get(connection.peer)
        if old is not None and old is not connection:
            old.abort()  # the newer connection wins: the old one is likely dead
        self.connections[connection.peer] = connection

        def forget(_: object) -> None:
            if self.connections.get(connection.peer) is connection:
                del self.connections[connection.peer]

        self.server.spawn(connection.closed.wait()).add_done_callback(forget)
