"""Queue limits (issue 36): what a publish does to a queue its messages would take past
its ``max-messages`` or ``max-bytes`` (:class:`~eomsg.core.queues.QueueConfig`) —
refused whole (QueueFull), or room made by dead-lettering the oldest waiting — decided
under ``lock`` while the publish is staged (:meth:`eomsg.node.ingress.Ingress.stage`),
so what it changes commits with the publish.

A queue's depth here counts what it holds, in flight included, and what is staged for it
and not yet durable (:attr:`QueueState.incoming`; its bytes likewise,
:attr:`QueueState.held_bytes`), so publishers racing each other cannot pass the limit
together. A max-bytes counts payload bytes, as ``max-payload`` does. Every check comes
before any change: a refused publish leaves no record, no count, no seq and no id
behind. A duplicate (an id the node knows) counts nowhere, since it is not stored again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from eomsg.core.cursor import Outcome
from eomsg.core.message import Publishable
from eomsg.core.queues import DEAD_LETTER_OLDEST, REFUSE
from eomsg.errors import QueueFull
from eomsg.node.dedup import Deduplication
from eomsg.node.state import Destination, QueueState, Shared
from eomsg.store.writer import RowBatch

Route = tuple[Destination, ...]
# (queue, its dead-letter queue, seq, payload bytes): a message displaced into the latter
Displaced = list[tuple[QueueState, QueueState, int, int]]


class Kernel(Shared, Protocol):
    """What :class:`Overflow` needs of the node besides :class:`~eomsg.node.state.Shared`."""

    limited: bool
    uncommitted_ids: dict[str, int]
    dedup: Deduplication
    settled_since_compaction: int


class Overflow:
    """The limits of the queues a publish goes to: refusals, and the room made. A part
    of :class:`~eomsg.node.ingress.Ingress`, which stages publishes."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def displaced(
        self,
        messages: Sequence[Publishable],
        known: dict[str, int],
        route_of: Callable[[int], Route],
    ) -> dict[QueueState, int]:
        """For each queue that dead-letters its oldest, how many of ``messages`` (the
        first routed to it) never enter it: those beyond the room it can make from the
        messages waiting in it (a batch larger than its limit, or every message held in
        flight; by bytes, the newest that fit are kept) go to its dead-letter queue in
        the same commit. ``known``: the ids the dedup window holds; ``route_of(i)``:
        the route of message ``i``. Under ``lock``."""
        if not self._kernel.limited:
            return {}
        adding: dict[QueueState, list[int]] = {}  # the payload sizes it would get
        seen: set[str] = set()
        makers = _OnRoute(DEAD_LETTER_OLDEST)
        for i, m in enumerate(messages):
            limited = makers.of(route_of(i))
            if not limited:
                continue
            if m.id is not None:
                if m.id in seen or m.id in self._kernel.uncommitted_ids or m.id in known:
                    continue
                seen.add(m.id)
            for q in limited:
                adding.setdefault(q, []).append(len(m.payload))
        out = {}
        for q, sizes in adding.items():
            n = len(sizes)
            waiting = q.cursor.depth - q.cursor.in_flight
            beyond = min(n, q.config.over(q.depth, n) - waiting)
            if q.config.max_bytes is not None:
                beyond = max(beyond, n - _newest_fitting(q, sizes))
            if beyond > 0:
                out[q] = beyond
        return out

    def displace(
        self,
        displaced: dict[QueueState, int],
        moved: Displaced,
        queues: Route,
        seq: int,
        size: int,
        rerouted: dict[tuple[int, QueueState], Route],
    ) -> Route:
        """``queues``, the route of message ``seq``, with each queue it is displaced from
        (:meth:`displaced`) replaced by that queue's dead-letter queue; noted in
        ``moved``, for :meth:`record_displaced` once nothing refuses. ``rerouted``:
        the routes made so far, by route and queue displaced from (a batch's messages
        share a few; each route keyed is alive while the batch is staged: the node's,
        the caller's, or one made here and kept in ``rerouted``). Under ``lock``."""
        for q in queues:
            if displaced.get(q):  # type: ignore[call-overload]
                assert isinstance(q, QueueState)
                displaced[q] -= 1
                dlq = self._kernel.queues[q.config.dead_letter or ""]
                moved.append((q, dlq, seq, size))
                key = (id(queues), q)
                made = rerouted.get(key)
                if made is None:
                    made = (*(d for d in queues if d is not q and d is not dlq), dlq)
                    rerouted[key] = made
                queues = made
        return queues

    def refuse_past(
        self, adding: dict[QueueState, int], adding_bytes: dict[QueueState, int]
    ) -> None:
        """QueueFull if a queue that refuses would pass its max-messages with ``adding``
        more, or its max-bytes with ``adding_bytes`` more (only those it gets count: one
        over its limit already, by what was dead-lettered into it, refuses nothing it is
        not given). Under ``lock``."""
        for q, n in adding.items():
            if n <= 0 or q.config.overflow != REFUSE:
                continue
            if q.config.over(q.depth, n) or q.config.over_bytes(
                q.held_bytes, adding_bytes.get(q, 0)
            ):
                q.overflowed += n
                raise full(q, n, adding_bytes.get(q, 0))

    def record_displaced(self, batch: RowBatch, moved: Displaced, now_us: int) -> None:
        """Record the displaced messages as routed to their queue and dead-lettered from
        it at once (their route took them to the dead-letter queue). Under ``lock``."""
        destinations, settled = batch.rows_of("destinations"), batch.rows_of("settled")
        for q, _, seq, _ in moved:
            destinations.append((seq, q.id))
            settled.append((q.id, seq, Outcome.DEAD_LETTERED, now_us))
            q.counts[Outcome.DEAD_LETTERED] += 1
            q.overflowed += 1
        self._kernel.settled_since_compaction += len(moved)

    def make_room(
        self,
        batch: RowBatch,
        adding: dict[QueueState, int],
        adding_bytes: dict[QueueState, int],
        now: float,
    ) -> None:
        """Each queue that dead-letters its oldest and would pass its max-messages with
        ``adding`` more, or its max-bytes with ``adding_bytes`` more, moves its oldest
        waiting messages to its dead-letter queue, in ``batch``. Under ``lock``."""
        for q, n in adding.items():
            if n > 0 and q.config.overflow == DEAD_LETTER_OLDEST:
                over = q.config.over(q.depth, n)
                over_bytes = q.config.over_bytes(q.held_bytes, adding_bytes.get(q, 0))
                if over or over_bytes:
                    room, expiries = q.cursor.make_room(over, over_bytes)
                    q.overflowed += len(room)
                    self._kernel.record_settlements(batch, q, room, now, expiries)

    def room(self, ids: Sequence[str], now: float) -> Room:
        """A check of room, message by message, in the queues that refuse (a link's
        frame, a transaction's prepare); ``ids``: the messages' ids, looked up in the
        dedup window only if one goes to such a queue. Under ``lock``."""
        return Room(self._kernel, ids, now)


