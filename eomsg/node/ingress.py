"""Ingress and routing (seed 004): validate, dedup by id (seed 001), assign the next
sequence number, match the queues subscribed to the topic, persist the message together
with its destination list in one group commit, and acknowledge only after that commit.
The commit's after-commit step then hands the message to each destination's cursor.

Under the lock discipline of :mod:`eomsg.node.state`: a batch is staged and queued under
``lock``, so the log's commit order is the order its sequence numbers were assigned.
What else takes messages in — a transaction's commit (:mod:`eomsg.node.participant`), a
linked peer's frame (:mod:`eomsg.node.intake`) — stages them here too
(:meth:`Ingress.stage`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from eomsg.core import access
from eomsg.core.access import OWNER
from eomsg.core.limits import check_outgoing
from eomsg.core.message import Outgoing, Publishable, PublishResult
from eomsg.core.topics import Matcher
from eomsg.errors import InvalidConfig, QueueFull
from eomsg.failpoints import failpoint
from eomsg.node.dedup import Deduplication
from eomsg.node.events import Signal
from eomsg.node.overflow import Displaced, Overflow
from eomsg.node.state import Destination, QueueState, Shared, to_us
from eomsg.store.writer import RowBatch

if TYPE_CHECKING:
    from eomsg.node.access import Access
    from eomsg.node.links import Links

REQUEUED_FROM = "eomsg-requeued-from"  # the header a requeued message carries: its old seq
Route = tuple[Destination, ...]
Fresh = tuple[int, str | None, float | None, Route]  # seq, id, expiry, route
# A message as the log keeps it: seq, topic, id, published at µs, expires at µs, headers
LogRow = tuple[int, str, str | None, int, int | None, str | None, bytes]


class Kernel(Shared, Protocol):
    """What :class:`Ingress` needs of the node besides :class:`~eomsg.node.state.Shared`."""

    access: Access
    links: Links
    admin_lock: threading.Lock
    next_seq: int
    durable_seq: int
    uncommitted_ids: dict[str, int]
    dedup: Deduplication
    routes: dict[str, tuple[Destination, ...]]
    matcher: Matcher[QueueState]
    limited: bool
    settled_since_compaction: int

    def check_room(self) -> None: ...
    def check_memory(self) -> None: ...


class Ingress:
    """Publishing: messages in, numbered, routed and made durable. :attr:`committed` is
    emitted after each commit of published messages (on the writer's thread, in commit
    order, not under ``lock``) with the routes they took, before the queues are woken."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self.overflow = Overflow(kernel)
        self.committed: Signal[[set[Route]]] = Signal()

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
        k = self._kernel
        self.check_messages(messages)
        now = k.clock()
        batch = RowBatch()
        with k.lock:
            k.check_open()
            first_seq = k.next_seq
            results, fresh = self.stage(batch, messages, now)
            if fresh or k.durable_seq < first_seq - 1:  # duplicates wait for originals
                committed = self.write_staged(batch, first_seq, fresh)
            else:
                committed = Future()
                committed.set_result(None)
            failpoint("publish.before_commit")
        acked: Future[list[PublishResult]] = Future()

        def on_commit(f: Future[None]) -> None:
            error = f.exception()
            if error is not None:
                with k.lock:
                    for _, msg_id, _, _ in fresh:
                        if msg_id is not None:
                            k.uncommitted_ids.pop(msg_id, None)
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
        k = self._kernel
        now = k.clock()
        k.check_room()
        with k.lock:
            k.check_open()
            q = k.queue(name)
            target = k.queue(to) if to is not None else self._dead_lettering_into(q)
            if target is q:
                raise InvalidConfig(f"queue {name!r} cannot be requeued into itself")
            into = target.config.name  # picked here when not named: its right checked here
            k.access.policy.check(by, access.admin_of(into), f"requeue into queue {into}")
            batch = RowBatch()
            # What expired by now expires, rather than being moved with a moment to live.
            k.record_settlements(batch, q, q.cursor.poll(now), now)
            found = k.egress.fetch_messages(q.cursor.waiting(max_messages))  # before any change
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
            first_seq = k.next_seq
            refused: QueueFull | None = None
            try:
                _, fresh = self.stage(batch, again, now, route=(target,))
            except QueueFull as e:  # nothing moves; what expired meanwhile is recorded
                refused, future = e, k.queue_write(batch)
            else:
                settled = q.cursor.take_out([m.seq for m in moved])
                k.record_settlements(batch, q, settled, now)
                if moved:
                    detail = f"{len(moved)} messages into {target.config.name}"
                    batch.add("audit", *k.audit_entry(by, "requeue", name, detail))
                future = self.write_staged(batch, first_seq, fresh) if not batch.empty else None
        k.await_commit(future)
        if refused is not None:
            raise refused
        return len(moved), target.config.name

    def _dead_lettering_into(self, q: QueueState) -> QueueState:
        """The one queue whose dead-letter queue ``q`` is; InvalidConfig if none or many."""
        queues = self._kernel.queues.values()
        sources = [s for s in queues if s.config.dead_letter == q.config.name]
        if len(sources) != 1:
            said = "no queue" if not sources else f"{len(sources)} queues"
            raise InvalidConfig(
                f"{said} dead-letter into {q.config.name!r}: say where its messages go (use --to)"
            )
        return sources[0]

    def check_messages(self, messages: Sequence[Outgoing]) -> None:
        """Validate every message (a publish's, a transaction's) and, if there are any,
        make sure the disk and the node's memory have room for them — before anything
        is staged."""
        k = self._kernel
        limits = k.settings.limits
        for m in messages:
            check_outgoing(m, limits)
        if messages:
            k.check_room()
            k.check_memory()

    def stage(
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
        takes it past) or makes room (:mod:`eomsg.node.overflow`). Call with ``lock``
        held, then :meth:`write_staged`."""
        k = self._kernel
        uncommitted = k.uncommitted_ids
        published = k.dedup.lookup_many([m.id for m in messages if m.id is not None], now)

        def route_of(i: int) -> Route:
            if routes is not None:
                return routes[i]
            return self.route(messages[i].topic) if route is None else route

        displaced = self.overflow.displaced(messages, published, route_of)
        staged = _Staging(to_us(now))
        add = staged.add
        seq = k.next_seq
        for i, m in enumerate(messages):
            msg_id = m.id
            if msg_id is not None:
                original = uncommitted.get(msg_id) or published.get(msg_id)
                if original is not None:
                    staged.results.append(PublishResult(original, msg_id, True, None))
                    continue
                uncommitted[msg_id] = seq
            queues = route_of(i)
            if displaced:
                queues = self.overflow.displace(
                    displaced, staged.moved, queues, seq, len(m.payload), staged.rerouted
                )
            add(seq, m, now, queues)
            seq += 1
        if staged.touched:
            self._limit(batch, staged, now, refuse)
        k.next_seq = seq
        staged.into(batch)
        fresh = staged.fresh
        if fresh:
            k.links.save_routes(batch)
            batch.after_commit(lambda: self._published(fresh))
        return staged.results, fresh

    def _limit(self, batch: RowBatch, staged: _Staging, now: float, refuse: bool) -> None:
        """Hold what ``staged`` adds to its queues to their limits: QueueFull if a queue
        that refuses would pass one (``refuse``; its ids forgotten, nothing else changed
        yet), else the displaced recorded and room made, in ``batch``. Under
        ``lock``."""
        adding = dict(staged.touched)
        adding_bytes: dict[QueueState, int] = {}
        for q, _, nbytes in staged.sized:
            adding_bytes[q] = adding_bytes.get(q, 0) + nbytes
        for _, dlq, _, nbytes in staged.moved:  # dead-lettered into a queue: past its limit
            adding[dlq] -= 1
            if dlq in adding_bytes:
                adding_bytes[dlq] -= nbytes
        if refuse:
            try:
                self.overflow.refuse_past(adding, adding_bytes)
            except QueueFull:  # nothing changed but the ids noted: forgotten
                for _, msg_id, _, _ in staged.fresh:
                    if msg_id is not None:
                        self._kernel.uncommitted_ids.pop(msg_id, None)
                raise
        self.overflow.record_displaced(batch, staged.moved, staged.now_us)
        self.overflow.make_room(batch, adding, adding_bytes, now)

    def write_staged(self, batch: RowBatch, first_seq: int, fresh: list[Fresh]) -> Future[None]:
        """Queue a batch holding staged messages; if the writer refuses it, forget them
        (nothing was queued), so their seqs and ids are free again."""
        k = self._kernel
        try:
            return k.write(batch)
        except BaseException:
            k.next_seq = first_seq
            for seq, msg_id, _, route in fresh:
                if msg_id is not None:
                    k.uncommitted_ids.pop(msg_id, None)
                for q in route:
                    if isinstance(q, QueueState):
                        q.unstage(seq)
            raise

    def check_queue_room(self, messages: Sequence[Outgoing], now: float) -> None:
        """QueueFull if ``messages`` would take a queue that refuses past its
        max-messages: a transaction's prepare votes no then (its commit, which must not
        fail, takes them in regardless). Under ``lock``."""
        room = self.overflow.room([m.id for m in messages if m.id is not None], now)
        for m in messages:
            if (why := room.full(self.route(m.topic), m.id, len(m.payload))) is not None:
                raise why

    def route(self, topic: str) -> Route:
        """The queues subscribed to ``topic``, then the links it goes out on. Under
        ``lock``."""
        k = self._kernel
        route = k.routes.get(topic)
        if route is None:
            queues = sorted(k.matcher.match(topic), key=lambda q: q.id)
            route = (*queues, *k.links.hops(topic))
            if len(k.routes) > 8192:
                k.routes.clear()
            k.routes[topic] = route
        return route

    def _published(self, fresh: list[Fresh]) -> None:
        """After commit (writer thread, commit order): make the messages deliverable and
        their ids known."""
        k = self._kernel
        with k.lock:
            routes = self.deliverable(fresh)
            k.durable_seq = fresh[-1][0]
        self.committed.emit(routes)  # seed 004 k: toward further nodes first, then locally
        k.notify({q.config.name for r in routes for q in r if isinstance(q, QueueState)})

    def deliverable(self, fresh: list[Fresh]) -> set[Route]:
        """Hand messages to their destinations (the queues' cursors, the links) and their
        ids to the dedup window; the routes they took. Consecutive messages with the
        same route go as one run, since a batch usually shares one topic. Under
        ``lock``."""
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
        self._kernel.dedup.remember_many(ids, id_seqs, id_expiry)
        uncommitted = self._kernel.uncommitted_ids
        for msg_id in ids:
            uncommitted.pop(msg_id, None)
        return routes

    @staticmethod
    def _append_run(route: Route | None, seqs: list[int], expiry: list[float | None]) -> None:
        for q in route or ():
            q.extend(seqs, expiry)


class _Staging:
    """What :meth:`Ingress.stage` makes of a batch's new messages, message by message:
    their rows, the queues and link routes they go to, and their results."""

    __slots__ = (
        *("now_us", "results", "fresh", "log_rows", "id_rows", "dest_rows", "runs"),
        *("run_rows", "touched", "sized", "moved", "rerouted"),
    )

    def __init__(self, now_us: int) -> None:
        self.now_us = now_us
        self.results: list[PublishResult] = []
        self.fresh: list[Fresh] = []
        self.log_rows: list[LogRow] = []
        self.id_rows: list[tuple[object, ...]] = []
        self.dest_rows: list[tuple[object, ...]] = []
        self.runs: dict[int, list[int]] = {}  # by route: its latest run [route, first, last]
        self.run_rows: list[list[int]] = []
        self.touched: dict[QueueState, int] = {}  # how many each queue gets
        self.sized: list[tuple[QueueState, int, int]] = []  # (queue, seq, bytes): max-bytes
        self.moved: Displaced = []  # displaced into their queue's dead-letter queue
        self.rerouted: dict[tuple[int, QueueState], Route] = {}

    def add(self, seq: int, m: Publishable, now: float, queues: Route) -> None:
        """Message ``m``, numbered ``seq``, going to ``queues``."""
        msg_id = m.id
        expires = None if m.ttl is None else now + m.ttl
        expires_us = None if expires is None else to_us(expires)
        self.log_rows.append(
            (seq, m.topic, msg_id, self.now_us, expires_us, m.log_headers, m.payload)
        )
        if msg_id is not None:
            self.id_rows.append((msg_id, seq, expires_us))
        for q in queues:
            if q.id > 0:  # a queue: a row each
                self.dest_rows.append((seq, q.id))
                self.touched[q] = self.touched.get(q, 0) + 1  # type: ignore[index,call-overload]
                if q.staged_sizes is not None:  # type: ignore[attr-defined]
                    self.sized.append((q, seq, len(m.payload)))  # type: ignore[arg-type]
            elif (run := self.runs.get(q.id)) is not None and run[2] == seq - 1:
                run[2] = seq  # a link's route: runs of consecutive seqs
            else:
                self.runs[q.id] = run = [q.id, seq, seq]
                self.run_rows.append(run)
        self.fresh.append((seq, msg_id, expires, queues))
        self.results.append(PublishResult(seq, msg_id, False, len(queues)))

    def into(self, batch: RowBatch) -> None:
        """Count what the queues get, and add the rows to ``batch``. Under ``lock``, once
        nothing refuses."""
        touched, log_rows = self.touched, self.log_rows
        if touched and log_rows:  # what a take may read at once follows their size
            size = sum(len(row[6]) for row in log_rows) / len(log_rows)
            for q in touched:
                q.note_payload(size)
        for q, n in touched.items():
            q.incoming += n
        for q, staged_seq, nbytes in self.sized:
            q.stage_size(staged_seq, nbytes)
        for name, rows in (
            ("messages", log_rows),
            ("publish_ids", self.id_rows),
            ("destinations", self.dest_rows),
            ("route_runs", [tuple(run) for run in self.run_rows]),
        ):
            if rows:
                batch.rows_of(name).extend(rows)
