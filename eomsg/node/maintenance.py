"""Maintenance: the passage of time and the upkeep of the store. Deliveries time out and
messages expire (each cursor's poll, seed 003); settled rows leave the hot tables
(compaction, every ``compact_every`` settlements) and, past retention, the log (garbage
collection, every ``gc_interval``), along with the publish ids (seed 001) and finished
transactions (seed 000) old enough to forget. Run by the node's ticker and at close.

:class:`Maintenance` is a component of the node (``node.maintenance``): it owns when the
log was last collected, and what it needs of the node is its :class:`Kernel` protocol.
Under the lock discipline of :mod:`eomsg.node.state`: what is due is decided under
``lock``; the compaction and collection jobs are waited for outside it.
"""

from __future__ import annotations

from typing import Protocol

from eomsg.core.rates import Rates, Totals
from eomsg.node.dedup import Deduplication
from eomsg.node.intake import Intake
from eomsg.node.links import Links
from eomsg.node.participant import Participant
from eomsg.node.state import Shared, to_us
from eomsg.store.store import Store
from eomsg.store.writer import RowBatch

TXN_MEMORY = 7 * 86400.0  # how long a finished transaction's outcome is remembered


class Kernel(Shared, Protocol):
    """What maintenance needs of the rest of the node: its state
    (:class:`~eomsg.node.state.NodeState`), the links' hooks, the participant."""

    participant: Participant
    links: Links
    intake: Intake
    closed: bool
    dedup: Deduplication
    rates: Rates
    durable_seq: int
    settled_since_compaction: int

    def totals(self) -> Totals: ...
    def write_now(self) -> None: ...


class Maintenance:
    """Timeouts, expiry, compaction and garbage collection."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._last_gc = 0.0  # when the log was last collected (recover sets it)

    def recover(self, now: float) -> None:
        """At open: when the log was last collected — never later than ``now``: the time
        is kept to the microsecond, which a rounding may put a hair past a clock that
        stood still since (or a clock set back far past it), and collection would wait
        for it."""
        self._last_gc = min(float(self._kernel.store.meta("gc_at") or 0.0), now)

    def maintain(self) -> None:
        """Time out deliveries and expire messages; when due, compact the hot tables and
        collect the log past retention. Runs every ``tick`` seconds and at close."""
        if self._kernel.closed:
            return
        now = self._kernel.clock()
        self.poll(now)
        with self._kernel.lock:
            self._kernel.intake.write_held(now)  # held in memory past their hold: stored now
            # Before the jobs below: the link messages they drop are ones its peer is
            # known, on disk, to hold.
            self._kernel.write_now()
            self._kernel.rates.note(now, self._kernel.totals())
            compact = self._kernel.settled_since_compaction >= self._kernel.settings.compact_every
            if compact:
                self._kernel.settled_since_compaction = 0
            taken = self._kernel.links.routes_taken() if compact else {}
            gc_due = now - self._last_gc >= self._kernel.settings.gc_interval
            floor = self._kernel.durable_seq + 1
            low = self._kernel.links.lowest_pending()
            if low is not None:
                floor = min(floor, low)
            for q in self._kernel.queues.values():
                low = q.cursor.lowest_pending()
                if low is not None:
                    floor = min(floor, low)
        if compact:
            self._kernel.store.writer.run(Store.compact_job(taken)).result()
        if gc_due:
            forgotten = self._kernel.store.writer.run(
                Store.forget_txns_job(to_us(now - TXN_MEMORY))
            ).result()
            if forgotten:
                remembered = self._kernel.store.finished_txns()
                with self._kernel.lock:
                    self._kernel.participant.forget(remembered)
            self._last_gc = now
            cutoff = to_us(now - self._kernel.settings.retention)
            horizon = self._kernel.store.writer.run(
                Store.collect_garbage_job(floor, cutoff, to_us(now))
            ).result()
            self._kernel.store.writer.recent.forget_below(horizon)
            self._kernel.dedup.collect(horizon, now)
        self._kernel.dedup.spill_over()  # the window back within its share of the memory
        self._kernel.dedup.fill_filter()

    def poll(self, now: float) -> None:
        """Apply the passage of time to every cursor and persist what it settled."""
        batch = RowBatch()
        with self._kernel.lock:
            self._kernel.check_open()
            for q in self._kernel.queues.values():
                self._kernel.record_settlements(batch, q, q.cursor.poll(now), now)
            future = self._kernel.queue_write(batch)
        self._kernel.await_commit(future)
