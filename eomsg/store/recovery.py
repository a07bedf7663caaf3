"""What a node reads of its store as it opens, to rebuild its state in memory: the
queues, what they still hold and how often each message was delivered, the live
publish ids, the transactions prepared and finished, the settled counts and what the
links' routes were given.

Each reads only the hot tables and the log range they point into, or a table whose size
is bounded by compaction (see ``docs/architecture.md``, "Hot tables and the log"): a
recovery reads state proportional to the backlog, not to the log.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import duckdb

from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import StorageError, one_line
from eomsg.store.reads import Reads

if TYPE_CHECKING:
    import pyarrow as pa

    from eomsg.core.idruns import RetainedIds


class PendingRow(NamedTuple):
    """One unsettled (queue, message) pair found on recovery; times in microseconds (a
    tuple: a recovery reads millions)."""

    queue_id: int
    seq: int
    expires_us: int | None
    attempt: int | None  # None: never delivered
    due_us: int | None
    released: bool | None


class UnreadRun(NamedTuple):
    """Pending messages of one queue found on recovery that were never handed out, in
    ascending seq order, with their expiry times in microseconds (None: none) — as
    columns: most of a large backlog is these."""

    queue_id: int
    seqs: list[int]
    expires_us: list[int | None]


@dataclass(frozen=True, slots=True)
class PreparedRow:
    """A transaction found prepared on recovery (seed 000), with its work."""

    txid: str
    coordinator: str
    principal: str | None  # who prepared it (None: before principals existed)
    prepared_us: int
    messages: list[Outgoing]
    deletes: list[tuple[int, int]]  # (queue_id, seq)


@dataclass(frozen=True, slots=True)
class SettledCounts:
    deleted: int = 0
    expired: int = 0
    dead_lettered: int = 0
    purged: int = 0


_PENDING = """
    WITH hot AS (
        SELECT d.queue_id, d.seq FROM destinations d
        ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
    ), arrived AS (
        SELECT DISTINCT queue_id, first_seq AS seq FROM delivery_runs WHERE due IS NULL
    ), firsts AS (
        SELECT h.queue_id, h.seq, 1 AS attempt, r.due, false AS released
        FROM hot h
        ASOF JOIN (SELECT * FROM delivery_runs WHERE due IS NOT NULL) r
            ON r.queue_id = h.queue_id AND h.seq >= r.first_seq
        ANTI JOIN arrived a ON a.queue_id = h.queue_id AND a.seq = h.seq
        WHERE h.seq <= r.last_seq
    ), handouts AS (
        SELECT queue_id, seq, attempt, due, released FROM deliveries
        UNION ALL SELECT * FROM firsts
    ), latest AS (
        SELECT queue_id, seq, max(attempt) AS top,
               arg_max(epoch_us(due), (attempt * 2 + released::INTEGER, due)) AS due,
               arg_max(released, attempt * 2 + released::INTEGER) AS released
        FROM handouts GROUP BY queue_id, seq
    ), handed AS (
        SELECT queue_id, seq, attempt, count(*) FILTER (NOT released) AS n
        FROM handouts GROUP BY queue_id, seq, attempt
    ), back AS (
        SELECT queue_id, seq, attempt, count(*) AS n,
               max(epoch_us(returned_at)) AS at
        FROM returned GROUP BY queue_id, seq, attempt
    ), counted AS (
        SELECT h.queue_id, h.seq,
               coalesce(max(h.attempt) FILTER (WHERE h.n > coalesce(b.n, 0)), 0)
                   AS attempt,
               max(b.at) AS at
        FROM handed h LEFT JOIN back b USING (queue_id, seq, attempt)
        GROUP BY h.queue_id, h.seq
    ), parked AS (
        SELECT queue_id, seq, attempt, max(epoch_us(due)) AS due
        FROM deliveries WHERE released GROUP BY queue_id, seq, attempt
    )
    SELECT h.queue_id, h.seq, epoch_us(m.expires_at),
           CASE WHEN c.attempt IS NULL AND a.seq IS NOT NULL THEN 0 ELSE c.attempt END,
           CASE WHEN c.attempt IS NULL AND a.seq IS NOT NULL THEN 0
                WHEN c.attempt < l.top AND cb.n IS NOT NULL AND p.due IS NOT NULL THEN p.due
                WHEN c.attempt < l.top THEN c.at
                ELSE l.due END,
           CASE WHEN c.attempt IS NULL AND a.seq IS NOT NULL THEN true
                ELSE c.attempt < l.top OR l.released END
    FROM hot h
    JOIN messages m ON m.seq = h.seq
    LEFT JOIN latest l ON l.queue_id = h.queue_id AND l.seq = h.seq
    LEFT JOIN counted c ON c.queue_id = h.queue_id AND c.seq = h.seq
    LEFT JOIN back cb ON cb.queue_id = h.queue_id AND cb.seq = h.seq AND cb.attempt = c.attempt
    LEFT JOIN parked p ON p.queue_id = h.queue_id AND p.seq = h.seq AND p.attempt = c.attempt
    LEFT JOIN arrived a ON a.queue_id = h.queue_id AND a.seq = h.seq
    WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)
    ORDER BY h.queue_id, h.seq
