"""What a replay reads of the store: the log as Arrow chunks of a selection
(:mod:`eomsg.store.logread`), and the replay jobs' status records.

A job's records are insert-only: its latest row wins, so a status is recorded in one
insert that commits or not, and no earlier row is changed.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb

from eomsg.core.replay import JobRecord, JobStatus, Selection
from eomsg.store import logread
from eomsg.store.messages import US
from eomsg.store.reads import Reads


def log_bounds(reads: Reads, sel: Selection) -> tuple[int, int] | None:
    """The first and last seq ``sel`` selects (see :mod:`eomsg.store.logread`)."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    return reads.on_reader(lambda cursor: logread.bounds(cursor, sel), "reading the log")


def log_horizon(reads: Reads) -> tuple[int, int | None]:
    """See :func:`eomsg.store.logread.horizon`."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    return reads.on_reader(logread.horizon, "reading the log")


def log_chunk(reads: Reads, sel: Selection, lo: int, hi: int, max_bytes: int) -> tuple[Any, int]:
    """Up to about ``max_bytes`` of ``sel`` in ``[lo, hi)`` as an Arrow table, and the
    seq to go on from."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    return reads.on_reader(
        lambda cursor: logread.read_chunk(cursor, sel, lo, hi, max_bytes), "reading the log"
    )


def replay_jobs(reads: Reads, job_id: str | None = None) -> list[JobRecord]:
    """The latest record of every replay job (or of ``job_id``), newest first: each
    field the latest row's, none taken from an older row (a failed run's rows and
    digest are none, not a done run's before it)."""
    where, params = ("WHERE job_id = ?", [job_id]) if job_id is not None else ("", [])
    rows = reads.rows(
        f"""SELECT job_id, arg_max(status, recorded_at), arg_max(spec, recorded_at),
                   arg_max(lo, recorded_at), arg_max(hi, recorded_at),
                   arg_max_null(rows, recorded_at), arg_max_null(digest, recorded_at),
                   epoch_us(max(recorded_at))
            FROM replay_jobs {where} GROUP BY job_id ORDER BY max(recorded_at) DESC""",
        params,
    )
    return [
        JobRecord(jid, JobStatus(st), json.loads(spec), lo, hi, n, dg, at / US)
        for jid, st, spec, lo, hi, n, dg, at in rows
    ]


def record_replay_job(record: JobRecord) -> Any:
    """The writer's job appending one status row of a replay job (insert-only: the
    latest row wins)."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        conn.execute(
            "INSERT INTO replay_jobs VALUES (?, ?, ?, ?, ?, ?, ?, make_timestamp(?))",
            [
                record.job_id,
                record.status.value,
                json.dumps(record.spec, sort_keys=True),
                record.lo,
                record.hi,
                record.rows,
                record.digest,
                int(record.recorded_at * US),
            ],
        )

    return job
