"""Replay through Spark (``eomsg spark-replay``'s job), on local[N] in this process.

``replay`` fills a fresh log with ``--n`` messages (``--payload`` bytes of JSON each),
starts one SparkSession (timed: the fixed start-up cost), then replays the whole log
``--rounds`` times into Parquet, each round a new job (timed from plan to the job's
``done`` record: the job's fixed cost plus the rows). ``--transform rows`` adds a Python
row function (the payload parsed as JSON), ``sql`` a SQL projection; ``none`` copies.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eomsg.core.message import Outgoing
from eomsg.embedded import LocalClient
from eomsg.node.node import NodeSettings

SCENARIOS = ("replay",)
TRANSFORMS = ("none", "rows", "sql")
FILL = 50_000

BENCH_FN = """
def reprice(row):
    p = row["payload"]
    return {"n": p["n"], "price": p["price"] * 1.1}
reprice.schema = "n BIGINT, price DOUBLE"
"""


def _fill(data: Path, n: int, payload: int) -> None:
    pad = "x" * max(0, payload - 40)
    with LocalClient.open(data, NodeSettings(tick=None)) as node:
        for lo in range(0, n, FILL):
            node.publish_batch(
                [
                    Outgoing("bench/orders", json.dumps({"n": i, "price": 1.5, "p": pad}).encode())
                    for i in range(lo, min(lo + FILL, n))
                ]
            )


def run(
    n: int, payload: int, rounds: int, master: str, transform: str, tmp: Path
) -> dict[str, Any]:
    import sys

    from eomsg.spark.job import ReplaySpec, execute, plan
    from eomsg.spark.session import start

    data = tmp / "data"
    _fill(data, n, payload)
    (tmp / "benchfix.py").write_text(BENCH_FN)
    sys.path.insert(0, str(tmp))

    @contextlib.contextmanager
    def node() -> Iterator[LocalClient]:
        with LocalClient.open(data, NodeSettings(tick=None)) as opened:
            yield opened

    t0 = time.perf_counter()
    spark = start(master, {"spark.ui.enabled": "false"})
    startup = time.perf_counter() - t0
    options: dict[str, Any] = {
        "none": {},
        "rows": {"transform": "benchfix:reprice", "decode": "json"},
        "sql": {"sql": "SELECT seq, id, topic, length(payload) AS size FROM messages"},
    }[transform]
    timings = []

    def one_row_job(name: str) -> float:
        spec = ReplaySpec(sink=f"parquet:{tmp / name}", job_id=name, to_seq=1, **options)
        t = time.perf_counter()
        with node() as opened:
            p = plan(spec, opened, data=data)
        execute(p, node, lambda: spark)
        return time.perf_counter() - t

    try:
        first = one_row_job("bench-first")  # also starts Spark's Python workers
        for r in range(rounds):
            spec = ReplaySpec(sink=f"parquet:{tmp / f'out-{r}'}", job_id=f"bench-{r}", **options)
            t = time.perf_counter()
            with node() as opened:
                p = plan(spec, opened, data=data)
            result = execute(p, node, lambda: spark)
            timings.append(time.perf_counter() - t)
            assert result.rows == n, result
        # The fixed cost of a job: the same job on a 1-message range.
        spec = ReplaySpec(
            sink=f"parquet:{tmp / 'out-one'}", job_id="bench-one", to_seq=1, **options
        )
        t = time.perf_counter()
        with node() as opened:
            p = plan(spec, opened, data=data)
        execute(p, node, lambda: spark)
        one = time.perf_counter() - t
    finally:
        spark.stop()
    seconds = statistics.median(timings)
    return {
        "scenario": "replay",
        "n": n,
        "transform": transform,
        "master": master,
        "seconds": round(seconds, 3),
        "rows_per_s": round(n / seconds, 1),
        "rounds_rows_per_s": [round(n / s) for s in timings],
        "spark_startup_s": round(startup, 2),
        "first_job_s": round(first, 2),
        "job_fixed_s": round(one, 2),
        "payload_bytes": payload,
        "partitions": -(-n // 100_000),
    }
