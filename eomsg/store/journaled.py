"""What the journal's records hold, for the two that read them whole: a store's open,
which applies the records DuckDB lacks, and salvage, which keeps every readable one and
names what the journal's holes took (:mod:`eomsg.store.journal` finds them).

A hole's records cannot be read, so what they held is bounded from what can: the
messages a node publishes are numbered in the order they are journaled, so the seqs a
hole took lie between the last seq stored before it and the first after it. A record
whose payload fails its checksum but still decodes is read for what it names, said to
come from damaged bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import duckdb

from eomsg.core.seqs import written
from eomsg.store.journal import FORMAT, Hole, Record, Scan
from eomsg.store.logread import stored_seq
from eomsg.store.schema import route_runs_from_destinations
from eomsg.store.writer import APPLY_BYTES, APPLY_ROWS, RowBatch, insert_rows


def apply(
    db: duckdb.DuckDBPyConnection,
    records: Iterable[Record],
    between: Callable[[], None] = lambda: None,
) -> int:
    """Put ``records`` into the database open on ``db``, many in one transaction, each
    transaction noting the last record it holds (so a record is applied once); calls
    ``between`` after each commit (the caller's WAL bound). The last lsn applied (0:
    none)."""
    batch, last, size = RowBatch(), 0, 0
    pending = False
    for record in records:
        batch.merge(RowBatch.decode(record.payload))
        last, size, pending = record.lsn, size + len(record.payload), True
        if batch.size >= APPLY_ROWS or size >= APPLY_BYTES:
            _commit(db, batch, last)
            batch, size, pending = RowBatch(), 0, False
            between()
    if pending:
        _commit(db, batch, last)
        between()
    return last


def _commit(db: duckdb.DuckDBPyConnection, batch: RowBatch, lsn: int) -> None:
    db.execute("BEGIN TRANSACTION")
    try:
        insert_rows(db, batch, lsn)
        if any(queue_id < 0 for _, queue_id in batch.tables.get("destinations", ())):
            route_runs_from_destinations(db)  # journaled by a node before schema 7
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # a failed COMMIT has rolled back already
            db.execute("ROLLBACK")
        raise


def set_format(db: duckdb.DuckDBPyConnection) -> None:
    """Note (committed) that the store's journal is written in this eomsg's format: from
    now on a journal with no segment lost it."""
    db.execute(
        """INSERT INTO node_meta VALUES ('journal_format', ?)
           ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
        [str(FORMAT)],
    )


def damage(db: duckdb.DuckDBPyConnection, found: Scan) -> str:
    """What a damaged journal refuses an open with, in one line: where, the last good
    record, what may be lost."""
    return (
        f"its journal is damaged ({found.damage}); the last good record is "
        f"{found.last_good} (DuckDB holds up to {found.after}); {loss(db, found).line()}"
    )


def _seqs(record: Record) -> list[int]:
    return [row[0] for row in RowBatch.decode(record.payload).tables.get("messages", ())]


@dataclass
class Loss:
    """What a journal's holes past the store took, as far as it can be told."""

    holes: list[Hole]
    after_seq: int  # the last message seq stored before the first hole
    before_seq: int | None  # the first seq stored after the last hole (None: none is)
    named: dict[str, list[int]] = field(default_factory=dict)  # read from damaged bytes

    def seqs(self) -> str:
        """The message seqs that may be lost, in words."""
        if self.before_seq is None:
            return f"messages published after seq {self.after_seq}"
        if self.before_seq <= self.after_seq + 1:
            return "no message (no seq is missing around them)"
        if self.before_seq == self.after_seq + 2:
            return f"the message with seq {self.after_seq + 1}"
        return f"messages with seqs {self.after_seq + 1} to {self.before_seq - 1}"

    def line(self) -> str:
        """One line: which records, which seqs, and what else they may have held."""
        records = ", ".join(h.lsns for h in self.holes)
        text = (
            f"acknowledged writes in {records} are lost: {self.seqs()}, and the deletes, "
            "deliveries and settings recorded with them (messages consumed then may come "
            "again)"
        )
        if self.named.get("seqs"):
            text += f"; their damaged bytes name seqs {written(self.named['seqs'])}"
        if self.named.get("deleted"):
            text += f" and deletes of seqs {written(self.named['deleted'])}"
        return text


def loss(db: duckdb.DuckDBPyConnection, found: Scan) -> Loss:
    """What the holes of ``found`` past the store open on ``db`` took."""
    floor = found.after + 1  # the records below it DuckDB holds
    holes = [replace(h, first=max(h.first, floor)) for h in found.lost if not h.torn]
    first = min(h.first for h in holes)
    last = None if any(h.last is None for h in holes) else max(h.last or 0 for h in holes)
    before = [s for r in found.records if r.lsn < first for s in _seqs(r)]
    after = [s for r in found.records if r.lsn > last for s in _seqs(r)] if last is not None else []
    result = Loss(
        holes,
        max([stored_seq(db), *before]),
        min(after) if after else None,
    )
    for h in holes:
        for name, values in _damaged(h).items():
            result.named.setdefault(name, []).extend(values)
    return result


def _damaged(hole: Hole) -> dict[str, list[int]]:
    """What a record that fails its checksum still names, if its bytes decode."""
    if not hole.payload:
        return {}
    try:
        batch = RowBatch.decode(hole.payload)
        return {
            "seqs": sorted(int(r[0]) for r in batch.tables.get("messages", ())),
            "deleted": sorted(map(int, batch.settled_seqs())),
        }
    except Exception:  # garbled past reading: nothing is named
        return {}
