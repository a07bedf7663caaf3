"""Exactly-once scenarios of scripts/bench.py (seeds 000 and 001), side by side.

  txn           transactional copy through a node process (``eomsg serve``): each
                transaction takes one message of queue ``a`` (fetched 16 at a time),
                inserts a row into the application's database, publishes it to ``b``
                and deletes it — 2PC with the database as commit-markable resource
                (``--app duckdb|sqlite``) or as one that prepares (``--app
                postgresql``: a throwaway server started for the run, or the one
                ``EOMSG_BENCH_PG`` names). ``--clients`` threads run transactions at
                once over one node connection (as a thread pool would), sharing group
                commits, each with its own database connection. ``--app none``: the
                node's one-phase transactions alone.
  embedded-txn  the same with the node embedded in this process.
  express       consume-into-DuckDB through a node process, as ``eomsg consume
                --into``: ``--batch`` messages per application transaction, deduplicated
                by the inbox (seed 001).

Each round checks its outcome: every message copied (or inserted) exactly once.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import bench_broker
import duckdb
import pgcluster
import psycopg

import eomsg
from eomsg.client.broker import Broker
from eomsg.client.sink import TableSink
from eomsg.client.transaction import Transaction
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.embedded import LocalClient
from eomsg.node.node import Node, NodeSettings

SCENARIOS = ("txn", "embedded-txn", "express")
APPS = ("duckdb", "sqlite", "postgresql", "none")
PREFETCH = 16


def _app(kind: str, path: Path, dsn: str) -> Any:
    conn: Any
    if kind == "duckdb":
        conn = duckdb.connect(str(path.with_suffix(".duckdb")))
    elif kind == "postgresql":
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute("DROP TABLE IF EXISTS copied")
        conn.execute("DROP TABLE IF EXISTS eomsg_txns")
        conn.execute("CREATE TABLE copied (src_seq BIGINT PRIMARY KEY, payload BYTEA NOT NULL)")
        return conn
    else:
        conn = sqlite3.connect(path.with_suffix(".sqlite"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE copied (src_seq BIGINT PRIMARY KEY, payload BLOB NOT NULL)")
    return conn


def _connections(kind: str, app: Any, path: Path, count: int, dsn: str) -> list[Any]:
    """One connection per worker: DuckDB cursors of the one database (a DuckDB file
    belongs to one process), SQLite and PostgreSQL connections of their own."""
    if kind == "duckdb":
        return [app.cursor() for _ in range(count)]
    if kind == "postgresql":
        return [psycopg.connect(dsn, autocommit=True) for _ in range(count)]
    return [
        sqlite3.connect(
            path.with_suffix(".sqlite"),
            isolation_level=None,
            check_same_thread=False,
            timeout=60,
        )
        for _ in range(count)
    ]


def _copy(participant: Broker, conn: Any, resource: Any, done: list[int]) -> None:
    """Copy ``a`` to ``b``, one message per transaction, until ``a`` is empty; messages
    are fetched PREFETCH at a time, as a consumer's prefetch would."""
    resources = [resource] if resource is not None else []
    while taken := participant.fetch("a", PREFETCH):
        for d in taken:
            with Transaction(participant, resources) as tx:
                if conn is not None:
                    mark = "%s" if isinstance(conn, psycopg.Connection) else "?"
                    conn.execute(
                        f"INSERT INTO copied VALUES ({mark}, {mark})", [d.seq, d.message.payload]
                    )
                tx.publish("b/copy", d.message.payload, headers={"src": str(d.seq)})
                tx.delete(d)
            done.append(1)


