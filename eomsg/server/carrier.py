"""What a made link carries, both ways, and what keeps it honest.

Out: route changes as they come and the whole route table every few heartbeats (so a
change lost on the way is repaired), the acknowledgement of what this node took, and
the messages the link owes in sequence order — in as many frames as the peer's frame
limit needs; a message that fits none alone is passed over
(:class:`~eomsg.wire.link_events.Oversize`), which both sides count as refused once the
peer acknowledges it. In: what the peer sends is handed to the node, and acknowledged
once the node holds it. Pings every heartbeat; a peer silent for three is cut. A node
whose frame limit changed (its max-payload set while it serves) ends the connection, to
say the new one on the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from eomsg.core.message import Batch
from eomsg.errors import EomsgError, FrameTooLarge, one_line
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev

if TYPE_CHECKING:
    from eomsg.server.link import LinkConnection

log = logging.getLogger("eomsg.link")

TICK = 0.25  # how often the resend timer (and this node's frame limit) is looked at
TABLE_EVERY = 5  # heartbeats between two sendings of the whole route table


class Carrier:
    """The traffic of one link connection once it is made: its sending task and its
    timers, and the messages it passed over (the event loop's only, but for
    :meth:`wake`)."""

    def __init__(self, link: LinkConnection) -> None:
        self.link = link
        # Messages passed over on this connection (too large for any frame the peer
        # takes), by seq, with their payload's size: refused once the peer acknowledges
        # them — it may instead connect again, to take them under a new frame limit.
        self._passing: dict[int, int] = {}
        self._work = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self) -> None:
        """The link is made: what it owes from before goes now, and keeps going."""
        server = self.link.server
        self._work.set()
        self._tasks = [server.spawn(self._pump()), server.spawn(self._timers())]

    def stop(self) -> None:
        """The connection is lost: its task and timers end."""
        for task in self._tasks:
            task.cancel()

    def wake(self) -> None:
        """There is work for this connection (any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop closed at exit
            self.link.loop.call_soon_threadsafe(self._work.set)

    # -- in -----------------------------------------------------------------------------------

    def transfer(self, event: lev.Transfer) -> None:
        link = self.link
        self._take(link.node.intake.accept_transfer, event.prev, event.batch.carried())

    def oversize(self, event: lev.Oversize) -> None:
        """The peer passed over a message that fits no frame this side said it takes —
        taken as refused; unless this node's frame limit changed since it said so (its
        max-payload changed): then the link connects again, to say the new one, and the
        peer sends it again under it."""
        if self.limit_changed():
            return
        link = self.link
        self._take(
            link.node.intake.accept_oversize, event.prev, event.seq, event.size, link.conn.max_frame
        )

    def taken(self, event: lev.Taken) -> None:
        """The peer holds this node's messages up to ``event.read``: the link owes less,
        and what was passed over up to there counts as refused."""
        self.link.node.transfer.link_taken(self.link.peer, event.read, event.gap)
        if self._passing:
            self._passed(event.read)
        self._work.set()

    def _take(self, accept: Callable[..., Future[tuple[int, bool]]], *args: Any) -> None:
        """Hand what the peer sent to the node (``accept(peer, *args)``), and acknowledge
        it once the node holds it."""
        link = self.link
        try:
            taken = accept(link.peer, *args)
        except EomsgError as e:
            if e.code in ("invalid_input", "invalid_topic", "invalid_config", "payload_too_large"):
                raise
            # The node cannot take them now (a full disk, a store being reopened, a full
            # queue): the peer keeps them and sends them again, every few seconds while
            # it lasts — said once, and again for another reason or once the link moved on.
            why = one_line(e)
            if link.node.intake.not_taken_is_news(link.peer, why):
                log.warning("link to %s: messages not taken now: %s", link.peer, why)
            return

        def done(f: Future[tuple[int, bool]]) -> None:
            if f.exception() is None:
                read, gap = f.result()
                with contextlib.suppress(RuntimeError):
                    link.loop.call_soon_threadsafe(self._acknowledge, read, gap)

        taken.add_done_callback(done)

    def _acknowledge(self, read: int, gap: bool) -> None:
        if self.link.linked and not self.link.closed.is_set():
            self.link.send(lev.Taken(read, gap))

    # -- out ----------------------------------------------------------------------------------

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
            log.warning("link to %s: %s; connecting again", self.link.peer, one_line(e))
            self.link.abort()

    async def _pumping(self) -> None:
        link = self.link
        node, peer = link.node, link.peer
        while link.linked:
            await self._work.wait()
            self._work.clear()
            await link.writable.wait()
            if not link.linked:
                return
            for update in node.transfer.link_updates(peer):
                link.send(lev.Interest(update.full, update.moves))
            ack = node.transfer.link_ack(peer)  # messages held in memory, settled here
            if ack is not None:
                link.send(lev.Taken(ack, False))
            frames = node.transfer.link_frames(peer, memory_only=True)
            if frames is None:  # some must be read from the store: not on the loop
                frames = await link.server.blocking(node.transfer.link_frames, peer)
            for prev, batch in frames:
                self._send_transfer(prev, batch)

    def _send_transfer(self, prev: int, batch: Batch) -> None:
        """Send ``batch``, continuing from ``prev``, in as many frames as the peer's frame
        limit needs: halved while what it may take (:func:`~eomsg.wire.events.
        transfer_bound`) is over the limit, so a frame is packed once. A message that
        fits no frame the peer takes, alone, is passed over: the peer is told
        (:class:`~eomsg.wire.link_events.Oversize`), and it counts as refused on both sides
        once the peer acknowledges it (:meth:`_passed`)."""
        link = self.link
        if len(batch) > 1 and lev.transfer_bound(batch) > link.conn.peer_max_frame:
            first, rest = batch.split()
            self._send_transfer(prev, first)
            self._send_transfer(first.seqs[-1], rest)
            return
        try:
            link.send(lev.Transfer(prev, batch))
        except FrameTooLarge:
            if len(batch) > 1:
                raise  # within its bound, it cannot be: a bug, which costs this connection
            seq, size = batch.seqs[0], len(batch.payloads[0])
            self._passing[seq] = size
            link.send(lev.Oversize(prev, seq, size))

    def _passed(self, read: int) -> None:
        """The peer acknowledged up to ``read``: the messages passed over up to it were
        refused there (counted and logged here too)."""
        link = self.link
        for seq in sorted(s for s in self._passing if s <= read):
            size = self._passing.pop(seq)
            link.node.transfer.link_passed_over(link.peer, seq, size, link.conn.peer_max_frame)

    def limit_changed(self) -> bool:
        """Whether this node's frame limit is no longer the one this side of the
        connection said (its max-payload changed, and frames follow it): if so, the
        connection ends — the link connects again at once and says the new one."""
        link = self.link
        limit = link.node.settings.frame_limit
        if limit == link.conn.max_frame:
            return False
        log.info(
            "link to %s: this node takes frames of %d bytes now, not %d: connecting again to "
            "say so", link.peer, limit, link.conn.max_frame,
        )  # fmt: skip
        link.close(f"{link.node.node_name!r} takes frames of {limit} bytes now")
        return True

    # -- keeping it honest --------------------------------------------------------------------

    async def _timers(self) -> None:
        """The resend timer, pings, and the watchdog for a silent peer."""
        await self._guarded(self._timing())

    async def _timing(self) -> None:
        link = self.link
        heartbeat = link.server.settings.heartbeat
        next_ping = next_table = link.loop.time() + heartbeat
        while link.linked:
            await asyncio.sleep(TICK)
            now = link.loop.time()
            if now - link.last_heard > 3 * heartbeat:
                log.warning("link to %s: silent for %.0f s; cut", link.peer, now - link.last_heard)
                link.abort()
                return
            if now >= next_ping:
                link.send(ev.Ping(random.getrandbits(32)))
                next_ping = now + heartbeat
            if now >= next_table:
                table = link.node.transfer.link_table(link.peer)
                link.send(lev.Interest(table.full, table.moves))
                next_table = now + TABLE_EVERY * heartbeat
            if link.node.transfer.link_tick(link.peer):
                self._work.set()
            if not link.ending:  # (the watchdog above still looks after an ending one)
                self.limit_changed()
