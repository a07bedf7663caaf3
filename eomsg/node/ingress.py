"""Ingress and routing (seed 004): validate, dedup by id (seed 001), assign the next
sequence number, match the queues subscribed to the topic, persist the message together
with its destination list in one group commit, and acknowledge only after that commit.
The commit's after-commit step then hands the message to each destination's cursor.

Under the lock discipline of :mod:`eomsg.node.state`: a batch is staged and queued under
``_lock``, so the log's commit order is the order its sequence numbers were assigned.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from eomsg.core import access
from eomsg.core.access import OWNER
from eomsg.core.limits import check_outgoing
from eomsg.core.message import Outgoing, Publishable, PublishResult
from eomsg.errors import InvalidConfig, QueueFull
from eomsg.failpoints import failpoint
from eomsg.node.overflow import Displaced, Overflow
from eomsg.node.state import Destination, QueueState, to_us
from eomsg.store.writer import RowBatch

REQUEUED_FROM = "eomsg-requeued-from"  # the header a requeued message carries: its old seq
Route = tuple[Destination, ...]
Fresh = tuple[int, str | None, float | None, Route]  # seq, id, expiry, route


class Ingress(Overflow):
    """Publishing: messages in, numbered, routed and made durable."""

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
        self._check_memory()
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

    def requeue(
        self, name: str, to: str | None = None, max_messages: int | None = None, *, by: str = OWNER
    ) -> tuple[int, str]:
        """Move up to ``max_messages`` (None: all) of the messages waiting in queue
        ``name`` — a dead-letter queue, usually — into ``to`` (default: the one queue
        that dead-letters into it). Atomic: each is published again (a new seq; topic,
        payload, headers and remaining time to live kept, plus the header
        ``eomsg-requeued-from`` naming its old seq) into ``to`` alone, and settled here
        as deleted, in one commit. Messages in flight stay where they are. Returns how
        many moved, and the queue they went to."""
        if max_messages is not None and max_messages < 1:
            raise InvalidConfig("--max must be at least 1")
        now = self.clock()
        self._check_room()
        with self._lock:
            self._check_open()
            q = self._queue(name)
            target = self._queue(to) if to is not None else self._dead_lettering_into(q)
            if target is q:
                raise InvalidConfig(f"queue {name!r} cannot be requeued into itself")
            into = target.config.name  # picked here when not named: its right checked here
            self.access.policy.check(by, access.admin_of(into), f"requeue into queue {into}")
            batch = RowBatch()
            # What expired by now expires, rather than being moved with a moment to live.
            self._record_settlements(batch, q, q.cursor.poll(now), now)
            found = self._fetch_messages(q.cursor.waiting(max_messages))  # before any change
            moved = [found[seq] for seq in sorted(found)]
            again = [
                Outgoing(
                    m.topic,
                    m.payload,
                    None,  # the id stays with the original (it is deduplicated against it)
                    None if m.expires_at is None else max(m.expires_at - now, 1e-6),
                    {**m.headers, REQUEUED_FROM: str(m.seq)},
                )
                for m in moved
            ]
            first_seq = self._next_seq
            refused: QueueFull | None = None
            try:
                _, fresh = self._stage(batch, again, now, route=(target,))
            except QueueFull as e:  # nothing moves; what expired meanwhile is recorded
                refused, future = e, self._queue_write(batch)
            else:
                settled = q.cursor.take_out([m.seq for m in moved])
                self._record_settlements(batch, q, settled, now)
                if moved:
                    detail = f"{len(moved)} messages into {target.config.name}"
                    batch.add("audit", *self._audit(by, "requeue", name, detail))
                future = self._write_staged(batch, first_seq, fresh) if not batch.empty else None
        self._await_commit(future)
        if refused is not None:
            raise refused
        return len(moved), target.config.name

    def _dead_lettering_into(self, q: QueueState) -> QueueState:
        """The one queue whose dead-letter queue ``q`` is; InvalidConfig if none or many."""
        sources = [s for s in self._queues.values() if s.config.dead_letter == q.config.name]
        if len(sources) != 1:
            said = "no queue" if not sources else f"{len(sources)} queues"
            raise InvalidConfig(
                f"{said} dead-letter into {q.config.name!r}: say where its messages go (use --to)"
            )
        return sources[0]

    def _check_messages(self, messages: Sequence[Outgoing]) -> None:
        """Validate every message of a transaction and, if it publishes any, make sure
        the disk has room for them — before anything is staged."""
        for m in messages:
            check_outgoing(m, self.settings.limits)
        if messages:
            self._check_room()
            self._check_memory()

    def _stage(
        self,
        batch: RowBatch,
        messages: Sequence[Publishable],
        now: float,
        route: Route | None = None,
        routes: Sequence[Route] | None = None,
        refuse: bool = True,
    ) -> tuple[list[PublishResult], list[Fresh]]:
        """Dedup ``messages`` by id, give the new ones the next sequence numbers and
        route them (by topic, all to ``route``, or each to its own of ``routes``),
        adding their rows to ``batch`` (with the after-commit step that makes them
        deliverable): the log's, and the destinations — a row per message and queue,
        a run of consecutive seqs per link's route (what the link owes is settled as
        one number, so a row per message would only be written and deleted). A queue
        they would take past its max-messages refuses them (QueueFull, nothing
        changed; ``refuse`` False: a prepared transaction's commit, which must not fail,
        takes it past) or makes room (:mod:`eomsg.node.overflow`). Call with ``_lock``
        held, then :meth:`_write_staged`."""
        now_us = to_us(now)
        results: list[PublishResult] = []
        fresh: list[Fresh] = []
        log_rows, id_rows, dest_rows = [], [], []
        runs: dict[int, list[int]] = {}  # by route: its latest run [route, first, last]
        run_rows: list[list[int]] = []
        uncommitted = self._uncommitted_ids
        touched: dict[QueueState, int] = {}  # how many each queue gets
        sized: list[tuple[QueueState, int, int]] = []  # (queue, seq, bytes): max-bytes
        published = self._dedup.lookup_many([m.id for m in messages if m.id is not None], now)

        def route_of(i: int) -> Route:
            if routes is not None:
                return routes[i]
            return self._route(messages[i].topic) if route is None else route

        displaced = self._displaced(messages, published, route_of)
        moved: Displaced = []  # displaced into their queue's dead-letter queue
        rerouted: dict[tuple[int, QueueState], Route] = {}
        seq = self._next_seq
        for i, m in enumerate(messages):
            msg_id = m.id
            if msg_id is not None:
                original = uncommitted.get(msg_id) or published.get(msg_id)
                if original is not None:
                    results.append(PublishResult(original, msg_id, True, None))
                    continue
                uncommitted[msg_id] = seq
            expires = None if m.ttl is None else now + m.ttl
            expires_us = None if expires is None else to_us(expires)
            queues = route_of(i)
            if displaced:
                queues = self._displace(displaced, moved, queues, seq, len(m.payload), rerouted)
            headers = m.log_headers
            log_rows.append((seq, m.topic, msg_id, now_us, expires_us, headers, m.payload))
            if msg_id is not None:
                id_rows.append((msg_id, seq, expires_us))
            for q in queues:
                if q.id > 0:  # a queue: a row each
                    dest_rows.append((seq, q.id))
                    touched[q] = touched.get(q, 0) + 1  # type: ignore[index,call-overload]
                    if q.staged_sizes is not None:  # type: ignore[attr-defined]
                        sized.append((q, seq, len(m.payload)))  # type: ignore[arg-type]
                elif (run := runs.get(q.id)) is not None and run[2] == seq - 1:
                    run[2] = seq  # a link's route: runs of consecutive seqs
                else:
                    runs[q.id] = run = [q.id, seq, seq]
                    run_rows.append(run)
            fresh.append((seq, msg_id, expires, queues))
            results.append(PublishResult(seq, msg_id, False, len(queues)))
            seq += 1
        if touched:
            adding = dict(touched)
            adding_bytes: dict[QueueState, int] = {}
            for q, _, nbytes in sized:
                adding_bytes[q] = adding_bytes.get(q, 0) + nbytes
            for _, dlq, _, nbytes in moved:  # dead-lettered into a queue: past its limit
                adding[dlq] -= 1
                if dlq in adding_bytes:
                    adding_bytes[dlq] -= nbytes
            if refuse:
                try:
                    self._refuse_past(adding, adding_bytes)
                except QueueFull:  # nothing changed but the ids noted: forgotten
                    for _, msg_id, _, _ in fresh:
                        if msg_id is not None:
                            uncommitted.pop(msg_id, None)
                    raise
            self._record_displaced(batch, moved, now_us)
            self._make_room(batch, adding, adding_bytes, now)
        self._next_seq = seq
        if touched and log_rows:  # what a take may read at once follows their size
            size = sum(len(row[6]) for row in log_rows) / len(log_rows)
            for q in touched:
                q.note_payload(size)
        for q, n in touched.items():
            q.incoming += n
        for q, staged_seq, nbytes in sized:
            q.stage_size(staged_seq, nbytes)
        for name, rows in (
            ("messages", log_rows),
            ("publish_ids", id_rows),
            ("destinations", dest_rows),
            ("route_runs", [tuple(run) for run in run_rows]),
        ):
            if rows:
                batch.rows_of(name).extend(rows)
        if fresh:
            self._save_routes(batch)
            batch.after_commit(lambda: self._published(fresh))
        return results, fresh

    def _write_staged(self, batch: RowBatch, first_seq: int, fresh: list[Fresh]) -> Future[None]:
        """Queue a batch holding staged messages; if the writer refuses it, forget them
        (nothing was queued), so their seqs and ids are free again."""
        try:
            return self._write(batch)
        except BaseException:
            self._next_seq = first_seq
            for seq, msg_id, _, route in fresh:
                if msg_id is not None:
                    self._uncommitted_ids.pop(msg_id, None)
                for q in route:
                    if isinstance(q, QueueState):
                        q.unstage(seq)
            raise

    def _check_queue_room(self, messages: Sequence[Outgoing], now: float) -> None:
        """QueueFull if ``messages`` would take a queue that refuses past its
        max-messages: a transaction's prepare votes no then (its commit, which must not
        fail, takes them in regardless). Under ``_lock``."""
        room = self._room([m.id for m in messages if m.id is not None], now)
        for m in messages:
            if (why := room.full(self._route(m.topic), m.id, len(m.payload))) is not None:
                raise why

    def _route(self, topic: str) -> Route:
        """The queues subscribed to ``topic``, then the links it goes out on. Under
        ``_lock``."""
        route = self._routes.get(topic)
        if route is None:
            route = (*sorted(self._matcher.match(topic), key=lambda q: q.id), *self._hops(topic))
            if len(self._routes) > 8192:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _published(self, fresh: list[Fresh]) -> None:
        """After commit (writer thread, commit order): make the messages deliverable and
        their ids known."""
        with self._lock:
            routes = self._deliverable(fresh)
            self._durable_seq = fresh[-1][0]
        self._forward(routes)  # seed 004 k: toward further nodes first, then locally
        self._notify({q.config.name for r in routes for q in r if isinstance(q, QueueState)})

    def _deliverable(self, fresh: list[Fresh]) -> set[Route]:
        """Hand messages to their destinations (the queues' cursors, the links) and their
        ids to the dedup window; the routes they took. Consecutive messages with the
        same route go as one run, since a batch usually shares one topic. Under
        ``_lock``."""
        ids: list[str] = []
        id_seqs: list[int] = []
        id_expiry: list[float | None] = []
        routes: set[Route] = set()
        run_route: Route | None = None
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
        return routes

    @staticmethod
    def _append_run(route: Route | None, seqs: list[int], expiry: list[float | None]) -> None:
        for q in route or ():
            q.extend(seqs, expiry)
