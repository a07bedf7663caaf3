"""The node as a transaction participant (seed 000): the log and the cursors take part in
the application's distributed transaction. A prepare makes the transaction's messages
and held deliveries durable without applying them; the commit publishes the messages and
deletes what was held, the abort drops the messages and gives the deliveries back.
:meth:`Participant.transact` is the one-phase commit of a transaction whose only
participant is this node.

:class:`Participant` is a component of the node (``node.participant``): it owns the
prepared transactions and those decided (remembered for retries). A committed
transaction's messages enter the log as a publish does — what it needs of the node's
ingress and state is the :class:`Kernel` protocol (``ingress.stage``, ``ingress.write_staged``,
…).
Under the lock discipline of :mod:`eomsg.node.state`: every step changes the state and
queues its records under the node's ``lock``, and waits for the commit after releasing
it.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from typing import Protocol

from eomsg.core import access
from eomsg.core.access import OWNER
from eomsg.core.cursor import Outcome, Settlement
from eomsg.core.message import Key, Outgoing, PublishResult
from eomsg.core.operations import TxnDelete
from eomsg.core.text import is_text
from eomsg.core.txn import TxnInfo, TxnMove, TxnState, check_txid, move
from eomsg.errors import InvalidConfig, InvalidInput, TxnConflict, TxnNotFound
from eomsg.failpoints import failpoint
from eomsg.node.access import Access
from eomsg.node.ingress import Ingress
from eomsg.node.state import PreparedTxn, QueueState, Shared, to_us
from eomsg.store.store import US
from eomsg.store.writer import RowBatch


class Kernel(Shared, Protocol):
    """What the participant needs of the rest of the node: its state
    (:class:`~eomsg.node.state.NodeState`) and ingress (:mod:`eomsg.node.ingress`)."""

    access: Access
    ingress: Ingress
    next_seq: int
    queues_by_id: dict[int, QueueState]


class Participant:
    """Two-phase commit: prepare, commit, abort; and the one-phase :meth:`transact`."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._txns: dict[str, PreparedTxn] = {}  # prepared, undecided
        self._finished: dict[str, TxnState] = {}  # decided, remembered for retries

    def recover(self) -> None:
        """At open (nothing else runs): the transactions the store remembers decided, and
        those prepared and undecided, each holding again the deliveries it deletes."""
        store = self._kernel.store
        self._finished = {txid: TxnState(s) for txid, s in store.finished_txns().items()}
        for prep in store.load_prepared(set(self._finished)):
            held: dict[QueueState, list[int]] = {}
            for queue_id, seq in prep.deletes:
                q = self._kernel.queues_by_id.get(queue_id)
                if q is not None and q.cursor.has_delivered(seq):
                    held.setdefault(q, []).append(seq)
            for q, seqs in held.items():
                q.cursor.hold_many(seqs)
            self._txns[prep.txid] = PreparedTxn(
                prep.txid,
                prep.coordinator,
                prep.prepared_us / US,
                prep.messages,
                held,
                None,
                prep.principal,
            )

    def forget(self, remembered: Container[str]) -> None:
        """Decided transactions no longer remembered by the store (collected) are
        forgotten here too. Under the node's ``lock``."""
        self._finished = {t: s for t, s in self._finished.items() if t in remembered}

    def in_doubt(self) -> int:
        """Prepared transactions no connection owns: their coordinator must decide."""
        return sum(t.owner is None for t in list(self._txns.values()))

    def prepare_txn(
        self,
        txid: str,
        *,
        coordinator: str,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[TxnDelete] = (),
        owner: str | None = "",
        holder: int = 0,
        by: str = OWNER,
    ) -> None:
        """Vote yes for transaction ``txid``: make its work durable without applying it,
        and return once it is. ``messages`` will be published (invisible until the
        commit); ``deletes`` — ``(queue, seq, epoch, attempt)`` of deliveries in flight
        to ``holder`` — are held for the transaction: no timeout, no redelivery, no
        delete or release by anyone but its outcome. A delivery that is over
        (StaleDelivery) makes the node vote no, so the transaction aborts cleanly; so
        does a queue its messages would fill past a max-messages it refuses beyond
        (QueueFull: its commit takes them in even past it).
        ``coordinator`` says where the outcome will be recorded, for recovery; ``by`` is
        the principal preparing it, the one that may settle it. Atomic:
        on any error nothing is held or recorded.
        Idempotent: preparing a prepared transaction again does nothing."""
        check_txid(txid)
        if not is_text(coordinator):
            raise InvalidConfig("the coordinator descriptor is not UTF-8 text")
        if len(coordinator) > 1024:
            raise InvalidConfig("the coordinator descriptor is longer than 1024 characters")
        self._kernel.ingress.check_messages(messages)
        now = self._kernel.clock()
        batch = RowBatch()
        with self._kernel.lock:
            self._kernel.check_open()
            if txid in self._txns:
                if (self._txns[txid].principal or OWNER) != by:
                    raise TxnConflict(
                        f"transaction {txid!r} is prepared already, by another principal: "
                        "choose another id"
                    )
                return
            if txid in self._finished:
                move("participant", self._finished[txid], TxnMove.PREPARE, txid)
            by_queue = self._check_deletes(deletes, holder)
            self._kernel.ingress.check_queue_room(messages, now)
            held = {q: [s for s, _, _ in items] for q, items in by_queue.items()}
            for q, seqs in held.items():
                q.cursor.hold_many(seqs)
            batch.add("txn_log", txid, TxnState.PREPARED.value, to_us(now), coordinator, by)
            for i, m in enumerate(messages):
                batch.add("txn_messages", txid, i, m.topic, m.id, m.ttl, m.log_headers, m.payload)
            for q, seqs in held.items():
                for seq in seqs:
                    batch.add("txn_deletes", txid, q.id, seq)
            self._txns[txid] = PreparedTxn(txid, coordinator, now, list(messages), held, owner, by)
            failpoint("txn.prepare.before_commit")
            committed = self._kernel.write(batch)
        committed.result()
        failpoint("txn.prepare.after_commit")

    def commit_txn(self, txid: str, *, by: str = OWNER) -> list[PublishResult]:
        """Apply prepared transaction ``txid`` atomically: its messages enter the log (in
        order, with seqs from now) and its held messages are deleted. Returns once
        durable, with the publish results. Idempotent: committing a committed
        transaction returns ``[]``; TxnConflict if it was aborted, TxnNotFound if it was
        never prepared here (or finished long ago). NotAllowed unless ``by`` prepared
        it or administers the node."""
        now = self._kernel.clock()
        batch = RowBatch()
        with self._kernel.lock:
            self._kernel.check_open()
            t = self._txns.get(txid)
            if t is None:
                move("participant", self._decided(txid), TxnMove.COMMIT, txid)
                return []
            self._kernel.access.policy.check_settle(by, t.principal, txid)
            self._audit_settle(batch, by, t, "commit-txn")
            first_seq = self._kernel.next_seq
            results, fresh = self._kernel.ingress.stage(batch, t.messages, now, refuse=False)
            for q, seqs in t.deletes.items():
                if (
                    self._kernel.queues_by_id.get(q.id) is q
                ):  # the queue may have been deleted since
                    self._record_deleted(batch, q, seqs, q.cursor.delete_held(seqs), now)
            batch.add(
                "txn_log", txid, TxnState.COMMITTED.value, to_us(now), t.coordinator, t.principal
            )
            del self._txns[txid]
            self._finished[txid] = TxnState.COMMITTED
            failpoint("txn.commit.before_commit")
            committed = self._kernel.ingress.write_staged(batch, first_seq, fresh)
        committed.result()
        failpoint("txn.commit.after_commit")
        return results

    def abort_txn(self, txid: str, *, force: bool = False, by: str = OWNER) -> bool:
        """Drop prepared transaction ``txid``: its messages are never published and the
        messages it held are ready again at once. Idempotent; under presumed abort a
        transaction never prepared here is aborted already (False). ``force`` marks a
        person's heuristic decision, reported to a coordinator that later says commit.
        TxnConflict if it committed. True if this call aborted it. NotAllowed unless
        ``by`` prepared it or administers the node."""
        now = self._kernel.clock()
        how = TxnMove.FORCE_ABORT if force else TxnMove.ABORT
        batch = RowBatch()
        with self._kernel.lock:
            self._kernel.check_open()
            t = self._txns.get(txid)
            if t is None:
                if txid in self._finished:
                    move("participant", self._finished[txid], how, txid)
                return False
            self._kernel.access.policy.check_settle(by, t.principal, txid)
            state = move("participant", TxnState.PREPARED, how, txid)
            for q, seqs in t.deletes.items():
                if self._kernel.queues_by_id.get(q.id) is q:
                    self._kernel.record_releases(batch, q, q.cursor.unhold_many(seqs, now), now)
            batch.add("txn_log", txid, state.value, to_us(now), t.coordinator, t.principal)
            if force:  # a person's decision against the coordinator's: on the record
                batch.add(
                    "audit", *self._kernel.audit_entry(by, "force-abort", txid, t.coordinator)
                )
            else:
                self._audit_settle(batch, by, t, "abort-txn")
            del self._txns[txid]
            self._finished[txid] = state
            failpoint("txn.abort.before_commit")
            committed = self._kernel.write(batch)
        committed.result()
        self._kernel.notify({q.config.name for q in t.deletes})
        return True

    def _audit_settle(self, batch: RowBatch, by: str, t: PreparedTxn, action: str) -> None:
        """An administrator settling another principal's transaction: on the record."""
        prepared_by = t.principal or OWNER
        if by != prepared_by:
            batch.add(
                "audit", *self._kernel.audit_entry(by, action, t.txid, f"prepared by {prepared_by}")
            )

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
        self._kernel.ingress.check_messages(messages)
        now = self._kernel.clock()
        batch = RowBatch()
        with self._kernel.lock:
            self._kernel.check_open()
            by_queue = self._check_deletes(deletes, holder)
            first_seq = self._kernel.next_seq
            results, fresh = self._kernel.ingress.stage(batch, messages, now)
            for q, items in by_queue.items():
                for epoch, keys in _by_epoch(items):
                    done = q.cursor.delete_many(keys, epoch, holder)
                    self._record_deleted(batch, q, [s for s, _ in keys], done, now)
            committed = (
                self._kernel.ingress.write_staged(batch, first_seq, fresh)
                if not batch.empty
                else None
            )
        self._kernel.await_commit(committed)
        return results

    def txns(self, *, by: str = OWNER) -> list[TxnInfo]:
        """The prepared transactions, oldest first; ``connected`` False means their
        coordinator is gone and `eomsg recover` may resolve them. Those ``by`` prepared,
        unless it may inspect the node: a coordinator recovering its own in-doubt
        transactions needs no more than the rights it used for them."""
        every = self._kernel.access.policy.allows(by, access.INSPECTS_NODE)
        with self._kernel.lock:
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
                if every or (t.principal or OWNER) == by
            ]

    def disown_txns(self, owner: str) -> int:
        """The coordinator session ``owner`` went away: its prepared transactions are in
        doubt from now on (they wait for recovery). Returns how many."""
        with self._kernel.lock:
            mine = [t for t in self._txns.values() if t.owner == owner]
            for t in mine:
                t.owner = None
            return len(mine)

    def _check_deletes(
        self, deletes: Sequence[TxnDelete], holder: int
    ) -> dict[QueueState, list[tuple[int, int, int]]]:
        """``(queue, seq, epoch, attempt)`` deletes as ``(seq, attempt, epoch)`` grouped
        by queue, each checked in flight to ``holder`` under its epoch and attempt — all
        of them before the caller changes anything. Under ``lock``."""
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
            by_queue.setdefault(self._kernel.queue(queue), []).append((seq, attempt, epoch))
        for q, items in by_queue.items():
            for epoch, keys in _by_epoch(items):
                self._kernel.check_epoch(q, epoch)
                q.cursor.check_in_flight(keys, epoch, holder)
        return by_queue

    def _record_deleted(
        self, batch: RowBatch, q: QueueState, seqs: list[int], done: list[bool], now: float
    ) -> None:
        """Record as deleted those of ``seqs`` whose delete ``done`` says happened now (a
        held delivery at commit, or one of :meth:`transact`'s). Under ``lock``."""
        settled = [Settlement(s, Outcome.DELETED) for s, d in zip(seqs, done, strict=True) if d]
        self._kernel.record_settlements(batch, q, settled, now)

    def _decided(self, txid: str) -> TxnState:
        state = self._finished.get(txid)
        if state is None:
            raise TxnNotFound(
                f"transaction {txid} is not prepared on this node (never prepared, or "
                "finished too long ago to remember)"
            )
        return state


def _by_epoch(items: list[tuple[int, int, int]]) -> Iterator[tuple[int, list[Key]]]:
    """``(seq, attempt, epoch)`` items as each epoch and the ``(seq, attempt)`` keys under it."""
    for epoch in {e for _, _, e in items}:
        yield epoch, [(s, a) for s, a, e in items if e == epoch]
