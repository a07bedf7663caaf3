"""``node_meta``: the node's small named values (its identity, the links' settings, the
GC's marks, the settings ``eomsg config set`` saved), one text value per key."""

from __future__ import annotations

from typing import Any

import duckdb

from eomsg.store.opening import SAVED_SETTINGS
from eomsg.store.reads import Reads


def meta(reads: Reads, key: str) -> str | None:
    """The value of ``key``, None if it has none."""
    rows = reads.rows("SELECT value FROM node_meta WHERE key = ?", [key])
    return rows[0][0] if rows else None


def meta_prefixed(reads: Reads, prefix: str) -> dict[str, str]:
    """Every entry whose key starts with ``prefix``."""
    rows = reads.rows(
        "SELECT key, value FROM node_meta WHERE starts_with(key, ?) ORDER BY key", [prefix]
    )
    return dict(rows)


def settings(reads: Reads) -> dict[str, str]:
    """Node settings saved in the data directory (``eomsg config set``)."""
    return dict(reads.rows(SAVED_SETTINGS))


def save_meta_job(key: str, value: str) -> Any:
    """The writer's job setting one entry (upsert)."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        conn.execute(
            """INSERT INTO node_meta VALUES (?, ?)
               ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
            [key, value],
        )

    return job


def save_setting_job(name: str, value: str) -> Any:
    """The writer's job saving the node setting ``name`` (read by :func:`settings`)."""
    return save_meta_job(f"setting.{name}", value)
