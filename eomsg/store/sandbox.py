"""``inspect sql``: one plain SELECT, read-only by construction.

A user's query runs inside the node's own database, so four walls keep it from changing
anything, each enough for what it covers:

1. DuckDB's parser must see exactly one statement of type SELECT (``FROM t``,
   ``VALUES``, ``WITH``, ``DESCRIBE``, ``SUMMARIZE`` are SELECTs too): SET, PRAGMA,
   CALL, CHECKPOINT, EXPLAIN (whose ANALYZE runs its statement), ATTACH and the rest
   are refused before anything runs. Kinds this DuckDB's Python API cannot name are
   refused as well.
2. The statement's parse tree may call only table functions that read
   (:data:`READ_ONLY_TABLE_FUNCTIONS`): ``checkpoint()``, ``enable_logging()``,
   ``query('…')`` or ``json_execute_serialized_sql`` are refused, being SELECTs that act.
3. It runs in a ``READ ONLY`` transaction, on a cursor of its own: no write commits.
4. The store locks DuckDB's configuration once it is set up (``lock_configuration``),
   and opens with file access off: no setting (``fsync``, ``memory_limit``, ``threads``)
   and no file outside the store can be reached, whatever slipped past the rest.

No secret is in the store for a query to find: the tokens of links are kept apart
(:mod:`eomsg.store.secrets`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb

from eomsg.core.text import is_text
from eomsg.errors import InvalidQuery, one_line

READ_ONLY_TABLE_FUNCTIONS = frozenset(
    {
        "range",
        "generate_series",
        "unnest",
        "repeat",
        "repeat_row",
        "json_each",
        "json_tree",
        "histogram",
        "histogram_values",
        "summary",  # SUMMARIZE
        "icu_calendar_names",
        "pg_timezone_names",
        "duckdb_columns",
        "duckdb_constraints",
        "duckdb_databases",
        "duckdb_dependencies",
        "duckdb_functions",
        "duckdb_indexes",
        "duckdb_keywords",
        "duckdb_memory",
        "duckdb_schemas",
        "duckdb_sequences",
        "duckdb_settings",
        "duckdb_tables",
        "duckdb_types",
        "duckdb_views",
        "pragma_collations",
        "pragma_database_size",
        "pragma_metadata_info",
        "pragma_platform",
        "pragma_show",
        "pragma_storage_info",
        "pragma_table_info",
        "pragma_version",
    }
)
"""Table functions a query may call: each only reads."""


def check(cursor: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise InvalidQuery unless ``sql`` is one plain SELECT calling only table functions
    that read (walls 1 and 2). Runs nothing of it."""
    if not is_text(sql):
        raise InvalidQuery("the query is not UTF-8 text")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise InvalidQuery(f"query failed: {one_line(e)}") from e
    if len(statements) != 1:
        raise InvalidQuery("give exactly one SQL statement")
    try:
        kind = statements[0].type
    except ValueError as e:  # a statement kind this DuckDB's Python API cannot name
        raise InvalidQuery(f"inspect sql is read-only: {e} (give one SELECT)") from e
    if kind is not duckdb.StatementType.SELECT:
        raise InvalidQuery(
            f"inspect sql is read-only: {kind.name} statements are refused (give one SELECT)"
        )
    try:
        (tree,) = cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchone() or ("{}",)
    except duckdb.Error as e:
        raise InvalidQuery(f"query failed: {one_line(e)}") from e
    parsed = json.loads(tree)
    if parsed.get("error"):
        raise InvalidQuery(f"query failed: {parsed.get('error_message', 'cannot parse it')}")
    for name in _table_functions(parsed):
        if name not in READ_ONLY_TABLE_FUNCTIONS:
            raise InvalidQuery(f"inspect sql is read-only: the table function {name}() is refused")


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object of a serialized parse tree, at any depth."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _table_functions(tree: Any) -> list[str]:
    """The names of the table functions a serialized parse tree calls, anywhere in it."""
    return [
        str((item.get("function") or {}).get("function_name", "?"))
        for item in _nodes(tree)
        if item.get("type") == "TABLE_FUNCTION"
    ]
