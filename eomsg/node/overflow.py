"""Queue limits (issue 36): what a publish does to a queue its messages would take past
its ``max-messages`` (:class:`~eomsg.core.queues.QueueConfig`) — refused whole
(QueueFull), or room made by dead-lettering the oldest waiting — decided under ``_lock``
while the publish is staged (:meth:`eomsg.node.ingress.Ingress._stage`), so what it
changes commits with the publish.

A queue's depth here counts what it holds, in flight included, and what is staged for it
and not yet durable (:attr:`QueueState.incoming`), so publishers racing each other cannot
pass the limit together. Every check comes before any change: a refused publish leaves
no record, no count, no seq and no id behind. A duplicate (an id the node knows) counts
nowhere, since it is not stored again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eomsg.core.cursor import Outcome
from eomsg.core.message import Publishable
from eomsg.core.queues import DEAD_LETTER_OLDEST, REFUSE
from eomsg.errors import QueueFull
from eomsg.node.state import Destination, NodeState, QueueState
from eomsg.store.writer import RowBatch

Route = tuple[Destination, ...]
Displaced = list[tuple[QueueState, QueueState, int]]  # (queue, its dead-letter queue, seq)


class Overflow(NodeState):
    """The limits of the queues a publish goes to: refusals, and the room made."""

    def _displaced(
        self,
        messages: Sequence[Publishable],
        known: dict[str, int],
        route_of: Callable[[int], Route],
    ) -> dict[QueueState, int]:
        """For each queue that dead-letters its oldest, how many of ``messages`` (the
        first routed to it) never enter it: those beyond the room it can make from the
        messages waiting in it (a batch larger than its limit, or every message held in
        flight) go to its dead-letter queue in the same commit. ``known``: the ids the
        dedup window holds; ``route_of(i)``: the route of message ``i``. Under
        ``_lock``."""
        if not self._limited:
            return {}
        adding: dict[QueueState, int] = {}
        seen: set[str] = set()
        makers = _OnRoute(DEAD_LETTER_OLDEST)
        for i, m in enumerate(messages):
            limited = makers.of(route_of(i))
            if not limited:
                continue
            if m.id is not None:
                if m.id in seen or m.id in self._uncommitted_ids or m.id in known:
                    continue
                seen.add(m.id)
            for q in limited:
                adding[q] = adding.get(q, 0) + 1
        out = {}
        for q, n in adding.items():
            waiting = q.cursor.depth - q.cursor.in_flight
            if (beyond := min(n, q.config.over(q.depth, n) - waiting)) > 0:
                out[q] = beyond
        return out

    def _displace(
        self, displaced: dict[QueueState, int], moved: Displaced, queues: Route, seq: int
    ) -> Route:
        """``queues``, the route of message ``seq``, with each queue it is displaced from
        (:meth:`_displaced`) replaced by that queue's dead-letter queue; noted in
        ``moved``, for :meth:`_record_displaced` once nothing refuses. Under ``_lock``."""
        for q in queues:
            if displaced.get(q):  # type: ignore[call-overload]
                assert isinstance(q, QueueState)
                displaced[q] -= 1
                dlq = self._queues[q.config.dead_letter or ""]
                queues = (*(d for d in queues if d is not q and d is not dlq), dlq)
                moved.append((q, dlq, seq))
        return queues

    def _refuse_past(self, adding: dict[QueueState, int]) -> None:
        """QueueFull if a queue that refuses would pass its max-messages with ``adding``
        more (only those it gets count: one over its limit already, by what was
        dead-lettered into it, refuses nothing it is not given). Under ``_lock``."""
        for q, n in adding.items():
            if n > 0 and q.config.overflow == REFUSE and q.config.over(q.depth, n):
                q.overflowed += n
                raise full(q)

    def _record_displaced(self, batch: RowBatch, moved: Displaced, now_us: int) -> None:
        """Record the displaced messages as routed to their queue and dead-lettered from
        it at once (their route took them to the dead-letter queue). Under ``_lock``."""
        for q, _, seq in moved:
            batch.add("destinations", seq, q.id)
            batch.add("settled", q.id, seq, Outcome.DEAD_LETTERED, now_us)
            q.counts[Outcome.DEAD_LETTERED] += 1
            q.overflowed += 1
        self._settled_since_compaction += len(moved)

    def _make_room(self, batch: RowBatch, adding: dict[QueueState, int], now: float) -> None:
        """Each queue that dead-letters its oldest and would pass its max-messages with
        ``adding`` more moves its oldest waiting messages to its dead-letter queue, in
        ``batch``. Under ``_lock``."""
        for q, n in adding.items():
            if n > 0 and q.config.overflow == DEAD_LETTER_OLDEST:
                over = q.config.over(q.depth, n)
                if over:
                    room, expiries = q.cursor.make_room(over)
                    q.overflowed += len(room)
                    self._record_settlements(batch, q, room, now, expiries)

    def _room(self, ids: Sequence[str], now: float) -> Room:
        """A check of room, message by message, in the queues that refuse (a link's
        frame, a transaction's prepare); ``ids``: the messages' ids, looked up in the
        dedup window only if one goes to such a queue. Under ``_lock``."""
        return Room(self, ids, now)


class Room:
    """Counts, message by message in order, what a batch adds to the queues that refuse
    past their max-messages, and says which would pass it. A duplicate (an id known, or
    earlier in the batch) counts nowhere."""

    def __init__(self, node: Overflow, ids: Sequence[str], now: float) -> None:
        self._node, self._ids, self._now = node, ids, now
        self._known: dict[str, int] | None = None
        self._seen: set[str] = set()
        self._adding: dict[QueueState, int] = {}
        self._refusing = _OnRoute(REFUSE)

    def full(self, route: Route, msg_id: str | None) -> QueueFull | None:
        """Why a queue of ``route`` has no room for one more message (counted nowhere
        then), or None (counted)."""
        limited = self._refusing.of(route) if self._node._limited else ()
        if not limited:
            return None
        if msg_id is not None:
            if self._known is None:
                self._known = self._node._dedup.lookup_many(list(self._ids), self._now)
            if msg_id in self._seen or msg_id in self._known:
                return None
            if msg_id in self._node._uncommitted_ids:
                return None
        for q in limited:
            if q.config.over(q.depth, self._adding.get(q, 0) + 1):
                q.overflowed += 1
                return full(q)
        if msg_id is not None:
            self._seen.add(msg_id)
        for q in limited:
            self._adding[q] = self._adding.get(q, 0) + 1
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
                and q.config.max_messages is not None
                and q.config.overflow == self._overflow
            )
            hit = self._found[id(route)] = (route, limited)
        return hit[1]


def full(q: QueueState) -> QueueFull:
    """The refusal of a publish ``q`` has no room for."""
    return QueueFull(
        f"queue {q.config.name!r} is full: it holds {q.depth} messages of its "
        f"{q.config.max_messages} (max-messages) and refuses more; nothing of this "
        "publish was stored (retry it once consumers made room)"
    )
