"""Recovery of in-doubt transactions (seed 000, presumed abort).

A transaction is *in doubt* when the node holds it prepared and its coordinator is gone
(it crashed, or lost its connection, between prepare and completion). Its outcome is in
the marker table its descriptor names: a COMMIT marker means commit; no marker means the
coordinator never decided, so — after fencing it with an ABORT marker, which a late
coordinator can never overwrite — abort. When the marker table cannot be read (the
application holds its DuckDB file, the file is gone), the transaction waits for a person:
``--abort-older-than`` aborts those older than a limit, as a heuristic decision that is
reported, never silent.

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
from eomsg.core.message import Delivered, Outgoing, PublishResult
from eomsg.core.txn import TxnInfo, Verdict, verdict
from eomsg.errors import EomsgError

log = logging.getLogger("eomsg.recovery")


class Participant(Protocol):
    """The node side of a transaction: an embedded :class:`~eomsg.node.node.Node` or a
    :class:`~eomsg.client.sync.Client` of a running one (same calls, same contracts)."""

    def prepare_txn(
        self,
        txid: str,
        *,
        coordinator: str,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[tuple[str, int, int]] = (),
    ) -> None: ...

    def commit_txn(self, txid: str) -> list[PublishResult]: ...

    def abort_txn(self, txid: str, *, force: bool = False) -> bool: ...

    def transact(
        self, messages: Sequence[Outgoing] = (), deletes: Sequence[tuple[str, int, int]] = ()
    ) -> list[PublishResult]: ...

    def txns(self) -> list[TxnInfo]: ...

    def fetch(self, queue: str, max_messages: int = ..., wait: float = ...) -> list[Delivered]: ...

    def release(
        self, queue: str, seqs: Sequence[int], delay: float = ..., *, epoch: int = ...
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Step:
    """What recovery does (or did) with one in-doubt transaction, and why."""

    txn: TxnInfo
    verdict: Verdict
    reason: str
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            **self.txn.to_json(),
            "verdict": self.verdict.value,
            "reason": self.reason,
            "done": self.done,
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
    markers: MarkerOpener = open_markers,
) -> list[Step]:
    """Decide, without changing anything, what to do with each in-doubt transaction
    (only those of ``coordinator``, if given). Reads each marker table once."""
    steps = []
    for t in participant.txns():
        if t.connected or (coordinator is not None and t.coordinator != coordinator):
            continue
        age = now - t.prepared_at
        try:
            with markers(t.coordinator) as table:
                outcome = table.peek(t.txid)
        except Exception as e:  # unreadable: locked by its application, gone, corrupt
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
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
    return steps


def execute(
    participant: Participant, steps: list[Step], *, markers: MarkerOpener = open_markers
) -> list[Step]:
    """Carry out a plan; returns each step as done (or, for WAIT, as left)."""
    out = []
    for step in steps:
        txid = step.txn.txid
        try:
            if step.verdict is Verdict.COMMIT:
                participant.commit_txn(txid)
                _forget(markers, step.txn.coordinator, txid)
            elif step.verdict is Verdict.ABORT:
                with markers(step.txn.coordinator) as table:
                    committed = table.outcome_or_fence(txid)
                if committed:  # its coordinator decided after the plan was made
                    participant.commit_txn(txid)
                    step = replace(step, verdict=Verdict.COMMIT, reason="COMMIT recorded meanwhile")
                    _forget(markers, step.txn.coordinator, txid)
                else:
                    participant.abort_txn(txid)
            elif step.verdict is Verdict.FORCE_ABORT:
                participant.abort_txn(txid, force=True)
                log.warning("transaction %s aborted by a person's decision: %s", txid, step.reason)
            else:
                out.append(step)
                continue
        except EomsgError as e:
            out.append(replace(step, verdict=Verdict.WAIT, reason=f"{step.reason}; failed: {e}"))
            continue
        out.append(replace(step, done=True))
    return out


def _forget(markers: MarkerOpener, descriptor: str, txid: str) -> None:
    """Drop a marker whose outcome is applied; harmless to skip (never read again)."""
    with contextlib.suppress(Exception), markers(descriptor) as table:
        table.forget([txid])
