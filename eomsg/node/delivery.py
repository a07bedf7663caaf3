"""Delivery and cursors (seed 003): each queue's :class:`~eomsg.core.cursor.Cursor`
keeps its own read position in the log and hands messages out — redeliveries first, then
new messages in sequence order — and a delete is recorded per queue, apart from the log.
Every delivery attempt, release and delete is durable before it is answered: a take's
first deliveries of new messages, read in order past the cursor's read position, as one
row for their range of seqs (``delivery_runs``), the others a row each.

:class:`Delivery` is a component of the node (``node.delivery``); the cursors it moves are
the queues' (:mod:`eomsg.node.state`), and what it needs of the node is its :class:`Kernel`
protocol. Under the lock discipline of :mod:`eomsg.node.state`: the cursor changes and its
records are queued under ``lock``; the caller waits for the commit after releasing it. A
fetch that waits for messages waits on ``ready``, holding nothing else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Protocol, cast

from eomsg.core.cursor import Delivery as CursorDelivery
from eomsg.core.cursor import Outcome, Release, Settlement, Taken
from eomsg.core.message import Delivered, Deliveries, Key, MessageColumns, check_keys
from eomsg.errors import InvalidConfig, NotActive
from eomsg.failpoints import failpoint
from eomsg.node.flows import Elections
from eomsg.node.state import QueueState, Shared, to_us
from eomsg.store.writer import RowBatch

TAKE_BYTES = 16 << 20  # payload bytes a take reads into memory at once, about
_SEQ, _ATTEMPT, _DEADLINE = itemgetter(0), itemgetter(1), itemgetter(2)  # of a Delivery


class Kernel(Shared, Protocol):
    """What delivery needs of the rest of the node (:class:`~eomsg.node.state.NodeState`,
    the elections)."""

    elections: Elections
    ready: threading.Condition
    ready_generation: int
    settled_since_compaction: int


@dataclass(frozen=True, slots=True)
class Take:
    """Messages handed out (:meth:`Delivery.take_async`) whose delivery records are
    queued (``committed``: their commit; None if there was nothing to record) and whose
    messages are not read yet."""

    queue: str
    epoch: int
    deliveries: list[CursorDelivery]
    committed: Future[None] | None


class Delivery:
    """Consuming: fetch, delete, release and give back deliveries."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def fetch(
        self,
        queue: str,
        max_messages: int = 100,
        wait: float = 0.0,
        *,
        flow: int | None = None,
        holder: int = 0,
    ) -> list[Delivered]:
        """:meth:`fetch_batch`, each delivery made a :class:`Delivered`."""
        return self.fetch_batch(queue, max_messages, wait, flow=flow, holder=holder).delivered()

    def fetch_batch(
        self,
        queue: str,
        max_messages: int = 100,
        wait: float = 0.0,
        *,
        flow: int | None = None,
        holder: int = 0,
    ) -> Deliveries:
        """Deliver up to ``max_messages`` from ``queue``: redeliveries first, then new
        messages in sequence order. Each delivery attempt is durable before it is
        returned, so the redelivery limit holds across crashes.

        With ``flow`` (see :meth:`bind`) the messages go to that consumer under its epoch,
        and only while it is active: an inactive flow gets none. When several flows are
        active, each fetch takes at most its fair share of the ready messages, so a
        burst is spread over them. Without ``flow``, only a queue with no limit on active
        consumers can be read (NotActive otherwise). With ``wait``, an empty queue is
        waited on for up to that many seconds. ``holder`` names the caller (the server
        gives each connection its own; in-process callers share 0): only the holder of a
        delivery settles it."""
        deadline = time.monotonic() + wait
        while True:
            with self._kernel.ready:
                generation = self._kernel.ready_generation
            taken = self.take_batch(queue, max_messages, flow=flow, holder=holder)[0]
            remaining = deadline - time.monotonic()
            if taken or remaining <= 0:
                return taken
            with self._kernel.ready:
                if self._kernel.ready_generation == generation:
                    self._kernel.ready.wait(remaining)

    def take(
        self, queue: str, max_messages: int = 100, *, flow: int | None = None, holder: int = 0
    ) -> tuple[list[Delivered], bool]:
        """:meth:`take_batch`, each delivery made a :class:`Delivered`."""
        taken, more = self.take_batch(queue, max_messages, flow=flow, holder=holder)
        return taken.delivered(), more

    def take_batch(
        self, queue: str, max_messages: int = 100, *, flow: int | None = None, holder: int = 0
    ) -> tuple[Deliveries, bool]:
        """:meth:`fetch_batch`, also saying whether the queue still holds messages that
        are not in flight (looked at in the same step, so a consumer knows it has
        drained it)."""
        take, more = self.take_async(queue, max_messages, flow=flow, holder=holder)
        self._kernel.await_commit(take.committed)
        return self.read(take), more

    def take_async(
        self, queue: str, max_messages: int = 100, *, flow: int | None = None, holder: int = 0
    ) -> tuple[Take, bool]:
        """The first half of :meth:`take_batch`, which never blocks but on the node's
        lock: hand the messages out and queue their delivery records. The caller waits
        for :attr:`Take.committed`, then reads their messages (:meth:`read`) — so a session's
        event loop takes without a thread's hop, and a take right after a delete goes
        into the delete's commit."""
        if max_messages < 1:
            raise InvalidConfig("max messages must be at least 1")
        now = self._kernel.clock()
        with self._kernel.lock:
            self._kernel.check_open()
            q = self._kernel.queue(queue)
            epoch = 0
            if flow is None:
                if q.config.max_active:
                    raise NotActive(
                        f"queue {queue!r} is {q.config.kind} (at most {q.config.max_active} "
                        "active consumers): bind a consumer to it (client.consumer(...) or "
                        "`eomsg consume`) to receive"
                    )
            else:
                self._kernel.elections.flow(q, flow)
                epoch = q.election.epoch_of(flow)
                if not epoch:
                    return Take(queue, 0, [], None), q.cursor.ready_count > 0
                active = len(q.live_epochs)
                if active > 1:
                    share = -(-q.cursor.ready_count // active)
                    max_messages = max(1, min(max_messages, share))
            # Payloads read into memory at once stay about TAKE_BYTES whatever their size
            # (a prefetch of 256 fifty-megabyte messages would be 12.8 GB).
            if q.payload_bytes is not None:
                fits = int(TAKE_BYTES // max(q.payload_bytes, 1.0))
                max_messages = max(1, min(max_messages, fits))
            taken = q.cursor.take(now, max_messages, epoch, holder)
            q.delivered += len(taken.deliveries)
            more = q.cursor.ready_count > 0
            batch = RowBatch()
            self._record_taken(batch, q, taken)
            self._kernel.record_settlements(batch, q, taken.settlements, now)
            failpoint("take.before_commit")
            future = self._kernel.queue_write(batch)
        return Take(queue, epoch, taken.deliveries, future), more

    def may_read_store(self, queue: str) -> bool:
        """Whether a take of ``queue`` now may read the store under the node's lock — it
        dead-letters what came due, and reads their expiries and sizes — so an event
        loop takes on a thread instead (looked at without the lock: a hint)."""
        q = self._kernel.queues.get(queue)
        return q is not None and bool(q.config.dead_letter) and q.cursor.due(self._kernel.clock())

    def read(self, take: Take) -> Deliveries:
        """The messages of ``take``, whose records are durable (:attr:`Take.committed`
        done), held in memory or stored."""
        found = self._read(take, memory_only=False)
        assert found is not None
        return found

    def read_from_memory(self, take: Take) -> Deliveries | None:
        """:meth:`read`, or None rather than read DuckDB (for an event loop, which must
        not block)."""
        return self._read(take, memory_only=True)

    def _read(self, take: Take, *, memory_only: bool) -> Deliveries | None:
        deliveries = take.deliveries
        seqs = list(map(_SEQ, deliveries))
        ascending = all(map(int.__lt__, seqs, seqs[1:]))
        found = self._kernel.egress.fetch_columns(
            seqs if ascending else sorted(seqs), memory_only=memory_only
        )
        if found is None:
            return None
        failpoint("take.after_commit")
        if not ascending:  # one came to the queue out of order: as they were handed out
            found = _in_order(found, seqs)
        if len(found[0]) < len(deliveries):  # one purged meanwhile: settled, none needed
            kept = set(found[0])
            deliveries = [d for d in deliveries if d.seq in kept]
        attempts, deadlines = list(map(_ATTEMPT, deliveries)), list(map(_DEADLINE, deliveries))
        return Deliveries(take.queue, take.epoch, found, attempts, deadlines)

    def _record_taken(self, batch: RowBatch, q: QueueState, taken: Taken) -> None:
        """Add the deliveries of ``taken`` to ``batch``: its run of first deliveries
        (:attr:`Taken.run`) as one ``delivery_runs`` row, the others a ``deliveries``
        row each — all of them so when one of the run is held in memory by a link's
        egress (the rows about a held message stay with it). Under ``lock``."""
        deliveries, run = taken.deliveries, taken.run
        if run is not None and self._kernel.egress.holds_any(d.seq for d in deliveries[run:]):
            run = None
        for d in deliveries if run is None else deliveries[:run]:
            batch.add("deliveries", q.id, d.seq, d.attempt, to_us(d.deadline), False)
        if run is not None:
            last = deliveries[-1]
            batch.add("delivery_runs", q.id, deliveries[run].seq, last.seq, to_us(last.deadline))

    def delete(
        self, queue: str, keys: Iterable[Key], *, epoch: int = 0, holder: int = 0
    ) -> list[bool]:
        """Delete delivered messages from ``queue`` (seed 003: a deletion record per
        message), each named by its delivery ``(seq, attempt)`` (:attr:`Delivered.key`).
        Atomic and idempotent: True for each message deleted now, False for one already
        settled. Nothing is deleted if any was never delivered (NotInFlight), if any
        delivery is over or is not ``holder``'s (StaleDelivery), or if ``epoch`` — that
        of the flow the messages were delivered to, 0 for a fetch without one — is over
        or does not match (StaleEpoch). Returns once durable."""
        return self.delete_async(queue, keys, epoch=epoch, holder=holder).result()

    def delete_async(
        self, queue: str, keys: Iterable[Key], *, epoch: int = 0, holder: int = 0
    ) -> Future[list[bool]]:
        """Like :meth:`delete`, but returns at once with a future that resolves after the
        commit, so a consumer can fetch its next batch meanwhile (both then share one
        commit). Invalid input raises here, before anything is queued."""
        keys = check_keys(keys)
        now_us = to_us(self._kernel.clock())
        deleted: Future[list[bool]] = Future()
        with self._kernel.lock:
            self._kernel.check_open()
            q = self._kernel.queue(queue)
            self._kernel.check_epoch(q, epoch)
            done = q.cursor.delete_many(keys, epoch, holder)
            n = sum(done)
            q.counts[Outcome.DELETED] += n
            self._kernel.settled_since_compaction += n
            failpoint("delete.before_commit")
            if not n:
                deleted.set_result(done)
                return deleted
            batch = RowBatch()
            seqs = [s for (s, _), d in zip(keys, done, strict=True) if d]
            first, last = min(seqs), max(seqs)
            if n > 1 and last - first == n - 1 and not self._kernel.egress.holds_any(seqs):
                # (n distinct seqs: each settled once) a run, one row in the journal
                batch.settle_run(q.id, first, last, Outcome.DELETED, now_us)
            else:
                batch.rows_of("settled").extend(
                    zip(repeat(q.id), seqs, repeat(Outcome.DELETED), repeat(now_us), strict=False)
                )
            committed = self._kernel.write(batch)

        def on_commit(f: Future[None]) -> None:
            error = f.exception()
            if error is not None:
                deleted.set_exception(error)
            else:
                deleted.set_result(done)

        committed.add_done_callback(on_commit)
        return deleted

    def release(
        self,
        queue: str,
        keys: Iterable[Key],
        delay: float = 0.0,
        *,
        epoch: int = 0,
        holder: int = 0,
    ) -> None:
        """Give deliveries back for redelivery after ``delay`` seconds (nack). Atomic. A
        message past its redelivery limit goes to the dead-letter queue. Each delivery
        is checked as for :meth:`delete`, and must still be in flight; ``delay`` is 0
        to 100 years (InvalidInput otherwise)."""
        keys = check_keys(keys)
        now = self._kernel.clock()
        with self._kernel.lock:
            self._kernel.check_open()
            q = self._kernel.queue(queue)
            self._kernel.check_epoch(q, epoch)
            outcomes = q.cursor.release_many(keys, now, delay, epoch, holder)
            future = self._write_releases(q, outcomes, now)
        self._released(queue, future, bool(keys) and delay <= 0)

    def return_unseen(
        self, queue: str, keys: Iterable[Key], *, epoch: int = 0, holder: int = 0
    ) -> None:
        """Take back deliveries that ``holder`` never handed to its application (they sat
        in its prefetch buffer): ready again at once and un-counted, so a message's
        attempt stays the number of times it was handed out. Deliveries no longer
        ``holder``'s are left alone. Idempotent."""
        keys = check_keys(keys)
        now = self._kernel.clock()
        with self._kernel.lock:
            self._kernel.check_open()
            q = self._kernel.queue(queue)
            outcomes = q.cursor.return_unseen(keys, now, epoch, holder)
            future = self._write_releases(q, outcomes, now)
        self._released(queue, future, bool(keys))

    def release_held(self, queue: str, held: Iterable[Key], holder: int) -> int:
        """Give back those of ``holder``'s deliveries that are still in flight to it —
        what a consumer that went away was holding — and leave alone any message
        settled or handed out since. They count as handed out. Returns how many."""
        now = self._kernel.clock()
        with self._kernel.lock:
            self._kernel.check_open()
            q = self._kernel.queue(queue)
            outcomes = q.cursor.release_holder(list(held), now, holder)
            future = self._write_releases(q, outcomes, now)
        self._released(queue, future, bool(outcomes))
        return len(outcomes)

    def _write_releases(
        self, q: QueueState, outcomes: list[Release | Settlement], now: float
    ) -> Future[None] | None:
        """Record releases and settlements in one batch; under ``lock``."""
        batch = RowBatch()
        self._kernel.record_releases(batch, q, outcomes, now)
        return self._kernel.queue_write(batch)

    def _released(self, queue: str, future: Future[None] | None, ready: bool) -> None:
        self._kernel.await_commit(future)
        if ready:
            self._kernel.notify({queue})


def _in_order(found: MessageColumns, seqs: list[int]) -> MessageColumns:
    """The messages ``found`` (ascending) in the order of ``seqs`` (those found)."""
    at = {seq: i for i, seq in enumerate(found[0])}
    order = [at[seq] for seq in seqs if seq in at]
    return cast(
        MessageColumns,
        tuple(None if column is None else [column[i] for i in order] for column in found),
    )
