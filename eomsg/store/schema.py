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

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from eomsg.core.dedup import id_hash
from eomsg.errors import SchemaTooNew


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    fill: Callable[[duckdb.DuckDBPyConnection], None] | None = None  # after the statements


def hash_publish_ids(conn: duckdb.DuckDBPyConnection) -> None:
    """Give each publish id without one its :func:`~eomsg.core.dedup.id_hash` (Python's:
    DuckDB has no CRC-32). Idempotent: migration 5 runs it, and salvage after copying a
    store from before it."""
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
)

SCHEMA_VERSION = MIGRATIONS[-1].version

# Column order and Arrow types of the insert-only tables the writer appends to.
TIMESTAMP = pa.timestamp("us")
ROW_TABLES: dict[str, pa.Schema] = {
    "messages": pa.schema(
        [
            ("seq", pa.int64()),
            ("topic", pa.string()),
            ("id", pa.string()),
            ("published_at", TIMESTAMP),
            ("expires_at", TIMESTAMP),
            ("headers", pa.string()),
            ("payload", pa.binary()),
        ]
    ),
    "publish_ids": pa.schema(  # h: id_hash(id), added by the writer (see insert_rows)
        [("id", pa.string()), ("seq", pa.int64()), ("expires_at", TIMESTAMP), ("h", pa.uint32())]
    ),
    "destinations": pa.schema([("seq", pa.int64()), ("queue_id", pa.int32())]),
    "route_runs": pa.schema([("route_id", pa.int32()), ("lo", pa.int64()), ("hi", pa.int64())]),
    "deliveries": pa.schema(
        [
            ("queue_id", pa.int32()),
            ("seq", pa.int64()),
            ("attempt", pa.int32()),
            ("due", TIMESTAMP),
            ("released", pa.bool_()),
        ]
    ),
    "delivery_runs": pa.schema(
        [
            ("queue_id", pa.int32()),
            ("first_seq", pa.int64()),
            ("last_seq", pa.int64()),
            ("due", TIMESTAMP),
        ]
    ),
    "returned": pa.schema(
        [
            ("queue_id", pa.int32()),
            ("seq", pa.int64()),
            ("attempt", pa.int32()),
            ("returned_at", TIMESTAMP),
        ]
    ),
    "txn_log": pa.schema(
        [
            ("txid", pa.string()),
            ("state", pa.string()),
            ("logged_at", TIMESTAMP),
            ("coordinator", pa.string()),
            ("principal", pa.string()),
        ]
    ),
    "txn_messages": pa.schema(
        [
            ("txid", pa.string()),
            ("idx", pa.int32()),
            ("topic", pa.string()),
            ("id", pa.string()),
            ("ttl", pa.float64()),
            ("headers", pa.string()),
            ("payload", pa.binary()),
        ]
    ),
    "txn_deletes": pa.schema(
        [("txid", pa.string()), ("queue_id", pa.int32()), ("seq", pa.int64())]
    ),
    "audit": pa.schema(
        [
            ("recorded_at", TIMESTAMP),
            ("principal", pa.string()),
            ("action", pa.string()),
            ("target", pa.string()),
            ("detail", pa.string()),
        ]
    ),
    "settled": pa.schema(
        [
            ("queue_id", pa.int32()),
            ("seq", pa.int64()),
            ("outcome", pa.int8()),
            ("settled_at", TIMESTAMP),
        ]
    ),
}


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