class Room:
    """Counts, message by message in order, what a batch adds to the queues that refuse
    past their max-messages or max-bytes, and says which would pass one. A duplicate (an
    id known, or earlier in the batch) counts nowhere."""

    def __init__(self, node: Kernel, ids: Sequence[str], now: float) -> None:
        self._node, self._ids, self._now = node, ids, now
        self._known: dict[str, int] | None = None
        self._seen: set[str] = set()
        self._adding: dict[QueueState, int] = {}
        self._adding_bytes: dict[QueueState, int] = {}
        self._refusing = _OnRoute(REFUSE)

    def never_fits(self, route: Route, size: int) -> tuple[QueueState, ...]:
        """The queues of ``route`` that refuse and that a message of ``size`` payload
        bytes can never fit, however many consumers make room (its max-bytes is less):
        a link leaves them out of its route, or it would wait at the peer for ever and
        hold up the link behind it. Each counts it as overflowed."""
        if not self._node.limited:
            return ()
        never = tuple(
            q
            for q in self._refusing.of(route)
            if q.config.max_bytes is not None and size > q.config.max_bytes
        )
        for q in never:
            q.overflowed += 1
        return never

    def full(self, route: Route, msg_id: str | None, size: int) -> QueueFull | None:
        """Why a queue of ``route`` has no room for one more message of ``size``
        payload bytes (counted nowhere then), or None (counted)."""
        limited = self._refusing.of(route) if self._node.limited else ()
        if not limited:
            return None
        if msg_id is not None:
            if self._known is None:
                self._known = self._node.dedup.lookup_many(list(self._ids), self._now)
            if msg_id in self._seen or msg_id in self._known:
                return None
            if msg_id in self._node.uncommitted_ids:
                return None
        for q in limited:
            nbytes = self._adding_bytes.get(q, 0) + size
            if q.config.over(q.depth, self._adding.get(q, 0) + 1) or q.config.over_bytes(
                q.held_bytes, nbytes
            ):
                q.overflowed += 1
                return full(q, self._adding.get(q, 0) + 1, nbytes)
        if msg_id is not None:
            self._seen.add(msg_id)
        for q in limited:
            self._adding[q] = self._adding.get(q, 0) + 1
            self._adding_bytes[q] = self._adding_bytes.get(q, 0) + size
        return None


class _OnRoute:
    """The queues of a route that have a limit with one overflow policy, found once per
    route (a batch's messages share a few). Keeps the routes it saw, so that an id it
    keys them by is never reused while it runs."""

    def __init__(self, overflow: str) -> None:
        self._overflow = overflow
        self._found: dict[int, tuple[Route, tuple[QueueState, ...]]] = {}

    def of(self, route: Route) -> tuple[QueueState, ...]:
        hit = self._found.get(id(route))
        if hit is None:
            limited = tuple(
                q
                for q in route
                if isinstance(q, QueueState)
                and q.config.limited
                and q.config.overflow == self._overflow
            )
            hit = self._found[id(route)] = (route, limited)
        return hit[1]


def _newest_fitting(q: QueueState, sizes: list[int]) -> int:
    """How many of the newest of ``sizes`` (payload bytes, oldest first) fit in ``q``'s
    max-bytes once every message waiting in it is dead-lettered: what is in flight or
    on its way in stays."""
    assert q.config.max_bytes is not None
    room = max(0, q.config.max_bytes - q.cursor.in_flight_bytes() - q.incoming_bytes)
    kept = 0
    for size in reversed(sizes):
        if size > room:
            break
        room -= size
        kept += 1
    return kept


def full(q: QueueState, n: int, nbytes: int) -> QueueFull:
    """The refusal of a publish of ``n`` messages, ``nbytes`` payload bytes, that ``q``
    has no room for."""
    c = q.config
    if c.max_bytes is not None and nbytes > c.max_bytes:
        return QueueFull(
            f"queue {c.name!r} holds at most {c.max_bytes} payload bytes (max-bytes): "
            f"a publish of {nbytes} can never fit; nothing of it was stored (publish it "
            "in smaller parts)"
        )
    if c.over(q.depth, n):
        held = f"{q.depth} messages of its {c.max_messages} (max-messages)"
    else:
        held = f"{q.held_bytes} payload bytes of its {c.max_bytes} (max-bytes)"
    return QueueFull(
        f"queue {c.name!r} is full: it holds {held} and refuses more; nothing of this "
        "publish was stored (retry it once consumers made room)"
    )
