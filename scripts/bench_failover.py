"""Failover benchmarks (seed 002) through a node process: how long after the active
consumer of an exclusive queue goes away the standby is told it is active, and receives
the first of the messages the old one held.

  failover-unbind  the active consumer unbinds (closes its consumer) in this process
  failover-kill    the active consumer is a process of its own, killed with SIGKILL

Each of ``n`` rounds: publish ``held`` messages, bind the active consumer and let it take
them without deleting, bind a standby, then make the active one go away. Reported:
``activate_ms`` (until the standby's on_active callback runs) and ``first_message_ms``
(until it holds the first redelivered message), as p50 / p99 / max.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import bench_broker

import eomsg
from eomsg.core.election import FlowEvent
from eomsg.core.queues import QueueConfig

SCENARIOS = ("failover-unbind", "failover-kill")
QUEUE = "failover"

ACTIVE = textwrap.dedent(
    """
    import sys, eomsg
    with eomsg.connect(sys.argv[1]) as client:
        with client.consumer(sys.argv[2], prefetch=int(sys.argv[3])) as consumer:
            n = 0
            for msg in consumer:  # takes them, never deletes
                n += 1
                if n == int(sys.argv[3]):
                    print("holding", flush=True)
            """
)


class _Standby:
    """A consumer on standby that notes when it becomes active and gets a message."""

    def __init__(self, client: eomsg.Client) -> None:
        self.activated = 0.0
        self.first = 0.0
        self.got = threading.Event()
        self.consumer = client.consumer(QUEUE, prefetch=1000, on_active=self._on_active)
        self.consumer.__enter__()
        assert not self.consumer.active
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _on_active(self, event: FlowEvent) -> None:
        self.activated = time.perf_counter()

    def _read(self) -> None:
        for msg in self.consumer:
            if not self.first:
                self.first = time.perf_counter()
                self.got.set()
            msg.delete()

    def close(self) -> None:
        self.consumer.close()


def _round(client: eomsg.Client, data: Path, scenario: str, held: int) -> tuple[float, float]:
    for i in range(held):
        client.publish_async(f"{QUEUE}/x", str(i).encode())
    client.publish(f"{QUEUE}/x", b"last")
    proc = None
    active: eomsg.Client | None = None
    if scenario == "failover-kill":
        proc = subprocess.Popen(
            [sys.executable, "-c", ACTIVE, str(data), QUEUE, str(held + 1)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
    else:
        active = eomsg.connect(data)
        holder = active.consumer(QUEUE, prefetch=held + 1)
        holder.__enter__()
        for count, _ in enumerate(holder, 1):
            if count == held + 1:
                break
    standby = _Standby(client)
    t0 = time.perf_counter()
    if proc is not None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    else:
        holder.close()
    if not standby.got.wait(30):
        raise SystemExit("bench: the standby never received the messages")
    while client.stats()[0].depth:  # every message deleted before the next round
        time.sleep(0.01)
    standby.close()
    if active is not None:
        active.close()
    return (standby.activated - t0) * 1e3, (standby.first - t0) * 1e3


def run(scenario: str, n: int, held: int, tmp: Path) -> dict[str, object]:
    data = tmp / "data"
    node = bench_broker.NodeProcess(data)
    activate: list[float] = []
    first: list[float] = []
    try:
        with eomsg.connect(data) as client:
            client.create_queue(QueueConfig.create(QUEUE, [f"{QUEUE}/>"], max_active=1))
            for _ in range(n):
                a, f = _round(client, data, scenario, held)
                activate.append(a)
                first.append(f)
    finally:
        node.stop()
    result: dict[str, object] = {"scenario": scenario, "n": n, "held": held + 1}
    for name, values in (("activate_ms", activate), ("first_message_ms", first)):
        ordered = sorted(values)
        result[name] = {
            "p50": round(statistics.median(ordered), 3),
            "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
            "max": round(ordered[-1], 3),
        }
    return result
