#!/usr/bin/env python3
"""Benchmarks of eomsg, each on a fresh temporary data directory.

    python scripts/bench.py --scenario embedded-publish-batch --n 200000 --json
    python scripts/bench.py --scenario embedded-consume --n 200000 --log-size 1000000

Scenarios in this process (an embedded node, through ``LocalClient``):
  embedded-publish        one message per publish call (one commit each)
  embedded-publish-batch  --batch messages per publish call (group commit)
  embedded-consume        fetch --batch, then delete them (consume+delete), until empty

Scenarios through a node process started on a temporary data directory (``eomsg
serve``), with the Python client on its Unix socket (see scripts/bench_broker.py):
  publish      one client, publish_async per message (pipelined, bounded window)
  publish-c32  --clients (32) connections, each with --inflight (100) unacknowledged
  consume      one consumer, --prefetch (1000), deleting each message
  e2e          publish and consume at once; timed until the last message is consumed
  latency      one message in flight at a time; adds p50_ms, p99_ms and max_ms

Exactly once (scripts/bench_txn.py): ``txn`` and ``embedded-txn`` copy ``--n`` messages
from queue a to b, one transaction each, over ``--clients`` workers with an ``--app``
database (duckdb, sqlite, or none: the node's one-phase transaction); ``express``
consumes ``--n`` messages into a DuckDB table, ``--batch`` per transaction (default
1000), as ``eomsg consume --into`` does.

Linked nodes (scripts/bench_link.py): ``link-throughput`` publishes ``--n`` messages
on node a for a queue on node b and compares how fast they arrive there with a single
node's publish rate in the same run (``--rounds`` times, medians); ``link-latency``
times ``--n`` messages, one in flight, through a chain a → b → c (the latency each hop
adds); ``link-resume`` SIGKILLs
and restarts the receiving node ``--n`` times (the time until the link is up again and
the first message arrives); ``link-egress`` publishes ``--n`` messages on a for a queue
on b that a consumer there drains, with b storing them and then holding them in memory
(the rate the consumer got them at, and what b wrote).

Failover of an exclusive queue (scripts/bench_failover.py), ``--n`` failovers with
``--held`` messages held by the consumer that goes away:
  failover-unbind  the active consumer unbinds gracefully
  failover-kill    the active consumer's process is killed with SIGKILL

The WAL under sustained publishing (scripts/bench_wal.py): ``wal`` publishes ``--n``
messages, ``--batch`` per commit (default 100), one commit at a time, and reports the
commit latency p50 / p99 / max (a checkpoint stalls the commit it runs in), the largest
WAL seen and how many checkpoints ran.

Replay through Spark (scripts/bench_replay.py): ``replay`` replays a log of ``--n``
messages into Parquet on ``--master`` (local[2]) with ``--transform`` none, rows or sql;
reports rows/s, the SparkSession start-up and the fixed cost of a job.

Side by side with Redis and RabbitMQ (scripts/bench_peers.py): ``--peers`` (no
``--scenario``) publishes ``--n`` messages through each, 256 unacknowledged at a time,
consumes and acknowledges them in batches of 256, then times ``--latency-n`` (2000)
single publishes (p50 / p99); ``--rounds`` default 1 there. Runs scripts/peers.sh first
if a server or client is missing.

Scale (scripts/bench_scale.py): ``scale`` grows one embedded node's log (consumed,
retained) to each of ``--sizes`` (default 10^4,10^5,10^6,10^7) and measures publish and
consume+delete of ``--n`` messages in batches of 256 at each, with a plot (``--plot``,
default docs/img/scale.png); ``restart`` fills ``--retained`` (10^7) messages of which
``--pending`` (10^6) stay pending, serves them, and times ``eomsg serve`` after SIGKILL
right after a burst of publishes, to its ready line and to a client's first ``stats()``.

Memory over a long run (scripts/bench_soak.py): ``soak`` publishes at a steady ``--rate``
(10,000/s) for ``--seconds`` (1800) from one producer process while a consumer process
keeps the queue empty; ``soak-backlog`` publishes ``--n`` (10^7) messages flat out with no
consumer (``--drain``: then consumes them). Both sample the node's RSS, CPU, the queue's
depth and the data directory's disk use every ``--sample`` seconds, and summarise the RSS
after warm-up (``--memory-limit`` and each ``--serve-arg`` go to ``eomsg serve``).

Start-up of the command line (scripts/bench_cli.py): ``cli`` times whole ``eomsg``
processes — ``--help``, ``publish`` and ``inspect queues`` through a node — ``--n`` runs
each (20 unless given), median wall time; ``--eomsg PROGRAM`` times another install.

The embedded scenarios run as the README advises an application that publishes or
consumes in volume: ``eomsg.settle_collector()`` once the node is open
(``--default-collector``: CPython's collector as it starts).

Messages carry ids (deduplicated) unless ``--no-ids``. ``--log-size L`` first fills
the log with L messages that have already been consumed (retained for replay, not
pending), so the measured messages land on a log of that size: compare L = 10^4 and
10^6 to see that the cost per message stays flat.

Each of ``--rounds`` rounds (default 3) measures ``n`` messages on the same log; the
median is reported, with every round. Prints one JSON object (``--json``) or a line of
text; only the measured phase is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_broker  # scripts/ is on the path when this file runs as a script
import bench_cli
import bench_failover
import bench_fill
import bench_link
import bench_peers
import bench_replay
import bench_scale
import bench_soak
import bench_txn
import bench_wal
import duckdb

from eomsg.client.broker import Broker
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.embedded import LocalClient
from eomsg.node.collector import settle_collector
from eomsg.node.node import NodeSettings

SCENARIOS = (
    "embedded-publish",
    "embedded-publish-batch",
    "embedded-consume",
    *bench_broker.SCENARIOS,
    *bench_failover.SCENARIOS,
    *bench_txn.SCENARIOS,
    *bench_replay.SCENARIOS,
    *bench_wal.SCENARIOS,
    *bench_scale.SCENARIOS,
    *bench_cli.SCENARIOS,
    *bench_link.SCENARIOS,
    *bench_soak.SCENARIOS,
)
FILL_BATCH = 10_000


IDS = True
LIMIT: int | None = None  # --max-messages: the bench queue dead-letters its oldest past it
LIMIT_BYTES: int | None = None  # --max-bytes: the same, by payload bytes


def _messages(n: int, payload: bytes, start: int) -> list[Outgoing]:
    if not IDS:
        return [Outgoing("bench/orders/eu", payload) for _ in range(n)]
    return [Outgoing("bench/orders/eu", payload, f"m{start + i}") for i in range(n)]


def _publish_all(broker: Broker, n: int, payload: bytes, batch: int, start: int) -> None:
    bench_fill.publish_all(
        broker, (_messages(min(batch, n - i), payload, start + i) for i in range(0, n, batch))
    )


def run(
    scenario: str,
    n: int,
    batch: int,
    payload_size: int,
    log_size: int,
    rounds: int = 3,
    *,
    settle: bool = True,
) -> dict[str, object]:
    payload = os.urandom(payload_size // 2).hex().encode()[:payload_size]
    timings = []
    with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
        # Long retention and rare GC: the prefilled log must stay for the measurement.
        settings = NodeSettings(tick=None, retention=10 * 86400, gc_interval=10 * 86400)
        with LocalClient.open(Path(tmp) / "data", settings) as client:
            if settle:
                settle_collector()
            client.create_queue(
                QueueConfig.create("bench", ["bench/>"])
                if LIMIT is None and LIMIT_BYTES is None
                else QueueConfig.create(
                    "bench", ["bench/>"], max_messages=LIMIT, max_bytes=LIMIT_BYTES,
                    overflow="dead-letter-oldest", dead_letter="bench-old",
                )
            )  # fmt: skip
            start = 0
            if log_size:
                _publish_all(client, log_size, payload, FILL_BATCH, 0)
                bench_fill.drain(client, FILL_BATCH)
                client.node.maintenance.maintain()  # compaction between rounds, as the ticker would
                start = log_size
            for _ in range(rounds):  # each round leaves the queue empty again
                if scenario == "embedded-consume":
                    _publish_all(client, n, payload, FILL_BATCH, start)
                t0 = time.perf_counter()
                if scenario == "embedded-publish":
                    for m in _messages(n, payload, start):
                        client.publish_batch([m])
                elif scenario == "embedded-publish-batch":
                    _publish_all(client, n, payload, batch, start)
                else:
                    consumed = bench_fill.drain(client, batch)
                    assert consumed == n or LIMIT or LIMIT_BYTES, f"consumed {consumed} of {n}"
                timings.append(time.perf_counter() - t0)
                if scenario != "embedded-consume":
                    bench_fill.drain(client, FILL_BATCH)
                client.node.maintenance.maintain()  # compaction between rounds, as the ticker would
                start += n
    seconds = statistics.median(timings)
    return {
        "scenario": scenario,
        "n": n,
        "seconds": round(seconds, 4),
        "msgs_per_s": round(n / seconds, 1),
        "us_per_msg": round(seconds / n * 1e6, 2),
        "rounds_msgs_per_s": [round(n / t) for t in timings],
        "batch": 1 if scenario == "embedded-publish" else batch,
        "payload_bytes": payload_size,
        "log_size": log_size,
        "ids": IDS,
        "collector": "settled" if settle else "default",
        "max_messages": LIMIT,
        "max_bytes": LIMIT_BYTES,
        "machine": machine(),
    }


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, help="required unless --peers")
    parser.add_argument(
        "--peers", action="store_true", help="eomsg side by side with Redis and RabbitMQ"
    )
    parser.add_argument("--latency-n", type=int, default=2000, help="peers: single publishes timed")
    parser.add_argument(
        "--n", type=int, default=None, help="messages measured (default 100000; soak-backlog 10^7)"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="messages per call (default: 5000 to publish, as `publish --stdin`; 1000 to consume)",
    )
    parser.add_argument("--payload", type=int, default=256, help="payload bytes")
    parser.add_argument(
        "--log-size", type=int, default=0, help="consumed messages already in the log"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="measured rounds; the median is reported (default 3; 1 with --peers)",
    )
    parser.add_argument(
        "--no-ids", action="store_true", help="publish without message ids (no dedup)"
    )
    parser.add_argument(
        "--default-collector",
        action="store_true",
        help="embedded scenarios: leave CPython's cycle collector as it starts, rather than "
        "call eomsg.settle_collector() once the node is open, as the README advises an "
        "application that publishes or consumes in volume",
    )
    parser.add_argument(
        "--max-messages",
        type=int,
        default=None,
        help="embedded scenarios: the queue holds at most this many, dead-lettering its "
        "oldest past it (what a queue at its limit costs a publish)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=None,
        help="embedded scenarios: the same by payload bytes (both may be given)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="consumer prefetch window (default 1000; express: 2 x --batch, as "
        "`eomsg consume --into` takes ahead)",
    )
    parser.add_argument(
        "--clients", type=int, default=32, help="publish-c32: connections; txn: worker threads"
    )
    parser.add_argument(
        "--inflight",
        type=int,
        default=None,
        help="publish-c32: unacknowledged per connection (default 100); soak: unacknowledged "
        "publishes (1000); soak-backlog: unacknowledged publish calls (2)",
    )
    parser.add_argument("--held", type=int, default=100, help="failover: messages held")
    parser.add_argument(
        "--app", choices=bench_txn.APPS, default="duckdb", help="txn: the application database"
    )
    parser.add_argument("--master", default="local[2]", help="replay: the Spark master")
    parser.add_argument(
        "--transform", choices=bench_replay.TRANSFORMS, default="none", help="replay: transform"
    )
    parser.add_argument("--eomsg", default=None, help="cli: the eomsg program to time")
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="PROGRAM",
        help="cli: another eomsg program timed in turn with --eomsg, run by run",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in bench_scale.SIZES),
        help="scale: log sizes, comma-separated",
    )
    parser.add_argument(
        "--plot",
        default=None,
        help="scale: the PNG to write (default docs/img/scale.png, '' for none); soak: a PNG "
        "of RSS and depth over time",
    )
    parser.add_argument(
        "--retained", type=int, default=10_000_000, help="restart: messages in the log"
    )
    parser.add_argument(
        "--pending", type=int, default=1_000_000, help="restart: of them, still pending"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    bench_soak.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.n is None:
        args.n = 10_000_000 if args.scenario == "soak-backlog" else 100_000
    if args.inflight is None:
        args.inflight = {"soak": 1000, "soak-backlog": 2}.get(args.scenario, 100)
    if args.rounds is None:
        args.rounds = 1 if args.peers else 3
    if args.peers:
        if args.rounds < 1 or args.n < 1 or args.latency_n < 1:
            parser.error("--rounds, --n and --latency-n must be positive")
        bench_peers.ensure_installed()
        peers = bench_peers.run(args.n, args.latency_n, args.rounds, args.payload)
        peers["machine"] = machine()
        print(json.dumps(peers) if args.json else bench_peers.text(peers))
        return 0
    if args.scenario is None:
        parser.error("--scenario is required (unless --peers)")
    if args.batch is None:
        args.batch = {"embedded-consume": 1000, "express": 1000, "wal": 100}.get(
            args.scenario, 5000
        )
    if args.prefetch is None:
        args.prefetch = 2 * args.batch if args.scenario == "express" else 1000
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.n < 1 or args.batch < 1 or args.payload < 0 or args.log_size < 0:
        parser.error("--n and --batch must be positive, --payload and --log-size not negative")
    global IDS, LIMIT, LIMIT_BYTES
    IDS = not args.no_ids
    LIMIT, LIMIT_BYTES = args.max_messages, args.max_bytes
    if args.scenario in bench_soak.SCENARIOS:
        if args.scenario == "soak-backlog":  # its data directory goes under the temp dir
            bench_scale.check_room(Path(tempfile.gettempdir()), args.n, args.payload)
        return bench_soak.main(parser, args, machine())
    if args.scenario in bench_cli.SCENARIOS:
        n = args.n if "--n" in (argv if argv is not None else sys.argv) else 20
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            program = args.eomsg or bench_cli.default_program()
            cli = bench_cli.run(n, program, Path(tmp), args.baseline)
        cli["machine"] = machine()
        if args.json:
            print(json.dumps(cli))
        else:
            print(
                ", ".join(
                    f"{c} {cli[f'{c} ms']} ms"
                    + (f" (baseline {cli[f'{c} baseline ms']} ms)" if args.baseline else "")
                    for c in bench_cli.COMMANDS
                )
                + f" (median of {n}); heavy modules loaded: "
                + "; ".join(
                    f"{c}: {', '.join(cli[f'{c} loaded']) or 'none'}"  # type: ignore[arg-type]
                    for c in bench_cli.COMMANDS
                )
            )
        return 0
    if args.scenario in bench_replay.SCENARIOS:
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            replay = bench_replay.run(
                args.n, args.payload, args.rounds, args.master, args.transform, Path(tmp)
            )
        replay["machine"] = machine()
        if args.json:
            print(json.dumps(replay))
        else:
            print(
                f"replay: {replay['rows_per_s']} rows/s (n={args.n}, {args.transform}); "
                f"Spark start-up {replay['spark_startup_s']} s, "
                f"a 1-row job {replay['job_fixed_s']} s"
            )
        return 0
    if args.scenario in bench_wal.SCENARIOS:
        payload = os.urandom(args.payload // 2 + 1).hex().encode()[: args.payload]
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            wal = bench_wal.run(args.n, args.batch, payload, args.rounds, Path(tmp))
        wal["machine"] = machine()
        if args.json:
            print(json.dumps(wal))
        else:
            print(
                f"wal: {wal['msgs_per_s']:,} msgs/s, commit p50 {wal['p50_ms']} ms, p99 "
                f"{wal['p99_ms']} ms, max {wal['max_ms']} ms; WAL at most {wal['wal_max_mb']} "
                f"MiB, {wal['checkpoints']} checkpoints"
            )
        return 0
    if args.scenario in bench_scale.SCENARIOS:
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            if args.scenario == "scale":
                try:
                    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
                except ValueError:
                    parser.error("--sizes takes comma-separated numbers of messages")
                if not sizes or sizes[0] < 1:
                    parser.error("--sizes must be positive")
                bench_scale.check_room(
                    Path(tmp), sizes[-1] + len(sizes) * args.n * args.rounds, args.payload
                )
                to = "docs/img/scale.png" if args.plot is None else args.plot
                plot = Path(to) if to else None
                result = bench_scale.run_scale(
                    sizes, args.n, args.payload, args.rounds, IDS, Path(tmp), plot
                )
            else:
                if not 0 <= args.pending <= args.retained:
                    parser.error("--pending must be between 0 and --retained")
                bench_scale.check_room(Path(tmp), args.retained, args.payload)
                result = bench_scale.run_restart(
                    args.retained, args.pending, args.rounds, args.payload, IDS, Path(tmp)
                )
        result["machine"] = machine()
        print(json.dumps(result) if args.json else bench_scale.text(result))
        return 0
    if args.scenario in bench_link.SCENARIOS:
        payload = os.urandom(args.payload // 2 + 1).hex().encode()[: args.payload]
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            linked = bench_link.run(args.scenario, args.n, args.rounds, payload, Path(tmp))
        linked["machine"] = machine()
        print(json.dumps(linked) if args.json else ", ".join(f"{k} {v}" for k, v in linked.items()))
        return 0
    if args.scenario in bench_failover.SCENARIOS:
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            failover = bench_failover.run(args.scenario, args.n, args.held, Path(tmp))
        failover["machine"] = machine()
        if args.json:
            print(json.dumps(failover))
        else:
            print(
                f"{args.scenario}: activate {failover['activate_ms']} ms, "
                f"first message {failover['first_message_ms']} ms (n={args.n})"
            )
        return 0
    if args.scenario in bench_txn.SCENARIOS:
        payload = os.urandom(args.payload // 2 + 1).hex().encode()[: args.payload]
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            if args.scenario == "express":
                result = bench_txn.run_express(
                    args.n, payload, args.rounds, args.batch, args.prefetch, Path(tmp)
                )
            else:
                result = bench_txn.run_txn(
                    args.scenario, args.n, payload, args.rounds, args.clients, args.app, Path(tmp)
                )
        result["machine"] = machine()
    elif args.scenario in bench_broker.SCENARIOS:
        if args.log_size:
            parser.error("--log-size applies to the embedded scenarios only")
        payload = os.urandom(args.payload // 2 + 1).hex().encode()[: args.payload]
        with tempfile.TemporaryDirectory(prefix="eomsg-bench-") as tmp:
            result = bench_broker.run(
                args.scenario,
                args.n,
                payload,
                args.rounds,
                IDS,
                args.prefetch,
                args.clients,
                args.inflight,
                Path(tmp),
            )
        result["machine"] = machine()
    else:
        result = run(
            args.scenario,
            args.n,
            args.batch,
            args.payload,
            args.log_size,
            args.rounds,
            settle=not args.default_collector,
        )
    if args.json:
        print(json.dumps(result))
    elif "tx_per_s" in result:
        print(
            f"{result['scenario']}: {result['tx_per_s']:,.0f} tx/s (n={args.n}, "
            f"clients={args.clients}, app={args.app})"
        )
    else:
        print(
            f"{result['scenario']}: {result['msgs_per_s']:,.0f} msgs/s "
            f"({result['us_per_msg']} us/msg, n={args.n}, batch={result['batch']}, "
            f"log={args.log_size})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
