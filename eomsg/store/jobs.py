"""The writer's jobs that change the node's queues and links: each a function of the
writer's connection, run in its own transaction (:meth:`Writer.run`), so that each
change commits whole or not at all.

DuckDB has no savepoints: a job never opens a transaction of its own, and a change that
must commit with another (an audit record: :func:`eomsg.store.access.audited`) is made
by one job wrapping the other, both run in the one transaction the writer opens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import duckdb

from eomsg.core.queues import QueueConfig


def create_queue_job(config: QueueConfig, now_us: int) -> Any:
    """Add a queue with ``config``; the job returns its new id."""

    def job(conn: duckdb.DuckDBPyConnection) -> int:
        row = conn.execute(
            """INSERT INTO queues VALUES (nextval('queue_ids'), ?, ?, make_timestamp(?))
               RETURNING queue_id""",
            [config.name, json.dumps(config.to_json()), now_us],
        ).fetchone()
        assert row is not None
        return int(row[0])

    return job


def update_queue_job(queue_id: int, config: QueueConfig) -> Any:
    """Replace the config of queue ``queue_id``."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        conn.execute(
            "UPDATE queues SET config = ? WHERE queue_id = ?",
            [json.dumps(config.to_json()), queue_id],
        )

    return job


def drop_queue_job(queue_id: int) -> Any:
    """Remove a queue and every record of it, atomically."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        for table in (
            "destinations",
            "deliveries",
            "delivery_runs",
            "returned",
            "settled",
            "queue_stats",
            "queues",
        ):
            conn.execute(f"DELETE FROM {table} WHERE queue_id = ?", [queue_id])

    return job


def drop_link_job(prefix: str, route_ids: Sequence[int]) -> Any:
    """Remove a link: its ``node_meta`` entries (keys starting with ``prefix``) and
    every record of its routes, atomically."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        conn.execute("DELETE FROM node_meta WHERE starts_with(key, ?)", [prefix])
        conn.execute(
            "DELETE FROM route_runs WHERE route_id IN (SELECT unnest(?::INTEGER[]))",
            [list(route_ids)],
        )

    return job
