"""One eomsg node: the core's rules wired to the store. Thread-safe; the CLI uses it
in-process (embedded mode) and the broker daemon will serve it over the wire.

Ingress follows seed 004: validate, dedup by id (seed 001), assign the next sequence
number, match the queues subscribed to the topic, persist the message together with its
destination list in one group commit, and acknowledge only after that commit. Each queue's
:class:`~eomsg.core.cursor.Cursor` (seed 003) then hands the message out; a delete is
recorded per queue, and once no destination remains the message leaves the hot tables
(compaction) and, after the retention period, the log (garbage collection).

The node's shared state, and the lock discipline every method here follows, are in
:mod:`eomsg.node.state`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from eomsg.core.cursor import Outcome, Release, Settlement
from eomsg.core.election import Change, FlowEvent, FlowInfo
from eomsg.core.limits import check_outgoing
from eomsg.core.message import Delivered, Key, Message, Outgoing, PublishResult, check_keys
from eomsg.core.operations import TxnDelete
from eomsg.core.queues import QueueConfig, QueueStats
from eomsg.core.replay import JobEvent, JobRecord, Selection, job_transition, validate_job_id
from eomsg.core.topics import pattern_regex
from eomsg.core.txn import TxnInfo, TxnMove, TxnState, check_txid, move
from eomsg.errors import (
    EomsgError,
    InvalidConfig,
    InvalidInput,
    NodeClosed,
    NotActive,
    QueueExists,
    QueueNotEmpty,
    TxnNotFound,
)
from eomsg.failpoints import failpoint
from eomsg.node.settings import SETTINGS, NodeSettings, apply_saved
from eomsg.node.state import Clock, FlowState, NodeState, Notify, PreparedTxn, QueueState, to_us
from eomsg.store.store import US, SettledCounts, Store
from eomsg.store.writer import RowBatch

__all__ = ["SETTINGS", "Node", "NodeSettings"]

log = logging.getLogger("eomsg.node")

_Fresh = tuple[int, str | None, float | None, tuple[QueueState, ...]]  # seq, id, expiry, route
LOG_CHUNK = 64 << 20  # bytes of log one read_log returns unless told
EPOCH_BLOCK = 1024  # epochs reserved durably at a time, so activations rarely wait
TXN_MEMORY = 7 * 86400.0  # how long a finished transaction's outcome is remembered


class Node(NodeState):
    """A node over one data directory. Use :meth:`open`, and close it (or use ``with``)."""

    def __init__(self, store: Store, settings: NodeSettings, clock: Clock) -> None:
        super().__init__(store, settings, clock)
        self._recover()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if settings.tick is not None:
            self._ticker = threading.Thread(target=self._tick, name="eomsg-tick", daemon=True)
            self._ticker.start()

    @classmethod
    def open(
        cls,
        data_dir: Path | str,
        settings: NodeSettings | None = None,
        clock: Clock = time.time,
        *,
        create: bool = True,
    ) -> Node:
        """Open the data directory (creating it unless ``create`` is False) and rebuild
        the in-memory state from it."""
        settings = settings or NodeSettings()
        store = Store(Path(data_dir), create=create, wal_limit=settings.wal_limit)
        try:
            return cls(store, settings, clock)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        """Run a last maintenance pass, finish queued writes and release the data dir."""
        if self._closed:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        try:
            if not self.store.writer.failed:
                self.maintain()
        finally:
            self._closed = True
            self.store.close()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recovery -----------------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild queues, cursors and live publish ids from the hot tables (not the
        whole history: compaction keeps those tables proportional to the backlog)."""
        store, now = self.store, self.clock()
        for queue_id, config in store.load_queues():
            self._install(queue_id, config)
        self._next_seq = store.last_seq() + 1
        self._durable_seq = self._next_seq - 1
        unread: dict[int, list[tuple[int, float | None]]] = {}
        for row in store.load_pending():
            q = self._by_id.get(row.queue_id)
            if q is None:
                continue
            expires = None if row.expires_us is None else row.expires_us / US
            if row.attempt is None:
                unread.setdefault(row.queue_id, []).append((row.seq, expires))
            else:
                # In flight when the node stopped: its consumer's session died with the
                # node, so its deadline is now — it times out at the first poll (ready
                # again in seq order, or dead-lettered if that was its last attempt), not
                # after an ack timeout that nobody can honour any more.
                assert row.due_us is not None
                due = row.due_us / US if row.released else min(now, row.due_us / US)
                q.cursor.restore(row.seq, row.attempt, due, not row.released, expires)
        for queue_id, items in unread.items():  # after restore: read_seq is known
            cursor = self._by_id[queue_id].cursor
            for seq, expires in items:
                cursor.append(seq, expires)
        for msg_id, seq, expires_us in store.load_publish_ids(to_us(now)):
            self._dedup.remember(msg_id, seq, None if expires_us is None else expires_us / US)
        for queue_id, counts in store.load_counts().items():
            if (q := self._by_id.get(queue_id)) is not None:
                self._add_counts(q, counts)
        self._settled_since_compaction = store.settled_rows()
        self._finished = {txid: TxnState(s) for txid, s in store.finished_txns().items()}
        for prep in store.load_prepared(set(self._finished)):
            held: dict[QueueState, list[int]] = {}
            for queue_id, seq in prep.deletes:
                q = self._by_id.get(queue_id)
                if q is not None and q.cursor.has_delivered(seq):
                    held.setdefault(q, []).append(seq)
            for q, seqs in held.items():
                q.cursor.hold_many(seqs)
            self._txns[prep.txid] = PreparedTxn(
                prep.txid, prep.coordinator, prep.prepared_us / US, prep.messages, held, None
            )
        self._last_gc = float(store.meta("gc_at") or 0.0)

    @staticmethod
    def _add_counts(q: QueueState, counts: SettledCounts) -> None:
        q.counts[Outcome.DELETED] += counts.deleted
        q.counts[Outcome.EXPIRED] += counts.expired
        q.counts[Outcome.DEAD_LETTERED] += counts.dead_lettered
        q.counts[Outcome.PURGED] += counts.purged

    # -- publishing (seed 004 ingress) ------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> PublishResult:
        """Publish one message; returns once it is durable (see :meth:`publish_batch`)."""
        return self.publish_batch([Outgoing(topic, payload, id, ttl, headers or {})])[0]

    def publish_batch(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish messages atomically: all are durable when this returns, none if it raises.

        Every message is validated before anything is written. A message whose ``id`` was
        published before and can still live is not stored again: its result carries the
        original ``seq`` and ``duplicate=True`` (also within one batch).
        """
        return self.publish_batch_async(messages).result()

    def publish_batch_async(self, messages: Sequence[Outgoing]) -> Future[list[PublishResult]]:
        """Like :meth:`publish_batch`, but returns at once with a future that resolves
        after the commit, so a producer can prepare its next batch meanwhile. Invalid
        input raises here, before anything is queued."""
        limits = self.settings.limits
        for m in messages:
            check_outgoing(m, limits)
        self._check_room()
        now = self.clock()
        batch = RowBatch()
        with self._lock:
            self._check_open()
            first_seq = self._next_seq
            results, fresh = self._stage(batch, messages, now)
            if fresh or self._durable_seq < first_seq - 1:  # duplicates wait for originals
                committed = self._write_staged(batch, first_seq, fresh)
            else:
                committed = Future()
                committed.set_result(None)
            failpoint("publish.before_commit")
        acked: Future[list[PublishResult]] = Future()

        def on_commit(f: Future[None]) -> None:
            error = f.exception()
            if error is not None:
                with self._lock:
                    for _, msg_id, _, _ in fresh:
                        if msg_id is not None:
                            self._uncommitted_ids.pop(msg_id, None)
                acked.set_exception(error)
                return
            failpoint("publish.after_commit")
            acked.set_result(results)

        committed.add_done_callback(on_commit)
        return acked

    def _stage(
        self, batch: RowBatch, messages: Sequence[Outgoing], now: float
    ) -> tuple[list[PublishResult], list[_Fresh]]:
        """Dedup ``messages`` by id, give the new ones the next sequence numbers and
        route them, adding their rows to ``batch`` (with the after-commit step that
        makes them deliverable). Call with ``_lock`` held, then :meth:`_write_staged`."""
        now_us = to_us(now)
        results: list[PublishResult] = []
        fresh: list[_Fresh] = []
        log_rows, id_rows, dest_rows = [], [], []
        uncommitted, lookup = self._uncommitted_ids, self._dedup.lookup
        seq = self._next_seq
        for m in messages:
            msg_id = m.id
            if msg_id is not None:
                original = uncommitted.get(msg_id) or lookup(msg_id, now)
                if original is not None:
                    results.append(PublishResult(original, msg_id, True, None))
                    continue
                uncommitted[msg_id] = seq
            expires = None if m.ttl is None else now + m.ttl
            expires_us = None if expires is None else to_us(expires)
            queues = self._route(m.topic)
            headers = json.dumps(m.headers) if m.headers else None
            log_rows.append((seq, m.topic, msg_id, now_us, expires_us, headers, m.payload))
            if msg_id is not None:
                id_rows.append((msg_id, seq, expires_us))
            for q in queues:
                dest_rows.append((seq, q.id))
            fresh.append((seq, msg_id, expires, queues))
            results.append(PublishResult(seq, msg_id, False, len(queues)))
            seq += 1
        self._next_seq = seq
        for name, rows in (
            ("messages", log_rows),
            ("publish_ids", id_rows),
            ("destinations", dest_rows),
        ):
            if rows:
                batch.rows_of(name).extend(rows)
        if fresh:
            batch.after_commit(lambda: self._published(fresh))
        return results, fresh

    def _write_staged(self, batch: RowBatch, first_seq: int, fresh: list[_Fresh]) -> Future[None]:
        """Queue a batch holding staged messages; if the writer refuses it, forget them
        (nothing was queued), so their seqs and ids are free again."""
        try:
            return self.store.writer.write(batch)
        except BaseException:
            self._next_seq = first_seq
            for _, msg_id, _, _ in fresh:
                if msg_id is not None:
                    self._uncommitted_ids.pop(msg_id, None)
            raise

    def _route(self, topic: str) -> tuple[QueueState, ...]:
        route = self._routes.get(topic)
        if route is None:
            route = tuple(sorted(self._matcher.match(topic), key=lambda q: q.id))
            if len(self._routes) > 8192:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _published(self, fresh: list[_Fresh]) -> None:
        """After commit (writer thread, commit order): make the messages deliverable and
        their ids known. Consecutive messages with the same route go to the cursors as
        one run, since a batch usually shares one topic."""
        ids: list[str] = []
        id_seqs: list[int] = []
        id_expiry: list[float | None] = []
        routes: set[tuple[QueueState, ...]] = set()
        with self._lock:
            run_route: tuple[QueueState, ...] | None = None
            run_seqs: list[int] = []
            run_expiry: list[float | None] = []
            for seq, msg_id, expires, route in fresh:
                if route is not run_route:
                    self._append_run(run_route, run_seqs, run_expiry)
                    run_route, run_seqs, run_expiry = route, [], []
                    routes.add(route)
                run_seqs.append(seq)
                run_expiry.append(expires)
                if msg_id is not None:
                    ids.append(msg_id)
                    id_seqs.append(seq)
                    id_expiry.append(expires)
            self._append_run(run_route, run_seqs, run_expiry)
            self._dedup.remember_many(ids, id_seqs, id_expiry)
            for msg_id in ids:
                self._uncommitted_ids.pop(msg_id, None)
            self._durable_seq = fresh[-1][0]
        self._notify({q.config.name for route in routes for q in route})

    @staticmethod
    def _append_run(
        route: tuple[QueueState, ...] | None, seqs: list[int], expiry: list[float | None]
    ) -> None:
        for q in route or ():
            q.cursor.extend(seqs, expiry)

    # -- consuming (seed 003 cursor) -----------------------------------------------------

    def fetch(
        self,
        queue: str,
        max_messages: int = 100,
        wait: float = 0.0,
        *,
        flow: int | None = None,
        holder: int = 0,
    ) -> list[Delivered]:
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
            with self._ready:
                generation = self._ready_generation
            taken = self.take(queue, max_messages, flow=flow, holder=holder)[0]
            remaining = deadline - time.monotonic()
            if taken or remaining <= 0:
                return taken
            with self._ready:
                if self._ready_generation == generation:
                    self._ready.wait(remaining)

    def take(
        self, queue: str, max_messages: int = 100, *, flow: int | None = None, holder: int = 0
    ) -> tuple[list[Delivered], bool]:
        """:meth:`fetch`, also saying whether the queue still holds messages that are not
        in flight (looked at in the same step, so a consumer knows it has drained it)."""
        if max_messages < 1:
            raise InvalidConfig("max messages must be at least 1")
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            epoch = 0
            if flow is None:
                if q.config.max_active:
                    raise NotActive(
                        f"queue {queue!r} is {q.config.kind} (at most {q.config.max_active} "
                        "active consumers): bind a consumer to it (client.consumer(...) or "
                        "`eomsg consume`) to receive"
                    )
            else:
                self._flow(q, flow)
                epoch = q.election.epoch_of(flow)
                if not epoch:
                    return [], q.cursor.ready_count > 0
                active = len(q.live_epochs)
                if active > 1:
                    share = -(-q.cursor.ready_count // active)
                    max_messages = max(1, min(max_messages, share))
            taken = q.cursor.take(now, max_messages, epoch, holder)
            more = q.cursor.ready_count > 0
            batch = RowBatch()
            for d in taken.deliveries:
                batch.add("deliveries", q.id, d.seq, d.attempt, to_us(d.deadline), False)
            self._record_settlements(batch, q, taken.settlements, now)
            future = self._queue_write(batch)
        self._await_commit(future)
        if not taken.deliveries:
            return [], more
        messages = self.store.fetch([d.seq for d in taken.deliveries])
        delivered = [
            Delivered(queue, messages[d.seq], d.attempt, d.deadline, epoch)
            for d in taken.deliveries
        ]
        return delivered, more

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
        now_us = to_us(self.clock())
        deleted: Future[list[bool]] = Future()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            self._check_epoch(q, epoch)
            done = q.cursor.delete_many(keys, epoch, holder)
            rows = [
                (q.id, s, Outcome.DELETED, now_us)
                for (s, _), d in zip(keys, done, strict=True)
                if d
            ]
            q.counts[Outcome.DELETED] += len(rows)
            self._settled_since_compaction += len(rows)
            failpoint("delete.before_commit")
            if not rows:
                deleted.set_result(done)
                return deleted
            batch = RowBatch()
            batch.rows_of("settled").extend(rows)
            committed = self.store.writer.write(batch)

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
        is checked as for :meth:`delete`, and must still be in flight."""
        keys = check_keys(keys)
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            self._check_epoch(q, epoch)
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
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            expired = q.cursor.return_unseen(keys, now, epoch, holder)
            future = self._write_releases(q, list(expired), now)
        self._released(queue, future, bool(keys))

    def release_held(self, queue: str, held: Iterable[Key], holder: int) -> int:
        """Give back those of ``holder``'s deliveries that are still in flight to it —
        what a consumer that went away was holding — and leave alone any message
        settled or handed out since. They count as handed out. Returns how many."""
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            outcomes = q.cursor.release_holder(list(held), now, holder)
            future = self._write_releases(q, outcomes, now)
        self._released(queue, future, bool(outcomes))
        return len(outcomes)

    def _write_releases(
        self, q: QueueState, outcomes: list[Release | Settlement], now: float
    ) -> Future[None] | None:
        """Record releases and settlements in one batch; under ``_lock``."""
        batch = RowBatch()
        self._record_releases(batch, q, outcomes, now)
        return self._queue_write(batch)

    def _released(self, queue: str, future: Future[None] | None, ready: bool) -> None:
        self._await_commit(future)
        if ready:
            self._notify({queue})

    # -- transactions (seed 000: the node's log and cursors as 2PC participants) --------

    def prepare_txn(
        self,
        txid: str,
        *,
        coordinator: str,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[TxnDelete] = (),
        owner: str | None = "",
        holder: int = 0,
    ) -> None:
        """Vote yes for transaction ``txid``: make its work durable without applying it,
        and return once it is. ``messages`` will be published (invisible until the
        commit); ``deletes`` — ``(queue, seq, epoch, attempt)`` of deliveries in flight
        to ``holder`` — are held for the transaction: no timeout, no redelivery, no
        delete or release by anyone but its outcome. A delivery that is over
        (StaleDelivery) makes the node vote no, so the transaction aborts cleanly.
        ``coordinator`` says where the outcome will be recorded, for recovery. Atomic:
        on any error nothing is held or recorded.
        Idempotent: preparing a prepared transaction again does nothing."""
        check_txid(txid)
        if len(coordinator) > 1024:
            raise InvalidConfig("the coordinator descriptor is longer than 1024 characters")
        for m in messages:
            check_outgoing(m, self.settings.limits)
        if messages:
            self._check_room()
        now = self.clock()
        batch = RowBatch()
        with self._lock:
            self._check_open()
            if txid in self._txns:
                return
            if txid in self._finished:
                move("participant", self._finished[txid], TxnMove.PREPARE, txid)
            by_queue = self._check_deletes(deletes, holder)
            held = {q: [s for s, _, _ in items] for q, items in by_queue.items()}
            for q, seqs in held.items():
                q.cursor.hold_many(seqs)
            batch.add("txn_log", txid, TxnState.PREPARED.value, to_us(now), coordinator)
            for i, m in enumerate(messages):
                headers = json.dumps(m.headers) if m.headers else None
                batch.add("txn_messages", txid, i, m.topic, m.id, m.ttl, headers, m.payload)
            for q, seqs in held.items():
                for seq in seqs:
                    batch.add("txn_deletes", txid, q.id, seq)
            self._txns[txid] = PreparedTxn(txid, coordinator, now, list(messages), held, owner)
            failpoint("txn.prepare.before_commit")
            committed = self.store.writer.write(batch)
        committed.result()
        failpoint("txn.prepare.after_commit")

    def commit_txn(self, txid: str) -> list[PublishResult]:
        """Apply prepared transaction ``txid`` atomically: its messages enter the log (in
        order, with seqs from now) and its held messages are deleted. Returns once
        durable, with the publish results. Idempotent: committing a committed
        transaction returns ``[]``; TxnConflict if it was aborted, TxnNotFound if it was
        never prepared here (or finished long ago)."""
        now = self.clock()
        batch = RowBatch()
        with self._lock:
            self._check_open()
            t = self._txns.get(txid)
            if t is None:
                move("participant", self._decided(txid), TxnMove.COMMIT, txid)
                return []
            first_seq = self._next_seq
            results, fresh = self._stage(batch, t.messages, now)
            for q, seqs in t.deletes.items():
                if self._by_id.get(q.id) is q:  # the queue may have been deleted since
                    done = q.cursor.delete_held(seqs)
                    settled = [
                        Settlement(s, Outcome.DELETED) for s, d in zip(seqs, done, strict=True) if d
                    ]
                    self._record_settlements(batch, q, settled, now)
            batch.add("txn_log", txid, TxnState.COMMITTED.value, to_us(now), t.coordinator)
            del self._txns[txid]
            self._finished[txid] = TxnState.COMMITTED
            failpoint("txn.commit.before_commit")
            committed = self._write_staged(batch, first_seq, fresh)
        committed.result()
        failpoint("txn.commit.after_commit")
        return results

    def abort_txn(self, txid: str, *, force: bool = False) -> bool:
        """Drop prepared transaction ``txid``: its messages are never published and the
        messages it held are ready again at once. Idempotent; under presumed abort a
        transaction never prepared here is aborted already (False). ``force`` marks a
        person's heuristic decision, reported to a coordinator that later says commit.
        TxnConflict if it committed. True if this call aborted it."""
        now = self.clock()
        how = TxnMove.FORCE_ABORT if force else TxnMove.ABORT
        batch = RowBatch()
        with self._lock:
            self._check_open()
            t = self._txns.get(txid)
            if t is None:
                if txid in self._finished:
                    move("participant", self._finished[txid], how, txid)
                return False
            state = move("participant", TxnState.PREPARED, how, txid)
            for q, seqs in t.deletes.items():
                if self._by_id.get(q.id) is q:
                    self._record_releases(batch, q, q.cursor.unhold_many(seqs, now), now)
            batch.add("txn_log", txid, state.value, to_us(now), t.coordinator)
            del self._txns[txid]
            self._finished[txid] = state
            failpoint("txn.abort.before_commit")
            committed = self.store.writer.write(batch)
        committed.result()
        self._notify({q.config.name for q in t.deletes})
        return True

    def transact(
        self,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[TxnDelete] = (),
        *,
        holder: int = 0,
    ) -> list[PublishResult]:
        """Publish ``messages`` and delete ``deletes`` (``(queue, seq, epoch, attempt)``
        of deliveries in flight to ``holder``) in one atomic step: the one-phase commit
        of a transaction whose only participant is this node. Returns once durable; on
        any error nothing changed."""
        for m in messages:
            check_outgoing(m, self.settings.limits)
        if messages:
            self._check_room()
        now = self.clock()
        batch = RowBatch()
        with self._lock:
            self._check_open()
            by_queue = self._check_deletes(deletes, holder)
            first_seq = self._next_seq
            results, fresh = self._stage(batch, messages, now)
            for q, items in by_queue.items():
                for epoch in {e for _, _, e in items}:
                    keys = [(s, a) for s, a, e in items if e == epoch]
                    done = q.cursor.delete_many(keys, epoch, holder)
                    settled = [
                        Settlement(s, Outcome.DELETED)
                        for (s, _), d in zip(keys, done, strict=True)
                        if d
                    ]
                    self._record_settlements(batch, q, settled, now)
            committed = self._write_staged(batch, first_seq, fresh) if not batch.empty else None
        self._await_commit(committed)
        return results

    def txns(self) -> list[TxnInfo]:
        """The prepared transactions, oldest first; ``connected`` False means their
        coordinator is gone and `eomsg recover` may resolve them."""
        with self._lock:
            return [
                TxnInfo(
                    t.txid,
                    TxnState.PREPARED,
                    t.coordinator,
                    t.prepared_at,
                    t.owner is not None,
                    len(t.messages),
                    sum(len(s) for s in t.deletes.values()),
                )
                for t in sorted(self._txns.values(), key=lambda t: (t.prepared_at, t.txid))
            ]

    def disown_txns(self, owner: str) -> int:
        """The coordinator session ``owner`` went away: its prepared transactions are in
        doubt from now on (they wait for recovery). Returns how many."""
        with self._lock:
            mine = [t for t in self._txns.values() if t.owner == owner]
            for t in mine:
                t.owner = None
            return len(mine)

    def _check_deletes(
        self, deletes: Sequence[TxnDelete], holder: int
    ) -> dict[QueueState, list[tuple[int, int, int]]]:
        """``(queue, seq, epoch, attempt)`` deletes as ``(seq, attempt, epoch)`` grouped
        by queue, each checked in flight to ``holder`` under its epoch and attempt — all
        of them before the caller changes anything. Under ``_lock``."""
        by_queue: dict[QueueState, list[tuple[int, int, int]]] = {}
        for item in deletes:
            if (
                type(item) is not tuple
                or len(item) != 4
                or type(item[0]) is not str
                or not all(type(x) is int for x in item[1:])
            ):
                raise InvalidInput(
                    f"a transaction's delete is (queue, seq, epoch, attempt), not {item!r}"
                )
            queue, seq, epoch, attempt = item
            by_queue.setdefault(self._queue(queue), []).append((seq, attempt, epoch))
        for q, items in by_queue.items():
            for epoch in {e for _, _, e in items}:
                self._check_epoch(q, epoch)
                keys = [(s, a) for s, a, e in items if e == epoch]
                q.cursor.check_in_flight(keys, epoch, holder)
        return by_queue

    def _decided(self, txid: str) -> TxnState:
        state = self._finished.get(txid)
        if state is None:
            raise TxnNotFound(
                f"transaction {txid} is not prepared on this node (never prepared, or "
                "finished too long ago to remember)"
            )
        return state

    # -- queues -------------------------------------------------------------------------

    def create_queue(self, config: QueueConfig) -> bool:
        """Create ``config.name`` (and its dead-letter queue, if missing). Idempotent:
        False if an identical queue exists; QueueExists if it differs."""
        with self._admin:
            existing = self._queues.get(config.name)
            if existing is not None:
                if existing.config == config:
                    return False
                raise QueueExists(
                    f"queue {config.name!r} already exists with other settings; delete it "
                    "first or use `eomsg queue subscribe`"
                )
            if config.dead_letter and config.dead_letter not in self._queues:
                self._create(QueueConfig(config.dead_letter))
            self._create(config)
            return True

    def _create(self, config: QueueConfig) -> None:
        self._check_open()
        queue_id = self.store.writer.run(
            Store.create_queue_job(config, to_us(self.clock()))
        ).result()
        with self._lock:
            self._install(queue_id, config)

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        """Delete a queue and its records; returns how many messages it still held.
        Refuses a non-empty queue unless ``force``, and a queue another dead-letters to.
        Consumers still bound to it are told they were unbound."""
        with self._admin:
            q = self._queue(name)
            users = [u.config.name for u in self._queues.values() if u.config.dead_letter == name]
            if users:
                raise QueueNotEmpty(
                    f"queue {name!r} is the dead-letter queue of {', '.join(users)}; "
                    "delete those first"
                )
            depth = q.cursor.depth
            if depth and not force:
                raise QueueNotEmpty(
                    f"queue {name!r} holds {depth} messages; purge it or use --force"
                )
            self._check_open()
            self.store.writer.run(Store.drop_queue_job(q.id)).result()
            with self._lock:
                for pattern in q.config.subscriptions:
                    self._matcher.remove(pattern, q)
                self._routes.clear()
                del self._queues[name], self._by_id[q.id]
                for v in q.election.flows():
                    f = self._flows.pop(v.flow)
                    if f.notify is not None:
                        f.notify(FlowEvent(name, v.flow, "unbound", False, 0))
            return depth

    def subscribe(self, name: str, pattern: str) -> bool:
        """Route messages published from now on to topics matching ``pattern`` into the
        queue. Idempotent: False if it was subscribed already."""
        with self._admin:
            q = self._queue(name)
            if pattern in q.config.subscriptions:
                return False
            self._update(q, replace(q.config, subscriptions=(*q.config.subscriptions, pattern)))
            return True

    def unsubscribe(self, name: str, pattern: str) -> bool:
        """Stop routing ``pattern`` to the queue. Idempotent: False if not subscribed."""
        with self._admin:
            q = self._queue(name)
            if pattern not in q.config.subscriptions:
                return False
            subs = tuple(p for p in q.config.subscriptions if p != pattern)
            self._update(q, replace(q.config, subscriptions=subs))
            return True

    def _update(self, q: QueueState, config: QueueConfig) -> None:
        self._check_open()
        self.store.writer.run(Store.update_queue_job(q.id, config)).result()
        with self._lock:
            for pattern in q.config.subscriptions:
                self._matcher.remove(pattern, q)
            for pattern in config.subscriptions:
                self._matcher.add(pattern, q)
            self._routes.clear()
            q.config = config

    def purge(self, name: str) -> int:
        """Settle every message in the queue as purged; returns how many."""
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(name)
            settlements = q.cursor.purge()
            batch = RowBatch()
            self._record_settlements(batch, q, settlements, now)
            future = self._queue_write(batch)
        self._await_commit(future)
        return len(settlements)

    def queue_config(self, name: str) -> QueueConfig:
        with self._lock:
            return self._queue(name).config

    def queue_names(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    # -- flows: consumers bound to a queue (seed 002) ------------------------------------

    def bind(
        self,
        queue: str,
        *,
        priority: int = 0,
        owner: str = "",
        notify: Notify | None = None,
    ) -> FlowInfo:
        """Bind a consumer to ``queue`` and run the election; returns the new flow,
        active or on standby. ``notify`` then hears every change of the flow, in order:
        first ``bound`` (the same state as returned), later ``active`` / ``inactive``
        with their epochs, and ``unbound`` if an administrator unbinds it. It runs under
        the node's lock, on whichever thread caused the change, so it must only hand
        the event on (never call the node)."""
        if not -(2**31) <= priority < 2**31:
            raise InvalidConfig("priority must fit in 32 bits")
        with self._elect:
            self._check_open()
            self._reserve_epochs(queue)
            now = self.clock()
            with self._lock:
                q = self._queue(queue)
                f = FlowState(next(self._flow_ids), q, priority, owner, notify)
                f.bound_at = now
                self._flows[f.id] = f
                changes = q.election.bind(f.id, priority)
                future = self._apply(q, [c for c in changes if c.flow != f.id], now)
                mine = [c for c in changes if c.flow == f.id]
                epoch = mine[0].epoch if mine else 0
                if epoch:
                    q.live_epochs.add(epoch)
                if notify is not None:
                    notify(FlowEvent(queue, f.id, "bound", bool(epoch), epoch))
                info = FlowInfo(queue, f.id, owner, priority, bool(epoch), epoch, now, 0)
        self._settle_apply(q, future)
        return info

    def unbind(
        self, queue: str, flow: int, *, admin: bool = False, seen: Iterable[Key] | None = None
    ) -> int:
        """Unbind a flow — its consumer asked, went away, or fell silent; or, with
        ``admin``, an administrator did (its consumer is told ``unbound``) — and run the
        election. Whatever it held in flight is redelivered, in order, to the active
        flows. With ``seen`` — a consumer that unbinds says which of its deliveries it
        handed to its application — the others are un-counted (they sat in its prefetch
        buffer). Returns how many messages were redelivered."""
        seen_keys = None if seen is None else set(check_keys(seen))
        with self._elect:
            self._check_open()
            self._reserve_epochs(queue)
            now = self.clock()
            with self._lock:
                q = self._queue(queue)
                f = self._flow(q, flow)
                epoch = q.election.epoch_of(flow)
                held = q.cursor.in_flight_by_epoch().get(epoch, 0) if epoch else 0
                changes = q.election.unbind(flow)
                future = self._apply(
                    q, changes, now, None if seen_keys is None else {epoch: seen_keys}
                )
                del self._flows[flow]
                if admin and f.notify is not None:
                    f.notify(FlowEvent(queue, flow, "unbound", False, 0))
        self._settle_apply(q, future)
        return held

    def flows(self, queue: str | None = None) -> list[FlowInfo]:
        """The flows bound to ``queue`` (or to every queue), best-ranked first."""
        with self._lock:
            queues = [self._queue(queue)] if queue is not None else list(self._queues.values())
            out = []
            for q in sorted(queues, key=lambda q: q.config.name):
                held = q.cursor.in_flight_by_epoch()
                for v in q.election.flows():
                    f = self._flows[v.flow]
                    out.append(
                        FlowInfo(
                            q.config.name,
                            v.flow,
                            f.owner,
                            v.priority,
                            v.active,
                            v.epoch,
                            f.bound_at,
                            held.get(v.epoch, 0) if v.active else 0,
                        )
                    )
            return out

    def _reserve_epochs(self, queue: str) -> None:
        """Make sure the epochs the next election may hand out are durably reserved, so
        that none is ever reused after a crash. Call with ``_elect`` held."""
        with self._lock:
            bound = len(self._queue(queue).election)
        need = self._epochs.last + bound + 1
        if need > self._epochs_reserved:
            reserved = need + EPOCH_BLOCK
            self.store.writer.run(Store.save_meta_job("epochs_reserved", str(reserved))).result()
            self._epochs_reserved = reserved

    def _apply(
        self,
        q: QueueState,
        changes: list[Change],
        now: float,
        seen: dict[int, set[Key]] | None = None,
    ) -> Future[None] | None:
        """Carry out an election's changes, in order, under ``_lock``: a deactivated
        flow's epoch stops being accepted and what it held in flight is made ready again
        (lowest seq first, for the next active flow) — un-counted where ``seen`` lists
        what that epoch's consumer handed to its application, and the rest is not in
        it; every flow hears of its change."""
        batch = RowBatch()
        for c in changes:
            if c.active:
                q.live_epochs.add(c.epoch)
            else:
                q.live_epochs.discard(c.epoch)
                given_back = q.cursor.release_epoch(c.epoch, now, (seen or {}).get(c.epoch))
                self._record_releases(batch, q, given_back, now)
            f = self._flows.get(c.flow)
            if f is not None and f.notify is not None:
                kind = "active" if c.active else "inactive"
                f.notify(FlowEvent(q.config.name, c.flow, kind, c.active, c.epoch))
        return self._queue_write(batch)

    def _settle_apply(self, q: QueueState, future: Future[None] | None) -> None:
        if future is not None:  # something was settled: the next flow may take it
            future.result()
            self._notify({q.config.name})

    # -- settings -----------------------------------------------------------------------

    def configure(self, name: str, value: str) -> str:
        """Save a node setting in the data directory and apply it now; returns its value
        in canonical form. ``retention`` and ``gc-interval`` are durations, ``max-payload``
        a size."""
        if name not in SETTINGS:
            raise InvalidConfig(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}")
        canonical = SETTINGS[name][0](value)
        with self._admin:
            self._check_open()
            self.store.writer.run(Store.save_setting_job(name, canonical)).result()
            self.settings = apply_saved(self.settings, {name: canonical})
        return canonical

    def saved_settings(self) -> dict[str, str]:
        """Every setting and its value, saved or default, in canonical form."""
        s = self.settings
        return {
            "retention": f"{s.retention:g}",
            "gc-interval": f"{s.gc_interval:g}",
            "max-payload": str(s.limits.max_payload),
            "disk-reserve": str(s.disk_reserve),
        }

    # -- watching -----------------------------------------------------------------------

    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(queue)`` whenever messages become ready in a queue (published,
        released, dead-lettered into it). It runs on whichever thread made them ready,
        so it must be quick and must not call the node; redeliveries that come due by
        time are not announced — poll for those."""
        self._listeners.append(callback)

    # -- inspection -----------------------------------------------------------------------

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read-only SQL query on the store: column names and rows."""
        self._check_open()
        return self.store.query(sql)

    def stats(self) -> list[QueueStats]:
        """A snapshot of every queue, by name."""
        now = self.clock()
        self._poll(now)
        with self._lock:
            snapshot = [
                (
                    q.config,
                    q.cursor.depth,
                    q.cursor.in_flight,
                    dict(q.counts),
                    q.cursor.lowest_pending(),
                    len(q.election),
                    len(q.live_epochs),
                )
                for q in sorted(self._queues.values(), key=lambda q: q.config.name)
            ]
        published = self.store.published_at([s[4] for s in snapshot if s[4] is not None])
        out = []
        for config, depth, in_flight, counts, low, flows, active in snapshot:
            oldest = published.get(low) if low is not None else None
            out.append(
                QueueStats(
                    config.name,
                    config.subscriptions,
                    depth,
                    in_flight,
                    counts[Outcome.DELETED],
                    counts[Outcome.EXPIRED],
                    counts[Outcome.DEAD_LETTERED],
                    counts[Outcome.PURGED],
                    None if oldest is None else max(0.0, now - oldest),
                    config.dead_letter,
                    config.max_redeliveries,
                    config.max_active,
                    flows,
                    active,
                )
            )
        return out

    def log(self, pattern: str | None = None, from_seq: int = 0, limit: int = 20) -> list[Message]:
        """Messages still in the retained log, oldest first."""
        if limit < 1:
            raise InvalidConfig("limit must be at least 1")
        regex = None if pattern is None else pattern_regex(pattern)
        return self.store.log(regex, from_seq, limit)

    # -- replay (read by eomsg.spark) -------------------------------------------------------

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None:
        """The first and last committed seq that ``sel`` selects, or None."""
        self._check_open()
        return self.store.log_bounds(sel)

    def log_horizon(self) -> tuple[int, int | None]:
        """The first seq the log still holds (log GC drops what is below it; 1 if it
        never dropped any) and the latest publish time among the messages it dropped, in
        microseconds (None if none)."""
        self._check_open()
        return self.store.log_horizon()

    def read_log(
        self, sel: Selection, lo: int, hi: int, max_bytes: int | None = None
    ) -> tuple[Any, int]:
        """Committed messages of ``sel`` in ``[lo, hi)``, oldest first, as an Arrow table
        of at most about ``max_bytes`` (one row at least; None: 64 MiB), and the seq to
        read on from (``hi`` when the range is exhausted). Reading the same range again
        gives the same rows: below the last committed seq the log never changes (until
        log GC)."""
        self._check_open()
        if max_bytes is None:
            max_bytes = LOG_CHUNK
        if max_bytes < 1:
            raise InvalidConfig("max_bytes must be at least 1")
        return self.store.log_chunk(sel, lo, hi, max_bytes)

    def replay_jobs(self, job_id: str | None = None) -> list[JobRecord]:
        """The replay jobs recorded against this log (or the one named), newest first."""
        self._check_open()
        return self.store.replay_jobs(job_id)

    def record_replay(self, record: JobRecord, event: JobEvent) -> JobRecord:
        """Durably move job ``record.job_id`` by ``event`` (the table in core.replay) and
        return its new record; an illegal move (finishing a job that is not running)
        raises IllegalMove and changes nothing."""
        with self._admin:
            self._check_open()
            known = self.store.replay_jobs(validate_job_id(record.job_id))
            status = job_transition(known[0].status if known else None, event, record.job_id)
            new = replace(record, status=status, recorded_at=self.clock())
            self.store.writer.run(Store.record_replay_job(new)).result()
            return new

    # -- maintenance -----------------------------------------------------------------------

    def maintain(self) -> None:
        """Time out deliveries and expire messages; when due, compact the hot tables and
        collect the log past retention. Runs every ``tick`` seconds and at close."""
        if self._closed:
            return
        self.store.refresh_disk_free()
        now = self.clock()
        self._poll(now)
        with self._lock:
            compact = self._settled_since_compaction >= self.settings.compact_every
            if compact:
                self._settled_since_compaction = 0
            gc_due = now - self._last_gc >= self.settings.gc_interval
            floor = self._durable_seq + 1
            for q in self._queues.values():
                low = q.cursor.lowest_pending()
                if low is not None:
                    floor = min(floor, low)
        if compact:
            self.store.writer.run(Store.compact_job()).result()
        if gc_due:
            forgotten = self.store.writer.run(
                Store.forget_txns_job(to_us(now - TXN_MEMORY))
            ).result()
            if forgotten:
                remembered = self.store.finished_txns()
                with self._lock:
                    self._finished = {t: s for t, s in self._finished.items() if t in remembered}
            self._last_gc = now
            cutoff = to_us(now - self.settings.retention)
            horizon = self.store.writer.run(
                Store.collect_garbage_job(floor, cutoff, to_us(now))
            ).result()
            with self._lock:
                self._dedup.forget_below(horizon)
                self._dedup.expire(now)

    def _poll(self, now: float) -> None:
        """Apply the passage of time to every cursor and persist what it settled."""
        batch = RowBatch()
        with self._lock:
            self._check_open()
            for q in self._queues.values():
                self._record_settlements(batch, q, q.cursor.poll(now), now)
            future = self._queue_write(batch)
        self._await_commit(future)

    def _tick(self) -> None:
        tick = self.settings.tick
        assert tick is not None
        while not self._stop.wait(tick):
            try:
                self.maintain()
            except NodeClosed:
                return
            except EomsgError as e:
                if self.failed is not None:
                    return  # the store must be reopened: its listeners were told
                log.warning("maintenance failed, tried again in %g s: %s", tick, e)

    def add_failure_listener(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(cause)`` once, on the writer's thread, if the store stops
        taking writes (a commit failed): the node must then be closed and opened again,
        which rebuilds its state from what the disk holds."""
        self.store.failure_listeners.append(callback)

    @property
    def failed(self) -> BaseException | None:
        """Why the store stopped taking writes, if it did."""
        return self.store.writer.failure