"""


def load_queues(reads: Reads) -> list[tuple[int, QueueConfig]]:
    """Every queue, by id (ascending), with its config."""
    rows = reads.rows("SELECT queue_id, config FROM queues ORDER BY queue_id")
    return [(qid, QueueConfig.from_json(json.loads(config))) for qid, config in rows]


def load_pending(reads: Reads) -> Iterator[PendingRow | UnreadRun]:
    """Every unsettled (queue, message) pair with its latest delivery attempt: a row
    each for those handed out before (ordered by queue then seq), the others as an
    :class:`UnreadRun` of a queue's seqs (each run ascending, a queue's runs in order;
    a large backlog comes from DuckDB as Arrow batches). Reads only the hot tables and
    the log range they point into.

    An attempt counts while it was handed out more often than it was given back
    unseen (the number is reused by the next delivery, so the two are counted): the
    attempt restored is the highest that counts (0: none did). When that is below
    the highest ever made, the message is ready again since its last return, as the
    cursor keeps it in memory — unless that attempt was itself given back unseen and
    handed out again since (a stale give-back of a delivery that timed out un-counts it
    a second time, and its number is reused): then it is as the latest release of that
    attempt left it, parked until its due (a release's due is never before an earlier
    one's: the message was handed out again only once that was past), or in flight,
    which a restart times out at once. An attempt handed out more than once (given back
    unseen between) has the due of its latest handing out.

    A take's first deliveries may be one ``delivery_runs`` row rather than a row each:
    it counts as a ``deliveries`` row (attempt 1, its due, not released) for each
    unsettled message of its queue in its range — but a message that came to the queue
    after the run (a row with no due names it) was not handed out by it; one such
    message never handed out since is restored as given back (attempt 0, ready), so
    that no later run covers it either."""
    try:
        result = reads.reader().execute(_PENDING)
        rows = result.fetchmany(FEW_PENDING)
        yield from _pending_of_rows(rows)
        if len(rows) < FEW_PENDING:
            return
        with warnings.catch_warnings():  # the copy it warns of is DuckDB's own, in C
            warnings.filterwarnings("ignore", "Arrow output on a DB-API result", UserWarning)
            batches = result.to_arrow_reader(FEW_PENDING)
        assert batches is not None  # (None only when no result is pending)
    except duckdb.Error as e:
        raise reads.error(e, "recovering pending messages") from e
    import pyarrow as pa  # (loaded: the reader is Arrow's)

    try:
        for batch in batches:
            yield from _pending_of_batch(batch)
    except (duckdb.Error, OSError, pa.ArrowException) as e:  # DuckDB's, as Arrow streams it
        if isinstance(e, duckdb.Error):
            raise reads.error(e, "recovering pending messages") from e
        raise StorageError(f"recovering pending messages failed: {one_line(e)}") from e


FEW_PENDING = 65536  # rows read as Python tuples; the rest of a backlog comes as Arrow


def _pending_of_rows(rows: Sequence[Any]) -> Iterator[PendingRow | UnreadRun]:
    """A few pending rows (no Arrow, no numpy: a command's open of a small store)."""
    unread: dict[int, UnreadRun] = {}
    for row in map(PendingRow._make, rows):
        if row.attempt is not None:
            yield row
            continue
        run = unread.get(row.queue_id)
        if run is None:
            run = unread[row.queue_id] = UnreadRun(row.queue_id, [], [])
        run.seqs.append(row.seq)
        run.expires_us.append(row.expires_us)
    yield from unread.values()


def _pending_of_batch(batch: pa.RecordBatch) -> Iterator[PendingRow | UnreadRun]:
    """A batch of a large backlog: the rows delivered before as rows, the others a run
    of columns a queue (the batch is in queue, then seq order)."""
    import numpy as np
    import pyarrow.compute as pc

    never = pc.is_null(batch.column(3))
    delivered = batch.filter(pc.invert(never))
    if delivered.num_rows:
        yield from map(
            PendingRow._make, zip(*(c.to_pylist() for c in delivered.columns), strict=True)
        )
    fresh = batch.filter(never)
    n = fresh.num_rows
    if not n:
        return
    queue_ids = fresh.column(0).to_numpy()
    seqs = fresh.column(1).to_numpy()
    expires = fresh.column(2)
    expires_us = [None] * n if expires.null_count == n else expires.to_pylist()
    cuts = [0, *(np.flatnonzero(np.diff(queue_ids)) + 1).tolist(), n]
    for lo, hi in itertools.pairwise(cuts):
        yield UnreadRun(int(queue_ids[lo]), seqs[lo:hi].tolist(), expires_us[lo:hi])


_LIVE_IDS = """FROM publish_ids
    WHERE seq >= ? AND (expires_at IS NULL OR epoch_us(expires_at) > ?)
    ORDER BY seq"""


def few_publish_ids(
    reads: Reads, now_us: int, from_seq: int, most: int
) -> list[tuple[str, int, float | None]] | None:
    """The live publish ids numbered from ``from_seq`` on as (id, seq, expiry in
    seconds or None) in seq order, if there are at most ``most`` of them; None if
    there are more (then :func:`publish_id_runs` reads them, as columns). Plain rows:
    a few ids need neither numpy nor Arrow."""
    rows = reads.rows(
        f"SELECT id, seq, epoch_us(expires_at) / 1e6 {_LIVE_IDS} LIMIT ?",
        [from_seq, now_us, most + 1],
    )
    return rows if len(rows) <= most else None


def publish_id_runs(reads: Reads, now_us: int, from_seq: int, rows: int) -> Iterator[RetainedIds]:
    """The live publish ids numbered from ``from_seq`` on, in runs of about ``rows``
    ids in seq order, each sorted by hash for the dedup window (DuckDB keeps each
    id's hash: none is computed here)."""
    import numpy as np  # (what a store of many ids is read into)
    import pyarrow as pa

    from eomsg.core.idruns import RetainedIds

    cursor = reads.cursor()  # its own: a scan left unfinished blocks checkpoints
    try:
        relation = cursor.sql(
            f"""SELECT h, seq, id,
                      coalesce(epoch_us(expires_at) / 1e6, 'NaN'::DOUBLE) AS expires
               {_LIVE_IDS}""",
            params=[from_seq, now_us],
        )
        for chunk in relation.to_arrow_reader(rows):
            if not chunk.num_rows:
                continue
            hashes = chunk.column("h").to_numpy(zero_copy_only=False).astype(np.uint32)
            order = np.argsort(hashes, kind="stable")
            yield RetainedIds(
                hashes[order],
                chunk.column("seq").to_numpy(zero_copy_only=False)[order],
                chunk.column("expires").to_numpy(zero_copy_only=False)[order],
                pa.chunked_array([chunk.column("id").take(pa.array(order))]),
            )
    except duckdb.Error as e:
        raise reads.error(e, "reading the store") from e
    finally:
        cursor.close()


def finished_txns(reads: Reads) -> dict[str, str]:
    """The final state of every finished transaction still recorded, by txid."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    return dict(reads.rows("SELECT txid, state FROM txn_log WHERE state <> 'prepared'"))


def load_prepared(reads: Reads, finished: set[str]) -> list[PreparedRow]:
    """Prepared transactions not among ``finished``, with what they publish and
    delete, in preparation order."""
    heads = reads.rows(
        """SELECT txid, coordinator, principal, epoch_us(logged_at) FROM txn_log
           WHERE state = 'prepared' ORDER BY logged_at, txid"""
    )
    open_ = [h for h in heads if h[0] not in finished]
    if not open_:
        return []
    ids = [h[0] for h in open_]
    messages: dict[str, list[Outgoing]] = {}
    for txid, topic, msg_id, ttl, headers, payload in reads.rows(
        """SELECT txid, topic, id, ttl, headers, payload FROM txn_messages
           WHERE txid IN (SELECT unnest(?::VARCHAR[])) ORDER BY txid, idx""",
        [ids],
    ):
        messages.setdefault(txid, []).append(
            Outgoing(topic, bytes(payload), msg_id, ttl, json.loads(headers) if headers else {})
        )
    deletes: dict[str, list[tuple[int, int]]] = {}
    for txid, queue_id, seq in reads.rows(
        """SELECT txid, queue_id, seq FROM txn_deletes
           WHERE txid IN (SELECT unnest(?::VARCHAR[])) ORDER BY txid, queue_id, seq""",
        [ids],
    ):
        deletes.setdefault(txid, []).append((queue_id, seq))
    return [
        PreparedRow(
            txid, coordinator, principal, at_us, messages.get(txid, []), deletes.get(txid, [])
        )
        for txid, coordinator, principal, at_us in open_
    ]


def load_counts(reads: Reads) -> dict[int, SettledCounts]:
    """Settled totals per queue: compacted totals plus records not yet compacted."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    rows = reads.rows(
        """SELECT queue_id, sum(deleted), sum(expired), sum(dead_lettered), sum(purged)
           FROM (
               SELECT queue_id, deleted, expired, dead_lettered, purged FROM queue_stats
               UNION ALL
               SELECT queue_id, (outcome = 0)::INT, (outcome = 1)::INT,
                      (outcome = 2)::INT, (outcome = 3)::INT FROM settled
           ) GROUP BY queue_id"""
    )
    return {qid: SettledCounts(*(int(v) for v in vals)) for qid, *vals in rows}


def load_route_runs(reads: Reads) -> dict[int, list[tuple[int, int]]]:
    """What the links' routes were given and not compacted yet: by route id, its
    runs of seqs (first, last), ascending. At recovery (node/links.py)."""
    runs: dict[int, list[tuple[int, int]]] = {}
    for route_id, lo, hi in reads.rows(
        "SELECT route_id, lo, hi FROM route_runs ORDER BY route_id, lo"
    ):
        runs.setdefault(route_id, []).append((lo, hi))
    return runs
