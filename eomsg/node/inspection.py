"""Inspection and replay reads: queue statistics, the retained log, read-only SQL, and
the log ranges and job records that replay (``eomsg.spark``) reads through the node. No
seed of its own: it reads what the others wrote, and changes nothing but a replay job's
record.

:class:`Inspection` is a component of the node (``node.inspection``); it owns no state,
and reads the rest of the node through what :class:`Kernel` names. Under the lock
discipline of :mod:`eomsg.node.state`: :meth:`Inspection.stats` takes its snapshot under
``lock`` and reads the store outside it, after applying the passage of time
(``maintenance.poll``); a job record is written under ``admin_lock``.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Protocol

from eomsg.core.access import OWNER
from eomsg.core.cursor import Outcome
from eomsg.core.memory import MemoryUse
from eomsg.core.message import Message
from eomsg.core.queues import QueueStats
from eomsg.core.rates import Rates, Totals
from eomsg.core.replay import JobEvent, JobRecord, Selection, job_transition, validate_job_id
from eomsg.core.topics import pattern_regex
from eomsg.errors import InvalidConfig
from eomsg.node.dedup import Deduplication
from eomsg.node.maintenance import Maintenance
from eomsg.node.state import Shared, to_us
from eomsg.store.store import Store

LOG_CHUNK = 64 << 20  # bytes of log one read_log returns unless told
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: the last second a log's time may name


class Kernel(Shared, Protocol):
    """What inspection needs of the rest of the node (:class:`~eomsg.node.state.NodeState`
    and the maintenance that applies time)."""

    admin_lock: threading.Lock
    dedup: Deduplication
    rates: Rates
    maintenance: Maintenance

    def totals(self) -> Totals: ...


class Inspection:
    """Reads for people and for replay."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one read-only SQL query on the store: column names and rows. An integer
        wider than 64 bits (a HUGEINT) comes as its text, as the wire could not carry it."""
        self._kernel.check_open()
        columns, rows = self._kernel.store.query(sql)
        return columns, [tuple(_narrow(v) for v in row) for row in rows]

    def deliveries(self) -> dict[str, int]:
        """Each queue's deliveries since the node opened, redeliveries included (for the
        metrics: a counter that starts again at a restart)."""
        with self._kernel.lock:
            return {name: q.delivered for name, q in self._kernel.queues.items()}

    def journal_bytes(self) -> int:
        """The bytes the journal's segment files take on disk."""
        return self._kernel.store.journal_bytes()

    def memory(self) -> MemoryUse:
        """Where the node's memory goes (:mod:`eomsg.core.memory`)."""
        with self._kernel.lock:
            queues = sum(q.cursor.nbytes for q in self._kernel.queues.values())
            backlog = sum(q.cursor.depth for q in self._kernel.queues.values())
            dedup, dedup_ids = self._kernel.dedup.nbytes, len(self._kernel.dedup)
        spill = self._kernel.dedup.spill
        return MemoryUse(
            self._kernel.settings.memory_limit,
            _rss(),
            self._kernel.store.duckdb_memory(),
            self._kernel.store.memory_limit or 0,
            dedup,
            dedup_ids,
            len(spill),
            spill.disk_bytes,
            queues,
            self._kernel.store.writer.behind,
            backlog,
            self._kernel.store.writer.recent.size,
        )

    def stats(self) -> list[QueueStats]:
        """A snapshot of every queue, by name."""
        now = self._kernel.clock()
        self._kernel.maintenance.poll(now)
        with self._kernel.lock:
            snapshot = [
                (
                    q.config,
                    q.cursor.depth,
                    q.cursor.in_flight,
                    dict(q.counts),
                    q.cursor.lowest_pending(),
                    len(q.election),
                    len(q.live_epochs),
                    q.id,
                    q.overflowed,
                )
                for q in sorted(self._kernel.queues.values(), key=lambda q: q.config.name)
            ]
            rates = self._kernel.rates.rates(now, self._kernel.totals())
        published = self._kernel.store.published_at([s[4] for s in snapshot if s[4] is not None])
        sizes = self._kernel.store.pending_bytes()
        out = []
        for config, depth, in_flight, counts, low, flows, active, queue_id, overflowed in snapshot:
            oldest = published.get(low) if low is not None else None
            in_rate, out_rate = rates.get(config.name, (None, None))
            out.append(
                QueueStats(
                    config.name,
                    config.subscriptions,
                    depth,
                    in_flight,
                    counts[Outcome.DELETED],
                    counts[Outcome.EXPIRED],
                    counts[Outcome.DEAD_LETTERED],
                    counts[Outcome.PURGED],
                    None if oldest is None else max(0.0, now - oldest),
                    config.dead_letter,
                    config.max_redeliveries,
                    config.max_active,
                    flows=flows,
                    active=active,
                    bytes=sizes.get(queue_id, 0),
                    in_rate=in_rate,
                    out_rate=out_rate,
                    max_messages=config.max_messages,
                    overflow=config.overflow,
                    overflowed=overflowed,
                    max_bytes=config.max_bytes,
                )
            )
        return out

    def log(
        self,
        pattern: str | None = None,
        from_seq: int = 0,
        limit: int = 20,
        newest: bool = False,
        to_seq: int | None = None,
        until: float | None = None,
    ) -> list[Message]:
        """Messages still in the retained log from ``from_seq`` (to ``to_seq``, published
        before ``until``, seconds since the epoch, when given), oldest first: the first
        ``limit`` of them, or with ``newest`` the last ``limit``."""
        if limit < 1:
            raise InvalidConfig("limit must be at least 1")
        if until is not None and not 0 <= until <= MAX_TIME:
            raise InvalidConfig("until must be a time: seconds since the epoch, before 9999")
        regex = None if pattern is None else pattern_regex(pattern)
        until_us = None if until is None else to_us(until)
        return self._kernel.store.log(
            regex, from_seq, limit, newest=newest, to_seq=to_seq, until_us=until_us
        )

    def browse(self, name: str, from_seq: int = 0, limit: int = 20) -> list[Message]:
        """Messages waiting in the queue (in flight included) from ``from_seq``, oldest
        first, without taking them: a look, which changes nothing."""
        if limit < 1:
            raise InvalidConfig("limit must be at least 1")
        with self._kernel.lock:
            self._kernel.check_open()
            seqs = self._kernel.queue(name).cursor.pending_from(from_seq, limit)
        found = self._kernel.egress.fetch_messages(seqs)
        return [found[s] for s in seqs if s in found]  # settled meanwhile: gone from view

    # -- replay (read by eomsg.spark) -------------------------------------------------------

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None:
        """The first and last committed seq that ``sel`` selects, or None — never past
        a message held in memory, which may yet be written below the last (so a range
        read is read the same again)."""
        self._kernel.check_open()
        with self._kernel.lock:
            ceiling = self._kernel.egress.log_ceiling()
        found = self._kernel.store.log_bounds(sel)
        if found is None or ceiling is None or found[1] <= ceiling:
            return found
        return (found[0], ceiling) if found[0] <= ceiling else None

    def log_horizon(self) -> tuple[int, int | None]:
        """The first seq the log still holds (log GC drops what is below it; 1 if it
        never dropped any) and the latest publish time among the messages it dropped, in
        microseconds (None if none)."""
        self._kernel.check_open()
        return self._kernel.store.log_horizon()

    def read_log(
        self, sel: Selection, lo: int, hi: int, max_bytes: int | None = None
    ) -> tuple[Any, int]:
        """Committed messages of ``sel`` in ``[lo, hi)``, oldest first, as an Arrow table
        of at most about ``max_bytes`` (one row at least; None: 64 MiB), and the seq to
        read on from (``hi`` when the range is exhausted). Reading the same range again
        gives the same rows: below the last committed seq the log never changes (until
        log GC)."""
        self._kernel.check_open()
        if max_bytes is None:
            max_bytes = LOG_CHUNK
        if max_bytes < 1:
            raise InvalidConfig("max_bytes must be at least 1")
        return self._kernel.store.log_chunk(sel, lo, hi, max_bytes)

    def replay_jobs(self, job_id: str | None = None) -> list[JobRecord]:
        """The replay jobs recorded against this log (or the one named), newest first."""
        self._kernel.check_open()
        return self._kernel.store.replay_jobs(job_id)

    def record_replay(self, record: JobRecord, event: JobEvent, *, by: str = OWNER) -> JobRecord:
        """Durably move job ``record.job_id`` by ``event`` (the table in core.replay) and
        return its new record, in the audit log ``by`` whom; an illegal move (finishing
        a job that is not running) raises IllegalMove and changes nothing."""
        with self._kernel.admin_lock:
            self._kernel.check_open()
            known = self._kernel.store.replay_jobs(validate_job_id(record.job_id))
            status = job_transition(known[0].status if known else None, event, record.job_id)
            # Past the last record (stored in µs), so it is the latest whatever the clock did.
            at = (
                max(self._kernel.clock(), known[0].recorded_at + 2e-6)
                if known
                else self._kernel.clock()
            )
            new = replace(record, status=status, recorded_at=at)
            entry = self._kernel.audit_entry(
                by, f"replay-{event.value}", record.job_id, status.value
            )
            self._kernel.store.writer.run(
                Store.audited(Store.record_replay_job(new), entry)
            ).result()
            return new


def _narrow(value: Any) -> Any:
    if isinstance(value, int) and not -(1 << 63) <= value < (1 << 64):
        return str(value)
    return value


def _rss() -> int:
    """This process's resident memory, in bytes (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
