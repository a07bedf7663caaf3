"""The WAL's bound under sustained publishing, and what a checkpoint costs the
acknowledgements waiting behind it (embedded node, one publisher).

  wal  publish ``n`` messages, ``batch`` per commit, one commit at a time; after each,
       note its latency and the WAL's size

Reported: msgs/s, commit latency p50 / p99 / max (a checkpoint, DuckDB's at 16 MiB of WAL
or the node's at its ``wal_limit``, runs inside a commit and stalls it: that is the max),
the largest WAL seen (``wal_max_mb``) and how many checkpoints ran (``checkpoints``).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.embedded import LocalClient
from eomsg.node.node import NodeSettings

SCENARIOS = ("wal",)


def run(n: int, batch: int, payload: bytes, rounds: int, tmp: Path) -> dict[str, object]:
    wal = tmp / "data" / "eomsg.duckdb.wal"
    latencies: list[float] = []
    per_round: list[float] = []
    largest = checkpoints = previous = 0
    with LocalClient.open(tmp / "data", NodeSettings(tick=None)) as client:
        client.create_queue(QueueConfig.create("bench", ["bench/>"]))
        seq = 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                messages = [
                    Outgoing("bench/wal", payload, f"m{seq + k}") for k in range(min(batch, n - i))
                ]
                seq += len(messages)
                start = time.perf_counter()
                client.publish_batch(messages)
                latencies.append(time.perf_counter() - start)
                try:
                    size = wal.stat().st_size
                except FileNotFoundError:  # checkpointed meanwhile, behind the journal
                    size = 0
                checkpoints += size < previous  # a checkpoint emptied it
                previous, largest = size, max(largest, size)
            per_round.append(n / (time.perf_counter() - t0))
    latencies.sort()
    return {
        "scenario": "wal",
        "n": n,
        "batch": batch,
        "rounds_msgs_per_s": [round(r) for r in per_round],
        "msgs_per_s": round(statistics.median(per_round)),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2),
        "wal_max_mb": round(largest / (1 << 20), 1),
        "checkpoints": checkpoints,
        "payload": len(payload),
    }
