"""Egress in memory (seed 004, egress i to xi): messages a linked peer sends for this
node's own queues, held in memory instead of being stored, when the link says so.

A link whose ``egress`` is ``memory`` holds each message that arrives over it for this
node's queues alone (none to carry further) in memory: it is numbered and handed to the
queues' cursors at once, as if stored, but nothing of it is written (ii, iii). What the
queues record about it meanwhile — deliveries, releases, deletes — stays with it in
memory too (iv, v). When every queue has settled it, it is forgotten, and the peer is
told this node holds it (vi): not one byte of it ever reached this node's disk. One not
settled everywhere within the link's ``hold`` is written then, whole — the message, its
queues, and what they recorded so far — and acknowledged once durable (vii, viii); from
there it is a stored message like any other (ix to xi). A held message that a durable
record needs (moved to a dead-letter queue, deleted by a transaction) is written whole
with that record, the same way.

What it trades: the peer keeps the message (it is not acknowledged) until it is settled
here or written, so a crash of this node loses nothing the peer sent — but what local
consumers took from memory is delivered again after it (the peer sends it again): at
least once for those messages, exactly once with the inbox and publish ids (the inbox
dedups by id). Held messages that are settled in time never enter this node's log (the
node they were published on keeps them in its own); one written late enters the log
below seqs already there, so readers of the log see no further than the lowest held
message (:meth:`Egress.log_ceiling`).

This module keeps the held messages and the rows recorded about them, and is where every
write passes (:meth:`Egress.divert`) and every read of a message looks first; the link's
side — what is held, when to write it, what to acknowledge — is in
:mod:`eomsg.node.intake`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, overload

from eomsg.core.message import Message, MessageColumns, message_columns
from eomsg.node.events import Signal
from eomsg.node.state import QueueState
from eomsg.store.store import Store
from eomsg.store.writer import RowBatch

if TYPE_CHECKING:
    from eomsg.node.linkstate import LinkState

# Where each table that names a message keeps its seq.
SEQ_AT = {
    "messages": 0,
    "publish_ids": 1,
    "destinations": 0,
    "deliveries": 1,
    "returned": 1,
    "settled": 1,
    "txn_deletes": 2,
}
KEPT = ("deliveries", "returned", "settled")  # what a held message keeps while held
_QUEUE_AT = {"destinations": 1, "deliveries": 0, "returned": 0, "settled": 0}
MAX_HELD_BYTES = 64 << 20  # payload bytes held at once; past it, messages are stored


@dataclass(eq=False)
class Held:
    """A message held in memory: its seq here, the peer's seq it came as and its link,
    its rows (those that store it, then those recorded about it since), the queues
    that have not settled it, when it must be written, and the message itself."""

    seq: int
    peer_seq: int
    link: LinkState
    message: Message
    deadline: float
    owed: set[int]  # queue ids
    rows: RowBatch = field(default_factory=RowBatch)
    writing: bool = False  # written with a batch not yet durable

    @property
    def size(self) -> int:
        return len(self.message.payload) + 256


class Kernel(Protocol):
    """What :class:`Egress` needs of the node: the store, and the lock it runs under."""

    store: Store
    lock: threading.Lock


class Egress:
    """Messages held in memory for this node's queues, and the rows kept with them:
    what the node writes, reads and drops passes here first. :attr:`done` is emitted,
    under ``lock``, with the messages that are settled everywhere here or durable."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._held: dict[int, Held] = {}  # by seq, in the order they were held (ascending)
        self._held_bytes = 0
        self.done: Signal[[list[Held]]] = Signal()

    def has_room(self, size: int) -> bool:
        """Whether ``size`` more payload bytes may be held. Under ``lock``."""
        return self._held_bytes + size <= MAX_HELD_BYTES

    def keep(self, held: Held) -> None:
        """Hold ``held`` (its rows staged, its queues in ``owed``). Under ``lock``."""
        self._held[held.seq] = held
        self._held_bytes += held.size

    def holds(self, held: Held) -> bool:
        """Whether ``held`` is still held (not settled everywhere, nor written). Under
        ``lock``."""
        return self._held.get(held.seq) is held

    def holds_any(self, seqs: Iterable[int]) -> bool:
        """Whether any of the messages ``seqs`` is held in memory. Under ``lock``."""
        held = self._held
        return bool(held) and any(s in held for s in seqs)

    def due(self, now: float, link: LinkState | None, every: bool) -> list[Held]:
        """The held messages not being written whose hold is over at ``now`` (``every``:
        all), of ``link`` (None: of every link). Under ``lock``."""
        return [
            h
            for h in self._held.values()
            if not h.writing and (every or h.deadline <= now) and (link is None or h.link is link)
        ]

    # -- what the rest of the node sees ---------------------------------------------------

    def divert(self, batch: RowBatch) -> RowBatch:
        """``batch`` as it goes to the writer: rows about held messages kept with them
        instead; a held message that another record needs (a dead-letter destination, a
        transaction's delete) written whole with it. Under ``lock``."""
        held = self._held
        if not held:
            return batch
        needed: set[int] = set()
        for name, rows in batch.tables.items():
            at = SEQ_AT.get(name)
            if at is not None and name not in KEPT:
                needed.update(
                    row[at] for row in rows if row[at] in held and not held[row[at]].writing
                )
        if needed:
            self.write_with(batch, [held[s] for s in sorted(needed)])
        settled_all = self._keep_rows(batch)
        for h in settled_all:
            self._forget(h)
        if settled_all and batch.empty:
            self.done.emit(settled_all)
        elif settled_all:  # acknowledged once what came with it is durable (a requeue)
            batch.after_commit(lambda: self._done_after_commit(settled_all))
        return batch

    def _keep_rows(self, batch: RowBatch) -> list[Held]:
        """Move the rows of ``batch`` about held messages to them; the held messages
        that settled everywhere by them. Under ``lock``."""
        held = self._held
        settled_all: list[Held] = []
        for name in KEPT:
            if not batch.tables.get(name):
                continue
            rows, at = batch.tables[name], SEQ_AT[name]
            rest = []
            for row in rows:
                h = held.get(row[at])
                if h is None or h.writing:
                    rest.append(row)
                    continue
                h.rows.rows_of(name).append(row)
                if name == "settled":
                    h.owed.discard(row[0])
                    if not h.owed:
                        settled_all.append(h)
            if rest:
                batch.tables[name] = rest
            else:
                del batch.tables[name]
        return settled_all

    def _done_after_commit(self, done: list[Held]) -> None:
        with self._kernel.lock:
            self.done.emit(done)

    def unwritten(self, batch: RowBatch) -> None:
        """The writer refused ``batch``: messages held in memory that were to be
        written with it stay held. Under ``lock``."""
        for row in batch.tables.get("messages", ()):
            h = self._held.get(row[0])
            if h is not None:
                h.writing = False  # still held: written later, or settled

    def fetch_messages(self, seqs: Sequence[int]) -> dict[int, Message]:
        """The messages with these seqs (ascending), held in memory or stored."""
        # Not under the lock: a message may leave memory meanwhile, written (the writer's
        # overlay has it then) or settled (then it is gone, as a stored one may be).
        held, store = self._held, self._kernel.store
        if not held:
            return store.fetch(seqs)
        found = {s: h.message for s in seqs if (h := held.get(s)) is not None}
        rest = [s for s in seqs if s not in found]
        if rest:
            found.update(store.fetch(rest))
        return found

    @overload
    def fetch_columns(self, seqs: Sequence[int]) -> MessageColumns: ...
    @overload
    def fetch_columns(self, seqs: Sequence[int], *, memory_only: bool) -> MessageColumns | None: ...

    def fetch_columns(
        self, seqs: Sequence[int], *, memory_only: bool = False
    ) -> MessageColumns | None:
        """The messages with these seqs (ascending) held in memory or stored, as columns
        (a consumer's take: no value made per message unless one is held here).
        ``memory_only``: None rather than read DuckDB."""
        held = self._held
        if not held or held.keys().isdisjoint(seqs):
            return self._kernel.store.fetch_columns(seqs, memory_only=memory_only)
        if memory_only:
            return None  # (rare: a link's egress holds one) read on a thread instead
        found = self.fetch_messages(seqs)
        return message_columns([found[s] for s in seqs if s in found])

    def expiries(self, seqs: Sequence[int]) -> dict[int, float]:
        """Expiry times of the messages among ``seqs`` that have one."""
        held = self._held
        found = {s: e for s in seqs if s in held and (e := held[s].message.expires_at)}
        rest = [s for s in seqs if s not in held]
        if rest:
            found.update(self._kernel.store.expiries(rest))
        return found

    def payload_sizes(self, seqs: Sequence[int]) -> dict[int, int]:
        """Payload bytes of the messages among ``seqs``, held in memory or stored."""
        held = self._held
        found = {s: len(held[s].message.payload) for s in seqs if s in held}
        rest = [s for s in seqs if s not in held]
        if rest:
            found.update(self._kernel.store.payload_sizes_of(rest))
        return found

    def queue_dropped(self, q: QueueState) -> None:
        """Queue ``q`` is gone: what is held no longer waits for it (a subscriber of
        ``NodeState.queue_dropped``). Under ``lock``."""
        done = []
        for h in list(self._held.values()):
            if q.id not in h.owed or h.writing:
                continue
            h.owed.discard(q.id)
            for name, rows in h.rows.tables.items():
                if name != "messages" and name != "publish_ids":
                    h.rows.tables[name] = [r for r in rows if r[_QUEUE_AT[name]] != q.id]
            if not h.owed:
                self._forget(h)
                done.append(h)
        if done:
            self.done.emit(done)

    def log_ceiling(self) -> int | None:
        """The highest seq readers of the log may rely on: below the lowest message
        held (it may yet be written). None when none is held. Under ``lock``."""
        for seq in self._held:  # ascending: the first is the lowest
            return seq - 1
        return None

    # -- writing held messages ----------------------------------------------------------------

    def write_with(self, batch: RowBatch, helds: list[Held]) -> None:
        """Put ``helds`` whole into ``batch``, ahead of its own rows (so what was
        recorded about them comes first); they count as done once it is durable.
        Under ``lock``."""
        for name in {n for h in helds for n in h.rows.tables}:
            before = [row for h in helds for row in h.rows.tables.get(name, ())]
            batch.tables[name] = before + batch.tables.get(name, [])
        for h in helds:
            h.writing = True

        def written() -> None:
            with self._kernel.lock:
                done = [h for h in helds if self._held.get(h.seq) is h]
                for h in done:
                    self._forget(h)
                if done:
                    self.done.emit(done)

        batch.after_commit(written)

    def _forget(self, held: Held) -> None:
        del self._held[held.seq]
        self._held_bytes -= held.size
