"""A node's memory: the limit it is held to (``serve --memory-limit``), each part's share
of it, and what each part takes (``eomsg inspect memory``).

The parts that grow with the traffic are each bounded by their share:

* **DuckDB**'s buffers: its own ``memory_limit``; past it DuckDB spills to a temporary
  directory beside its file. (It gets more than its share when ``max-payload`` needs
  it: room for four of the largest payloads.)
* **the dedup window** (:mod:`eomsg.core.dedup`): past its share its oldest ids go to
  disk, where they are still looked up (none that can still live is forgotten).
* **the queues**: what each cursor keeps of the messages waiting and in flight, and the
  messages journaled but not yet in DuckDB. These cannot be spilled without reading
  them back for every delivery, so past their share the node applies backpressure:
  publishes are refused (:class:`~eomsg.errors.MemoryFull`, which a producer retries)
  until consumers take the queues back under it.
* **the latest messages** (:mod:`eomsg.store.recent`): those DuckDB holds, kept a while
  longer for consumers that follow close behind; past its share the oldest are dropped.

The rest of the limit is the process itself (Python, its libraries, the servers'
buffers).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DEFAULT_LIMIT = 1 << 30
LOWEST = 256 << 20  # a node needs about this much before any traffic
DUCKDB_SHARE = 0.25
DEDUP_SHARE = 0.125
QUEUES_SHARE = 0.375
RECENT_SHARE = 1 / 32


def duckdb_limit(limit: int, max_payload: int = 0) -> int:
    """DuckDB's share of ``limit`` — or more, to hold four payloads of ``max_payload``
    at once (a checkpoint holds a message twice, as its row and as the blocks it
    writes, while a read holds it again and a reader of the next one starts): a node
    that takes large payloads needs DuckDB room for them, whatever its limit. A read
    that finds no room even so runs again with the writer held between its commits
    (``Writer.alone``), and an apply waits for readers (:mod:`eomsg.store.writer`)."""
    return max(int(limit * DUCKDB_SHARE), 4 * max_payload + (64 << 20))


def dedup_limit(limit: int) -> int:
    return int(limit * DEDUP_SHARE)


def queues_limit(limit: int) -> int:
    return int(limit * QUEUES_SHARE)


def recent_limit(limit: int) -> int:
    return int(limit * RECENT_SHARE)


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """Where a node's memory goes, in bytes (``eomsg inspect memory``)."""

    limit: int
    rss: int  # the process's resident memory (0 if it cannot be read)
    duckdb: int  # DuckDB's buffers
    duckdb_limit: int  # DuckDB's memory_limit (its share, or room for four payloads)
    dedup: int  # the dedup window in memory
    dedup_ids: int  # ids it holds in memory
    spilled_ids: int  # ids it keeps on disk
    spilled_bytes: int  # the file that holds them
    queues: int  # the cursors' waiting and in-flight messages
    journaled: int  # messages journaled and not yet in DuckDB
    backlog: int  # messages waiting in the queues
    recent: int  # the latest messages kept after DuckDB holds them

    def to_json(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MemoryUse:
        """The figures a node sent; one it did not send (an older node) reads as 0."""
        values = [d.get(f.name, 0) for f in fields(cls)]
        if any(type(v) is not int or v < 0 for v in values):
            raise ValueError("every figure is a number of bytes or items")
        return cls(*values)

    @property
    def dedup_limit(self) -> int:
        return dedup_limit(self.limit)

    @property
    def queues_limit(self) -> int:
        return queues_limit(self.limit)

    @property
    def recent_limit(self) -> int:
        return recent_limit(self.limit)
