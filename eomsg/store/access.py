"""Principals, grants and the audit log as the store keeps them (what they mean:
:mod:`eomsg.core.access`; the tokens' digests are not here but in
:mod:`eomsg.store.principals`).

Every change of access commits with its audit record, in one transaction
(:func:`audited`): there is no change without its record, nor a record of a change
that did not happen.
"""

from __future__ import annotations

from typing import Any

import duckdb

from eomsg.store.reads import Reads


def load_access(reads: Reads) -> tuple[dict[str, int], list[tuple[str, str, str, str]]]:
    """Every principal (name → when it was added, µs) and every grant, as
    (principal, right, kind, name)."""
    principals = dict(reads.rows("SELECT name, epoch_us(created_at) FROM principals"))
    grants = reads.rows('SELECT principal, "right", kind, name FROM grants')
    return principals, [tuple(g) for g in grants]


def audit_log(reads: Reads, limit: int, before_us: int | None = None) -> list[tuple[Any, ...]]:
    """Up to ``limit`` audit records, newest first (before ``before_us``, if given):
    (at µs, principal, action, target, detail) — and more when records share the
    last one's time: a page never splits them, so paging back from its last time
    skips none."""
    reads.sync()  # every acknowledged change, not only what DuckDB holds
    select = """SELECT epoch_us(recorded_at), principal, action, target, detail
                FROM audit WHERE {} ORDER BY recorded_at DESC, rowid DESC {}"""
    rows = reads.rows(
        select.format("? IS NULL OR recorded_at < make_timestamp(?)", "LIMIT ?"),
        [before_us, before_us, limit],
    )
    if len(rows) == limit and rows:
        last = rows[-1][0]
        ties = reads.rows(select.format("recorded_at = make_timestamp(?)", ""), [last])
        rows = [r for r in rows if r[0] != last] + ties
    return rows


def audited(job: Any, entry: tuple[int, str, str, str, str]) -> Any:
    """``job`` with the audit record ``entry`` (at µs, principal, action, target,
    detail) appended in its own transaction: the change and its record commit
    together or not at all."""

    def audited_job(conn: duckdb.DuckDBPyConnection) -> Any:
        result = job(conn) if job is not None else None
        conn.execute("INSERT INTO audit VALUES (make_timestamp(?), ?, ?, ?, ?)", list(entry))
        return result

    return audited_job


def add_principal_job(name: str, now_us: int) -> Any:
    """Add principal ``name``, holding no grant."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        conn.execute("INSERT INTO principals VALUES (?, make_timestamp(?))", [name, now_us])

    return job


def remove_principal_job(name: str) -> Any:
    """Remove principal ``name`` and every grant it holds."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        conn.execute("DELETE FROM grants WHERE principal = ?", [name])
        conn.execute("DELETE FROM principals WHERE name = ?", [name])

    return job


def grant_job(grant: tuple[str, str, str, str], given: bool) -> Any:
    """Add (``given``) or remove the grant (principal, right, kind, name)."""

    def job(conn: duckdb.DuckDBPyConnection) -> None:
        if given:
            conn.execute("INSERT INTO grants VALUES (?, ?, ?, ?)", list(grant))
        else:
            conn.execute(
                """DELETE FROM grants
                   WHERE principal = ? AND "right" = ? AND kind = ? AND name = ?""",
                list(grant),
            )

    return job
