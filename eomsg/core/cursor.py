"""The cursor of one queue (seed 003): where the queue has read to in the log, which
messages are out for delivery, and which it considers deleted.

Pure state: no clock, no I/O. Every call takes ``now`` (seconds since the epoch) and
returns the effects the node must make durable — deliveries to record before handing
messages out, settlements (deleted, expired, dead-lettered, purged) to record. The node
applies a call's effects in one commit; if that commit fails the node stops, so the
in-memory state never runs ahead of what a restart would rebuild.

Life of a message in a cursor::

    unread ──take──► in flight ──delete──► settled (DELETED)
                      │   ▲
      deadline/release│   │take
                      ▼   │
                    parked ──due──► ready
                      │
                      └─ past max_redeliveries ─► settled (DEAD_LETTERED)

    in flight ──hold──► held (for a prepared transaction: no deadline, no delete or
                        release but its outcome's) ──commit──► settled (DELETED)
                          └──abort──► ready

An unread or parked message whose time-to-live has passed is settled EXPIRED and never
delivered; one in flight is left to its consumer and expires if it comes back.

A delivery is named by its key ``(seq, attempt)``: ``attempt`` counts the times the
message was handed out. A delete or release names the delivery it settles, and is
refused (StaleDelivery, nothing changed) when that delivery is over — timed out and
handed out again, taken back, or held by someone else: each delivery records its
``holder`` (an opaque caller token: the node gives each connection its own) and the
``epoch`` of the flow it went to. A consumer that gives back deliveries it never handed
to its application (:meth:`Cursor.return_unseen`) has them un-counted, so ``attempt``
stays the number of times the application saw the message.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from eomsg.core.durations import MAX_SECONDS
from eomsg.core.message import Key
from eomsg.core.seqqueue import SeqQueue
from eomsg.errors import HeldByTransaction, InvalidInput, NotInFlight, StaleDelivery, StaleEpoch

HELD = -1
"""The epoch of a message held by a prepared transaction (seed 000's delivery
transaction): no flow has it, so no flow can delete or release it."""

ORPHAN = -1
"""The holder of a delivery restored after a restart: whoever held it is gone with the
old process, so nobody may settle it; it is handed out again (counted) at once."""


class Outcome(IntEnum):
    """Why a message left a queue; stored in the settlement record."""

    DELETED = 0
    EXPIRED = 1
    DEAD_LETTERED = 2
    PURGED = 3


class Delivery(NamedTuple):
    """A message handed out: the consumer must delete or release it before ``deadline``
    (a named tuple: a take makes one per message)."""

    seq: int
    attempt: int
    deadline: float
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Settlement:
    """A message leaving the queue for good, with the reason."""

    seq: int
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Release:
    """A delivery given back: ready again at ``due`` (its attempt count is kept) — or,
    ``unseen``, given back un-counted: its consumer never handed it out, and ``attempt``
    is the count after taking that delivery back."""

    seq: int
    attempt: int
    due: float
    unseen: bool = False


@dataclass(slots=True)
class Taken:
    """Effects of :meth:`Cursor.take`: deliveries to record and settlements found on the
    way.

    ``run`` (None: none) is where in ``deliveries`` a run of first deliveries starts:
    from there on, the deliveries are of every message this queue held unsettled with a
    seq from ``deliveries[run].seq`` to ``deliveries[-1].seq``, each read from the log
    in order past the read position and handed out for the first time (attempt 1,
    one deadline) — recordable as one row for the range. The messages of the range it
    does not hand out were settled before or by this take; none came to the queue out
    of order."""

    deliveries: list[Delivery]
    settlements: list[Settlement]
    run: int | None = None


class _Delivered:
    """A message delivered at least once and not yet settled."""

    __slots__ = ("attempt", "due", "epoch", "holder", "in_flight", "ready")

    def __init__(
        self, attempt: int, due: float, in_flight: bool, epoch: int = 0, holder: int = 0
    ) -> None:
        self.attempt = attempt
        self.due = due  # deadline while in flight, not-before time while parked
        self.in_flight = in_flight
        self.ready = False
        self.epoch = epoch  # of the flow it was last delivered to; 0: no flow
        self.holder = holder  # who it was last delivered to (an opaque token)


class Cursor:
    """Delivery state of one queue. See the module docstring for the life cycle."""

    def __init__(
        self,
        *,
        ack_timeout: float,
        max_redeliveries: int | None = None,
        read_seq: int = 0,
    ) -> None:
        self.ack_timeout = ack_timeout
        self.max_redeliveries = max_redeliveries
        self.read_seq = read_seq  # seed 003: the last message read from the log in order
        self._unread = SeqQueue()  # destined here, after read_seq, ascending
        self._dropped: set[int] = set()  # unread seqs settled without delivery (lazy)
        # The highest seq that came out of order (below one already here, or moved here
        # from another queue): no run of first deliveries may start at or below it.
        self._late = 0
        self._delivered: dict[int, _Delivered] = {}
        # Heap of (due, tiebreak, seqs): one entry per take() or release, since a batch
        # shares its deadline; each seq is validated against its entry when it fires.
        self._timers: list[tuple[float, int, array[int]]] = []
        self._timer_ids = 0
        self._ready: list[int] = []  # heap of seqs, validated lazily
        self._expires: dict[int, float] = {}
        self._expiry: list[tuple[float, int]] = []  # heap (expires_at, seq)
        self._count = 0
        self._in_flight = 0
        # The payload size of each message it holds, while a max-bytes asks for them
        # (:meth:`track_sizes`); ``bytes`` their sum.
        self._sizes: dict[int, int] | None = None
        self.bytes = 0

    # -- what is in the queue ---------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages not yet settled, in flight included."""
        return self._count

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def nbytes(self) -> int:
        """About the memory its state takes: 8 bytes a message waiting unread, about
        200 a message delivered and not settled, 120 one with an expiry (what
        ``eomsg inspect memory`` counts against the queues' share)."""
        return (
            8 * len(self._unread)
            + 200 * len(self._delivered)
            + 120 * len(self._expires)
            + 80 * len(self._dropped)
            + 100 * len(self._sizes or ())
        )

    def holds(self, seq: int) -> bool:
        """Whether message ``seq`` is pending here (waiting, in flight or held)."""
        return seq in self._delivered or (seq in self._unread and seq not in self._dropped)

    @property
    def sized(self) -> bool:
        """Whether it keeps the payload size of each message it holds."""
        return self._sizes is not None

    def track_sizes(self, sizes: dict[int, int] | None) -> None:
        """Keep from now on the payload size of each message it holds, starting from
        ``sizes`` (of every message it holds now: one missing counts 0), or (None) stop
        keeping them. What a max-bytes is held against; about 100 bytes of memory a
        message, so kept only while a queue has one."""
        if sizes is None:
            self._sizes, self.bytes = None, 0
            return
        self._sizes = {seq: sizes.get(seq, 0) for seq in self.pending()}
        self.bytes = sum(self._sizes.values())

    def in_flight_bytes(self) -> int:
        """The payload bytes of the messages in flight (or held): what making room
        cannot free. Costs the messages delivered and not settled; 0 unless sized."""
        sizes = self._sizes
        if sizes is None:
            return 0
        return sum(sizes.get(s, 0) for s, e in self._delivered.items() if e.in_flight)

    @property
    def ready_count(self) -> int:
        """Messages that could be handed out now or later: pending and not in flight."""
        return self._count - self._in_flight

    def lowest_pending(self) -> int | None:
        """The lowest sequence number not yet settled, or None when empty."""
        low = min(self._delivered, default=None)
        for seq in self._unread:
            if seq not in self._dropped:
                return seq if low is None else min(low, seq)
        return low

    def in_flight_by_epoch(self) -> dict[int, int]:
        """How many messages each epoch holds in flight (for inspection)."""
        counts: dict[int, int] = {}
        for entry in self._delivered.values():
            if entry.in_flight:
                counts[entry.epoch] = counts.get(entry.epoch, 0) + 1
        return counts

    def pending(self) -> list[int]:
        """All unsettled sequence numbers, ascending (for tests and inspection)."""
        live = [s for s in self._unread if s not in self._dropped]
        return sorted([*live, *self._delivered])

    def pending_from(self, from_seq: int, limit: int) -> list[int]:
        """Up to ``limit`` unsettled sequence numbers from ``from_seq`` on, ascending,
        without sorting the whole queue: the unread ones are kept in order."""
        live = []
        for seq in self._unread.since(from_seq):
            if seq not in self._dropped:
                live.append(seq)
                if len(live) >= limit:
                    break
        delivered = heapq.nsmallest(limit, (s for s in self._delivered if s >= from_seq))
        return sorted([*live, *delivered])[:limit]

    def waiting(self, limit: int | None = None) -> list[int]:
        """Up to ``limit`` of the messages waiting here (not in flight), lowest seq first."""
        found = []
        for seq in self.pending():
            entry = self._delivered.get(seq)
            if entry is None or not entry.in_flight:
                found.append(seq)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def take_out(self, seqs: Sequence[int]) -> list[Settlement]:
        """Settle, as DELETED, the waiting messages ``seqs`` (from :meth:`waiting`): they
        leave this queue for another (a requeue)."""
        return [self._settle(seq, Outcome.DELETED) for seq in seqs]

    # -- filling -----------------------------------------------------------------------

    def append(
        self, seq: int, expires_at: float | None = None, size: int = 0, *, moved: bool = False
    ) -> None:
        """A message destined for this queue was durably logged (each seq once), of
        ``size`` payload bytes (kept if :attr:`sized`).

        Messages normally arrive in sequence order; one that arrives late (a message
        dead-lettered here from another queue) is made ready at once instead. One that
        arrives late, or ``moved`` here from another queue, counts as out of order: no
        run of first deliveries (:attr:`Taken.run`) starts at or below it.
        """
        if moved:
            self._late = max(self._late, seq)
        self._enter(seq, expires_at)
        if self._sizes is not None:
            self._sizes[seq] = size
            self.bytes += size

    def extend(
        self, seqs: list[int], expires_at: list[float | None], sizes: list[int] | None = None
    ) -> None:
        """:meth:`append` for many ascending seqs at once (the ingress fast path), of
        ``sizes`` payload bytes (None: 0 each)."""
        unread = self._unread
        if (
            seqs
            and seqs[0] > self.read_seq
            and (not unread or seqs[0] > unread.last())
            and not any(expires_at)
        ):
            unread.extend(seqs)
            self._count += len(seqs)
        else:
            for seq, expires in zip(seqs, expires_at, strict=True):
                self._enter(seq, expires)
        if self._sizes is not None:
            if sizes is None:
                self._sizes.update(dict.fromkeys(seqs, 0))
            else:
                self._sizes.update(zip(seqs, sizes, strict=True))
                self.bytes += sum(sizes)

    def _enter(self, seq: int, expires_at: float | None) -> None:
        if (self._unread and seq <= self._unread.last()) or seq <= self.read_seq:
            self._late = max(self._late, seq)
            self._park(seq, _Delivered(0, 0.0, in_flight=False), ready=True)
        else:
            self._unread.append(seq)
        self._count += 1
        if expires_at is not None:
            self._expires[seq] = expires_at
            heapq.heappush(self._expiry, (expires_at, seq))

    def restore(
        self,
        seq: int,
        attempt: int,
        due: float,
        in_flight: bool,
        expires_at: float | None,
        size: int = 0,
    ) -> None:
        """Rebuild a delivered-before message on recovery (``attempt`` 0 if every
        delivery of it was given back unseen); nobody
        holds it (:data:`ORPHAN`) until it is handed out again."""
        self._count += 1
        entry = _Delivered(attempt, due, in_flight, holder=ORPHAN)
        self._delivered[seq] = entry
        self._in_flight += in_flight
        self._add_timer(due, [seq])
        self.read_seq = max(self.read_seq, seq)
        if expires_at is not None:
            self._expires[seq] = expires_at
            heapq.heappush(self._expiry, (expires_at, seq))
        if self._sizes is not None:
            self._sizes[seq] = size
            self.bytes += size

    # -- the consumer's side ------------------------------------------------------------

    def take(self, now: float, limit: int, epoch: int = 0, holder: int = 0) -> Taken:
        """Hand out up to ``limit`` messages to ``holder``, on the flow holding ``epoch``
        (0: no flow): redeliveries first (lowest seq first), then unread messages in
        order — those a run of first deliveries (:attr:`Taken.run`) unless one came out
        of order inside their range. Also returns settlements that came due on the way."""
        settlements = self.poll(now)
        deliveries: list[Delivery] = []
        deadline = now + self.ack_timeout
        delivered, expires = self._delivered, self._expires
        timed: list[int] = []
        run: int | None = None
        while len(deliveries) < limit:
            seq = self._next_ready()
            if seq is None and not expires:  # the usual case: the rest read in one step
                if fresh_seqs := self._take_unread(
                    limit - len(deliveries), deadline, epoch, holder
                ):
                    run = len(deliveries) if run is None else run
                    deliveries.extend(
                        map(Delivery, fresh_seqs, repeat(1), repeat(deadline), repeat(epoch))
                    )
                    timed.extend(fresh_seqs)
                break
            if seq is None:
                seq = self._next_unread()
                if seq is None:
                    break
                self.read_seq = seq
                entry = delivered[seq] = _Delivered(0, 0.0, in_flight=False)
                fresh = True
            else:
                entry, fresh = delivered[seq], False
            if expires:
                expires_at = expires.get(seq)
                if expires_at is not None and expires_at <= now:
                    settlements.append(self._settle(seq, Outcome.EXPIRED))
                    continue
            if fresh and run is None:
                run = len(deliveries)
            entry.attempt += 1
            entry.due, entry.in_flight, entry.ready, entry.epoch = deadline, True, False, epoch
            entry.holder = holder
            timed.append(seq)
            deliveries.append(Delivery(seq, entry.attempt, deadline, epoch))
        if timed:
            self._add_timer(deadline, timed)
            self._in_flight += len(timed)
        if run is not None and deliveries[run].seq <= self._late:
            run = None  # one came out of order: it may lie inside the range
        return Taken(deliveries, settlements, run)

    def _take_unread(self, n: int, deadline: float, epoch: int, holder: int) -> list[int]:
        """Hand out up to ``n`` unread messages in order as first deliveries, a batch at
        a time (:meth:`take`'s way for a queue none of whose messages has a time to
        live); their seqs."""
        unread, dropped, delivered = self._unread, self._dropped, self._delivered
        taken: list[int] = []
        while len(taken) < n and len(unread):
            seqs = unread.popmany(n - len(taken))
            if dropped:  # settled while unread: skipped, as _next_unread skips them
                kept = [s for s in seqs if s not in dropped]
                dropped.difference_update(seqs)
                seqs = kept
            entries = [_Delivered(1, deadline, True, epoch, holder) for _ in seqs]
            delivered.update(zip(seqs, entries, strict=True))
            taken += seqs
        if taken:
            self.read_seq = taken[-1]
        return taken

    def due(self, now: float) -> bool:
        """Whether a :meth:`poll` at ``now`` has work: a timer or an expiry come due."""
        return bool(self._timers and self._timers[0][0] <= now) or bool(
            self._expiry and self._expiry[0][0] <= now
        )

    def delete_many(self, keys: Sequence[Key], epoch: int = 0, holder: int = 0) -> list[bool]:
        """Record the deletion of delivered messages (seed 003) by ``holder``, on the
        flow holding ``epoch`` (0: no flow), atomically.

        Idempotent: True for each message settled now, False for one settled already (or
        listed twice). Changing nothing, raises NotInFlight if any was never delivered,
        StaleDelivery if any names an attempt that is over or a delivery held by someone
        else, and StaleEpoch if any was last delivered under another epoch (it was
        handed to another consumer since, who may be processing it). A delivery that
        timed out but was not handed out again may still be deleted by its holder.
        """
        delivered = self._delivered
        seqs = list(map(_FIRST, keys))
        entries = list(map(delivered.get, seqs))
        for (seq, attempt), entry in zip(keys, entries, strict=True):
            if entry is None:
                if seq > self.read_seq:  # unread seqs are all above read_seq
                    raise _never_delivered(seq)
            elif (
                entry.attempt != attempt
                or entry.epoch != epoch
                or entry.holder != holder
                or not attempt
            ):
                self._check(seq, attempt, entry, epoch, holder)
        if len(set(seqs)) < len(seqs):  # one listed twice: settled once, False the next
            done = []
            for seq in seqs:
                settle = seq in delivered
                if settle:
                    self._settle(seq, Outcome.DELETED)
                done.append(settle)
            return done
        # Every key once: what _settle does for each, a step at a time for them all.
        live = [seq for seq, entry in zip(seqs, entries, strict=True) if entry is not None]
        self._in_flight -= sum(entry.in_flight for entry in entries if entry is not None)
        deque(map(delivered.pop, live), maxlen=0)
        if self._expires:
            deque(map(self._expires.pop, live, repeat(None)), maxlen=0)
        if self._sizes is not None:
            self.bytes -= sum(map(self._sizes.pop, live, repeat(0)))
        self._count -= len(live)
        return [entry is not None for entry in entries]

    def release_many(
        self, keys: Sequence[Key], now: float, delay: float = 0.0, epoch: int = 0, holder: int = 0
    ) -> list[Release | Settlement]:
        """Give back deliveries in flight to ``holder`` on the flow holding ``epoch``,
        atomically: each is ready again after ``delay``, or — past its redelivery limit
        or expired — settled instead. Raises as :meth:`check_in_flight`, and
        InvalidInput for a delay that is not 0 to 100 years, changing nothing."""
        if not 0.0 <= delay <= MAX_SECONDS:  # NaN too
            raise InvalidInput(
                f"a release delay is 0 to {MAX_SECONDS:.0f} seconds (100 years), not {delay!r}"
            )
        self.check_in_flight(keys, epoch, holder)
        return [self._give_back(s, self._delivered[s], now, now + delay) for s, _ in keys]

    def return_unseen(
        self, keys: Sequence[Key], now: float, epoch: int = 0, holder: int = 0
    ) -> list[Release | Settlement]:
        """Take back deliveries their consumer never handed to its application (they
        sat in its prefetch buffer): ready again at once, and un-counted — the attempt
        is the number of times the message was handed out. A delivery that is no
        longer the caller's (settled, or handed out again since) is left alone;
        idempotent. Returns what to record: the un-counted (``unseen``) releases, so a
        restart keeps the count, and the messages that expired meanwhile."""
        out: list[Release | Settlement] = []
        for seq, attempt in sorted(set(keys)):
            entry = self._delivered.get(seq)
            if (
                entry is None
                or attempt < 1
                or (entry.attempt, entry.epoch, entry.holder) != (attempt, epoch, holder)
            ):
                continue
            if entry.in_flight:
                out.append(self._give_back_unseen(seq, entry, now))
            elif entry.ready:  # timed out meanwhile, not handed out again yet
                entry.attempt -= 1
                out.append(Release(seq, entry.attempt, entry.due, unseen=True))
        return out

    def release_holder(
        self, keys: Sequence[Key], now: float, holder: int
    ) -> list[Release | Settlement]:
        """Give back, ready at once and counted, those of ``keys`` still in flight to
        ``holder`` (not superseded, not held by a transaction): what a consumer that
        went away held. The others are left alone."""
        out = []
        for seq, attempt in sorted(set(keys)):
            entry = self._delivered.get(seq)
            if (
                entry is not None
                and entry.in_flight
                and entry.epoch != HELD
                and (entry.attempt, entry.holder) == (attempt, holder)
            ):
                out.append(self._give_back(seq, entry, now, now))
        return out

    def check_in_flight(self, keys: Sequence[Key], epoch: int, holder: int = 0) -> None:
        """Raise NotInFlight unless every delivery is in flight, each listed once;
        StaleDelivery if one names an attempt that is over or is held by someone other
        than ``holder``; StaleEpoch (HeldByTransaction) if one is in flight to another
        flow (held by a prepared transaction). Changes nothing."""
        if len({seq for seq, _ in keys}) != len(keys):
            raise NotInFlight("a message is listed twice; list each once")
        for seq, attempt in keys:
            entry = self._delivered.get(seq)
            if entry is None or not entry.in_flight:
                raise NotInFlight(
                    f"message {seq} is not in flight on this queue (never delivered, timed "
                    "out or settled): receive it again"
                )
            self._check(seq, attempt, entry, epoch, holder)

    def _check(self, seq: int, attempt: int, entry: _Delivered, epoch: int, holder: int) -> None:
        """Raise unless the caller (``epoch``, ``holder``) may settle delivery
        ``(seq, attempt)`` of this unsettled ``entry``."""
        if entry.attempt == 0:  # never handed out (dead-lettered here, or given back unseen)
            raise _never_delivered(seq)
        if entry.epoch != epoch:
            raise _not_yours(seq, epoch, entry.epoch)
        if entry.attempt != attempt:
            raise StaleDelivery(
                f"message {seq} was handed out again since attempt {attempt} (it is at "
                f"attempt {entry.attempt}): that delivery is over; do not apply it"
            )
        if entry.holder != holder:
            raise StaleDelivery(
                f"message {seq} (attempt {attempt}) is not held by this consumer"
                + (
                    " (it was in flight when the node restarted and is delivered again)"
                    if entry.holder == ORPHAN
                    else ""
                )
                + "; do not apply it"
            )

    def has_delivered(self, seq: int) -> bool:
        """True if ``seq`` was delivered at least once and is not settled."""
        return seq in self._delivered

    def delete_held(self, seqs: list[int]) -> list[bool]:
        """Settle as DELETED the messages held for a transaction that committed.
        Idempotent: True for each settled now, False for one no longer held."""
        done = []
        for seq in seqs:
            entry = self._delivered.get(seq)
            held = entry is not None and entry.epoch == HELD
            if held:
                self._settle(seq, Outcome.DELETED)
            done.append(held)
        return done

    def hold_many(self, seqs: list[int]) -> None:
        """Hold delivered messages for a prepared transaction (check them first with
        :meth:`check_in_flight`; a restart re-holds what it restored as is): from now on
        only :meth:`delete_held` (the commit) or :meth:`unhold_many` (the abort) settles
        them, and they never time out."""
        for seq in seqs:
            entry = self._delivered[seq]
            if not entry.in_flight:
                entry.in_flight = True
                self._in_flight += 1
            entry.epoch, entry.due, entry.ready = HELD, math.inf, False

    def unhold_many(self, seqs: list[int], now: float) -> list[Release | Settlement]:
        """Give back held messages (their transaction aborted), ready at once. Idempotent:
        a message no longer held is left alone."""
        out = []
        for seq in seqs:
            entry = self._delivered.get(seq)
            if entry is not None and entry.epoch == HELD:
                entry.epoch = 0
                out.append(self._give_back(seq, entry, now, now))
        return out

    def release_epoch(
        self, epoch: int, now: float, seen: set[Key] | None = None
    ) -> list[Release | Settlement]:
        """Give back, ready at once and in sequence order, every message in flight under
        ``epoch``: its flow lost activity, and the next active flow takes them over.
        With ``seen`` (its consumer said which of them it handed to its application),
        the others are un-counted as by :meth:`return_unseen`."""
        held = sorted(s for s, e in self._delivered.items() if e.in_flight and e.epoch == epoch)
        out = []
        for s in held:
            entry = self._delivered[s]
            if seen is not None and (s, entry.attempt) not in seen:
                out.append(self._give_back_unseen(s, entry, now))
            else:
                out.append(self._give_back(s, entry, now, now))
        return out

    def poll(self, now: float) -> list[Settlement]:
        """Advance time: time out deliveries past their deadline, ready parked messages
        that are due, and expire messages past their time-to-live."""
        out: list[Settlement] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            due, _, seqs = heapq.heappop(timers)
            for seq in seqs:
                entry = self._delivered.get(seq)
                if entry is None or entry.due != due or entry.ready:
                    continue  # settled, or re-timed since this timer was set
                if entry.in_flight:
                    result = self._give_back(seq, entry, now, now)
                    if isinstance(result, Settlement):
                        out.append(result)
                else:
                    entry.ready = True
                    heapq.heappush(self._ready, seq)
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, seq = heapq.heappop(expiry)
            entry = self._delivered.get(seq)
            if seq not in self._expires or (entry is not None and entry.in_flight):
                continue  # settled already, or its consumer still holds it
            out.append(self._settle(seq, Outcome.EXPIRED))
        return out

    def make_room(self, n: int, nbytes: int = 0) -> tuple[list[Settlement], dict[int, float]]:
        """Settle as DEAD_LETTERED the oldest messages waiting — unread, or given back
        and not handed out again; never one in flight or held — lowest seq first, until
        ``n`` of them and ``nbytes`` payload bytes (if :attr:`sized`) are freed: the
        room a queue over its limit makes (less if less waits); with the expiry times of
        those that have one, for their dead-letter queue. Costs the delivered messages
        it holds, not its backlog: the unread ones are taken from the front."""
        out: list[Settlement] = []
        expiries: dict[int, float] = {}
        sizes = self._sizes
        if sizes is None:
            nbytes = 0
        if n <= 0 and nbytes <= 0:
            return out, expiries
        known = self._expires
        parked = [s for s, e in self._delivered.items() if not e.in_flight]
        if nbytes > 0:
            parked.sort()
        else:
            parked = heapq.nsmallest(n, parked)
        unread, dropped = self._unread, self._dropped
        i, freed = 0, 0
        while len(out) < n or freed < nbytes:
            while len(unread) and unread.first() in dropped:  # settled already (lazily)
                dropped.discard(unread.popleft())
            head = unread.first() if len(unread) else None
            if i < len(parked) and (head is None or parked[i] < head):
                seq = parked[i]
                i += 1
                if (expires := known.get(seq)) is not None:
                    expiries[seq] = expires
                freed += sizes.get(seq, 0) if sizes is not None else 0
                out.append(self._settle(seq, Outcome.DEAD_LETTERED))
            elif head is not None:
                unread.popleft()  # never delivered: settled here, not left to skip
                if (expires := known.pop(head, None)) is not None:
                    expiries[head] = expires
                if sizes is not None:
                    size = sizes.pop(head, 0)
                    self.bytes -= size
                    freed += size
                self._count -= 1
                out.append(Settlement(head, Outcome.DEAD_LETTERED))
            else:
                break
        return out, expiries

    def purge(self) -> list[Settlement]:
        """Settle every pending message as PURGED, in flight included."""
        return [self._settle(seq, Outcome.PURGED) for seq in self.pending()]

    # -- internals ---------------------------------------------------------------------

    def _give_back(
        self, seq: int, entry: _Delivered, now: float, due: float
    ) -> Release | Settlement:
        expires_at = self._expires.get(seq)
        if expires_at is not None and expires_at <= now:
            return self._settle(seq, Outcome.EXPIRED)
        if self.max_redeliveries is not None and entry.attempt > self.max_redeliveries:
            return self._settle(seq, Outcome.DEAD_LETTERED)
        entry.in_flight = False
        self._in_flight -= 1
        self._park(seq, entry, ready=due <= now, due=due)
        return Release(seq, entry.attempt, due)

    def _give_back_unseen(self, seq: int, entry: _Delivered, now: float) -> Release | Settlement:
        """Take back an in-flight delivery nobody handed out: un-counted, ready now."""
        entry.attempt -= 1
        given = self._give_back(seq, entry, now, now)
        return (
            Release(seq, given.attempt, now, unseen=True) if isinstance(given, Release) else given
        )

    def _park(self, seq: int, entry: _Delivered, *, ready: bool, due: float = 0.0) -> None:
        entry.due = due
        entry.ready = ready
        self._delivered[seq] = entry
        if ready:
            heapq.heappush(self._ready, seq)
        else:
            self._add_timer(due, [seq])

    def _add_timer(self, due: float, seqs: list[int]) -> None:
        self._timer_ids += 1
        heapq.heappush(self._timers, (due, self._timer_ids, array("q", seqs)))

    def _next_ready(self) -> int | None:
        ready = self._ready
        while ready:
            seq = heapq.heappop(ready)
            entry = self._delivered.get(seq)
            if entry is not None and entry.ready and not entry.in_flight:
                return seq
        return None

    def _next_unread(self) -> int | None:
        unread = self._unread
        while len(unread):
            seq = unread.popleft()
            if seq in self._dropped:
                self._dropped.discard(seq)
                continue
            return seq
        return None

    def _settle(self, seq: int, outcome: Outcome) -> Settlement:
        entry = self._delivered.pop(seq, None)
        if entry is None:
            self._dropped.add(seq)  # still in _unread; skipped when reached
        elif entry.in_flight:
            self._in_flight -= 1
        self._expires.pop(seq, None)
        if self._sizes is not None:
            self.bytes -= self._sizes.pop(seq, 0)
        self._count -= 1
        return Settlement(seq, outcome)


_FIRST = itemgetter(0)


def _never_delivered(seq: int) -> NotInFlight:
    return NotInFlight(
        f"message {seq} has not been delivered from this queue, so it cannot be settled"
    )


def _not_yours(seq: int, epoch: int, current: int) -> StaleEpoch | HeldByTransaction:
    if current == HELD:
        return HeldByTransaction(
            f"message {seq} is held by a prepared transaction; its outcome settles it "
            "(see `eomsg inspect txns`)"
        )
    if current == 0:
        return StaleEpoch(
            f"message {seq} was not delivered to the flow of epoch {epoch}; do not apply it"
        )
    return StaleEpoch(
        f"message {seq} was last delivered under epoch {current}, not {epoch}: it belongs "
        "to another consumer now; do not apply it"
    )
