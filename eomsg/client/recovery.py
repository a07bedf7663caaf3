"""Recovery of in-doubt transactions (seed 000, presumed abort).

A transaction is *in doubt* when the node holds it prepared and its coordinator is gone
(it crashed, or lost its connection, between prepare and completion). Its outcome is in
the marker table its descriptor names: a COMMIT marker means commit; no marker means the
coordinator never decided, so — after fencing it with an ABORT marker, which a late
coordinator can never overwrite — abort. When the marker table cannot be read (the
application holds its DuckDB file, the file is gone), the transaction waits for a person:
``--abort-older-than`` aborts those older than a limit, as a heuristic decision that is
reported, never silent.

A database that prepares (PostgreSQL) settles its part first, by the same outcome. Work
it holds prepared *alone* — the node's part finished, or never prepared because the
connection broke during PREPARE — is found by scanning it (``apps``): committed if
COMMIT is recorded, else rolled back once it is older than :data:`APP_ONLY_GRACE`.

The plan is computed apart from its execution, so ``eomsg recover --dry-run`` shows it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from eomsg.client.appdb import open_descriptor
from eomsg.client.resources import MarkerTable
from eomsg.core.message import Delivered, Key, Outgoing, PublishResult
from eomsg.core.txn import TxnInfo, TxnState, Verdict, verdict
from eomsg.errors import InDoubt, InvalidConfig, InvalidInput, one_line

# Work prepared in the application database alone is left this long before recovery
# rolls it back: a coordinator of *another* node sharing the database may be between
# its PREPARE and its decision. (This node's coordinators prepare the node first.)
APP_ONLY_GRACE = 60.0

log = logging.getLogger("eomsg.recovery")


class Participant(Protocol):
    """The node side of a transaction: what a :class:`~eomsg.client.broker.Broker` offers
    of it (a node embedded here or a running one: same calls, same contracts)."""

    def prepare_txn(
        self,
        txid: str,
        *,
        coordinator: str,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[tuple[str, int, int, int]] = (),
    ) -> None: ...

    def commit_txn(self, txid: str) -> list[PublishResult]: ...

    def abort_txn(self, txid: str, *, force: bool = False) -> bool: ...

    def transact(
        self,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[tuple[str, int, int, int]] = (),
    ) -> list[PublishResult]: ...

    def txns(self) -> list[TxnInfo]: ...

    def fetch(self, queue: str, max_messages: int = ..., wait: float = ...) -> list[Delivered]: ...

    def release(
        self, queue: str, keys: Sequence[Key], delay: float = ..., *, epoch: int = ...
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Step:
    """What recovery does (or did) with one in-doubt transaction, and why. ``node``
    False: only the application database holds it prepared."""

    txn: TxnInfo
    verdict: Verdict
    reason: str
    done: bool = False
    node: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            **self.txn.to_json(),
            "verdict": self.verdict.value,
            "reason": self.reason,
            "done": self.done,
            "node": self.node,
        }


MarkerOpener = Callable[[str], contextlib.AbstractContextManager[MarkerTable]]


@contextlib.contextmanager
def open_markers(descriptor: str) -> Iterator[MarkerTable]:
    """The marker table a descriptor names, on a connection of its own (closed after)."""
    db, table = open_descriptor(descriptor)
    try:
        yield MarkerTable(db, table)
    finally:
        db.conn.close()


def plan(
    participant: Participant,
    *,
    now: float,
    abort_older_than: float | None = None,
    coordinator: str | None = None,
    apps: Sequence[str] = (),
    markers: MarkerOpener = open_markers,
) -> list[Step]:
    """Decide, without changing anything, what to do with each in-doubt transaction
    (only those of ``coordinator``, if given), and with the work the application
    databases ``apps`` (descriptors) hold prepared alone. InDoubt if one of ``apps``
    cannot be read."""
    steps = []
    held = participant.txns()
    for t in held:
        if t.connected or (coordinator is not None and t.coordinator != coordinator):
            continue
        age = now - t.prepared_at
        try:
            with markers(t.coordinator) as table:
                outcome = table.peek(t.txid)
        except Exception as e:  # unreadable: locked by its application, gone, corrupt
            why = one_line(e)
            v = verdict(None, readable=False, age=age, abort_older_than=abort_older_than)
            reason = f"cannot read {t.coordinator}: {why}"
            if v is Verdict.FORCE_ABORT:
                reason += f"; prepared {age:.0f}s ago, past --abort-older-than"
            steps.append(Step(t, v, reason))
            continue
        v = verdict(outcome == "commit", readable=True, age=age, abort_older_than=None)
        reason = (
            f"COMMIT recorded in {t.coordinator}"
            if v is Verdict.COMMIT
            else f"no COMMIT recorded in {t.coordinator} (presumed abort)"
        )
        steps.append(Step(t, v, reason))
    known = {t.txid for t in held}
    for descriptor in apps:
        steps.extend(_app_only(descriptor, known, now, markers))
    return steps


def _app_only(
    descriptor: str, known: set[str], now: float, markers: MarkerOpener
) -> Iterator[Step]:
    """The steps for the work ``descriptor`` holds prepared that the node does not."""
    try:
        with markers(descriptor) as table:
            alone = [(t, at, table.peek(t)) for t, at in table.db.prepared() if t not in known]
    except InvalidInput as e:  # a malformed descriptor: the caller's to fix
        raise InvalidConfig(f"{descriptor}: {e}") from e
    except Exception as e:  # the database is down, locked, gone: a person's to see to
        raise InDoubt(f"cannot read {descriptor}: {one_line(e)}") from e
    for txid, at, outcome in alone:
        info = TxnInfo(txid, TxnState.PREPARED, descriptor, at, False, 0, 0)
        if outcome == "commit":
            reason = f"COMMIT recorded in {descriptor}; prepared there only"
            yield Step(info, Verdict.COMMIT, reason, node=False)
        elif now - at >= APP_ONLY_GRACE:
            reason = f"prepared only in {descriptor}, no COMMIT recorded (presumed abort)"
            yield Step(info, Verdict.ABORT, reason, node=False)


def execute(
    participant: Participant, steps: list[Step], *, markers: MarkerOpener = open_markers
) -> list[Step]:
    """Carry out a plan; returns each step as done (or, for WAIT, as left). A step that
    fails is left as WAIT, with why, and the others go on."""
    out = []
    for step in steps:
        if step.verdict is Verdict.WAIT:
            out.append(step)
            continue
        try:
            out.append(_apply(participant, step, markers))
        except Exception as e:
            why = one_line(e)
            out.append(replace(step, verdict=Verdict.WAIT, reason=f"{step.reason}; failed: {why}"))
    return out


def _apply(participant: Participant, step: Step, markers: MarkerOpener) -> Step:
    """One step: the application database's prepared part first (while it is prepared,
    the node's part is too, so a crash here leaves the transaction findable), then the
    node's, then the marker is dropped."""
    txid = step.txn.txid
    if step.verdict is Verdict.FORCE_ABORT:  # its database cannot be read
        participant.abort_txn(txid, force=True)
        log.warning("transaction %s aborted by a person's decision: %s", txid, step.reason)
        return replace(step, done=True)
    with markers(step.txn.coordinator) as table:
        decided = step.verdict is Verdict.COMMIT
        committed = settle(participant, table, txid, decided=decided, node=step.node) is not None
    if committed and not decided:  # its coordinator decided after the plan was made
        step = replace(step, verdict=Verdict.COMMIT, reason="COMMIT recorded meanwhile")
    return replace(step, done=True)


def settle(
    participant: Participant,
    table: MarkerTable,
    txid: str,
    *,
    decided: bool = False,
    node: bool = True,
) -> list[PublishResult] | None:
    """Finish ``txid`` everywhere by the outcome ``table`` records: commit if
    ``decided`` or COMMIT is recorded; else fence it with ABORT (so that its coordinator
    can never record COMMIT) and abort. The application database's prepared part goes
    first: while it is prepared, the node's part is too (``node`` False: the node holds
    none), so a crash in between leaves the transaction findable. Returns the node's
    publish results when it committed, None when it aborted."""
    commit = decided or table.outcome_or_fence(txid)
    table.db.finish_prepared(txid, commit)
    if not commit:
        if node:
            participant.abort_txn(txid)
        return None
    results = participant.commit_txn(txid) if node else []
    with contextlib.suppress(Exception):  # applied everywhere: never read again
        table.forget([txid])
    return results
