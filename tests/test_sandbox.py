"""``inspect sql`` is read-only by construction (issue 15, item 6): one statement of every
kind DuckDB parses is refused but a plain SELECT, no SELECT that acts (a checkpoint, a
setting, logging) runs, and after all of it the node's settings are what they were —
fsync included — on an embedded node and through a served one, by the CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest

from eomsg.core.links import token_hash
from eomsg.errors import ExitCode, InvalidQuery
from eomsg.node.node import Node
from tests.conftest import NodeProcess

# One statement of each kind DuckDB's parser produces, by its StatementType name.
EVERY_KIND = {
    "INSERT": "INSERT INTO node_meta VALUES ('k', 'v')",
    "UPDATE": "UPDATE node_meta SET value = 'x'",
    "CREATE": "CREATE TABLE x (a INT)",
    "DELETE": "DELETE FROM messages",
    "PREPARE": "PREPARE p AS SELECT 1",
    "EXECUTE": "EXECUTE p",
    "ALTER": "ALTER TABLE messages ADD COLUMN c INT",
    "TRANSACTION": "BEGIN",
    "COPY": "COPY messages TO '/tmp/eomsg-leak.csv'",
    "EXPLAIN": "EXPLAIN ANALYZE SET threads = 1",
    "DROP": "DROP TABLE messages",
    "EXPORT": "EXPORT DATABASE '/tmp/eomsg-leak'",
    "PRAGMA": "PRAGMA disable_checkpoint_on_shutdown",
    "VACUUM": "VACUUM",
    "CALL": "CHECKPOINT",
    "SET": "SET memory_limit = '1MB'",
    "LOAD": "LOAD json",
    "ATTACH": "ATTACH ':memory:' AS m",
    "DETACH": "DETACH m",
    "MULTI": "PIVOT messages ON topic USING count(*)",
    "MERGE_INTO": "MERGE INTO node_meta USING node_meta s ON false WHEN MATCHED THEN DELETE",
}
# The attacks testers used, and SELECTs that act.
ATTACKS = [
    "EXPLAIN ANALYZE SET fsync_mode = 'NONE'",
    "EXPLAIN ANALYZE SET memory_limit = '1MB'",
    "EXPLAIN ANALYZE CHECKPOINT",
    "EXPLAIN SELECT 1",
    "SET threads = 1",
    "RESET memory_limit",
    "SET lock_configuration = false",
    "FORCE CHECKPOINT",
    "CALL checkpoint()",
    "SELECT * FROM checkpoint()",
    "SELECT (SELECT count(*) FROM force_checkpoint())",
    "WITH x AS (SELECT * FROM enable_logging()) SELECT * FROM x",
    "SELECT * FROM query('SELECT * FROM checkpoint()')",
    "SELECT * FROM json_execute_serialized_sql('{}')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT 1; SELECT 2",
    "UPDATE EXTENSIONS",
    "INSTALL json",
]
READS = [
    ("SELECT count(*) FROM messages", [(1,)]),
    ("FROM messages SELECT topic", [("t",)]),
    ("WITH m AS (SELECT seq FROM messages) SELECT count(*) FROM m", [(1,)]),
    ("VALUES (1), (2)", [(1,), (2,)]),
    ("SELECT 1 UNION SELECT 1", [(1,)]),
    ("SELECT count(*) FROM range(3)", [(3,)]),
    ("SELECT count(*) > 0 FROM duckdb_tables() WHERE table_name = 'messages'", [(True,)]),
]
GUARDED = [
    "threads",
    "memory_limit",
    "fsync_mode",
    "checkpoint_threshold",
    "auto_checkpoint_skip_wal_threshold",
    "enable_external_access",
]


def test_every_statement_kind_is_covered() -> None:
    """EVERY_KIND names each kind DuckDB's parser gives (a new one fails this test)."""
    for kind, sql in EVERY_KIND.items():
        assert duckdb.extract_statements(sql)[0].type.name == kind
    produced = {t.name for t in duckdb.StatementType} - {
        "INVALID", "SELECT", "ANALYZE", "VARIABLE_SET", "CREATE_FUNC", "COPY_DATABASE",
        "RELATION", "EXTENSION", "LOGICAL_PLAN", "UPDATE_EXTENSIONS",
    }  # fmt: skip
    assert produced <= set(EVERY_KIND), produced - set(EVERY_KIND)


