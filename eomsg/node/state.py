"""The node's shared state and the one lock discipline every part of it follows.

:class:`~eomsg.node.node.Node` is assembled from components — objects that own their
state and name what they need of the rest (``access``: principals and grants;
``elections``: flows and their elections; ``inspection``: reads; ``participant``:
transactions; ``admin``: queues and settings; ``delivery``: the cursors' deliveries;
``maintenance``: time and upkeep; ``ingress``, ``egress``, ``links``, ``transfer``,
``intake``: messages in, held, and to and from other nodes) — over :class:`NodeState`:
the runtime state they share, the helpers more than one of them uses, and the events
they subscribe to (:attr:`NodeState.interest_changed`, :attr:`NodeState.queue_dropped`).
The runtime structs of a queue, a flow and a prepared transaction are here too.

Lock discipline
---------------

``lock`` guards the in-memory state: the queues (``queues``, ``queues_by_id``, ``matcher``,
``routes``) with their cursors, counts, elections and live epochs; the flows; the sequence
numbers (``next_seq``, ``durable_seq``); the dedup window and ``uncommitted_ids``; the
prepared and finished transactions; ``settled_since_compaction``. It is held briefly and
never while waiting for the writer: the writer's after-commit callbacks (a publish made
deliverable, a message moved to its dead-letter queue) take it, so waiting for a commit
under it would deadlock. Writes are queued while holding it (:meth:`~NodeState.queue_write`,
``ingress.write_staged``, ``store.writer.write``), so the log's commit order is the order the state
changed in — for publishes, the order sequence numbers were assigned; the caller waits for
the commit (:meth:`~NodeState.await_commit`) after releasing it. A helper documented as
"under ``lock``" expects the caller to hold it.

``admin_lock`` serialises administrative changes — creating, deleting and (un)subscribing
queues, node settings, replay job records — which wait for their commit *before* they
touch the in-memory state (under ``lock``). The set of queues and each queue's config
change only with both held, so either one is enough to read them; ``settings`` is replaced
only under ``admin_lock``.

``elections.elect`` serialises the election's stimuli (bind, unbind), which may wait for
the writer to reserve epochs durably (``Elections._reserve_epochs``) before they take
``lock``; it guards the epochs reserved.

Order: ``admin_lock`` or ``elect`` first, then ``lock``; the two are never held together, and
nothing takes either of them under ``lock``. ``ready`` (a condition with its own lock,
guarding ``ready_generation``) wakes ``fetch(wait=)``; it is a leaf, never held with any of
the others: :meth:`~NodeState.notify` bumps it and then calls the readiness listeners,
and is called after ``lock`` is released.

A flow's ``notify`` callback runs *under* ``lock`` (bind, unbind, an election's changes,
a queue deleted), on whichever thread caused the change, so it must only hand the event on
and never call the node.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from eomsg.core.cursor import Cursor, Outcome, Release, Settlement
from eomsg.core.election import Election, Epochs, FlowEvent
from eomsg.core.limits import format_bytes
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.core.rates import Rates, Totals
from eomsg.core.topics import Matcher
from eomsg.errors import (
    DiskFull,
    MemoryFull,
    NodeClosed,
    QueueNotFound,
    StaleEpoch,
)
from eomsg.node.dedup import Deduplication
from eomsg.node.events import Signal
from eomsg.node.settings import NodeSettings, apply_saved
from eomsg.store.store import US, Store
from eomsg.store.writer import RowBatch

if TYPE_CHECKING:
    from eomsg.node.access import Access
    from eomsg.node.admin import Admin
    from eomsg.node.delivery import Delivery
    from eomsg.node.egress import Egress
    from eomsg.node.flows import Elections
    from eomsg.node.ingress import Ingress
    from eomsg.node.intake import Intake
    from eomsg.node.links import Links
    from eomsg.node.maintenance import Maintenance
    from eomsg.node.participant import Participant
    from eomsg.node.transfer import Transfer

FREE_MARGIN = 256 << 20  # free bytes above the reserve past which a reading may stand
FREE_FRESH = 0.02  # seconds a reading of the free space stands, that far above
RELEASED_AT = "released_at"  # node_meta: the latest time a release was recorded at

Clock = Callable[[], float]
Notify = Callable[[FlowEvent], None]


AuditRow = tuple[int, str, str, str, str]
"""An audit record as the store takes it: (at µs, principal, action, target, detail)."""


def audit_row(now: float, by: str, action: str, target: str, detail: str = "") -> AuditRow:
    """The audit record of a change ``by`` a principal at ``now``, to commit with it
    (:meth:`Store.audited`, or a batch's ``audit`` rows)."""
    return (to_us(now), by, action, target, detail)


def to_us(seconds: float) -> int:
    """Seconds as the store's microseconds."""
    return int(seconds * US)


class QueueState:
    """Runtime state of one queue; identity-hashed, so it can be a matcher key."""

    __slots__ = (
        "config", "counts", "cursor", "delivered", "election", "id", "incoming",
        "incoming_bytes", "live_epochs", "overflowed", "payload_bytes", "staged_sizes",
    )  # fmt: skip

    def __init__(self, queue_id: int, config: QueueConfig, epochs: Epochs) -> None:
        self.id = queue_id
        self.config = config
        self.cursor = Cursor(
            ack_timeout=config.ack_timeout, max_redeliveries=config.max_redeliveries
        )
        self.counts = dict.fromkeys(Outcome, 0)
        self.delivered = 0  # deliveries since the node opened (redeliveries included)
        self.election = Election(config.max_active, config.immediate, epochs)
        self.live_epochs: set[int] = set()  # of the active flows: deletes accepted
        # About the payload of its messages (a moving average of what was published to
        # it; None until it had one): what bounds the bytes a take reads into memory.
        self.payload_bytes: float | None = None
        # Messages staged for it whose commit is not durable yet (its cursor gets them
        # then): with the cursor's depth, what its max-messages is held against.
        self.incoming = 0
        self.overflowed = 0  # messages its overflow refused or dead-lettered, since open
        # While it has a max-bytes (or one is being set): the payload size of each
        # message staged for it, by seq, and their sum; its cursor keeps them once
        # durable (:meth:`extend`).
        self.staged_sizes: dict[int, int] | None = None
        self.incoming_bytes = 0
        if config.max_bytes is not None:
            self.staged_sizes = {}
            self.cursor.track_sizes({})

    @property
    def depth(self) -> int:
        """The messages it holds, and those on their way in (staged, not yet durable)."""
        return self.cursor.depth + self.incoming

    @property
    def held_bytes(self) -> int:
        """The payload bytes it holds and has on their way in, while it has a max-bytes
        (what that is held against; 0 otherwise)."""
        return self.cursor.bytes + self.incoming_bytes

    def stage_size(self, seq: int, size: int) -> None:
        """Message ``seq`` of ``size`` payload bytes is staged for it (noted only while
        sizes are kept)."""
        if self.staged_sizes is not None:
            self.staged_sizes[seq] = size
            self.incoming_bytes += size

    def unstage(self, seq: int) -> None:
        """Staged message ``seq`` will never come (its write was refused)."""
        self.incoming -= 1
        if self.staged_sizes is not None:
            self.incoming_bytes -= self.staged_sizes.pop(seq, 0)

    def note_payload(self, size: float) -> None:
        """Messages of about ``size`` payload bytes came to this queue."""
        known = self.payload_bytes
        self.payload_bytes = size if known is None else 0.9 * known + 0.1 * size

    def extend(self, seqs: list[int], expiry: list[float | None]) -> None:
        """Newly committed messages for this queue (a destination, as a link's route is)."""
        self.incoming -= len(seqs)
        staged = self.staged_sizes
        if staged is None:
            self.cursor.extend(seqs, expiry)
            return
        sizes = [staged.pop(seq, 0) for seq in seqs]
        self.incoming_bytes -= sum(sizes)
        self.cursor.extend(seqs, expiry, sizes)


class Destination(Protocol):
    """Where a stored message goes: a queue, or a route out over a link. Its ``id`` is
    what the store's destination and settlement records name."""

    id: int

    def extend(self, seqs: list[int], expiry: list[float | None]) -> None: ...


class FlowState:
    """A consumer bound to a queue: who it is and how to tell it about changes."""

    __slots__ = ("bound_at", "id", "notify", "owner", "priority", "queue")

    def __init__(
        self, flow_id: int, queue: QueueState, priority: int, owner: str, notify: Notify | None
    ) -> None:
        self.id = flow_id
        self.queue = queue
        self.priority = priority
        self.owner = owner
        self.notify = notify
        self.bound_at = 0.0


class PreparedTxn:
    """A transaction prepared here (seed 000) and not yet decided: what it publishes and
    the messages it holds, by queue; ``owner`` is the session of its coordinator while
    that is connected (None after a restart or a disconnect: the outcome is in doubt)."""

    __slots__ = ("coordinator", "deletes", "messages", "owner", "prepared_at", "principal", "txid")

    def __init__(
        self,
        txid: str,
        coordinator: str,
        prepared_at: float,
        messages: list[Outgoing],
        deletes: dict[QueueState, list[int]],
        owner: str | None,
        principal: str | None,
    ) -> None:
        self.txid = txid
        self.coordinator = coordinator
        self.prepared_at = prepared_at
        self.messages = messages
        self.deletes = deletes
        self.owner = owner
        self.principal = principal  # who prepared it (None: before principals, the owner)


class Shared(Protocol):
    """What every component of the node may use of :class:`NodeState` (each component's
    ``Kernel`` protocol adds what else it needs): the store, the clock and settings, the
    lock and the queues, and the helpers that check, record and write."""

    store: Store
    clock: Clock
    settings: NodeSettings
    lock: threading.Lock
    queues: dict[str, QueueState]
    egress: Egress

    def check_open(self) -> None: ...
    def queue(self, name: str) -> QueueState: ...
    @staticmethod
    def check_epoch(q: QueueState, epoch: int) -> None: ...
    def audit_entry(self, by: str, action: str, target: str, detail: str = "") -> AuditRow: ...
    def record_settlements(
        self,
        batch: RowBatch,
        q: QueueState,
        settlements: list[Settlement],
        now: float,
        expiries: dict[int, float] | None = None,
    ) -> None: ...
    def record_releases(
        self, batch: RowBatch, q: QueueState, outcomes: list[Release | Settlement], now: float
    ) -> None: ...
    def queue_write(self, batch: RowBatch) -> Future[None] | None: ...
    def write(self, batch: RowBatch) -> Future[None]: ...
    @staticmethod
    def await_commit(future: Future[None] | None) -> None: ...
    def notify(self, queues: set[str]) -> None: ...


class NodeState:
    """The state every concern of the node shares, under the lock discipline of this
    module's docstring, and the helpers more than one concern uses."""

    _free_seen: tuple[int, float] = (0, -math.inf)  # free bytes last read, and when

    # Set by Node._recover, from the store.
    next_seq: int  # the seq the next published message gets
    durable_seq: int  # the last seq whose commit is durable
    settled_since_compaction: int
    _released_at: float  # the latest time a release was recorded at (see _record_releases)
    dedup: Deduplication  # the publish ids (seed 001), in memory and spilled to disk
    access: Access  # principals, grants, the audit log: a component (Node makes it)
    elections: Elections  # the flows bound to queues and their elections: a component
    participant: Participant  # transactions prepared and decided: a component
    admin: Admin  # queues and saved settings administered: a component
    delivery: Delivery  # the cursors' deliveries taken, deleted and released: a component
    maintenance: Maintenance  # time applied, the store kept small: a component
    ingress: Ingress  # messages in: validated, numbered, routed, made durable
    egress: Egress  # messages a linked peer sent, held in memory instead of stored
    links: Links  # linked peers: their settings, interest and routes
    transfer: Transfer  # a link's connection: what goes out over it, and its timers
    intake: Intake  # what a linked peer sends: stored here and onward, or held

    def __init__(self, store: Store, settings: NodeSettings, clock: Clock) -> None:
        self.store = store
        self.settings = apply_saved(settings, store.settings())
        self.clock = clock
        self.lock = threading.Lock()
        self.admin_lock = threading.Lock()
        self.closed = False
        self.queues: dict[str, QueueState] = {}
        self.queues_by_id: dict[int, QueueState] = {}
        self.matcher: Matcher[QueueState] = Matcher()
        self.routes: dict[str, tuple[Destination, ...]] = {}
        self.limited = False  # whether a queue has a max-messages (see _queues_changed)
        self.uncommitted_ids: dict[str, int] = {}
        self._listeners: list[Callable[[str], None]] = []
        self.ready = threading.Condition()  # wakes fetch(wait=) when messages are ready
        self.ready_generation = 0
        self.rates = Rates()  # noted by the ticker: inspect queues' in/s and out/s
        self.later: dict[str, str] = {}  # node_meta to set with the next write (see below)
        # Under lock: the topics this node's queues want changed (links tell their peers);
        # a queue is dropped (what is held for it and its flows let go of it).
        self.interest_changed: Signal[[]] = Signal()
        self.queue_dropped: Signal[[QueueState]] = Signal()

    # -- checks -------------------------------------------------------------------------

    def check_open(self) -> None:
        """NodeClosed once the node is closed (each call checks; so does a caller that
        waits on its own, as a standby consumer does)."""
        if self.closed:
            raise NodeClosed("the node is closed")

    def check_room(self) -> None:
        """DiskFull unless the data directory's disk has the reserve free: below it the
        node takes no new messages (settlements, which keep the backlog from growing,
        go on), so a checkpoint and a restart always find the room they need. Reads the
        free space afresh at each call (a publish batch, not a message) while it is
        within :data:`FREE_MARGIN` of the reserve — so a disk filling up is refused at
        once and publishing resumes as soon as there is room — and at most every
        :data:`FREE_FRESH` seconds while it is far above (a statvfs lets go of the GIL,
        and the event loop waited to win it back at each publish: a tenth of its time
        at 10,000 publishes a second)."""
        reserve = self.settings.disk_reserve
        if not reserve:
            return
        free, at = self._free_seen
        now = time.monotonic()
        if free - reserve < FREE_MARGIN or now - at > FREE_FRESH:
            free = self.store.disk_free()
            self._free_seen = (free, now)
        if free < reserve:
            raise DiskFull(
                f"the disk holding {self.store.data_dir} has {free / (1 << 20):.1f} MiB "
                f"free, under the node's reserve of {reserve / (1 << 20):.0f} MiB: "
                "publishing resumes once more is free (or lower "
                "`eomsg config set disk-reserve`)"
            )

    def _queues_memory(self) -> int:
        """About the bytes the queues take: their cursors, and the messages journaled but
        not yet in DuckDB (read from the writer's memory meanwhile). Outside the node's
        lock: a copy of the queues (taken whole under the GIL) is summed, so a queue made
        or dropped meanwhile changes no dictionary under the sum."""
        queues = list(self.queues.values())
        return sum(q.cursor.nbytes for q in queues) + self.store.writer.behind

    def check_memory(self) -> None:
        """MemoryFull while the queues take more than their share of the node's memory:
        they cannot spill (every delivery would read back from disk), so the node holds
        producers back until consumers take the queues under it — a refusal a producer
        retries, never a node that runs out of memory. Read afresh at each call."""
        used, budget = self._queues_memory(), self.settings.queue_budget
        if used > budget:
            waiting = sum(q.cursor.depth for q in list(self.queues.values()))
            raise MemoryFull(
                f"the node's queues hold {waiting} messages in {format_bytes(used)} of "
                f"memory, over their share of {format_bytes(budget)}: publishing "
                "resumes as consumers take messages (or raise `eomsg serve --memory-limit`)"
            )

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            holder = self.links.elsewhere(name)
            if holder is not None:
                raise QueueNotFound(
                    f"queue {name!r} is on node {holder!r}, not this one: reach it through "
                    f"this node with --via {holder} (connect(..., via={holder!r}))"
                )
            raise QueueNotFound(
                f"queue {name!r} does not exist; create it with `eomsg queue create {name}`"
            )
        return q

    @staticmethod
    def check_epoch(q: QueueState, epoch: int) -> None:
        if epoch and epoch not in q.live_epochs:
            raise StaleEpoch(
                f"epoch {epoch} of queue {q.config.name!r} is over: that consumer is no longer "
                "active, and its messages go to the active one; do not apply them"
            )

    def totals(self) -> Totals:
        """Each queue's messages arrived and deleted, ever, and each link's
        (:meth:`Links.totals <eomsg.node.links.Links.totals>`): for rates. Under
        ``lock``."""
        totals = {
            name: (q.cursor.depth + sum(q.counts.values()), q.counts[Outcome.DELETED])
            for name, q in self.queues.items()
        }
        totals.update(self.links.totals())
        return totals

    def audit_entry(self, by: str, action: str, target: str, detail: str = "") -> AuditRow:
        """:func:`audit_row`, now."""
        return audit_row(self.clock(), by, action, target, detail)

    # -- writing ------------------------------------------------------------------------

    def queue_write(self, batch: RowBatch) -> Future[None] | None:
        """Hand ``batch`` to the writer if it holds anything (None if not). Call under
        ``lock``, so commits follow the order the state changed in, then wait with
        :meth:`await_commit` after releasing it."""
        return None if batch.empty else self.write(batch)

    def write_later(self, key: str, value: str) -> None:
        """Set ``node_meta``'s ``key`` with the next batch written, or at the next tick
        (within ``tick`` seconds) — for a record not worth a disk flush of its own: what
        a linked peer took, which it says again when it reconnects. Under ``lock``."""
        self.later[key] = value

    def write_now(self) -> None:
        """Write what waits to be written later, now (the ticker, before it compacts or
        collects the log). Under ``lock``."""
        if self.later:
            self.write(self._with_later(RowBatch()))

    def _with_later(self, batch: RowBatch) -> RowBatch:
        """``batch`` with what waits to be written later added (then no longer waiting).
        Under ``lock``."""
        for key, value in self.later.items():
            batch.set_meta(key, value)
        self.later.clear()
        return batch

    def write(self, batch: RowBatch) -> Future[None]:
        """Hand ``batch`` to the writer — what it records about messages held in memory
        kept with them instead (:mod:`eomsg.node.egress`), and what waited to be
        written later added to what is left; resolved at once if nothing is left to
        write (so a batch that only settles held messages costs no write). Under
        ``lock``."""
        batch = self.egress.divert(batch)
        if self.later and (not batch.empty or batch.callbacks):
            batch = self._with_later(batch)
        if batch.empty and not batch.callbacks:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        try:
            return self.store.writer.write(batch)
        except BaseException:
            self.egress.unwritten(batch)
            raise

    @staticmethod
    def await_commit(future: Future[None] | None) -> None:
        """Return once the commit :meth:`queue_write` queued is durable (at once if it
        queued none). Never under ``lock``: the writer's after-commit callbacks take
        it."""
        if future is not None:
            future.result()

    def record_settlements(
        self,
        batch: RowBatch,
        q: QueueState,
        settlements: list[Settlement],
        now: float,
        expiries: dict[int, float] | None = None,
    ) -> None:
        """Add settlement records (and dead-letter destinations) to ``batch``; the DLQ
        sees its new messages once the batch commits (``expiries``: theirs, when the
        caller knows them; else read from the store). Call with ``lock`` held."""
        if not settlements:
            return
        now_us = to_us(now)
        moved: list[int] = []
        dlq = self.queues.get(q.config.dead_letter) if q.config.dead_letter else None
        for s in settlements:
            batch.add("settled", q.id, s.seq, s.outcome, now_us)
            q.counts[s.outcome] += 1
            if s.outcome is Outcome.DEAD_LETTERED and dlq is not None:
                if dlq.cursor.holds(s.seq):  # subscribed to it too, or dead-lettered it
                    continue  # from another queue: it holds a message once
                batch.add("destinations", s.seq, dlq.id)
                # Not handed out by a run of the dead-letter queue's first deliveries
                # whose range it falls in (recovery reads them so).
                batch.add("delivery_runs", dlq.id, s.seq, s.seq, None)
                moved.append(s.seq)
        self.settled_since_compaction += len(settlements)
        if moved and dlq is not None:
            if expiries is None:
                expiries = self.egress.expiries(moved)
            # (kept from the moment a max-bytes is being set, before the cursor has them)
            sizes = self.egress.payload_sizes(moved) if dlq.staged_sizes is not None else {}
            target = dlq

            def to_dlq() -> None:
                with self.lock:
                    for seq in moved:
                        target.cursor.append(seq, expiries.get(seq), sizes.get(seq, 0), moved=True)
                self.notify({target.config.name})

            batch.after_commit(to_dlq)

    def record_releases(
        self, batch: RowBatch, q: QueueState, outcomes: list[Release | Settlement], now: float
    ) -> None:
        """Add releases (redeliveries, each with its due time) and settlements to
        ``batch``. Call with ``lock`` held."""
        settlements = []
        if any(isinstance(r, Release) for r in outcomes):
            # With the releases, the latest time one was recorded at: a restart whose
            # wall clock was set back since moves their due times back as far (Node.
            # _recover), or a message given back at once would wait out the jump.
            # (Written with what is left of the batch once rows about messages held in
            # memory are kept with them: a batch of only those costs no write.)
            self._released_at = max(self._released_at, now)
            self.write_later(RELEASED_AT, repr(self._released_at))
        for r in outcomes:
            if isinstance(r, Release) and r.unseen:
                batch.add("returned", q.id, r.seq, r.attempt + 1, to_us(now))
            elif isinstance(r, Release):
                batch.add("deliveries", q.id, r.seq, r.attempt, to_us(r.due), True)
            else:
                settlements.append(r)
        self.record_settlements(batch, q, settlements, now)

    # -- queues and readiness -------------------------------------------------------------

    def install(self, queue_id: int, config: QueueConfig) -> QueueState:
        """Make queue ``config`` live in memory (its commit is durable). Under ``lock``
        (or while nothing else runs: at recovery)."""
        q = QueueState(queue_id, config, self.elections.epochs)
        self.queues[config.name] = q
        self.queues_by_id[queue_id] = q
        for pattern in config.subscriptions:
            self.matcher.add(pattern, q)
        self.routes.clear()
        self.interest_changed.emit()
        self._queues_changed()
        return q

    def reconfigure_queue(self, q: QueueState, config: QueueConfig) -> None:
        """Queue ``q`` takes ``config`` (its commit is durable): its subscriptions routed
        anew. Under ``lock``."""
        for pattern in q.config.subscriptions:
            self.matcher.remove(pattern, q)
        for pattern in config.subscriptions:
            self.matcher.add(pattern, q)
        self.routes.clear()
        q.config = config
        self.interest_changed.emit()
        self._queues_changed()

    def uninstall(self, q: QueueState) -> None:
        """Queue ``q`` is dropped (its commit is durable): out of the routes and the
        queues, then :attr:`queue_dropped` emitted (what is held in memory for it, its
        flows). Under ``lock``."""
        for pattern in q.config.subscriptions:
            self.matcher.remove(pattern, q)
        self.routes.clear()
        del self.queues[q.config.name], self.queues_by_id[q.id]
        self.interest_changed.emit()
        self._queues_changed()
        self.queue_dropped.emit(q)

    def _queues_changed(self) -> None:
        """A queue was made, changed or dropped: note whether any has a max-messages or
        a max-bytes, so that a publish looks at limits only then. Under ``lock``."""
        self.limited = any(q.config.limited for q in self.queues.values())

    def notify(self, queues: set[str]) -> None:
        """Messages became ready in ``queues``: wake the waiting fetches and tell the
        listeners. Never under ``lock``."""
        with self.ready:
            self.ready_generation += 1
            self.ready.notify_all()
        for callback in self._listeners:
            for name in queues:
                callback(name)
