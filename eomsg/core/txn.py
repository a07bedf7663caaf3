"""Two-phase commit (seed 000), presumed abort: the rules every role follows.

A transaction's work spans *participants*: the node's log (messages published in the
transaction, invisible until it commits), the node's cursors (messages deleted in it,
held for it meanwhile: neither redelivered nor deletable by anyone else) and the
application's own database. The *coordinator* runs in the application's process:

1. **prepare** — each participant makes the transaction's work durable without applying
   it, and promises to apply or drop it on request (a "yes" vote);
2. **decide** — the coordinator records COMMIT durably: that record is the commit point.
   With a *commit-markable* resource (DuckDB, SQLite) the record is a marker row written
   in the application's own transaction, so its commit and the decision are one act;
3. **complete** — every participant is told the outcome, and applies or drops the work;
4. **forget** — once all have answered, the decision record may go.

*Presumed abort*: only commits are recorded. A transaction with no COMMIT record was not
committed, so recovery aborts every prepared transaction whose coordinator holds no
record — once that coordinator can no longer write one (it is gone, or the recovery
fenced it with an ABORT record it can never overwrite).

Pure state: no I/O, no clock. The tables below are the only place the moves are defined;
an illegal move raises :class:`~eomsg.errors.TxnConflict` naming the move, the role and
the state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from eomsg.errors import HeuristicOutcome, InvalidInput, TxnConflict

# A transaction not decided this long after it began is rolled back: it must not hold
# the messages it deletes, its locks and its prepared work for ever.
DEFAULT_TIMEOUT = 60.0


class TxnState(enum.Enum):
    ACTIVE = "active"  # work being gathered; nothing durable yet
    PREPARED = "prepared"  # voted yes; waits for the outcome
    COMMITTED = "committed"
    ABORTED = "aborted"
    HEURISTIC = "heuristic"  # aborted by a person's decision, not the coordinator's


class TxnMove(enum.Enum):
    PREPARE = "prepare"
    COMMIT = "commit"
    ABORT = "abort"
    FORCE_ABORT = "force-abort"


PARTICIPANT: dict[tuple[TxnState, TxnMove], TxnState] = {
    (TxnState.ACTIVE, TxnMove.PREPARE): TxnState.PREPARED,
    (TxnState.ACTIVE, TxnMove.ABORT): TxnState.ABORTED,
    (TxnState.PREPARED, TxnMove.COMMIT): TxnState.COMMITTED,
    (TxnState.PREPARED, TxnMove.ABORT): TxnState.ABORTED,
    (TxnState.PREPARED, TxnMove.FORCE_ABORT): TxnState.HEURISTIC,
    # Idempotent repeats: a coordinator retries until it hears back.
    (TxnState.COMMITTED, TxnMove.COMMIT): TxnState.COMMITTED,
    (TxnState.ABORTED, TxnMove.ABORT): TxnState.ABORTED,
    (TxnState.HEURISTIC, TxnMove.ABORT): TxnState.HEURISTIC,
    (TxnState.HEURISTIC, TxnMove.FORCE_ABORT): TxnState.HEURISTIC,
    (TxnState.ABORTED, TxnMove.FORCE_ABORT): TxnState.ABORTED,
}
"""A participant's (the node's) moves: (state, move) → state after it."""

COORDINATOR: dict[tuple[TxnState, TxnMove], TxnState] = {
    (TxnState.ACTIVE, TxnMove.PREPARE): TxnState.PREPARED,  # every participant voted yes
    (TxnState.ACTIVE, TxnMove.ABORT): TxnState.ABORTED,  # rollback, or a "no" vote
    (TxnState.PREPARED, TxnMove.COMMIT): TxnState.COMMITTED,  # the decision is durable
    (TxnState.PREPARED, TxnMove.ABORT): TxnState.ABORTED,  # the decision could not be made
}
"""The coordinator's moves. COMMITTED and ABORTED are final: it only tells the others."""

_TABLES = {"participant": PARTICIPANT, "coordinator": COORDINATOR}


def move(role: str, state: TxnState, how: TxnMove, txid: str = "") -> TxnState:
    """The state after ``how``; TxnConflict if the role's table has no such move
    (HeuristicOutcome if a person aborted the transaction and the move was commit)."""
    after = _TABLES[role].get((state, how))
    if after is None:
        named = f"transaction {txid}" if txid else "the transaction"
        if state is TxnState.HEURISTIC:
            raise HeuristicOutcome(
                f"{role} cannot {how.value} {named}: a person aborted it (eomsg recover "
                "--abort-older-than); check what its other participants did"
            )
        raise TxnConflict(f"{role} cannot {how.value} {named}: it is {state.value}")
    return after


class Verdict(enum.Enum):
    """What recovery does with a prepared transaction."""

    COMMIT = "commit"  # the coordinator recorded COMMIT
    ABORT = "abort"  # no COMMIT record, and none can appear any more
    FORCE_ABORT = "force-abort"  # outcome unreadable, but older than the operator's limit
    WAIT = "wait"  # outcome unreadable, or its coordinator may still decide: a person's call


def verdict(
    decision: bool | None, *, readable: bool, age: float, abort_older_than: float | None
) -> Verdict:
    """Presumed abort. ``decision`` is True when a COMMIT record exists, False when the
    record says ABORT or none exists (and the coordinator can no longer write one),
    None when ``readable`` is False — the record could not be read."""
    if readable:
        return Verdict.COMMIT if decision else Verdict.ABORT
    if abort_older_than is not None and age >= abort_older_than:
        return Verdict.FORCE_ABORT
    return Verdict.WAIT


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """A transaction as the node sees it: its state, where its coordinator records the
    outcome, whether that coordinator is still connected, and what it holds."""

    txid: str
    state: TxnState
    coordinator: str
    prepared_at: float
    connected: bool
    publishes: int
    deletes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "txid": self.txid,
            "state": self.state.value,
            "coordinator": self.coordinator,
            "prepared_at": self.prepared_at,
            "connected": self.connected,
            "publishes": self.publishes,
            "deletes": self.deletes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TxnInfo:
        return cls(
            str(data["txid"]),
            TxnState(data["state"]),
            str(data["coordinator"]),
            float(data["prepared_at"]),
            bool(data["connected"]),
            int(data["publishes"]),
            int(data["deletes"]),
        )


def check_txid(txid: str) -> None:
    """A transaction id: 1 to 128 printable ASCII characters (InvalidInput otherwise)."""
    if not (0 < len(txid) <= 128 and txid.isascii() and txid.isprintable()):
        raise InvalidInput("a transaction id is 1 to 128 printable ASCII characters")