def settings(node: Node) -> dict[str, Any]:
    rows = node.store.reads.rows(
        "SELECT name, value FROM duckdb_settings() WHERE name IN (SELECT unnest(?))", [GUARDED]
    )
    return dict(rows)


@pytest.mark.parametrize("sql", [*EVERY_KIND.values(), *ATTACKS])
def test_anything_but_a_plain_select_is_refused_and_changes_nothing(
    sql: str, node: Node, tmp_path: Path
) -> None:
    node.ingress.publish("t", b"x")
    before = settings(node)
    with pytest.raises(InvalidQuery):
        node.inspection.query(sql)
    assert settings(node) == before
    assert node.inspection.query("SELECT count(*) FROM messages")[1] == [(1,)]
    node.ingress.publish("t", b"y")  # the writer still writes
    assert not Path("/tmp/eomsg-leak.csv").exists()


def test_no_link_secret_is_in_the_store_for_a_query_to_find(node: Node) -> None:
    """The tokens of links are kept apart (store/secrets.py): whatever a query reads of
    node_meta — plainly, or through a table macro — holds none of them."""
    node.links.add_link("b", "tcp://127.0.0.1:1", "s3cret-dialling-token")
    node.links.add_link("c", None, "s3cret-accepted-token")
    secret_bits = [
        "s3cret",
        token_hash("s3cret-accepted-token"),
        token_hash("s3cret-dialling-token"),
    ]
    for sql in (
        "SELECT * FROM node_meta",
        "SELECT * FROM histogram(node_meta, value)",
        "SELECT * FROM histogram_values(node_meta, value)",
        "SELECT * FROM pragma_storage_info('node_meta')",
    ):
        shown = repr(node.inspection.query(sql)[1])
        assert not [bit for bit in secret_bits if bit in shown], sql
    kept = node.store.data_dir / "link-secrets.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert "s3cret-dialling-token" in kept.read_text()  # the token it must present


@pytest.mark.parametrize(("sql", "rows"), READS)
def test_plain_selects_run(sql: str, rows: list[tuple[Any, ...]], node: Node) -> None:
    node.ingress.publish("t", b"x")
    assert node.inspection.query(sql)[1] == rows


def test_the_configuration_is_locked_for_every_connection(node: Node) -> None:
    with pytest.raises(duckdb.InvalidInputException, match="locked"):
        node.store.reads.reader().execute("SET threads = 1")


def test_through_a_served_node_by_the_cli(
    serve: Any, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    proc: NodeProcess = serve()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [eomsg_bin, *args], env=cli_env, capture_output=True, text=True, timeout=60
        )

    guarded = f"SELECT name, value FROM duckdb_settings() WHERE name IN {tuple(GUARDED)}"
    assert run("publish", "t", "x").returncode == 0
    before = run("inspect", "sql", guarded, "--json").stdout
    assert '"fsync_mode", "value": "STANDARD"' in before.replace('"name": ', "")
    for sql in ATTACKS:
        r = run("inspect", "sql", sql)
        assert r.returncode == ExitCode.INVALID_INPUT, r.stderr
        assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1
    assert run("inspect", "sql", guarded, "--json").stdout == before
    assert proc.proc is not None and proc.proc.poll() is None


def test_the_store_reaches_no_file_but_its_own_even_past_the_sandbox(
    node: Node, tmp_path: Path
) -> None:
    """File access is turned off once the store's file is attached: a cursor of the
    node's own, which no sandbox checks, can read no other file and attach none."""
    other = tmp_path / "other.csv"
    other.write_text("a\n1\n")
    assert settings(node)["enable_external_access"] == "false"
    cursor = node.store.reads.cursor()
    for sql in (f"SELECT * FROM read_csv('{other}')", f"ATTACH '{tmp_path / 'x.duckdb'}'"):
        with pytest.raises(duckdb.PermissionException):
            cursor.execute(sql)
    assert not (tmp_path / "x.duckdb").exists()
