"""Flows and election wiring (seed 002): a queue elects which of its bound consumers
(flows) are active, and tells each one when that changes. The election itself is
:class:`~eomsg.core.election.Election`; here a bind or an unbind runs it and its changes
are carried out: an active flow's epoch is accepted, a deactivated one's deliveries are
made ready again for the next active flow.

:class:`Elections` is a component of the node (``node.elections``): it owns the flows, the
epochs handed out and how far they are reserved, and the ``elect`` lock; what it needs of
the rest of the node is :class:`~eomsg.node.state.Shared`. Under the lock discipline of
:mod:`eomsg.node.state`: a bind or an unbind takes ``elect`` (it may wait for epochs to be
reserved), then the node's ``lock`` to run the election and apply its changes; a flow's
``notify`` hears of them under ``lock``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

from eomsg.core.access import OWNER
from eomsg.core.election import Change, Epochs, FlowEvent, FlowInfo
from eomsg.core.message import Key, check_keys
from eomsg.errors import FlowNotFound, InvalidConfig
from eomsg.node.state import AuditRow, FlowState, Notify, QueueState, Shared
from eomsg.store.writer import RowBatch

EPOCH_BLOCK = 1024  # epochs reserved durably at a time, so activations rarely wait


class Elections:
    """Consumers bound to the node's queues: bind, unbind, and the election they run."""

    def __init__(self, kernel: Shared) -> None:
        self._kernel = kernel
        self.elect = threading.Lock()  # serialises election stimuli (they may wait)
        self.epochs = Epochs(int(kernel.store.meta("epochs_reserved") or 0))
        self._epochs_reserved = self.epochs.last
        self._flows: dict[int, FlowState] = {}
        self._flow_ids = itertools.count(1)

    def flow(self, q: QueueState, flow: int) -> FlowState:
        """Flow ``flow`` of queue ``q``; FlowNotFound if no such flow is bound to it."""
        f = self._flows.get(flow)
        if f is None or f.queue is not q:
            raise FlowNotFound(
                f"no flow {flow} is bound to queue {q.config.name!r}; see "
                f"`eomsg inspect flows {q.config.name}`"
            )
        return f

    def queue_dropped(self, q: QueueState) -> None:
        """Queue ``q`` is deleted: its flows are gone, each told ``unbound``. Under the
        node's ``lock``."""
        for v in q.election.flows():
            f = self._flows.pop(v.flow)
            if f.notify is not None:
                f.notify(FlowEvent(q.config.name, v.flow, "unbound", False, 0))

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
        with self._election(queue) as (q, now):
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
        self,
        queue: str,
        flow: int,
        *,
        admin: bool = False,
        seen: Iterable[Key] | None = None,
        by: str = OWNER,
    ) -> int:
        """Unbind a flow — its consumer asked, went away, or fell silent; or, with
        ``admin``, an administrator did (its consumer is told ``unbound``) — and run the
        election. Whatever it held in flight is redelivered, in order, to the active
        flows. With ``seen`` — a consumer that unbinds says which of its deliveries it
        handed to its application — the others are un-counted (they sat in its prefetch
        buffer). Returns how many messages were redelivered. An administrator's unbind
        is in the audit log, ``by`` whom."""
        seen_keys = None if seen is None else set(check_keys(seen))
        with self._election(queue) as (q, now):
            f = self.flow(q, flow)
            epoch = q.election.epoch_of(flow)
            held = q.cursor.in_flight_by_epoch().get(epoch, 0) if epoch else 0
            changes = q.election.unbind(flow)
            audit = (
                self._kernel.audit_entry(by, "unbind", queue, f"flow {flow} ({f.owner})")
                if admin
                else None
            )
            seen_by = None if seen_keys is None else {epoch: seen_keys}
            future = self._apply(q, changes, now, seen_by, audit)
            del self._flows[flow]
            if admin and f.notify is not None:
                f.notify(FlowEvent(queue, flow, "unbound", False, 0))
        self._settle_apply(q, future)
        return held

    def flows(self, queue: str | None = None) -> list[FlowInfo]:
        """The flows bound to ``queue`` (or to every queue), best-ranked first."""
        with self._kernel.lock:
            queues = (
                [self._kernel.queue(queue)]
                if queue is not None
                else list(self._kernel.queues.values())
            )
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

    @contextmanager
    def _election(self, queue: str) -> Iterator[tuple[QueueState, float]]:
        """Hold what an election stimulus (a bind, an unbind) needs: ``elect``, with the
        epochs the election may hand out reserved, then ``lock``; yields ``queue`` and
        the time."""
        with self.elect:
            self._kernel.check_open()
            self._reserve_epochs(queue)
            now = self._kernel.clock()
            with self._kernel.lock:
                yield self._kernel.queue(queue), now

    def _reserve_epochs(self, queue: str) -> None:
        """Make sure the epochs the next election may hand out are durably reserved, so
        that none is ever reused after a crash. Call with ``elect`` held."""
        with self._kernel.lock:
            bound = len(self._kernel.queue(queue).election)
        need = self.epochs.last + bound + 1
        if need > self._epochs_reserved:
            reserved = need + EPOCH_BLOCK
            batch = RowBatch()
            batch.set_meta("epochs_reserved", str(reserved))
            self._kernel.store.writer.write(batch).result()  # journaled: no wait for DuckDB
            self._epochs_reserved = reserved

    def _apply(
        self,
        q: QueueState,
        changes: list[Change],
        now: float,
        seen: dict[int, set[Key]] | None = None,
        audit: AuditRow | None = None,
    ) -> Future[None] | None:
        """Carry out an election's changes, in order, under ``lock``: a deactivated
        flow's epoch stops being accepted and what it held in flight is made ready again
        (lowest seq first, for the next active flow) — un-counted where ``seen`` lists
        what that epoch's consumer handed to its application, and the rest is not in
        it; every flow hears of its change. ``audit``: the record of an administrator's
        change, written with them."""
        batch = RowBatch()
        if audit is not None:
            batch.add("audit", *audit)
        for c in changes:
            if c.active:
                q.live_epochs.add(c.epoch)
            else:
                q.live_epochs.discard(c.epoch)
                given_back = q.cursor.release_epoch(c.epoch, now, (seen or {}).get(c.epoch))
                self._kernel.record_releases(batch, q, given_back, now)
            f = self._flows.get(c.flow)
            if f is not None and f.notify is not None:
                kind = "active" if c.active else "inactive"
                f.notify(FlowEvent(q.config.name, c.flow, kind, c.active, c.epoch))
        return self._kernel.queue_write(batch)

    def _settle_apply(self, q: QueueState, future: Future[None] | None) -> None:
        if future is not None:  # something was settled: the next flow may take it
            future.result()
            self._kernel.notify({q.config.name})
