"""What the queues hold, measured: payload bytes per queue and per message, and the
settlement records compaction has yet to fold.

What a queue holds is ``destinations`` less ``settled``; each read here reads those hot rows
and the log range they point into, so its cost grows with the backlog, not with the
log. Those that must count every acknowledged write wait for the writer first
(:meth:`Reads.sync`).
"""

from __future__ import annotations

from eomsg.store.reads import Reads


def pending_bytes(reads: Reads) -> dict[int, int]:
    """Payload bytes of the messages each queue still holds, by queue id (an
    operator's look, not a per-message path)."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    rows = reads.rows(
        """WITH hot AS (
               SELECT d.queue_id, d.seq FROM destinations d
               ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
           )
           SELECT h.queue_id, sum(octet_length(m.payload))::BIGINT
           FROM hot h JOIN messages m ON m.seq = h.seq
           WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)
           GROUP BY h.queue_id"""
    )
    return {queue_id: int(total) for queue_id, total in rows}


def payload_sizes(reads: Reads, sample: int) -> dict[int, float]:
    """About the payload of the messages each queue holds, by queue id: the mean over
    its ``sample`` oldest (read at open, so that what a take reads into memory is
    bounded from the first: not a read of every payload the backlog holds)."""
    rows = reads.rows(
        """WITH hot AS (
               SELECT d.queue_id, d.seq FROM destinations d
               ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
               QUALIFY row_number() OVER (PARTITION BY d.queue_id ORDER BY d.seq) <= ?
           )
           SELECT h.queue_id, avg(octet_length(m.payload))
           FROM hot h JOIN messages m ON m.seq = h.seq
           WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)
           GROUP BY h.queue_id""",
        [sample],
    )
    return {int(queue_id): float(size) for queue_id, size in rows}


def queue_payload_sizes(reads: Reads, queue_id: int) -> dict[int, int]:
    """Payload bytes of each message queue ``queue_id`` still holds, by seq: what a
    queue given a max-bytes starts counting from. Every acknowledged write, not only
    what DuckDB holds (it waits for those); 0.24 s for 10^6 messages here, so call it
    outside the node's lock."""
    reads.sync()
    return dict(
        reads.rows(
            """WITH hot AS (
                   SELECT d.seq FROM destinations d
                   ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
                   WHERE d.queue_id = ?
               )
               SELECT m.seq, octet_length(m.payload) FROM hot JOIN messages m ON m.seq = hot.seq
               WHERE m.seq >= (SELECT coalesce(min(seq), 0) FROM hot)""",
            [queue_id],
        )
    )


def settled_rows(reads: Reads) -> int:
    """Settlement records not yet compacted."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    return int(reads.rows("SELECT count(*) FROM settled")[0][0])
