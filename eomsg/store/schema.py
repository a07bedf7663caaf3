"""The DuckDB schema, its version and the migrations that bring a data directory up to it.

Every table that grows with traffic is insert-only (seed 003's "record that the message
is deleted" rather than an UPDATE), because UPDATE churn grows DuckDB's WAL; background
compaction and garbage collection delete whole ranges instead. Hot lookups (pending seqs,
live publish ids) are in memory, rebuilt at start, so no table needs an index — DuckDB's
ART indexes must fit in memory and halve bulk-insert speed.

Each migration runs in its own transaction together with the row that records it, so a
crash leaves the schema at one version or the next, never between.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from eomsg.core.idhash import id_hash
from eomsg.errors import SchemaTooNew

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    fill: Callable[[duckdb.DuckDBPyConnection], None] | None = None  # after the statements


def hash_publish_ids(conn: duckdb.DuckDBPyConnection) -> None:
    """Give each publish id without one its :func:`~eomsg.core.idhash.id_hash` (Python's:
    DuckDB has no CRC-32). Idempotent: migration 5 runs it, and salvage after copying a
    store from before it."""
    import pyarrow as pa  # (a store from before migration 5: rare)

    rows = conn.sql("SELECT rowid AS r, id FROM publish_ids WHERE h IS NULL").to_arrow_table()
    if not rows.num_rows:
        return
    hashes = pa.array(map(id_hash, rows["id"].to_pylist()), pa.uint32(), size=rows.num_rows)
    conn.register("_eomsg_hashes", pa.table({"r": rows["r"], "h": hashes}))
    try:
        conn.execute("UPDATE publish_ids SET h = x.h FROM _eomsg_hashes x WHERE rowid = x.r")
    finally:
        conn.unregister("_eomsg_hashes")


def route_runs_from_destinations(conn: duckdb.DuckDBPyConnection) -> None:
    """Move what links owe from per-message ``destinations`` rows (negative ids: the
    links' routes) into ``route_runs``, a run of one seq each; the routes' rows in the
    other hot tables go (a route is settled by its link's ``taken`` number, never by a
    row). Idempotent: migration 7 runs it; salvage after copying a store from before
    it; and the journal's replay, in the transaction of records that a node from before
    it journaled and never put into DuckDB (replayed after the migration)."""
    conn.execute(
        """INSERT INTO route_runs
           SELECT d.queue_id, d.seq, d.seq FROM destinations d
           ANTI JOIN settled s ON s.queue_id = d.queue_id AND s.seq = d.seq
           WHERE d.queue_id < 0"""
    )
    for table in ("destinations", "deliveries", "returned", "settled", "queue_stats"):
        conn.execute(f"DELETE FROM {table} WHERE queue_id < 0")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "message log, queues and cursor records",
        (
            """CREATE TABLE node_meta (
                   key VARCHAR PRIMARY KEY,
                   value VARCHAR NOT NULL)""",
            "CREATE SEQUENCE queue_ids START 1",
            """CREATE TABLE queues (
                   queue_id INTEGER PRIMARY KEY,
                   name VARCHAR NOT NULL UNIQUE,
                   config VARCHAR NOT NULL,
                   created_at TIMESTAMP NOT NULL)""",
            """CREATE TABLE queue_stats (
                   queue_id INTEGER PRIMARY KEY,
                   deleted BIGINT NOT NULL DEFAULT 0,
                   expired BIGINT NOT NULL DEFAULT 0,
                   dead_lettered BIGINT NOT NULL DEFAULT 0,
                   purged BIGINT NOT NULL DEFAULT 0)""",
            # The retained log: one row per message, in sequence order.
            """CREATE TABLE messages (
                   seq BIGINT NOT NULL,
                   topic VARCHAR NOT NULL,
                   id VARCHAR,
                   published_at TIMESTAMP NOT NULL,
                   expires_at TIMESTAMP,
                   headers VARCHAR,
                   payload BLOB NOT NULL)""",
            # Live publish ids (seed 001), trimmed by expiry and log GC.
            """CREATE TABLE publish_ids (
                   id VARCHAR NOT NULL,
                   seq BIGINT NOT NULL,
                   expires_at TIMESTAMP)""",
            # Seed 004: the destination list persisted with the message.
            """CREATE TABLE destinations (
                   seq BIGINT NOT NULL,
                   queue_id INTEGER NOT NULL)""",
            # Seed 003: each delivery attempt, written before the message is handed out.
            """CREATE TABLE deliveries (
                   queue_id INTEGER NOT NULL,
                   seq BIGINT NOT NULL,
                   attempt INTEGER NOT NULL,
                   due TIMESTAMP NOT NULL,
                   released BOOLEAN NOT NULL)""",
            # Seed 003: "a record that the cursor considers the message deleted".
            """CREATE TABLE settled (
                   queue_id INTEGER NOT NULL,
                   seq BIGINT NOT NULL,
                   outcome TINYINT NOT NULL,
                   settled_at TIMESTAMP NOT NULL)""",
        ),
    ),
    Migration(
        2,
        "prepared transactions (seed 000)",
        (
            # One row per state a transaction reaches: 'prepared', then one final state.
            """CREATE TABLE txn_log (
                   txid VARCHAR NOT NULL,
                   state VARCHAR NOT NULL,
                   logged_at TIMESTAMP NOT NULL,
                   coordinator VARCHAR NOT NULL)""",
            # What a prepared transaction publishes: into the log only when it commits.
            """CREATE TABLE txn_messages (
                   txid VARCHAR NOT NULL,
                   idx INTEGER NOT NULL,
                   topic VARCHAR NOT NULL,
                   id VARCHAR,
                   ttl DOUBLE,
                   headers VARCHAR,
                   payload BLOB NOT NULL)""",
            # What it deletes: held meanwhile, settled only when it commits.
            """CREATE TABLE txn_deletes (
                   txid VARCHAR NOT NULL,
                   queue_id INTEGER NOT NULL,
                   seq BIGINT NOT NULL)""",
        ),
    ),
    Migration(
        3,
        "replay jobs (spark-replay)",
        (
            # One row per status a job reaches; the latest row is its state.
            """CREATE TABLE replay_jobs (
                   job_id VARCHAR NOT NULL,
                   status VARCHAR NOT NULL,
                   spec VARCHAR NOT NULL,
                   lo BIGINT NOT NULL,
                   hi BIGINT NOT NULL,
                   rows BIGINT,
                   digest VARCHAR,
                   recorded_at TIMESTAMP NOT NULL)""",
        ),
    ),
    Migration(
        4,
        "deliveries given back unseen (seed 003)",
        (
            # A delivery its consumer gave back without handing it out: it does not
            # count. One row per such give-back of (queue, seq, attempt); an attempt
            # number is reused by the next delivery, so recovery compares how many
            # times each attempt was handed out with how many times it came back.
            """CREATE TABLE returned (
                   queue_id INTEGER NOT NULL,
                   seq BIGINT NOT NULL,
                   attempt INTEGER NOT NULL,
                   returned_at TIMESTAMP NOT NULL)""",
        ),
    ),
    Migration(
        5,
        "publish ids hashed, to load sorted (seed 001)",
        ("ALTER TABLE publish_ids ADD COLUMN h UINTEGER",),
        hash_publish_ids,
    ),
    Migration(
        6,
        "principals, grants and the audit log",
        (
            # Who may connect with a token of their own (the tokens' hashes are kept
            # apart from the store: store/principals.py).
            """CREATE TABLE principals (
                   name VARCHAR NOT NULL,
                   created_at TIMESTAMP NOT NULL)""",
            # What each may do (core/access.py).
            """CREATE TABLE grants (
                   principal VARCHAR NOT NULL,
                   "right" VARCHAR NOT NULL,
                   kind VARCHAR NOT NULL,
                   name VARCHAR NOT NULL)""",
            # Who changed what: appended in the commit of the change itself.
            """CREATE TABLE audit (
                   recorded_at TIMESTAMP NOT NULL,
                   principal VARCHAR NOT NULL,
                   action VARCHAR NOT NULL,
                   target VARCHAR NOT NULL,
                   detail VARCHAR NOT NULL)""",
            # The principal that prepared a transaction: it alone may settle it (NULL:
            # prepared before principals existed — the owner's).
            "ALTER TABLE txn_log ADD COLUMN principal VARCHAR",
        ),
    ),
    Migration(
        7,
        "what links owe, as runs of seqs (seed 004)",
        (
            # A link's destination (a route, seed 004 d) for every seq from lo to hi,
            # stored in the commit of those messages: one row for a batch's run of
            # messages going the same way, not a row per message. What the peer took
            # is one number per link (node_meta link/PEER/taken); compaction drops the
            # runs it covers.
            """CREATE TABLE route_runs (
                   route_id INTEGER NOT NULL,
                   lo BIGINT NOT NULL,
                   hi BIGINT NOT NULL)""",
        ),
        route_runs_from_destinations,
    ),
    Migration(
        8,
        "first deliveries as runs of seqs (seed 003)",
        (
            # A take's first deliveries as one row (due set): every message of the queue
            # with a seq from first_seq to last_seq, unsettled by then, was handed out as
            # attempt 1 with this deadline, in that take — what a deliveries row per
            # message would say. A row with no due marks one seq (first_seq = last_seq)
            # that came to the queue after the runs covering it (dead-lettered into
            # it): no run handed it out. Compaction drops a row once no destination of
            # its queue is left in its range.
            """CREATE TABLE delivery_runs (
                   queue_id INTEGER NOT NULL,
                   first_seq BIGINT NOT NULL,
                   last_seq BIGINT NOT NULL,
                   due TIMESTAMP)""",
        ),
    ),
    # No table changes: from here on the journal may hold a delete of a run of seqs as
    # one row (RowBatch.settle_run, seed 003), which an eomsg before it cannot apply — so
    # it refuses the store (a schema newer than its own) rather than fail on the record.
    Migration(9, "deletes of runs of seqs journaled as one row (seed 003)", ()),
)

SCHEMA_VERSION = MIGRATIONS[-1].version

# Column order and Arrow types (as :func:`pyarrow.type_for_alias` names them) of the
# insert-only tables the writer appends to; as data, so that a store opened for a few rows
# does not import Arrow (:func:`arrow_schema` builds a table's schema when one is needed).
ROW_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "messages": (
        ("seq", "int64"),
        ("topic", "string"),
        ("id", "string"),
        ("published_at", "timestamp[us]"),
        ("expires_at", "timestamp[us]"),
        ("headers", "string"),
        ("payload", "binary"),
    ),
    "publish_ids": (  # h: id_hash(id), added by the writer (see insert_rows)
        ("id", "string"),
        ("seq", "int64"),
        ("expires_at", "timestamp[us]"),
        ("h", "uint32"),
    ),
    "destinations": (("seq", "int64"), ("queue_id", "int32")),
    "route_runs": (("route_id", "int32"), ("lo", "int64"), ("hi", "int64")),
    "deliveries": (
        ("queue_id", "int32"),
        ("seq", "int64"),
        ("attempt", "int32"),
        ("due", "timestamp[us]"),
        ("released", "bool"),
    ),
    "delivery_runs": (
        ("queue_id", "int32"),
        ("first_seq", "int64"),
        ("last_seq", "int64"),
        ("due", "timestamp[us]"),
    ),
    "returned": (
        ("queue_id", "int32"),
        ("seq", "int64"),
        ("attempt", "int32"),
        ("returned_at", "timestamp[us]"),
    ),
    "txn_log": (
        ("txid", "string"),
        ("state", "string"),
        ("logged_at", "timestamp[us]"),
        ("coordinator", "string"),
        ("principal", "string"),
    ),
    "txn_messages": (
        ("txid", "string"),
        ("idx", "int32"),
        ("topic", "string"),
        ("id", "string"),
        ("ttl", "double"),
        ("headers", "string"),
        ("payload", "binary"),
    ),
    "txn_deletes": (("txid", "string"), ("queue_id", "int32"), ("seq", "int64")),
    "audit": (
        ("recorded_at", "timestamp[us]"),
        ("principal", "string"),
        ("action", "string"),
        ("target", "string"),
        ("detail", "string"),
    ),
    "settled": (
        ("queue_id", "int32"),
        ("seq", "int64"),
        ("outcome", "int8"),
        ("settled_at", "timestamp[us]"),
    ),
}


@functools.cache
def arrow_schema(name: str) -> pa.Schema:
    """Table ``name`` of :data:`ROW_TABLES` as an Arrow schema."""
    import pyarrow as pa

    return pa.schema([(column, pa.type_for_alias(kind)) for column, kind in ROW_TABLES[name]])


def schema_version(conn: duckdb.DuckDBPyConnection) -> int:
    """The version recorded in the connection's database, 0 for a new one. (Asked of
    that database alone: of every database, ≈ 5 ms more a node's open.)"""
    [(exists,)] = conn.execute(
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_catalog = current_database() AND table_name = 'schema_migrations'"
    ).fetchall()
    if not exists:
        return 0
    [(version,)] = conn.execute(
        "SELECT coalesce(max(version), 0) FROM schema_migrations"
    ).fetchall()
    return int(version)


def migrate(conn: duckdb.DuckDBPyConnection) -> list[Migration]:
    """Apply the migrations this database lacks, each atomically with its record.

    Idempotent. Raises SchemaTooNew when the database is ahead of this code.
    """
    conn.execute(
        """CREATE TABLE IF NOT EXISTS schema_migrations (
               version INTEGER PRIMARY KEY,
               name VARCHAR NOT NULL,
               applied_at TIMESTAMP NOT NULL DEFAULT (now()::TIMESTAMP))"""
    )
    current = schema_version(conn)
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the data directory has schema version {current}, this eomsg knows up to "
            f"{SCHEMA_VERSION}: upgrade eomsg"
        )
    applied = []
    for migration in MIGRATIONS:
        if migration.version <= current:
            continue
        conn.execute("BEGIN TRANSACTION")
        try:
            for statement in migration.statements:
                conn.execute(statement)
            if migration.fill is not None:
                migration.fill(conn)
            conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (?, ?)",
                [migration.version, migration.name],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(migration)
    return applied
