"""Broker scenarios of scripts/bench.py: a node process started here (``python -m eomsg
serve``) on a temporary data directory, driven by the Python client over its Unix
socket. Each round measures ``n`` messages and leaves the queue empty."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import eomsg
from eomsg.client.aio import AsyncClient, connect_async
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig

SCENARIOS = ("publish", "publish-c32", "consume", "e2e", "latency")
TOPIC = "bench/orders/eu"


class NodeProcess:
    def __init__(self, data: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or json.loads(line)["event"] != "ready":
            raise SystemExit("bench: eomsg serve did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def _ids(ids: bool, prefix: str, n: int) -> list[str | None]:
    return [f"{prefix}{i}" if ids else None for i in range(n)]


def _publish_pipelined(client: eomsg.Client, n: int, payload: bytes, ids: list[str | None]) -> None:
    futures = [client.publish_async(TOPIC, payload, id=ids[i]) for i in range(n)]
    for f in futures:
        f.result()


def _consume(client: eomsg.Client, n: int, prefetch: int) -> int:
    count = 0
    with client.consumer("bench", prefetch=prefetch, idle_timeout=10) as consumer:
        for msg in consumer:
            msg.delete()
            count += 1
            if count == n:
                break
    return count


async def _producers(
    data: Path, clients: int, n: int, payload: bytes, ids: bool, prefix: str, inflight: int
) -> None:
    """``clients`` connections, each publishing its share with ``inflight`` messages
    awaiting acknowledgement at a time (1: each waits for its ack, as a request handler
    would)."""
    conns: list[AsyncClient] = [await connect_async(data, window=inflight) for _ in range(clients)]

    async def produce(c: int, client: AsyncClient) -> None:
        share = range(c, n, clients)
        pending = []
        for i in share:
            msg_id = f"{prefix}{i}" if ids else None
            pending.append(await client.publish_async(TOPIC, payload, id=msg_id))
        await asyncio.gather(*pending)

    await asyncio.gather(*(produce(c, conn) for c, conn in enumerate(conns)))
    for conn in conns:
        await conn.close()


def run(
    scenario: str,
    n: int,
    payload: bytes,
    rounds: int,
    ids: bool,
    prefetch: int,
    clients: int,
    inflight: int,
    tmp: Path,
) -> dict[str, object]:
    data = tmp / "data"
    node = NodeProcess(data)
    timings: list[float] = []
    latencies: list[float] = []
    try:
        with eomsg.connect(data) as client:
            client.create_queue(QueueConfig.create("bench", ["bench/>"]))
            for r in range(rounds):
                prefix = f"r{r}-"
                id_list = _ids(ids, prefix, n)
                if scenario == "consume":
                    client.publish_batch([Outgoing(TOPIC, payload, id_list[i]) for i in range(n)])
                t0 = time.perf_counter()
                if scenario == "publish":
                    _publish_pipelined(client, n, payload, id_list)
                elif scenario == "publish-c32":
                    asyncio.run(_producers(data, clients, n, payload, ids, prefix, inflight))
                elif scenario == "consume":
                    assert _consume(client, n, prefetch) == n
                elif scenario == "e2e":
                    producer = _in_thread(
                        lambda ids=id_list: _publish_pipelined(client, n, payload, ids)  # type: ignore[misc]
                    )
                    assert _consume(client, n, prefetch) == n
                    producer.join()
                else:  # latency: one message in flight at a time
                    for i in range(n):
                        t = time.perf_counter()
                        client.publish(TOPIC, payload, id=id_list[i])
                        latencies.append(time.perf_counter() - t)
                timings.append(time.perf_counter() - t0)
                if scenario not in ("consume", "e2e"):
                    client.purge("bench")
    finally:
        node.stop()
    seconds = statistics.median(timings)
    result: dict[str, object] = {
        "scenario": scenario,
        "n": n,
        "seconds": round(seconds, 4),
        "msgs_per_s": round(n / seconds, 1),
        "us_per_msg": round(seconds / n * 1e6, 2),
        "rounds_msgs_per_s": [round(n / t) for t in timings],
        "batch": 1,
        "payload_bytes": len(payload),
        "log_size": 0,
        "ids": ids,
        "transport": "unix socket",
    }
    if scenario in ("consume", "e2e"):
        result["prefetch"] = prefetch
    if scenario == "publish-c32":
        result["clients"] = clients
        result["inflight_per_client"] = inflight
    if latencies:
        ordered = sorted(latencies)
        result["p50_ms"] = round(ordered[len(ordered) // 2] * 1e3, 3)
        result["p99_ms"] = round(ordered[int(len(ordered) * 0.99)] * 1e3, 3)
        result["max_ms"] = round(ordered[-1] * 1e3, 3)
    return result


def _in_thread(fn: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread
