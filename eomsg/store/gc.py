"""What the node's maintenance drops from the store, each a writer's job run in its own
transaction: the hot rows of settled pairs (compaction, their outcomes folded into
``queue_stats``), the work and records of finished transactions, and the log below the
GC horizon (see ``docs/architecture.md``, "Hot tables and the log").

Each keeps what recovery and a replay still need: compaction keeps the counts, the GC
records how far it went (``gc_horizon``, ``gc_published_us``) in the same transaction
as the rows it drops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from eomsg.store.messages import US

# The delivery runs with no destination of their queue left from first_seq to last_seq:
# for each run, the lowest destination at or past its first seq (an ASOF join, not a
# range join of every run with every destination).
_DEAD_RUNS = """
    DELETE FROM delivery_runs WHERE rowid IN (
        SELECT r.rowid FROM delivery_runs r
        ASOF LEFT JOIN destinations d ON d.queue_id = r.queue_id AND r.first_seq <= d.seq
        WHERE d.seq IS NULL OR d.seq > r.last_seq)
"""


def compact_job(routes_taken: Mapping[int, int]) -> Any:
    """Drop the hot-table rows of every settled (queue, message) pair, folding their
    outcomes into ``queue_stats``; the delivery runs left with no destination of their
    queue in their range (every message they cover settled: a run partly settled
    stays); and the links' route runs that end where each route's peer took them or
    before (``routes_taken``: route id → seq; kept as one number per link, not as
    ``settled`` rows). Returns the number of rows compacted (pairs and route runs)."""

    def job(conn: duckdb.DuckDBPyConnection) -> int:
        count = 0
        if routes_taken:
            row = conn.execute(
                """DELETE FROM route_runs r
                   USING (SELECT unnest(?::INTEGER[]) AS route_id,
                                 unnest(?::BIGINT[]) AS upto) t
                   WHERE r.route_id = t.route_id AND r.hi <= t.upto""",
                [list(routes_taken), list(routes_taken.values())],
            ).fetchone()
            count = int(row[0]) if row else 0
        row = conn.execute("SELECT count(*) FROM settled").fetchone()
        settled = int(row[0]) if row else 0
        if not settled:
            return count
        count += settled
        conn.execute(
            """INSERT INTO queue_stats
               SELECT queue_id, count(*) FILTER (outcome = 0), count(*) FILTER (outcome = 1),
                      count(*) FILTER (outcome = 2), count(*) FILTER (outcome = 3)
               FROM settled GROUP BY queue_id
               ON CONFLICT (queue_id) DO UPDATE SET
                   deleted = deleted + excluded.deleted,
                   expired = expired + excluded.expired,
                   dead_lettered = dead_lettered + excluded.dead_lettered,
                   purged = purged + excluded.purged"""
        )
        for table in ("destinations", "deliveries", "returned"):
            conn.execute(
                f"""DELETE FROM {table} t USING settled s
                    WHERE t.queue_id = s.queue_id AND t.seq = s.seq"""
            )
        conn.execute("DELETE FROM settled")
        conn.execute(_DEAD_RUNS)
        return count

    return job


def forget_txns_job(cutoff_us: int) -> Any:
    """Drop the work of every finished transaction (a commit copied it into the log
    and the settlement records), and the records of those finished before
    ``cutoff_us``: past that, a coordinator no longer asks. Returns how many were
    forgotten."""

    def job(conn: duckdb.DuckDBPyConnection) -> int:
        done = "SELECT txid FROM txn_log WHERE state <> 'prepared'"
        for table in ("txn_messages", "txn_deletes"):
            conn.execute(f"DELETE FROM {table} WHERE txid IN ({done})")
        row = conn.execute(
            f"""DELETE FROM txn_log WHERE txid IN (
                    {done} AND logged_at < make_timestamp(?)) RETURNING state""",
            [cutoff_us],
        ).fetchall()
        return sum(1 for (state,) in row if state != "prepared")

    return job


def collect_garbage_job(floor: int, cutoff_us: int, now_us: int) -> Any:
    """Drop the retained log below the GC horizon: no message at or above ``floor`` is
    pending anywhere, and none published after ``cutoff_us`` is past retention.
    Also trims expired publish ids. Returns the new horizon (first seq kept)."""

    def job(conn: duckdb.DuckDBPyConnection) -> int:
        row = conn.execute(
            """SELECT least(?, coalesce(
                   (SELECT min(seq) FROM messages WHERE published_at > make_timestamp(?)),
                   ?))""",
            [floor, cutoff_us, floor],
        ).fetchone()
        horizon = int(row[0]) if row else 0
        # What a replay selecting by publish time must know it can no longer read.
        conn.execute(
            """INSERT INTO node_meta
               SELECT 'gc_published_us', epoch_us(max(published_at))::VARCHAR
               FROM messages WHERE seq < ? HAVING count(*) > 0
               ON CONFLICT (key) DO UPDATE
               SET value = greatest(value::BIGINT, excluded.value::BIGINT)::VARCHAR""",
            [horizon],
        )
        conn.execute("DELETE FROM messages WHERE seq < ?", [horizon])
        conn.execute(
            """DELETE FROM publish_ids
               WHERE (expires_at IS NOT NULL AND expires_at <= make_timestamp(?))
                  OR (expires_at IS NULL AND seq < ?)""",
            [now_us, horizon],
        )
        conn.execute(
            """INSERT INTO node_meta VALUES ('gc_at', ?::VARCHAR)
               ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
            [now_us / US],
        )
        conn.execute(
            """INSERT INTO node_meta VALUES ('gc_horizon', ?::VARCHAR)
               ON CONFLICT (key) DO UPDATE
               SET value = greatest(value::BIGINT, excluded.value::BIGINT)::VARCHAR""",
            [horizon],
        )
        return horizon

    return job
