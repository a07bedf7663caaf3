"""Maintenance: the passage of time and the upkeep of the store. Deliveries time out and
messages expire (each cursor's poll, seed 003); settled rows leave the hot tables
(compaction, every ``compact_every`` settlements) and, past retention, the log (garbage
collection, every ``gc_interval``), along with the publish ids (seed 001) and finished
transactions (seed 000) old enough to forget. Run by the node's ticker and at close.

Under the lock discipline of :mod:`eomsg.node.state`: what is due is decided under
``_lock``; the compaction and collection jobs are waited for outside it.
"""

from __future__ import annotations

from eomsg.node.state import NodeState, to_us
from eomsg.store.store import Store
from eomsg.store.writer import RowBatch

TXN_MEMORY = 7 * 86400.0  # how long a finished transaction's outcome is remembered


class Maintenance(NodeState):
    """Timeouts, expiry, compaction and garbage collection."""

    def maintain(self) -> None:
        """Time out deliveries and expire messages; when due, compact the hot tables and
        collect the log past retention. Runs every ``tick`` seconds and at close."""
        if self._closed:
            return
        now = self.clock()
        self._poll(now)
        with self._lock:
            self._write_held(now)  # held in memory past their hold: stored now
            # Before the jobs below: the link messages they drop are ones its peer is
            # known, on disk, to hold.
            self._write_now()
            self._rates.note(now, self._totals())
            compact = self._settled_since_compaction >= self.settings.compact_every
            if compact:
                self._settled_since_compaction = 0
            taken = self._routes_taken() if compact else {}
            gc_due = now - self._last_gc >= self.settings.gc_interval
            floor = self._durable_seq + 1
            low = self._lowest_link_pending()
            if low is not None:
                floor = min(floor, low)
            for q in self._queues.values():
                low = q.cursor.lowest_pending()
                if low is not None:
                    floor = min(floor, low)
        if compact:
            self.store.writer.run(Store.compact_job(taken)).result()
        if gc_due:
            forgotten = self.store.writer.run(
                Store.forget_txns_job(to_us(now - TXN_MEMORY))
            ).result()
            if forgotten:
                remembered = self.store.finished_txns()
                with self._lock:
                    self.participant.forget(remembered)
            self._last_gc = now
            cutoff = to_us(now - self.settings.retention)
            horizon = self.store.writer.run(
                Store.collect_garbage_job(floor, cutoff, to_us(now))
            ).result()
            self._dedup.collect(horizon, now)
        self._dedup.spill_over()  # the window back within its share of the memory
        self._dedup.fill_filter()

    def _poll(self, now: float) -> None:
        """Apply the passage of time to every cursor and persist what it settled."""
        batch = RowBatch()
        with self._lock:
            self._check_open()
            for q in self._queues.values():
                self._record_settlements(batch, q, q.cursor.poll(now), now)
            future = self._queue_write(batch)
        self._await_commit(future)
