"""One eomsg node: the core's rules wired to the store. Thread-safe; the CLI uses it
in-process (embedded mode) and the broker daemon will serve it over the wire.

:class:`Node` is assembled from one module per concern, over the shared state of
:mod:`eomsg.node.state`, whose docstring is the lock discipline they all follow. Most are
components — objects of their own, attributes of the node, each owning its state and
naming what it needs of the rest (a ``Kernel`` protocol): ``ingress`` (publishing and
routing, seed 004, with the queues' limits), ``egress`` (messages held in memory, seed
004), ``access`` (principals, grants, the audit log), ``elections`` (module ``flows``:
bound consumers and their election, seed 002), ``inspection`` (stats, the log, replay
reads), ``participant`` (transactions, seed 000), ``admin`` (queues and saved settings),
``delivery`` (the cursors' deliveries, seed 003), ``maintenance`` (timeouts, expiry,
compaction, garbage collection), and for other nodes ``links`` (their settings, interest
and routes), ``transfer`` (a link's connection and what it sends) and ``intake`` (what a
link receives). The node's one base is the shared state; what one component must hear of
another it hears by a subscription the node makes here (:mod:`eomsg.node.events`).
This module holds the node's life: assembling it, opening and recovering its state from
the store, the maintenance ticker, listeners, and closing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from eomsg.core import memory
from eomsg.core.cursor import Outcome
from eomsg.core.nodeinfo import NodeInfo
from eomsg.core.operations import OPERATIONS
from eomsg.errors import DiskFull, EomsgError, NodeClosed
from eomsg.node.access import Access
from eomsg.node.admin import Admin
from eomsg.node.dedup import Deduplication
from eomsg.node.delivery import Delivery
from eomsg.node.egress import Egress
from eomsg.node.flows import Elections
from eomsg.node.ingress import Ingress
from eomsg.node.inspection import Inspection
from eomsg.node.intake import Intake
from eomsg.node.links import Links
from eomsg.node.maintenance import Maintenance
from eomsg.node.participant import Participant
from eomsg.node.settings import SETTINGS, NodeSettings, apply_saved
from eomsg.node.state import RELEASED_AT, Clock, NodeState, QueueState, to_us
from eomsg.node.transfer import Transfer
from eomsg.store.schema import SCHEMA_VERSION
from eomsg.store.store import US, MiB, SettledCounts, Store, UnreadRun
from eomsg.store.store import room_to_open as room_to_open  # the server waits on it too

__all__ = ["SETTINGS", "Node", "NodeSettings"]

log = logging.getLogger("eomsg.node")


def steady_clock() -> Clock:
    """Seconds since the epoch that move only as the monotonic clock does: the wall
    clock read once, then carried forward by ``time.monotonic``. A jump of the system's
    clock — NTP stepping it, a person setting it, ±1 h — then moves nothing the node
    times (ack deadlines, redelivery delays, expiry, hold and resend timers), where the
    wall clock would hold a consumer's messages an hour or time them all out at once.
    What the node records (``published_at``) drifts from the wall clock only by such a
    jump, until the next start reads it again."""
    wall, mono = time.time(), time.monotonic()
    return lambda: wall + (time.monotonic() - mono)


class Node(NodeState):
    """A node over one data directory. Use :meth:`open`, and close it (or use ``with``).

    Its components — objects of their own, each owning its state — are attributes named
    in :data:`COMPONENTS`; a declared operation (:mod:`eomsg.core.operations`) runs as
    the method of its name on the component that has one, else on the node
    (:meth:`operation`)."""

    COMPONENTS: ClassVar[dict[str, type]] = {
        "ingress": Ingress,
        "egress": Egress,
        "access": Access,
        "elections": Elections,
        "inspection": Inspection,
        "participant": Participant,
        "admin": Admin,
        "delivery": Delivery,
        "maintenance": Maintenance,
        "links": Links,
        "transfer": Transfer,
        "intake": Intake,
    }

    def __init__(self, store: Store, settings: NodeSettings, clock: Clock) -> None:
        super().__init__(store, settings, clock)
        store.writer.recent.limit = memory.recent_limit(self.settings.memory_limit)
        self.ingress = Ingress(self)
        self.egress = Egress(self)
        self.elections = Elections(self)
        self.inspection = Inspection(self)
        self.participant = Participant(self)
        self.admin = Admin(self)
        self.delivery = Delivery(self)
        self.maintenance = Maintenance(self)
        self.access = Access(store, clock, self.lock, self.admin_lock, self.check_open)
        self.links = Links(self)
        self.transfer = Transfer(self)
        self.intake = Intake(self)
        # Who hears what (each signal's owner says when it is emitted):
        self.interest_changed.subscribe(self.links.interest_changed)
        self.queue_dropped.subscribe(self.egress.queue_dropped)
        self.queue_dropped.subscribe(self.elections.queue_dropped)
        self.ingress.committed.subscribe(self.transfer.forward)
        self.egress.done.subscribe(self.intake.held_done)
        self._operations = self._bind_operations()
        self._opened = (clock(), time.monotonic())  # when, on the wall and steady clocks
        self.served: tuple[tuple[str, ...], int] = ((), 0)  # see served_on
        self._recover()
        self.node_name = self.links.node_name  # who this node is, to its peers
        self.incarnation = self.links.incarnation  # which data directory it runs on
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
        clock: Clock | None = None,
        *,
        create: bool = True,
    ) -> Node:
        """Open the data directory (creating it unless ``create`` is False) and rebuild
        the in-memory state from it. ``clock``: the node's time (default
        :func:`steady_clock`)."""
        clock = clock or steady_clock()
        settings = settings or NodeSettings()
        store = Store(
            Path(data_dir),
            create=create,
            wal_limit=settings.wal_limit,
            journal_segment=settings.journal_segment,
            apply_delay=settings.apply_delay,
            memory_limit=lambda saved: _duckdb_limit(apply_saved(settings, dict(saved))),
        )
        try:
            return cls(store, settings, clock)
        except BaseException:
            store.abandon()  # a failed open changes nothing
            raise

    @classmethod
    def open_when_room(
        cls,
        data_dir: Path | str,
        settings: NodeSettings | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> Node | None:
        """:meth:`open`, waiting while the disk holding the data directory has no room
        for it (DiskFull), and saying so once per change in the log — what ``eomsg
        serve`` does at start, as it does when its store fails and is reopened, rather
        than stopping on a full disk. None if ``stopping()`` turns true meanwhile."""
        wait, said = 0.5, ""
        while not stopping():
            try:
                return cls.open(data_dir, settings)
            except DiskFull:
                free, need = room_to_open(Path(data_dir))
                why = (
                    f"waiting for disk space to open the store: {free / MiB:.1f} MiB free on "
                    f"the disk holding {data_dir}, about {need / MiB:.1f} MiB needed (free "
                    "some; the node starts by itself)"
                )
                if why != said:
                    log.warning("%s", why)
                    said = why
            time.sleep(wait)
            wait = min(wait * 2, 5.0)
        return None

    def close(self) -> None:
        """Run a last maintenance pass, finish queued writes and release the data dir."""
        if self.closed:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        try:
            if not self.store.writer.failed:
                with self.lock:  # what is held in memory is stored: nothing comes twice
                    self.intake.write_held(self.clock(), every=True)
                self.maintenance.maintain()
        finally:
            self.closed = True
            self.store.close()

    @classmethod
    def implementation(cls, name: str) -> tuple[str | None, Callable[..., Any]]:
        """Where the operation ``name`` runs: the component (its attribute name; None:
        the node itself) and the function. AttributeError if nothing implements it."""
        for attribute, component in cls.COMPONENTS.items():
            if callable(function := getattr(component, name, None)):
                return attribute, function
        return None, getattr(cls, name)

    def operation(self, name: str) -> Callable[..., Any]:
        """The bound method that runs the declared operation ``name`` (see
        :meth:`implementation`): what the server and the embedded client call, looked
        up in a table the node builds once. KeyError if ``name`` is not declared."""
        return self._operations[name]

    def _bind_operations(self) -> dict[str, Callable[..., Any]]:
        """Each declared operation's bound method (see :meth:`implementation`)."""
        table = {}
        for name in OPERATIONS:
            attribute, _ = self.implementation(name)
            table[name] = getattr(self if attribute is None else getattr(self, attribute), name)
        return table

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
            self.install(queue_id, config)
        self.next_seq = store.last_seq() + 1
        self.durable_seq = self.next_seq - 1
        self.links.load(self.settings.node_name)
        self._restore_pending(store, now)
        for queue in self.queues.values():  # a max-bytes is held against what it holds
            if queue.cursor.sized:
                queue.cursor.track_sizes(store.queue_payload_sizes(queue.id))
        for queue_id, size in store.payload_sizes().items():  # bounds what a take reads
            if (q := self.queues_by_id.get(queue_id)) is not None:
                q.note_payload(size)
        budget = self.settings.dedup_budget
        self.dedup = Deduplication.load(store, to_us(now), budget, self.lock)
        for queue_id, counts in store.load_counts().items():
            if (q := self.queues_by_id.get(queue_id)) is not None:
                self._add_counts(q, counts)
        self.settled_since_compaction = store.settled_rows()
        self.links.restore_pending(store.load_route_runs())  # counts what they settled
        self.participant.recover()
        self.access.load()
        self.maintenance.recover(now)

    def _restore_pending(self, store: Store, now: float) -> None:
        """The queues' pending messages into their cursors: those handed out before
        restored one by one, the others (most of a backlog) appended a run at a time."""
        # Given back before the restart, due at a time of the clock it ran on: if the
        # wall clock was set back since (NTP stepping it, a person setting it), move
        # those times back as far, so none waits longer than its delay from now — or a
        # message given back at once would wait out the jump. Never later, at worst
        # sooner: a clock set ahead, or a release recorded behind the latest (a clock
        # set back, twice restarted), makes a delayed one due early.
        self._released_at = float(store.meta(RELEASED_AT) or 0.0)
        behind = max(0.0, self._released_at - now)
        unread: dict[int, tuple[list[int], list[float | None]]] = {}
        for row in store.load_pending():
            q = self.queues_by_id.get(row.queue_id)
            if q is None:
                continue
            if isinstance(row, UnreadRun):
                seqs, expiries = unread.setdefault(row.queue_id, ([], []))
                seqs.extend(row.seqs)
                if row.expires_us.count(None) == len(row.expires_us):
                    expiries.extend([None] * len(row.expires_us))
                else:
                    expiries.extend(None if e is None else e / US for e in row.expires_us)
            else:
                expires = None if row.expires_us is None else row.expires_us / US
                # In flight when the node stopped: its consumer's session died with the
                # node, so its deadline is now — it times out at the first poll (ready
                # again in seq order, or dead-lettered if that was its last attempt), not
                # after an ack timeout that nobody can honour any more.
                assert row.attempt is not None and row.due_us is not None
                due = row.due_us / US - behind if row.released else min(now, row.due_us / US)
                q.cursor.restore(row.seq, row.attempt, due, not row.released, expires)
        for queue_id, (seqs, expiries) in unread.items():  # after restore: read_seq known
            self.queues_by_id[queue_id].cursor.extend(seqs, expiries)

    @staticmethod
    def _add_counts(q: QueueState, counts: SettledCounts) -> None:
        q.counts[Outcome.DELETED] += counts.deleted
        q.counts[Outcome.EXPIRED] += counts.expired
        q.counts[Outcome.DEAD_LETTERED] += counts.dead_lettered
        q.counts[Outcome.PURGED] += counts.purged

    # -- maintenance ticker -----------------------------------------------------------------

    def _tick(self) -> None:
        tick = self.settings.tick
        assert tick is not None
        while not self._stop.wait(tick):
            try:
                self.maintenance.maintain()
            except NodeClosed:
                return
            except EomsgError as e:
                if self.failed is not None:
                    return  # the store must be reopened: its listeners were told
                log.warning("maintenance failed, tried again in %g s: %s", tick, e)

    # -- identity -----------------------------------------------------------------------

    def served_on(self, addresses: list[str], protocol_version: int) -> None:
        """Told by the daemon serving the node: its addresses and the wire protocol's
        version, for :meth:`node_info` (the node itself speaks no wire)."""
        self.served = (tuple(addresses), protocol_version)

    def node_info(self) -> NodeInfo:
        """Who the node is and how it stands (:mod:`eomsg.core.nodeinfo`). Reads the disk's
        free space afresh."""
        self.check_open()
        links = self.links.link_info()
        with self.lock:
            queues = len(self.queues)
            in_doubt = self.participant.in_doubt()
        return NodeInfo(
            name=self.node_name,
            version=_version(),
            pid=os.getpid(),
            started_at=self._opened[0],
            uptime=time.monotonic() - self._opened[1],
            data_dir=str(self.store.data_dir.resolve()),
            listening=self.served[0],
            schema_version=SCHEMA_VERSION,
            protocol_version=self.served[1],
            queues=queues,
            links=len(links),
            links_up=sum(i.connected for i in links),
            in_doubt=in_doubt,
            disk_free=self.store.disk_free(),
            disk_reserve=self.settings.disk_reserve,
        )

    # -- watching -----------------------------------------------------------------------

    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(queue)`` whenever messages become ready in a queue (published,
        released, dead-lettered into it). It runs on whichever thread made them ready,
        so it must be quick and must not call the node; redeliveries that come due by
        time are not announced — poll for those."""
        self._listeners = [*self._listeners, callback]  # replaced, never changed: see _notify

    def remove_listener(self, callback: Callable[[str], None]) -> None:
        """Stop calling ``callback`` (see :meth:`add_listener`); nothing if it was not
        listening."""
        self._listeners = [c for c in self._listeners if c is not callback]

    def add_failure_listener(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(cause)`` once, on one of the writer's threads, if the store stops
        taking writes (a commit failed): the node must then be closed and opened again,
        which rebuilds its state from what the disk holds."""
        self.store.failure_listeners.append(callback)

    @property
    def failed(self) -> BaseException | None:
        """Why the store stopped taking writes, if it did."""
        return self.store.writer.failure


@functools.cache
def _version() -> str:
    return importlib.metadata.version("eomsg")


def _duckdb_limit(settings: NodeSettings) -> int:
    return memory.duckdb_limit(settings.memory_limit, settings.limits.max_payload)