def run_txn(
    scenario: str, n: int, payload: bytes, rounds: int, clients: int, app_kind: str, tmp: Path
) -> dict[str, object]:
    node_proc = bench_broker.NodeProcess(tmp / "data") if scenario == "txn" else None
    embedded = (
        None
        if node_proc is not None
        else Node.open(tmp / "data", NodeSettings(tick=None, gc_interval=10 * 86400))
    )

    def open_broker() -> Broker:
        if embedded is not None:
            return LocalClient(embedded)
        return eomsg.connect(tmp / "data")

    admin: Broker | None = None
    participant: Broker | None = None
    timings = []
    server = None
    dsn = os.environ.get("EOMSG_BENCH_PG", "")
    if app_kind == "postgresql" and not dsn:
        server = pgcluster.Cluster()
        dsn = server.start()
    try:
        admin = open_broker()
        admin.create_queue(QueueConfig.create("a", ["a/>"]))
        admin.create_queue(QueueConfig.create("b", ["b/>"]))
        # One connection for all workers, as an application's thread pool would share it.
        participant = open_broker()
        app = _app(app_kind, tmp / "app", dsn) if app_kind != "none" else None
        conns = (
            _connections(app_kind, app, tmp / "app", clients, dsn)
            if app is not None
            else [None] * clients
        )
        resources = [_resource(app_kind, c) for c in conns]
        for r in range(rounds):
            admin.publish_batch([Outgoing("a/x", payload, f"r{r}-{i}") for i in range(n)])
            done: list[int] = []
            workers = [
                threading.Thread(target=_copy, args=(participant, conns[i], resources[i], done))
                for i in range(clients)
            ]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            timings.append(time.perf_counter() - t0)
            assert len(done) == n, f"copied {len(done)} of {n}"
            copies = admin.fetch("b", n + 1)
            assert len(copies) == n, f"{len(copies)} copies of {n}"
            admin.delete("b", [d.key for d in copies])
            if app is not None:
                rows = app.execute("SELECT count(*) FROM copied").fetchone()[0]
                assert rows == n * (r + 1), f"{rows} rows after {r + 1} rounds of {n}"
    finally:
        for broker in (participant, admin):
            if broker is not None:
                broker.close()
        if embedded is not None:
            embedded.close()
        if node_proc is not None:
            node_proc.stop()
        if server is not None:
            server.stop()
    seconds = statistics.median(timings)
    return {
        "scenario": scenario,
        "n": n,
        "seconds": round(seconds, 4),
        "tx_per_s": round(n / seconds, 1),
        "msgs_per_s": round(n / seconds, 1),
        "rounds_tx_per_s": [round(n / t) for t in timings],
        "clients": clients,
        "app": app_kind,
        "payload_bytes": len(payload),
        "transport": "unix socket" if scenario == "txn" else "in process",
    }


def _resource(kind: str, conn: Any) -> Any:
    if conn is None:
        return None
    if kind == "duckdb":
        return eomsg.DuckDBResource(conn)
    if kind == "postgresql":
        return eomsg.PostgresResource(conn)
    return eomsg.SQLiteResource(conn)


def run_express(
    n: int, payload: bytes, rounds: int, batch: int, prefetch: int, tmp: Path
) -> dict[str, object]:
    node_proc = bench_broker.NodeProcess(tmp / "data")
    timings = []
    app = duckdb.connect(str(tmp / "app.duckdb"))
    sink = TableSink(app, "orders")
    try:
        with eomsg.connect(tmp / "data") as client:
            client.create_queue(QueueConfig.create("orders", ["orders/>"]))
            for r in range(rounds):
                client.publish_batch(
                    [Outgoing("orders/eu", payload, f"r{r}-{i}") for i in range(n)]
                )
                inserted = 0
                t0 = time.perf_counter()
                with client.consumer("orders", prefetch, until_empty=True) as consumer:
                    for item in consumer.batches(batch):
                        if isinstance(item, list):
                            inserted += sink.write(item).inserted
                timings.append(time.perf_counter() - t0)
                assert inserted == n, f"inserted {inserted} of {n}"
        rows = app.execute("SELECT count(DISTINCT id), count(*) FROM orders").fetchone()
        assert rows == (n * rounds, n * rounds), rows
    finally:
        app.close()
        node_proc.stop()
    seconds = statistics.median(timings)
    return {
        "scenario": "express",
        "n": n,
        "seconds": round(seconds, 4),
        "msgs_per_s": round(n / seconds, 1),
        "us_per_msg": round(seconds / n * 1e6, 2),
        "rounds_msgs_per_s": [round(n / t) for t in timings],
        "batch": batch,
        "prefetch": prefetch,
        "app": "duckdb",
        "payload_bytes": len(payload),
        "transport": "unix socket",
    }
