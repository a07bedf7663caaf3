"""One eomsg node: the core's rules wired to the store. Thread-safe; the CLI uses it
in-process (embedded mode) and the broker daemon will serve it over the wire.

Ingress follows seed 004: validate, dedup by id (seed 001), assign the next sequence
number, match the queues subscribed to the topic, persist the message together with its
destination list in one group commit, and acknowledge only after that commit. Each queue's
:class:`~eomsg.core.cursor.Cursor` (seed 003) then hands the message out; a delete is
recorded per queue, and once no destination remains the message leaves the hot tables
(compaction) and, after the retention period, the log (garbage collection).

Locking: ``_lock`` guards the in-memory state and is never held while waiting for the
writer (the writer's after-commit callbacks take it). Writes are queued while holding it,
so the log's commit order is the order sequence numbers were assigned. ``_admin``
serialises queue changes, which must wait for their commit before touching the state.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eomsg.core.cursor import Cursor, Outcome, Release, Settlement
from eomsg.core.dedup import DedupWindow
from eomsg.core.durations import parse_duration
from eomsg.core.limits import Limits, check_outgoing, parse_size
from eomsg.core.message import Delivered, Message, Outgoing, PublishResult
from eomsg.core.queues import QueueConfig, QueueStats
from eomsg.core.topics import Matcher, pattern_regex
from eomsg.errors import (
    InvalidConfig,
    NodeClosed,
    QueueExists,
    QueueNotEmpty,
    QueueNotFound,
)
from eomsg.failpoints import failpoint
from eomsg.store.store import US, SettledCounts, Store
from eomsg.store.writer import RowBatch

Clock = Callable[[], float]


def _us(seconds: float) -> int:
    return int(seconds * US)


@dataclass(frozen=True)
class NodeSettings:
    """Tunables of a node. ``retention`` keeps fully consumed messages in the log for
    replay; ``compact_every`` settled records trigger a compaction of the hot tables."""

    limits: Limits = field(default_factory=Limits)
    retention: float = 86400.0
    compact_every: int = 50_000
    gc_interval: float = 60.0
    tick: float | None = 1.0  # maintenance period in seconds; None: only on demand


# Settings a data directory can save (``eomsg config set``): name -> (parse to the
# canonical text, apply to NodeSettings).
SETTINGS: dict[str, tuple[Callable[[str], str], Callable[[NodeSettings, str], NodeSettings]]] = {
    "retention": (
        lambda v: f"{parse_duration(v, allow_zero=True):g}",
        lambda s, v: replace(s, retention=float(v)),
    ),
    "gc-interval": (
        lambda v: f"{parse_duration(v, allow_zero=True):g}",
        lambda s, v: replace(s, gc_interval=float(v)),
    ),
    "max-payload": (
        lambda v: str(parse_size(v)),
        lambda s, v: replace(s, limits=replace(s.limits, max_payload=int(v))),
    ),
}


def _apply_saved(settings: NodeSettings, saved: dict[str, str]) -> NodeSettings:
    for name, value in saved.items():
        if name in SETTINGS:
            settings = SETTINGS[name][1](settings, value)
    return settings


class _Queue:
    """Runtime state of one queue; identity-hashed, so it can be a matcher key."""

    __slots__ = ("config", "counts", "cursor", "id")

    def __init__(self, queue_id: int, config: QueueConfig) -> None:
        self.id = queue_id
        self.config = config
        self.cursor = Cursor(
            ack_timeout=config.ack_timeout, max_redeliveries=config.max_redeliveries
        )
        self.counts = dict.fromkeys(Outcome, 0)


class Node:
    """A node over one data directory. Use :meth:`open`, and close it (or use ``with``)."""

    def __init__(self, store: Store, settings: NodeSettings, clock: Clock) -> None:
        self.store = store
        self.settings = _apply_saved(settings, store.settings())
        self.clock = clock
        self._lock = threading.Lock()
        self._admin = threading.Lock()
        self._closed = False
        self._queues: dict[str, _Queue] = {}
        self._by_id: dict[int, _Queue] = {}
        self._matcher: Matcher[_Queue] = Matcher()
        self._routes: dict[str, tuple[_Queue, ...]] = {}
        self._dedup = DedupWindow()
        self._uncommitted_ids: dict[str, int] = {}
        self._listeners: list[Callable[[str], None]] = []
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
        store = Store(Path(data_dir), create=create)
        try:
            return cls(store, settings or NodeSettings(), clock)
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
                assert row.due_us is not None
                q.cursor.restore(row.seq, row.attempt, row.due_us / US, not row.released, expires)
        for queue_id, items in unread.items():  # after restore: read_seq is known
            cursor = self._by_id[queue_id].cursor
            for seq, expires in items:
                cursor.append(seq, expires)
        for msg_id, seq, expires_us in store.load_publish_ids(_us(now)):
            self._dedup.remember(msg_id, seq, None if expires_us is None else expires_us / US)
        for queue_id, counts in store.load_counts().items():
            if (q := self._by_id.get(queue_id)) is not None:
                self._add_counts(q, counts)
        self._settled_since_compaction = store.settled_rows()
        self._last_gc = float(store.meta("gc_at") or 0.0)

    def _install(self, queue_id: int, config: QueueConfig) -> _Queue:
        q = _Queue(queue_id, config)
        self._queues[config.name] = q
        self._by_id[queue_id] = q
        for pattern in config.subscriptions:
            self._matcher.add(pattern, q)
        self._routes.clear()
        return q

    @staticmethod
    def _add_counts(q: _Queue, counts: SettledCounts) -> None:
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
        now = self.clock()
        now_us = _us(now)
        results: list[PublishResult] = []
        fresh: list[tuple[int, str | None, float | None, tuple[_Queue, ...]]] = []
        batch = RowBatch()
        log_rows, id_rows, dest_rows = (
            batch.rows_of("messages"),
            batch.rows_of("publish_ids"),
            batch.rows_of("destinations"),
        )
        with self._lock:
            self._check_open()
            uncommitted, lookup = self._uncommitted_ids, self._dedup.lookup
            seq = self._next_seq
            first_seq = seq
            for m in messages:
                msg_id = m.id
                if msg_id is not None:
                    original = uncommitted.get(msg_id) or lookup(msg_id, now)
                    if original is not None:
                        results.append(PublishResult(original, msg_id, True, None))
                        continue
                    uncommitted[msg_id] = seq
                expires = None if m.ttl is None else now + m.ttl
                expires_us = None if expires is None else _us(expires)
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
            for name in ("messages", "publish_ids", "destinations"):
                if not batch.tables[name]:
                    del batch.tables[name]
            if fresh:
                batch.after_commit(lambda: self._published(fresh))
            if fresh or self._durable_seq < first_seq - 1:  # duplicates wait for originals
                try:
                    committed = self.store.writer.write(batch)
                except BaseException:  # nothing was queued: forget this batch entirely
                    self._next_seq = first_seq
                    for _, msg_id, _, _ in fresh:
                        if msg_id is not None:
                            uncommitted.pop(msg_id, None)
                    raise
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

    def _route(self, topic: str) -> tuple[_Queue, ...]:
        route = self._routes.get(topic)
        if route is None:
            route = tuple(sorted(self._matcher.match(topic), key=lambda q: q.id))
            if len(self._routes) > 8192:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _published(
        self, fresh: list[tuple[int, str | None, float | None, tuple[_Queue, ...]]]
    ) -> None:
        """After commit (writer thread, commit order): make the messages deliverable and
        their ids known. Consecutive messages with the same route go to the cursors as
        one run, since a batch usually shares one topic."""
        ids: list[str] = []
        id_seqs: list[int] = []
        id_expiry: list[float | None] = []
        routes: set[tuple[_Queue, ...]] = set()
        with self._lock:
            run_route: tuple[_Queue, ...] | None = None
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
        if self._listeners:
            self._notify({q.config.name for route in routes for q in route})

    @staticmethod
    def _append_run(
        route: tuple[_Queue, ...] | None, seqs: list[int], expiry: list[float | None]
    ) -> None:
        for q in route or ():
            q.cursor.extend(seqs, expiry)

    # -- consuming (seed 003 cursor) -----------------------------------------------------

    def fetch(self, queue: str, max_messages: int = 100) -> list[Delivered]:
        """Deliver up to ``max_messages`` from ``queue``: redeliveries first, then new
        messages in sequence order. Each delivery attempt is durable before it is
        returned, so the redelivery limit holds across crashes."""
        if max_messages < 1:
            raise InvalidConfig("max messages must be at least 1")
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            taken = q.cursor.take(now, max_messages)
            batch = RowBatch()
            for d in taken.deliveries:
                batch.add("deliveries", q.id, d.seq, d.attempt, _us(d.deadline), False)
            self._record_settlements(batch, q, taken.settlements, now)
            future = self.store.writer.write(batch) if not batch.empty else None
        if future is not None:
            future.result()
        if not taken.deliveries:
            return []
        messages = self.store.fetch([d.seq for d in taken.deliveries])
        return [Delivered(queue, messages[d.seq], d.attempt, d.deadline) for d in taken.deliveries]

    def delete(self, queue: str, seqs: Iterable[int]) -> list[bool]:
        """Delete delivered messages from ``queue`` (seed 003: a deletion record per
        message). Atomic and idempotent: True for each message deleted now, False for one
        already settled; NotInFlight (and nothing deleted) if any was never delivered.
        Returns once the deletion is durable."""
        return self.delete_async(queue, seqs).result()

    def delete_async(self, queue: str, seqs: Iterable[int]) -> Future[list[bool]]:
        """Like :meth:`delete`, but returns at once with a future that resolves after the
        commit, so a consumer can fetch its next batch meanwhile (both then share one
        commit). Invalid input raises here, before anything is queued."""
        seqs = list(seqs)
        now_us = _us(self.clock())
        deleted: Future[list[bool]] = Future()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            done = q.cursor.delete_many(seqs)
            rows = [
                (q.id, s, Outcome.DELETED, now_us) for s, d in zip(seqs, done, strict=True) if d
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

    def release(self, queue: str, seqs: Iterable[int], delay: float = 0.0) -> None:
        """Give delivered messages back for redelivery after ``delay`` seconds (nack).
        Atomic. A message past its redelivery limit goes to the dead-letter queue."""
        self._release(queue, list(seqs), delay)

    def release_held(self, queue: str, held: Iterable[tuple[int, int]]) -> int:
        """Give back those of the ``(seq, attempt)`` deliveries that are still in flight
        under that very attempt — what a consumer that went away was holding — and
        leave alone any message settled or redelivered since. Returns how many."""
        return self._release(queue, [], 0.0, held=dict(held))

    def _release(
        self, queue: str, seqs: list[int], delay: float, *, held: dict[int, int] | None = None
    ) -> int:
        now = self.clock()
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            if held is not None:  # checked under the same lock as the release itself
                seqs = [s for s, a in held.items() if q.cursor.in_flight_attempt(s) == a]
            outcomes = q.cursor.release_many(seqs, now, delay)
            batch = RowBatch()
            settlements = []
            for r in outcomes:
                if isinstance(r, Release):
                    batch.add("deliveries", q.id, r.seq, r.attempt, _us(r.due), True)
                else:
                    settlements.append(r)
            self._record_settlements(batch, q, settlements, now)
            future = self.store.writer.write(batch) if not batch.empty else None
        if future is not None:
            future.result()
        if seqs and delay <= 0:
            self._notify({queue})
        return len(seqs)

    def _record_settlements(
        self, batch: RowBatch, q: _Queue, settlements: list[Settlement], now: float
    ) -> None:
        """Add settlement records (and dead-letter destinations) to ``batch``; the DLQ
        sees its new messages once the batch commits. Call with ``_lock`` held."""
        if not settlements:
            return
        now_us = _us(now)
        moved: list[int] = []
        dlq = self._queues.get(q.config.dead_letter) if q.config.dead_letter else None
        for s in settlements:
            batch.add("settled", q.id, s.seq, s.outcome, now_us)
            q.counts[s.outcome] += 1
            if s.outcome is Outcome.DEAD_LETTERED and dlq is not None:
                batch.add("destinations", s.seq, dlq.id)
                moved.append(s.seq)
        self._settled_since_compaction += len(settlements)
        if moved and dlq is not None:
            expiries = self.store.expiries(moved)
            target = dlq

            def to_dlq() -> None:
                with self._lock:
                    for seq in moved:
                        target.cursor.append(seq, expiries.get(seq))
                self._notify({target.config.name})

            batch.after_commit(to_dlq)

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
        queue_id = self.store.writer.run(Store.create_queue_job(config, _us(self.clock()))).result()
        with self._lock:
            self._install(queue_id, config)

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        """Delete a queue and its records; returns how many messages it still held.
        Refuses a non-empty queue unless ``force``, and a queue another dead-letters to."""
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
            return depth

    def subscribe(self, name: str, pattern: str) -> bool:
        """Route messages published from now on to topics matching ``pattern`` into the
        queue. Idempotent: False if it was subscribed already."""
        with self._admin:
            q = self._queue(name)
            if pattern in q.config.subscriptions:
                return False
            config = QueueConfig(
                name,
                (*q.config.subscriptions, pattern),
                q.config.max_redeliveries,
                q.config.dead_letter,
                q.config.ack_timeout,
            )
            self._update(q, config)
            return True

    def unsubscribe(self, name: str, pattern: str) -> bool:
        """Stop routing ``pattern`` to the queue. Idempotent: False if not subscribed."""
        with self._admin:
            q = self._queue(name)
            if pattern not in q.config.subscriptions:
                return False
            subs = tuple(p for p in q.config.subscriptions if p != pattern)
            config = QueueConfig(
                name,
                subs,
                q.config.max_redeliveries,
                q.config.dead_letter,
                q.config.ack_timeout,
            )
            self._update(q, config)
            return True

    def _update(self, q: _Queue, config: QueueConfig) -> None:
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
            future = self.store.writer.write(batch) if not batch.empty else None
        if future is not None:
            future.result()
        return len(settlements)

    def queue_config(self, name: str) -> QueueConfig:
        with self._lock:
            return self._queue(name).config

    def queue_names(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            raise QueueNotFound(
                f"queue {name!r} does not exist; create it with `eomsg queue create {name}`"
            )
        return q

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
            self.settings = _apply_saved(self.settings, {name: canonical})
        return canonical

    def saved_settings(self) -> dict[str, str]:
        """Every setting and its value, saved or default, in canonical form."""
        s = self.settings
        return {
            "retention": f"{s.retention:g}",
            "gc-interval": f"{s.gc_interval:g}",
            "max-payload": str(s.limits.max_payload),
        }

    # -- watching -----------------------------------------------------------------------

    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(queue)`` whenever messages become ready in a queue (published,
        released, dead-lettered into it). It runs on whichever thread made them ready,
        so it must be quick and must not call the node; redeliveries that come due by
        time are not announced — poll for those."""
        self._listeners.append(callback)

    def _notify(self, queues: set[str]) -> None:
        for callback in self._listeners:
            for name in queues:
                callback(name)

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
                )
                for q in sorted(self._queues.values(), key=lambda q: q.config.name)
            ]
        published = self.store.published_at([low for *_, low in snapshot if low is not None])
        out = []
        for config, depth, in_flight, counts, low in snapshot:
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
                )
            )
        return out

    def log(self, pattern: str | None = None, from_seq: int = 0, limit: int = 20) -> list[Message]:
        """Messages still in the retained log, oldest first."""
        if limit < 1:
            raise InvalidConfig("limit must be at least 1")
        regex = None if pattern is None else pattern_regex(pattern)
        return self.store.log(regex, from_seq, limit)

    # -- maintenance -----------------------------------------------------------------------

    def maintain(self) -> None:
        """Time out deliveries and expire messages; when due, compact the hot tables and
        collect the log past retention. Runs every ``tick`` seconds and at close."""
        if self._closed:
            return
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
            self._last_gc = now
            cutoff = _us(now - self.settings.retention)
            horizon = self.store.writer.run(
                Store.collect_garbage_job(floor, cutoff, _us(now))
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
            future = self.store.writer.write(batch) if not batch.empty else None
        if future is not None:
            future.result()

    def _tick(self) -> None:
        tick = self.settings.tick
        assert tick is not None
        while not self._stop.wait(tick):
            try:
                self.maintain()
            except NodeClosed:
                return

    def _check_open(self) -> None:
        if self._closed:
            raise NodeClosed("the node is closed")
