"""A link's connection (seeds 000 and 003 across machines): what the node does as the
server's link connection comes and goes, what it sends over it, and what the peer
acknowledges — the sending side of :mod:`eomsg.node.links` (whose docstring tells the
whole) and the connection's timers. What the peer sends is :mod:`eomsg.node.intake`'s.

Under the lock discipline of :mod:`eomsg.node.state`: everything under ``lock``. A
link's ``wake`` only schedules work on the server's loop, so it may be called under it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Protocol, overload

from eomsg.core.message import Batch
from eomsg.core.routing import Route, Update, Withdraw
from eomsg.core.transfer import Receiver
from eomsg.errors import DataDirDamaged, EomsgError, InvalidInput
from eomsg.node.linkstate import HopRoute, LinkState, Wake, frame_batch, route_json
from eomsg.node.state import Destination, Shared, to_us
from eomsg.store.writer import RowBatch

if TYPE_CHECKING:
    from eomsg.node.intake import Intake
    from eomsg.node.links import Links

log = logging.getLogger("eomsg.link")


class Kernel(Shared, Protocol):
    """What :class:`Transfer` needs of the node besides :class:`~eomsg.node.state.Shared`."""

    links: Links
    intake: Intake
    routes: dict[str, tuple[Destination, ...]]
    durable_seq: int
    settled_since_compaction: int

    def write_later(self, key: str, value: str) -> None: ...


class Transfer:
    """The sending side of each link, and its connection's life."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def link_hello(self, peer: str, incarnation: str) -> int:
        """A connection to ``peer`` (of data directory ``incarnation``) is being made
        (the peer authenticated): how far this node has taken the peer's messages. A
        new incarnation starts its sequence afresh, and that is kept at once, so a
        restart does not go back to the old one's."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.link(peer)
            if link.peer_incarnation != incarnation:
                log.log(
                    logging.WARNING if link.peer_incarnation else logging.INFO,
                    "link to %s: a new incarnation of it (%s, was %s): its sequence starts "
                    "afresh", peer, incarnation, link.peer_incarnation or "none",
                )  # fmt: skip
                # What the old one sent and is held here is written (it is this node's
                # now), and nothing of it counts toward what the new one is told.
                k.intake.write_held(k.clock(), link=link, every=True)
                link.held.clear()
                link.storing.clear()
                link.peer_incarnation = incarnation
                link.receiver = Receiver(0)
                batch = RowBatch()
                batch.set_meta(
                    f"link/{peer}/read", json.dumps({"incarnation": incarnation, "read": 0})
                )
                k.queue_write(batch)
            link.ack_sent = link.ack_point()
            return link.ack_sent

    def link_peek(self, peer: str, incarnation: str) -> int:
        """How far this node has taken the messages of ``peer`` (of data directory
        ``incarnation``), changing nothing: 0 for a link it does not know, or another
        incarnation (said to a dialler before it has proved who it is)."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.find(peer)
            if link is None or link.peer_incarnation != incarnation:
                return 0
            return link.ack_point()

    def link_read(self, peer: str) -> tuple[str, int]:
        """The peer's incarnation this node last took messages from, and how far."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.link(peer)
            link.ack_sent = link.ack_point()
            return link.peer_incarnation, link.ack_sent

    def link_connected(self, peer: str, read: int, wake: Wake) -> Update:
        """The connection to ``peer`` is up, and the peer holds this node's messages up
        to ``read``: settles what that covers, starts sending after it, and returns this
        node's whole table of routes, to send first."""
        k = self._kernel
        links = self._kernel.links
        now = k.clock()
        with k.lock:
            k.check_open()
            link = links.link(peer)
            link.connected, link.wake, link.connected_at, link.error = True, wake, now, None
            link.refusal = False
            # Past what this node committed (and handed its links, in the same step): a
            # lie, or a confusion — believed, it would settle a message still committing.
            read = min(read, k.durable_seq)
            link.updates.clear()
            # Settlements need not be waited for: the peer holds the messages already.
            self._settle_link(link, link.outbox.reconnected(read, now), now)
            (update,) = links.routing.link_up(peer)
        return update

    def link_failed(self, peer: str, why: str, *, refused: bool = False) -> None:
        """An attempt to connect to ``peer`` failed (shown by ``inspect links``):
        ``refused`` if one side said no (a name or token that does not fit, a link
        removed), rather than could not be reached."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.find(peer)
            if link is not None:
                link.error, link.refusal = why, refused

    def link_disconnected(self, peer: str, wake: Wake) -> None:
        """The connection ``wake`` belonged to is gone. Nothing is forgotten: what the
        link owes waits for the next connection."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.find(peer)
            if link is not None and link.wake == wake:  # (a bound method: a new object each time)
                link.connected, link.wake = False, None

    def link_table(self, peer: str) -> Update:
        """This node's whole table of routes for ``peer``: sent again now and then, so
        a route change lost on the way (a faulty network) is repaired."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            links.link(peer)
            (update,) = links.routing.link_up(peer)
            return update

    def link_updates(self, peer: str) -> list[Update]:
        """The route changes to tell ``peer``, taken (so told once)."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.link(peer)
            updates, link.updates = link.updates, []
            return updates

    def link_heard(self, peer: str, full: bool, moves: Sequence[Route | Withdraw]) -> None:
        """``peer`` sent routes (its whole table if ``full``). Kept, so a restart routes
        the same; the other peers hear what changed. InvalidInput if a route is bad
        (nothing of the frame is taken)."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            k.check_open()
            links.link(peer)
            if full:
                spread = links.routing.heard_all(peer, [m for m in moves if isinstance(m, Route)])
            else:
                for move in moves:  # all checked before any is taken
                    if isinstance(move, Route) and move.check().path[-1] != peer:
                        raise InvalidInput(f"route to {move.node!r} does not end with {peer!r}")
                spread = [u for m in moves for u in links.routing.heard(peer, m)]
            batch = RowBatch()
            offers = [route_json(r) for r in links.routing.offers(peer)]
            batch.set_meta(f"link/{peer}/offers", json.dumps(offers))
            k.queue_write(batch)
            links.spread(spread)
            k.routes.clear()

    @overload
    def link_frames(self, peer: str) -> list[tuple[int, Batch]]: ...
    @overload
    def link_frames(self, peer: str, *, memory_only: bool) -> list[tuple[int, Batch]] | None: ...

    def link_frames(
        self, peer: str, *, memory_only: bool = False
    ) -> list[tuple[int, Batch]] | None:
        """What to send ``peer`` now, as (prev, messages) frames, within its window.
        ``memory_only``: None, and nothing taken, if a message must be read from DuckDB
        (not the writer's overlay) — for the server's event loop, which asks again on
        a thread then; a busy link's messages are still in memory when they go."""
        k = self._kernel
        links = self._kernel.links
        now = k.clock()
        with k.lock:
            link = links.link(peer)
            if not link.connected:
                return []
            sender = link.outbox.sender
            frames = sender.frames(now, take=False)
            if not frames:
                return []
            seqs = list(chain.from_iterable(f.seqs for f in frames))
            rows = k.store.fetch_rows(seqs, memory_only=True)
            if rows is None and memory_only:
                return None
            sender.frames(now)  # the same frames, now taken
            routes = [link.outbox.routes_of(f.seqs) for f in frames]
            targets = {r: links.route_ids[r].targets for table, _ in routes for r in table}
        if rows is None:
            rows = k.store.fetch_rows(seqs)
        if None in rows:  # what a link owes is kept until the peer took it
            lost = seqs[rows.index(None)]
            raise DataDirDamaged(f"message {lost}, owed to {peer}, is not in the log")
        now_us, name = to_us(now), links.node_name
        to_of = {r: tuple(sorted(t)) for r, t in targets.items()}
        out, at = [], 0
        for frame, (table, route_of) in zip(frames, routes, strict=True):
            part, at = rows[at : at + len(frame.seqs)], at + len(frame.seqs)
            route_targets = tuple(to_of[r] for r in table)
            out.append((frame.prev, frame_batch(name, part, now_us, route_targets, route_of)))
        return out

    def link_passed_over(self, peer: str, seq: int, size: int, limit: int) -> None:
        """This node's message ``seq``, with a payload of ``size`` bytes, fits no frame
        of the ``limit`` bytes ``peer`` takes, and ``peer`` acknowledged it passed over
        (it took it as refused): counted as refused, and logged."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.find(peer)
            if link is None:
                return
            link.refused += 1
        log.warning(
            "link to %s: message %d refused: its payload of %d bytes fits no frame %s takes (at "
            "most %d bytes): passed over", peer, seq, size, peer, limit,
        )  # fmt: skip

    def link_taken(self, peer: str, read: int, gap: bool) -> None:
        """``peer`` holds this node's messages up to ``read`` (``gap``: it missed what
        follows): settle what that covers; after a gap, send again from there."""
        k = self._kernel
        links = self._kernel.links
        now = k.clock()
        with k.lock:
            link = links.link(peer)
            read = min(read, link.outbox.sender.sent)  # it cannot hold what was not sent
            self._settle_link(link, link.outbox.acknowledged(read, now, gap=gap), now)

    def link_tick(self, peer: str) -> bool:
        """The link's timers: the peer's messages held past their hold are written
        (and acknowledged once durable); whether the link went back to resend (nothing
        acknowledged for a while)."""
        k = self._kernel
        links = self._kernel.links
        now = k.clock()
        with k.lock:
            link = links.find(peer)
            if link is None:
                return False
            if link.held:
                with contextlib.suppress(EomsgError):  # a failed store: the node reopens
                    k.intake.write_held(now, link=link)
            return link.connected and link.outbox.sender.tick(now)

    def _settle_link(self, link: LinkState, done: dict[int, list[int]], now: float) -> None:
        """Settle the routes' messages the peer took (``done``, by route): one number,
        the highest of them — they are a prefix of what the link owes, so every message
        of the link's routes up to it is settled (see :meth:`_routes_taken`). Written
        with the next write: lost in a crash, it costs only a resend of what the peer
        holds, which it recognises and acknowledges again (and then says on
        reconnecting how far it holds). Under ``lock``."""
        k = self._kernel
        if not done:
            return
        count = sum(len(seqs) for seqs in done.values())
        link.taken_through = max(link.taken_through, *(seqs[-1] for seqs in done.values()))
        k.write_later(f"link/{link.config.peer}/taken", str(link.taken_through))
        link.taken += count
        link.last_taken_at = now
        k.settled_since_compaction += count

    def link_ack(self, peer: str) -> int | None:
        """An acknowledgement to send ``peer`` now — how far its messages are taken —
        if it moved since the last (messages held in memory settled or written)."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.find(peer)
            if link is None:
                return None
            point = link.ack_point()
            if point <= link.ack_sent:
                return None
            link.ack_sent = point
            return point

    def forward(self, routes: set[tuple[Destination, ...]]) -> None:
        """Messages committed for ``routes``: wake the links among them (a subscriber
        of ``Ingress.committed``). Never under ``lock``."""
        woken = set()
        for route in routes:
            for d in route:
                if isinstance(d, HopRoute) and d.link.wake is not None and d.link not in woken:
                    woken.add(d.link)
                    d.link.wake()
