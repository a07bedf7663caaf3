"""The transaction coordinator (seed 000): publish, delete and change the application's
database atomically.

::

    with client.transaction(resources=[eomsg.DuckDBResource(app)]) as tx:
        tx.resource(app).execute("UPDATE stock …")
        tx.publish("orders/eu/shipped", payload)
        tx.delete(msg)

How it commits, by what the transaction holds:

- node work and a commit-markable resource (DuckDB, SQLite) — two-phase commit, presumed
  abort: the node prepares (publishes invisible, deleted messages held), the COMMIT
  marker commits inside the application's transaction (the commit point), then the node
  applies the outcome;
- node work and PostgreSQL — the node prepares, then PostgreSQL (``PREPARE
  TRANSACTION``); the COMMIT marker commits in a transaction of its own (the commit
  point); then ``COMMIT PREPARED``, then the node;
- node work only — one atomic call to the node (one-phase);
- application work only — the application's own commit.

A crash anywhere leaves the node's part (and PostgreSQL's) prepared at worst; recovery —
the next transaction on the same database, or ``eomsg recover`` — commits it if the
marker is there and aborts it otherwise. The coordinator's state moves follow
:data:`eomsg.core.txn.COORDINATOR`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

from eomsg.client.recovery import Participant, Step, execute, plan, settle
from eomsg.client.resources import MarkerTable, Resource
from eomsg.core.durations import ttl_seconds
from eomsg.core.message import Delivered, Outgoing, PublishResult
from eomsg.core.txn import DEFAULT_TIMEOUT, TxnMove, TxnState, move
from eomsg.errors import (
    EomsgError,
    InDoubt,
    InvalidConfig,
    InvalidInput,
    TxnAborted,
    UsageError,
    one_line,
)
from eomsg.failpoints import failpoint

log = logging.getLogger("eomsg.transaction")

# Markers of completed transactions are dropped this many at a time, inside a later
# transaction's commit: one DELETE per transaction would cost DuckDB a third of its
# commit time. A crash leaves at most this many behind (harmless: never read again).
FORGET_BATCH = 128


class Transaction:
    """One transaction over a node (embedded or through a client) and at most one
    application database. Use it as a context manager: a clean exit commits, an
    exception rolls back. Not thread-safe; many may run at once on one client.

    ``timeout`` (seconds, None for none): a transaction that has not reached its
    decision this long after it began is rolled back (TxnAborted). Once decided it
    always completes; a participant that never hears the outcome waits for recovery
    and is listed by ``eomsg inspect txns``."""

    def __init__(
        self,
        participant: Participant,
        resources: Sequence[Resource] = (),
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        if len(resources) > 1:
            raise InvalidConfig("a transaction takes one application database (one resource)")
        if timeout is not None and not timeout > 0:
            raise InvalidConfig(f"a transaction timeout must be above 0 seconds, not {timeout}")
        self.participant = participant
        self.timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.txid = uuid.uuid4().hex
        self.state = TxnState.ACTIVE
        self.results: list[PublishResult] = []
        self.completed = False  # every participant applied the outcome (else: recovery)
        self._resource = resources[0] if resources else None
        self._messages: list[Outgoing] = []
        self._deletes: list[tuple[str, int, int, int]] = []  # queue, seq, epoch, attempt
        self._began = False

    # -- the work ---------------------------------------------------------------------------

    def __enter__(self) -> Transaction:
        r = self._resource
        if r is not None:
            if not r.recovered:
                recover_resource(self.participant, r)
            r.db.begin()
            self._began = True
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.state is not TxnState.ACTIVE:
            return
        if kind is None:
            self.commit()
        else:
            self.rollback()

    def resource(self, conn: Any) -> Any:
        """``conn``, checked to be this transaction's database: run the application's
        changes on it, inside the transaction."""
        if self._resource is None or self._resource.conn is not conn:
            raise UsageError("that connection is not a resource of this transaction")
        return conn

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Publish at commit (invisible until then; never, if the transaction aborts)."""
        self._active()
        self._messages.append(Outgoing(topic, payload, id, ttl_seconds(ttl), headers or {}))

    def delete(self, message: Any) -> None:
        """Delete a received message at commit (a :class:`Received` or a
        :class:`Delivered`); if the transaction aborts, it is redelivered. A delivery
        that is over by the commit (timed out and handed out again, or its consumer
        deposed) makes the node vote no: the transaction aborts, nothing applied."""
        self._active()
        d: Delivered = getattr(message, "delivered", message)
        self._deletes.append((d.queue, d.message.seq, d.epoch, d.attempt))

    def receive(self, queue: str, timeout: float = 0.0) -> Delivered | None:
        """Fetch the next message of ``queue`` (a queue with no limit on active
        consumers), waiting up to ``timeout`` seconds; None if none came. It still has to
        be passed to :meth:`delete` to be consumed by the transaction."""
        self._active()
        got = self.participant.fetch(queue, 1, timeout)
        return got[0] if got else None

    # -- the outcome ------------------------------------------------------------------------

    def commit(self) -> list[PublishResult]:
        """Commit everything atomically; returns the publish results. TxnAborted (with
        the cause) if it could not, and then nothing took effect. Once the decision is
        durable this does not raise: if the node cannot be told, :attr:`completed` stays
        False and recovery applies the outcome later. InDoubt only when a database that
        prepares (PostgreSQL) was lost mid-step and cannot be reached again to learn the
        outcome: both parts then stay prepared until recovery settles them."""
        self._active()
        r, node_work = self._resource, bool(self._messages or self._deletes)
        if self._late():
            self.rollback()
            raise TxnAborted(f"transaction {self.txid} rolled back: {self._late_reason()}")
        if r is None or not node_work:
            return self._commit_alone(r)
        self._prepare_node(r)
        forget = r.applied if len(r.applied) >= FORGET_BATCH else []
        if r.db.prepares and (failed := self._prepare_database(r)) is not None:
            return self._settle_anew(r, failed)  # perhaps prepared: ask again
        if self._late():  # prepared everywhere, but too late to decide COMMIT
            self._undo(r, TimeoutError(self._late_reason()), self._late_reason())
        if (failed := self._decide(r, forget)) is not None:
            return self._settle_anew(r, failed)  # the marker may have committed all the same
        if r.db.prepares and (failed := self._finish_database(r)) is not None:
            return self._settle_anew(r, failed)
        return self._commit_node(r)

    def _prepare_node(self, r: Resource) -> None:
        """The node prepares the transaction's messages and deletes; if it cannot, the
        application's part is rolled back and TxnAborted (or bad input's error) raised."""
        failpoint("coordinator.before_prepare")
        try:
            self.participant.prepare_txn(
                self.txid,
                coordinator=r.descriptor,
                messages=self._messages,
                deletes=self._deletes,
            )
        except BaseException as e:
            with contextlib.suppress(BaseException):
                r.db.rollback()
            self._abort(f"the node could not prepare: {e}", e)
        self.state = move("coordinator", self.state, TxnMove.PREPARE)
        failpoint("coordinator.after_prepare")

    def _prepare_database(self, r: Resource) -> BaseException | None:
        """The application's database (one that prepares) prepares its part: None once
        it has; the failure if it may have prepared all the same (to be settled anew). A
        refusal (the connection still sound) undoes both parts and raises TxnAborted."""
        try:
            failpoint("resource.before_prepare")
            r.db.prepare(self.txid)
            failpoint("resource.after_prepare")
        except BaseException as e:
            if isinstance(e, Exception) and not r.db.broken():  # refused: rolled back
                self._undo(r, e, f"the application database could not prepare: {e}")
            return e
        return None

    def _decide(self, r: Resource, forget: list[str]) -> BaseException | None:
        """The commit point: the COMMIT marker commits (dropping the markers ``forget``
        names), and the coordinator moves to COMMITTED; None once it has. If it failed
        on a database that prepares, the failure (it may have committed: settle anew);
        on one that does not, both parts are undone and TxnAborted raised."""
        try:
            r.markers.decide(self.txid, forget)
        except BaseException as e:
            if r.db.prepares:
                return e
            self._undo(r, e, f"the application database could not commit: {e}")
        if forget:
            r.applied = []
        self.state = move("coordinator", self.state, TxnMove.COMMIT)
        failpoint("coordinator.after_decision")
        return None

    def _finish_database(self, r: Resource) -> BaseException | None:
        """After the decision, the database that prepares commits its prepared part:
        None once it has, else the failure (to be settled anew)."""
        try:
            failpoint("resource.before_finish")
            r.db.finish_prepared(self.txid, commit=True)
            failpoint("resource.after_finish")
        except BaseException as e:
            return e
        return None

    def _commit_node(self, r: Resource) -> list[PublishResult]:
        """After the decision, the node applies the outcome: its publish results, or
        none if it could not be told (logged, not raised: recovery applies it, and
        :attr:`completed` stays False)."""
        try:
            self.results = self.participant.commit_txn(self.txid)
        except EomsgError as e:
            log.warning(
                "transaction %s committed; the node applies it at recovery: %s", self.txid, e
            )
            return []
        failpoint("coordinator.before_forget")
        r.applied.append(self.txid)  # its marker goes with a later transaction's commit
        self.completed = True
        return self.results

    def rollback(self) -> None:
        """Undo the application's changes and drop what was to be published; the
        messages to delete are given back for redelivery at once."""
        self._active()
        if self._began and self._resource is not None:
            self._resource.db.rollback()
        self.state = move("coordinator", self.state, TxnMove.ABORT)
        by_queue: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for queue, seq, epoch, attempt in self._deletes:
            by_queue.setdefault((queue, epoch), []).append((seq, attempt))
        for (queue, epoch), keys in by_queue.items():
            with contextlib.suppress(EomsgError):  # else they come back by timeout
                self.participant.release(queue, keys, epoch=epoch)

    def _commit_alone(self, r: Resource | None) -> list[PublishResult]:
        try:
            if r is not None:
                r.db.commit()
            elif self._messages or self._deletes:
                self.results = self.participant.transact(self._messages, self._deletes)
        except BaseException as e:
            if r is not None:
                with contextlib.suppress(BaseException):
                    r.db.rollback()
            self._abort(f"could not commit: {e}", e)
        self.state = TxnState.COMMITTED
        self.completed = True
        return self.results

    def _settle_anew(self, r: Resource, cause: BaseException) -> list[PublishResult]:
        """A step with a database that prepares failed, and whether it took effect is
        unknown (the connection broke, say, while the COMMIT marker committed): read the
        outcome on a new connection — fencing the transaction with ABORT if no COMMIT is
        recorded — and finish both parts by it. TxnAborted if that was abort; InDoubt if
        the database cannot be reached (recovery settles it later)."""
        with contextlib.suppress(Exception):  # leave this connection usable, if it is
            r.db.rollback()
        try:
            db = r.db.reopen()
            try:
                results = settle(self.participant, MarkerTable(db, r.markers.table), self.txid)
            finally:
                db.conn.close()
        except Exception as e:
            raise InDoubt(
                f"transaction {self.txid} is in doubt: {one_line(cause)}, and its outcome "
                f"could not be read again ({one_line(e)}); recovery settles it (eomsg "
                "recover, once this client has disconnected)"
            ) from cause
        if results is None:
            self._abort(f"the application database failed ({one_line(cause)})", cause)
        if self.state is TxnState.PREPARED:
            self.state = move("coordinator", self.state, TxnMove.COMMIT)
        self.results, self.completed = results, True
        if not isinstance(cause, Exception):
            raise cause
        log.warning("transaction %s committed after the database failed: %s", self.txid, cause)
        return results

    def _undo(self, r: Resource, cause: BaseException, why: str) -> NoReturn:
        """Before the decision: roll back the application's part (prepared or not) and
        the node's, then raise."""
        with contextlib.suppress(BaseException):
            r.db.rollback()
            r.db.finish_prepared(self.txid, commit=False)
        with contextlib.suppress(EomsgError):  # else recovery aborts it: no marker
            self.participant.abort_txn(self.txid)
        self._abort(why, cause)

    def _abort(self, why: str, cause: BaseException) -> NoReturn:
        """Everything is rolled back: say so. Bad input keeps its own error."""
        self.state = move("coordinator", self.state, TxnMove.ABORT)
        if not isinstance(cause, Exception) or isinstance(cause, InvalidInput):
            raise cause
        raise TxnAborted(f"transaction {self.txid} rolled back: {why}") from cause

    def _late(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _late_reason(self) -> str:
        return f"not decided within its timeout ({self.timeout:g}s)"

    def _active(self) -> None:
        if self.state is not TxnState.ACTIVE:
            raise UsageError(f"transaction {self.txid} is {self.state.value}; start a new one")


def recover_resource(participant: Participant, resource: Resource) -> list[Step]:
    """Resolve the in-doubt transactions whose outcome ``resource`` records (left by an
    earlier run of this application), and the work it holds prepared alone (PostgreSQL),
    on its own connection. Runs once per resource,
    before its first transaction; call it again after a lost connection."""

    @contextlib.contextmanager
    def own(_: str) -> Any:
        yield MarkerTable(resource.db, resource.markers.table)

    apps = [resource.descriptor] if resource.db.prepares else []
    steps = plan(
        participant, now=time.time(), coordinator=resource.descriptor, apps=apps, markers=own
    )
    done = execute(participant, steps, markers=own)
    for step in done:
        log.info(
            "recovered transaction %s: %s (%s)", step.txn.txid, step.verdict.value, step.reason
        )
    resource.recovered = True
    return done
