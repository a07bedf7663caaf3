"""The log's messages kept in memory after DuckDB holds them, for the readers that follow
close behind the writer.

A consumer that keeps up asks for the messages just written; one that drains a backlog
asks for the next ones in sequence, a take at a time. Either way a query per take costs
DuckDB's fixed ≈ 1 ms for a few hundred rows — most of a take's time on a fast consumer.
So the writer's applier puts each message it moves out of the overlay here, and a read
of the log that had to ask DuckDB for a dense run of messages reads some further ahead
(:data:`AHEAD_ROWS`, :data:`AHEAD_BYTES`) and puts those here too.

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
from collections.abc import Iterable, Sequence
from typing import Any

from eomsg.core import memory

ROW_COST = 256  # bytes a row costs beyond its payload: tuple, ints, topic, id
AHEAD_ROWS = 4096  # seqs a dense read of DuckDB reads past what was asked, at most
AHEAD_BYTES = 4 << 20  # and payload bytes (ROW_COST each included), at most


class Recent:
    """Message rows by seq (:data:`~eomsg.store.messages.MessageRow`), the oldest
    dropped first past :attr:`limit` bytes (payload and ROW_COST each; a new limit holds
    from the next :meth:`add`). :meth:`get` is safe from any thread without a lock (a
    dict lookup); :meth:`add` and :meth:`forget_below` take one."""

    def __init__(self, limit: int = memory.recent_limit(memory.DEFAULT_LIMIT)) -> None:
        self.limit = limit
        self._rows: dict[int, Sequence[Any]] = {}
        self._order: deque[tuple[int, int]] = deque()  # (seq, cost), in the order added
        self._bytes = 0
        self._lock = threading.Lock()
        self.get = self._rows.get

    @property
    def size(self) -> int:
        """Bytes the rows held count for (payload and ROW_COST each)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, rows: Iterable[Sequence[Any]]) -> None:
        """Keep ``rows`` (messages DuckDB holds), dropping the oldest kept past the
        limit. A row already kept is kept once."""
        with self._lock:
            kept, order = self._rows, self._order
            for row in rows:
                seq = row[0]
                if seq in kept:
                    continue
                cost = len(row[-1]) + ROW_COST
                kept[seq] = row
                order.append((seq, cost))
                self._bytes += cost
            while self._bytes > self.limit and order:
                seq, cost = order.popleft()
                if kept.pop(seq, None) is not None:
                    self._bytes -= cost

    def forget_below(self, horizon: int) -> None:
        """Drop every row below ``horizon`` (the collector dropped them from the log)."""
        with self._lock:
            kept = self._rows
            for seq in [s for s in kept if s < horizon]:
                del kept[seq]
            left = deque(entry for entry in self._order if entry[0] in kept)
            self._order = left
            self._bytes = sum(cost for _, cost in left)
