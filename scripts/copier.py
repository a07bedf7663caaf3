"""Copy messages from one queue into an application table and onward to a topic, each
copy one eomsg transaction (seed 000): the row, the publish and the delete commit
together or not at all, however often this process or the node is killed.

    python scripts/copier.py --broker DATA_DIR_OR_URL (--app app.duckdb | --pg DSN) \\
        --source a --target b [--batch 1] [--idle 2] [--max N]

With ``--pg`` the application's table lives in PostgreSQL, which prepares: two-phase
commit with PREPARE TRANSACTION rather than a commit marker.

A transaction built on a delivery that is over by its commit (it timed out while the
copier was slow and was handed out again) is refused by the node and rolls back whole;
the copier counts it and goes on: the message comes again, and is copied then.

The test suite runs it under failpoints and SIGKILLs (tests/test_txn_crash.py); it is
also the transactional figure of ``scripts/bench.py``. Prints one JSON line at the end:
``{"copied": N, "transactions": T, "stale": S}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import duckdb
import psycopg

import eomsg
from eomsg.errors import StaleDelivery, TxnAborted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--app", help="the application's DuckDB file")
    where.add_argument("--pg", help="the application's PostgreSQL database (a DSN)")
    p.add_argument("--source", default="a", help="queue to copy from")
    p.add_argument("--target", default="b", help="topic to publish the copies to")
    p.add_argument("--batch", type=int, default=1, help="messages per transaction")
    p.add_argument("--idle", type=float, default=2.0, help="stop after this long with none")
    p.add_argument("--max", type=int, default=0, help="stop after this many (0: no limit)")
    args = p.parse_args(argv)

    app: Any
    if args.pg:
        app = psycopg.connect(args.pg, autocommit=True)
        app.execute(
            "CREATE TABLE IF NOT EXISTS copied (src_seq BIGINT PRIMARY KEY, payload BYTEA NOT NULL)"
        )
        resource: eomsg.DuckDBResource | eomsg.PostgresResource = eomsg.PostgresResource(app)
        # one statement: executemany would go row by row
        insert = "INSERT INTO copied SELECT * FROM unnest(%s::BIGINT[], %s::BYTEA[])"
    else:
        app = duckdb.connect(args.app)
        app.execute(
            "CREATE TABLE IF NOT EXISTS copied (src_seq BIGINT PRIMARY KEY, payload BLOB NOT NULL)"
        )
        resource = eomsg.DuckDBResource(app)
        insert = "INSERT INTO copied SELECT unnest(?::BIGINT[]), unnest(?::BLOB[])"
    copied = transactions = stale = 0
    with eomsg.connect(args.broker, name="copier") as client:
        # Settle what an earlier run left in doubt before taking anything new: the
        # messages it held come back first, so the copies keep the queue's order.
        eomsg.recover_resource(client, resource)
        prefetch = max(64, args.batch * 4)
        with client.consumer(args.source, prefetch, idle_timeout=args.idle) as consumer:
            batch: list[eomsg.Received] = []

            def copy() -> None:
                nonlocal copied, transactions, stale
                try:
                    with client.transaction(resources=[resource]) as tx:
                        tx.resource(app).execute(
                            insert, [[m.seq for m in batch], [m.payload for m in batch]]
                        )
                        for m in batch:
                            tx.publish(args.target, m.payload, headers={"src": str(m.seq)})
                            tx.delete(m)
                except TxnAborted as e:
                    if not isinstance(e.__cause__, StaleDelivery):
                        raise
                    stale += 1  # nothing took effect; the messages come again
                else:
                    copied += len(batch)
                    transactions += 1
                batch.clear()

            for msg in consumer:
                batch.append(msg)
                if len(batch) >= args.batch:
                    copy()
                if args.max and copied >= args.max:
                    break
            if batch:
                copy()
    print(json.dumps({"copied": copied, "transactions": transactions, "stale": stale}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
