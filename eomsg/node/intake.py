"""What a linked peer sends (seeds 000, 003 and 004 k across machines): its messages
taken in order, stored here with their destinations — this node's queues, and onward for
the nodes behind it — in one commit with the link's read sequence, and acknowledged once
durable; or, on a link whose egress is ``memory``, held (:mod:`eomsg.node.egress`) and
acknowledged as each is settled here or written. The receiving side of
:mod:`eomsg.node.links` (whose docstring tells the whole).

Under the lock discipline of :mod:`eomsg.node.state`: everything under ``lock``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from eomsg.core.limits import check_outgoing
from eomsg.core.message import Carried, Message
from eomsg.core.topics import Matcher
from eomsg.core.transfer import Verdict
from eomsg.errors import EomsgError, QueueFull
from eomsg.node.egress import SEQ_AT, Held
from eomsg.node.ingress import Fresh
from eomsg.node.linkstate import HopRoute, LinkState
from eomsg.node.state import Destination, QueueState, Shared
from eomsg.store.writer import RowBatch

if TYPE_CHECKING:
    from eomsg.node.ingress import Ingress
    from eomsg.node.links import Links

log = logging.getLogger("eomsg.link")
Way = tuple["tuple[Destination, ...]", bool, "tuple[LinkState, ...]"]  # see _route_carried


class Kernel(Shared, Protocol):
    """What :class:`Intake` needs of the node besides :class:`~eomsg.node.state.Shared`."""

    links: Links
    ingress: Ingress
    next_seq: int
    matcher: Matcher[QueueState]

    def check_room(self) -> None: ...
    def check_memory(self) -> None: ...


class Intake:
    """The receiving side of each link: frames taken, stored or held, acknowledged."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def accept_transfer(
        self, peer: str, prev: int, messages: Sequence[Carried]
    ) -> Future[tuple[int, bool]]:
        """Messages from ``peer`` continuing from its sequence ``prev``. Those not taken
        before are stored, with their destinations here and onward, in one commit with
        the new read sequence; the future resolves after it with ``(read, gap)`` — what
        to acknowledge. A frame all taken before resolves at once; one that does not
        follow what was taken says so (``gap``). A message this node cannot take is
        counted as refused and passed over; one for a node this node has no route to
        is not carried there (both logged once, and counted in :meth:`link_info`).

        On a link whose egress is ``memory``, a frame whose messages are all for this
        node's queues alone is held in memory instead (:mod:`eomsg.node.egress`): taken
        at once, and acknowledged as each is settled here or written."""
        k = self._kernel
        limits = k.settings.limits
        outgoing: list[Carried | str] = []  # a str: refused here, and why (see below)
        for m in messages:
            try:
                check_outgoing(m, limits)
            except EomsgError as e:
                # A message this node cannot take (over its payload limit, a topic it
                # refuses) is taken as refused: held, it would block every message
                # behind it on the link for ever. Said in the log and in inspect links.
                outgoing.append(e.message)
                continue
            outgoing.append(m)
        return self._accept(peer, prev, [m.seq for m in messages], outgoing)

    def accept_oversize(
        self, peer: str, prev: int, seq: int, size: int, limit: int
    ) -> Future[tuple[int, bool]]:
        """``peer`` passed over its message ``seq`` (continuing from ``prev``), with a
        payload of ``size`` bytes: it fits no frame of the ``limit`` bytes this node
        takes from it. Taken as a message this node cannot take is — counted as
        refused, logged — so the link's sequence goes on past it; the future resolves
        as :meth:`accept_transfer`'s does."""
        k = self._kernel
        why = (
            f"its payload of {size} bytes fits no frame this node takes (at most {limit} "
            f"bytes; its max-payload is {k.settings.limits.max_payload} bytes): {peer} "
            "passed it over"
        )
        return self._accept(peer, prev, [seq], [why])

    def not_taken_is_news(self, peer: str, why: str) -> bool:
        """Whether ``why`` this node could not take a frame from ``peer`` (a full queue,
        disk or memory) is news for its log: not what it said last for that link since
        the link last moved on. The peer sends the frame again every few seconds while
        it lasts, over one connection or the next: said once, not at each. Notes it."""
        k = self._kernel
        links = self._kernel.links
        with k.lock:
            link = links.find(peer)
            if link is None:
                return True
            news, link.not_taken = link.not_taken != why, why
            return news

    def _accept(
        self, peer: str, prev: int, seqs: list[int], outgoing: list[Carried | str]
    ) -> Future[tuple[int, bool]]:
        """Take the messages ``seqs`` of ``peer``, continuing from ``prev``: each is
        ``outgoing``'s message to store here and onward, or why it is refused. DiskFull
        or MemoryFull (the queues over their share) while this node cannot take more:
        the peer keeps them and sends them again, as a producer retries."""
        k = self._kernel
        k.check_room()
        k.check_memory()
        now = k.clock()
        done: Future[tuple[int, bool]] = Future()
        with k.lock:
            k.check_open()
            link = k.links.link(peer)
            offer = link.receiver.offer(prev, seqs)
            if offer.verdict is not Verdict.TAKE:
                done.set_result((link.acked(), offer.verdict is Verdict.GAP))
                return done
            before = prev if offer.start == 0 else seqs[offer.start - 1]
            frame = self._sort(link, seqs[offer.start :], outgoing[offer.start :], before, now)
            kept, routes, read = frame.kept, frame.routes, frame.read
            link.received += len(kept)
            if read != before:  # the link moves on: a refusal from now on is news again
                link.not_taken = None
            if self._holds(link, kept, routes):
                try:
                    wake = self._hold_frame(link, kept, routes, frame.peer_seqs, now)
                except QueueFull:  # the peer keeps them and sends them again
                    link.received -= len(kept)
                    link.receiver.refused()
                    raise
                link.receiver.committed(read)  # taken by this process: never taken twice
                done.set_result((link.acked(), False))
            else:
                wake = None
                first = seqs[offer.start]
                committed = self._store_frame(link, kept, routes, first, now)
            link.refused += len(frame.refused)  # (not if the store refused it: sent again)
        for seq, why in frame.refused:
            log.warning("link to %s: message %d refused: %s", peer, seq, why)
        if wake is not None:
            k.notify(wake)
            return done

        def on_commit(f: Future[None]) -> None:
            error = f.exception()
            if error is not None:
                done.set_exception(error)
                return
            with k.lock:
                if link.storing and link.storing[0] == first:  # commits come in order
                    link.storing.popleft()
                link.receiver.committed(read)
                point = link.acked()
            done.set_result((point, False))

        committed.add_done_callback(on_commit)
        return done

    def _sort(
        self,
        link: LinkState,
        seqs: list[int],
        outgoing: list[Carried | str],
        before: int,
        now: float,
    ) -> _Frame:
        """What of a frame's new messages (``seqs``, the peer's, after ``before``) this
        node takes, each with its route; what it refuses, and why; how far it reads —
        short of the first message a full queue has no room for (it and the rest wait at
        the peer: QueueFull if that is the first). Under ``lock``."""
        peer, receiver = link.config.peer, link.receiver
        frame = _Frame(before)
        routed: dict[tuple[str, tuple[str, ...]], Way] = {}
        ids = [m.id for m in outgoing if not isinstance(m, str) and m.id]
        room = self._kernel.ingress.overflow.room(ids, now)
        for seq, m in zip(seqs, outgoing, strict=True):
            if isinstance(m, str):
                frame.refused.append((seq, m))
                frame.read = seq
                continue
            if not link.allows(m.topic):  # not this link's to carry: passed over
                link.withheld += 1
                log.warning("link to %s: message %d's topic is not the link's", peer, m.seq)
                frame.read = seq
                continue
            way = routed.get((m.topic, m.targets))  # a frame's messages share a few
            if way is None:
                way = routed[m.topic, m.targets] = self._route_carried(link, m)
            route, unreachable, withheld = way
            if never := room.never_fits(route, len(m.payload)):
                route = tuple(d for d in route if d not in never)
                log.warning(
                    "link to %s: message %d not given to queue %s: its payload of %d "
                    "bytes can never fit its max-bytes", peer, m.seq,
                    ", ".join(q.config.name for q in never), len(m.payload),
                )  # fmt: skip
            full = room.full(route, m.id, len(m.payload))
            if full is not None:  # it and the rest wait at the peer, sent again
                if frame.read == before:
                    receiver.refused()
                    raise full
                receiver.took(frame.read)
                break
            frame.read = seq
            link.unroutable += unreachable
            for out in withheld:  # not the next link's to carry
                out.withheld += 1
            frame.routes.append(route)
            frame.kept.append(m)
            frame.peer_seqs.append(m.seq)
        return frame

    def _route_carried(self, link: LinkState, m: Carried) -> Way:
        """Where a message from ``link`` goes: this node's queues if it is a target,
        and onward by next hop for the other targets, over links carrying its topic;
        whether some target has no route from here, and the links that do not carry
        it. Under ``lock``."""
        k = self._kernel
        links = self._kernel.links
        here, onward, unreachable = links.routing.forward(m.targets)
        if unreachable:
            log.warning(
                "link to %s: no route to %s for message %d: not carried there",
                link.config.peer, ", ".join(sorted(unreachable)), m.seq,
            )  # fmt: skip
        route: list[Destination] = list(k.matcher.match(m.topic)) if here else []
        route.sort(key=lambda d: d.id)
        withheld = []
        for hop, to in onward.items():
            out = links.link(hop)
            if out.allows(m.topic):
                route.append(links.hop(out, to))
            else:
                withheld.append(out)
        return tuple(route), bool(unreachable), tuple(withheld)

    def _store_frame(
        self,
        link: LinkState,
        kept: list[Carried],
        routes: list[tuple[Destination, ...]],
        first: int,
        now: float,
    ) -> Future[None]:
        """Store a frame's messages (the peer's seqs from ``first``) with the link's
        read sequence, in one commit — and, with them, the messages of this link still
        held in memory, so that the read sequence kept on disk may pass them: a restart
        then takes nothing stored here twice. Under ``lock``."""
        k = self._kernel
        batch = RowBatch()
        first_seq = k.next_seq
        try:  # QueueFull (a queue refuses more) or a refused write: sent again
            _, fresh = k.ingress.stage(
                batch, kept, now, routes=routes
            )  # nothing staged if it raises
            held = [h for h in link.held.values() if not h.writing and k.egress.holds(h)]
            if held:  # ahead of the frame's rows, whichever is put in first
                k.egress.write_with(batch, held)
            batch.set_meta(
                f"link/{link.config.peer}/read",
                json.dumps({"incarnation": link.peer_incarnation, "read": link.receiver.accepted}),
            )
            committed = k.ingress.write_staged(batch, first_seq, fresh)
        except BaseException:
            link.received -= len(kept)
            link.receiver.refused()
            raise
        link.storing.append(first)
        return committed

    def _holds(
        self, link: LinkState, kept: list[Carried], routes: list[tuple[Destination, ...]]
    ) -> bool:
        """Whether a frame is held in memory: the link says so, no frame of it stored
        before is waiting for its commit (the queues must get the peer's messages in its
        order), and every message of it is for this node's queues alone (none to carry
        further, none for no queue, none for a queue with a limit), within the room
        left. Under ``lock``."""
        k = self._kernel
        if link.config.egress != "memory" or not kept or link.storing:
            return False
        for route in routes:
            if not route or any(isinstance(d, HopRoute) for d in route):
                return False
            if any(isinstance(d, QueueState) and d.config.limited for d in route):
                return False  # making room records settlements of other messages: stored
        return k.egress.has_room(sum(len(m.payload) for m in kept))

    def _hold_frame(
        self,
        link: LinkState,
        kept: list[Carried],
        routes: list[tuple[Destination, ...]],
        peer_seqs: list[int],
        now: float,
    ) -> set[str]:
        """Number the frame's messages and hold them; their queues get them at once.
        The queues to wake once ``lock`` is released. Under ``lock``."""
        k = self._kernel
        staged = RowBatch()
        results, fresh = k.ingress.stage(staged, kept, now, routes=routes)
        rows: dict[int, RowBatch] = {}
        for name, table in staged.tables.items():
            at = SEQ_AT.get(name)
            if at is None:
                continue  # the routes' records: saved with the next batch stored
            for row in table:
                rows.setdefault(row[at], RowBatch()).rows_of(name).append(row)
        deadline = now + link.config.hold
        for m, result, peer_seq, route in zip(kept, results, peer_seqs, routes, strict=True):
            if result.duplicate:
                continue
            held = Held(
                result.seq,
                peer_seq,
                link,
                Message(
                    result.seq,
                    m.topic,
                    m.payload,
                    m.id,
                    now,
                    None if m.ttl is None else now + m.ttl,
                    m.all_headers(),
                ),
                deadline,
                {d.id for d in route},
                rows[result.seq],
            )
            k.egress.keep(held)
            link.held[peer_seq] = held
        return self._deliver(fresh) if fresh else set()

    def held_done(self, done: list[Held]) -> None:
        """These held messages are settled everywhere here, or durable: their links may
        acknowledge them (a subscriber of ``Egress.done``). Under ``lock``."""
        for held in done:
            if held.link.held.get(held.peer_seq) is held:  # (not one of a new incarnation)
                del held.link.held[held.peer_seq]
        for link in {held.link for held in done}:  # woken once: it sends one acknowledgement
            if link.wake is not None and link.ack_point() > link.ack_sent:
                link.wake()

    def write_held(
        self, now: float, *, link: LinkState | None = None, every: bool = False
    ) -> Future[None] | None:
        """Write the held messages whose hold is over (``every``: all of them; ``link``:
        that link's only) with what was recorded about them, and each link's read
        sequence past them, in one commit; they are acknowledged once it is durable.
        Under ``lock``."""
        k = self._kernel
        links = self._kernel.links
        due = k.egress.due(now, link, every)
        if not due:
            return None
        batch = RowBatch()
        k.egress.write_with(batch, due)
        for each in {h.link for h in due}:
            if links.find(each.config.peer) is not each:
                continue  # removed: nothing of it is kept
            # Frames stored before are durable before this commit, held ones in it or
            # before: the read kept may pass all but the held ones still to be written.
            point = each.receiver.accepted
            for peer_seq, h in each.held.items():
                if not h.writing:
                    point = min(point, peer_seq - 1)
                    break
            batch.set_meta(
                f"link/{each.config.peer}/read",
                json.dumps({"incarnation": each.peer_incarnation, "read": point}),
            )
        return k.write(batch)

    def _deliver(self, fresh: list[Fresh]) -> set[str]:
        """Hand held messages to their queues' cursors and their ids to the dedup
        window, as a commit does for stored ones; the names of the queues to wake once
        ``lock`` is released. Under ``lock``."""
        routes = self._kernel.ingress.deliverable(fresh)
        return {q.config.name for r in routes for q in r if isinstance(q, QueueState)}


class _Frame:
    """What :meth:`Intake._sort` makes of a frame: the messages taken, their routes and
    the peer's seqs; those refused, and why; how far it reads."""

    def __init__(self, read: int) -> None:
        self.kept: list[Carried] = []
        self.routes: list[tuple[Destination, ...]] = []
        self.peer_seqs: list[int] = []
        self.refused: list[tuple[int, str]] = []
        self.read = read
