"""The log's messages kept in memory after DuckDB holds them, for the readers that follow
close behind the writer.

A consumer that keeps up asks for the messages just written; one that drains a backlog
asks for the next ones in sequence, a take at a time. Either way a query per take costs
DuckDB's fixed ≈ 1 ms for a few hundred rows — most of a take's time on a fast consumer.
So the writer's applier puts each message it moves out of the overlay here, and a read
of the log that had to ask DuckDB for a dense run of messages reads further ahead, in a
query of its own sized by the payloads it just read (:data:`AHEAD_BYTES` of messages
like them, :data:`AHEAD_ROWS` at most: a queue of large payloads reads no further than
it asks), and puts those here too.

Bounded: at most :attr:`Recent.limit` bytes of rows (payload and a fixed cost each; the
node sets its share of ``serve --memory-limit``, :mod:`eomsg.core.memory`), the oldest
put here dropped first, so the node's memory stays flat however long the log.
A message of the log never changes, so a row here is the row DuckDB holds — or held:
a caller asks only for messages still pending somewhere (the collector drops none of
those), and :meth:`Recent.forget_below` drops what the collector dropped.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from eomsg.core import memory

ROW_COST = 256  # bytes a row costs beyond its payload: tuple, ints, topic, id
AHEAD_ROWS = 4096  # seqs a dense read of DuckDB reads past what was asked, at most
AHEAD_BYTES = 4 << 20  # and bytes of messages the size of those read (ROW_COST each)


class Recent:
    """Message rows by seq (:data:`~eomsg.store.messages.MessageRow`), the oldest
    dropped first past :attr:`limit` bytes (payload and ROW_COST each; a new limit holds
    from the next :meth:`add`). Rows are kept and dropped a batch at a time, as they
    were added: the applier adds every message it applies, so a row costs it a few C
    steps, not a Python one. :meth:`get` is safe from any thread without a lock (a dict
    lookup); :meth:`add` and :meth:`forget_below` take one."""

    def __init__(self, limit: int = memory.recent_limit(memory.DEFAULT_LIMIT)) -> None:
        self.limit = limit
        self._rows: dict[int, Sequence[Any]] = {}
        self._order: deque[tuple[list[int], int]] = deque()  # (seqs, cost) as added
        self._bytes = 0
        self._lock = threading.Lock()
        self.get = self._rows.get

    @property
    def size(self) -> int:
        """Bytes the batches kept count for (payload and ROW_COST a row; a row added
        again counts again until the older batch is dropped)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        """Keep ``rows`` (messages DuckDB holds) as one batch, dropping the oldest
        batches past the limit (this one too, if it alone is past it)."""
        if not rows:
            return
        seqs = list(map(_SEQ, rows))
        cost = sum(map(len, map(_PAYLOAD, rows))) + ROW_COST * len(rows)
        with self._lock:
            self._rows.update(zip(seqs, rows, strict=True))
            self._order.append((seqs, cost))
            self._bytes += cost
            while self._bytes > self.limit and self._order:
                self._drop(*self._order.popleft())

    def forget_below(self, horizon: int) -> None:
        """Drop every row below ``horizon`` (the collector dropped them from the log);
        a batch with rows on both sides keeps those above it."""
        with self._lock:
            kept = [(seqs, cost) for seqs, cost in self._order if seqs[-1] >= horizon]
            for seqs, cost in self._order:
                if seqs[-1] < horizon:
                    self._drop(seqs, cost)
            self._order = deque(kept)
            for seq in [s for s in self._rows if s < horizon]:
                del self._rows[seq]

    def _drop(self, seqs: list[int], cost: int) -> None:
        pop = self._rows.pop
        for seq in seqs:
            pop(seq, None)
        self._bytes -= cost


_SEQ, _PAYLOAD = itemgetter(0), itemgetter(-1)
