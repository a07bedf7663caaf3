"""Link benchmarks: nodes (``eomsg serve``) linked over loopback TCP.

link-throughput  node a takes ``n`` publishes (an id each, 256 unacknowledged) for a
                 queue on node b; reported: a's publish rate, the rate b's queue
                 filled at (first publish to last message stored at b), and, in the
                 same run, a single node's publish rate into a local queue — once
                 with every process sharing the machine's cores, once (``pinned_``)
                 with a and the publisher on one core and b on another, as if each
                 node had a machine of one core; each ``rounds`` times on the same
                 nodes, single and linked in turn, the medians reported (the rounds'
                 figures under ``rounds``)
link-latency     a chain a → b → c; one message in flight at a time, published at a
                 and fetched by a waiting consumer on a, on b and on c: the added
                 latency of each hop, p50 / p99
link-resume      messages flow a → b; b is SIGKILLed and started again: the time from
                 b's restart to the link being up, and to the first message b takes
link-egress      a takes ``n`` publishes for a queue on b, which a consumer on b drains
                 as they come (fetch and delete, batches of 256), once with b storing
                 what a sends and once holding it in memory (``link set --egress
                 memory``): the rate b's consumer got them at, and the messages b wrote
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import eomsg
from eomsg.core.queues import QueueConfig

SCENARIOS = ("link-throughput", "link-latency", "link-resume", "link-egress")
WINDOW = 256


class Node:
    """``eomsg serve`` named ``name`` on ``tmp/name``, on a TCP port of its own."""

    def __init__(self, tmp: Path, name: str, port: int = 0, cpus: set[int] | None = None) -> None:
        self.data, self.name = tmp / name, name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eomsg", "serve", "--data", str(self.data), "--json",
             "--node-name", name, "--listen", f"tcp://127.0.0.1:{port}", "--heartbeat", "1"],
            stdout=subprocess.PIPE, text=True,
            preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)),
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or json.loads(line)["event"] != "ready":
            raise SystemExit("bench: eomsg serve did not start")
        self.tcp = json.loads(line)["listen"][1]
        self.port = int(self.tcp.rsplit(":", 1)[1])

    def client(self) -> eomsg.Client:
        return eomsg.connect(self.data)

    def link_to(self, other: Node) -> None:
        token = (other.data / "eomsg.token").read_text().strip()
        with self.client() as c:
            c.add_link(other.name, other.tcp, token)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(60)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def _until(condition: object, timeout: float = 120.0, every: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("bench: timed out")
        time.sleep(every)


def _reaches(node: Node, *names: str) -> bool:
    with node.client() as c:
        return set(names) <= {n for i in c.link_info() for n in i.reaches}


def _publish_windowed(
    client: eomsg.Client, topic: str, n: int, payload: bytes, prefix: str
) -> float:
    """Publish ``n`` messages, WINDOW unacknowledged at a time; the seconds it took."""
    start = time.perf_counter()
    pending = []
    for i in range(n):
        pending.append(client.publish_async(topic, payload, id=f"{prefix}{i}"))
        if len(pending) >= WINDOW:
            pending.pop(0).result()
    for f in pending:
        f.result()
    return time.perf_counter() - start


def _depth(node: Node, queue: str) -> int:
    with node.client() as c:
        return next(s.depth for s in c.stats() if s.name == queue)


def throughput(n: int, rounds: int, payload: bytes, tmp: Path) -> dict[str, object]:
    out: dict[str, object] = {
        "scenario": "link-throughput",
        "n": n,
        "rounds": rounds,
        "payload": len(payload),
    }
    out.update(_throughput(n, rounds, payload, tmp / "shared", None))
    if len(os.sched_getaffinity(0)) >= 2:  # as if on two machines of a core each
        pinned = _throughput(n, rounds, payload, tmp / "pinned", ({0}, {1}))
        out.update({f"pinned_{k}": v for k, v in pinned.items()})
    return out


def _throughput(
    n: int, rounds: int, payload: bytes, tmp: Path, cpus: tuple[set[int], set[int]] | None
) -> dict[str, object]:
    """a single node's publish rate, then a's for a queue on b and b's arrival rate,
    ``rounds`` times; the medians, and each round's. With ``cpus``: a and this
    publisher on the first set, b on the second."""
    mine = os.sched_getaffinity(0)
    a = Node(tmp, "a", cpus=None if cpus is None else cpus[0])
    b = Node(tmp, "b", cpus=None if cpus is None else cpus[1])
    try:
        if cpus is not None:
            os.sched_setaffinity(0, cpus[0])
        with a.client() as c:
            c.create_queue(QueueConfig("local", subscriptions=("local/>",)))
        with b.client() as c:
            c.create_queue(QueueConfig("far", subscriptions=("far/>",)))
        a.link_to(b)
        _until(lambda: _reaches(a, "b"))
        each: list[dict[str, float]] = []
        with a.client() as c:
            for r in range(rounds):
                single = _publish_windowed(c, "local/x", n, payload, f"l{r}-")
                start = time.perf_counter()
                linked = _publish_windowed(c, "far/x", n, payload, f"f{r}-")
                # b has taken them when a owes it nothing (b acknowledges what it
                # stored): asked of a over this connection, every 5 ms — a new
                # connection to b every millisecond would load both nodes' cores.
                _until(lambda c=c: not any(i.pending for i in c.link_info()), 600, 0.005)
                arrived = time.perf_counter() - start
                if _depth(b, "far") != n * (r + 1):
                    raise SystemExit("bench: b's queue does not hold what a published")
                each.append(
                    {
                        "single_node_publish_per_s": round(n / single),
                        "linked_publish_per_s": round(n / linked),
                        "link_delivered_per_s": round(n / arrived),
                        "link_vs_single": round(single / arrived, 3),
                    }
                )
        out: dict[str, object] = {
            k: round(statistics.median(e[k] for e in each), 3) for k in each[0]
        }
        out["each_round"] = each
        return out
    finally:
        os.sched_setaffinity(0, mine)
        a.stop()
        b.stop()


def latency(n: int, payload: bytes, tmp: Path) -> dict[str, object]:
    nodes = [Node(tmp, name) for name in "abc"]
    a, b, c = nodes
    try:
        for node in nodes:
            with node.client() as cl:
                cl.create_queue(QueueConfig("q", subscriptions=("lat/>",)))
        a.link_to(b)
        b.link_to(c)
        _until(lambda: _reaches(a, "b", "c") and _reaches(c, "a", "b"))
        clients = [node.client() for node in nodes]
        took: dict[str, list[float]] = {"a": [], "b": [], "c": []}
        arrived: dict[str, float] = {}
        seen = [threading.Event() for _ in nodes]

        def wait(i: int) -> None:
            name, client = "abc"[i], clients[i]
            while True:
                got = client.fetch("q", 1, wait=5)
                if not got:
                    continue
                arrived[name] = time.perf_counter()
                client.delete("q", [got[0].key])
                if got[0].message.payload == b"stop":
                    return
                seen[i].set()

        readers = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(3)]
        for t in readers:
            t.start()
        for _ in range(n):
            for e in seen:
                e.clear()
            start = time.perf_counter()
            clients[0].publish("lat/x", payload)
            for e in seen:
                e.wait(30)
            for name in "abc":
                took[name].append((arrived[name] - start) * 1000)
        clients[0].publish("lat/x", b"stop")
        for t in readers:
            t.join(30)
        for cl in clients:
            cl.close()

        def pct(xs: list[float]) -> list[float]:
            q = statistics.quantiles(xs, n=100)
            return [round(q[49], 3), round(q[98], 3)]

        hops = {
            "b_minus_a": [y - x for x, y in zip(took["a"], took["b"], strict=True)],
            "c_minus_b": [y - x for x, y in zip(took["b"], took["c"], strict=True)],
        }
        return {
            "scenario": "link-latency",
            "n": n,
            "at_a_ms_p50_p99": pct(took["a"]),
            "at_b_ms_p50_p99": pct(took["b"]),
            "at_c_ms_p50_p99": pct(took["c"]),
            "hop_ab_ms_p50_p99": pct(hops["b_minus_a"]),
            "hop_bc_ms_p50_p99": pct(hops["c_minus_b"]),
        }
    finally:
        for node in nodes:
            node.stop()


def resume(rounds: int, payload: bytes, tmp: Path) -> dict[str, object]:
    a, b = Node(tmp, "a"), Node(tmp, "b")
    up_ms, first_ms = [], []
    try:
        with b.client() as c:
            c.create_queue(QueueConfig("q", subscriptions=("r/>",)))
        a.link_to(b)
        _until(lambda: _reaches(a, "b"))
        for r in range(rounds):
            b.kill()
            with a.client() as c:
                for i in range(100):  # owed while b is down
                    c.publish_async("r/x", payload, id=f"r{r}-{i}")
                c.publish("r/x", payload, id=f"r{r}-last")
            start = time.perf_counter()
            b = Node(tmp, "b", b.port)

            def up() -> bool:
                with a.client() as c:
                    return any(i.connected for i in c.link_info())

            _until(up)
            up_ms.append((time.perf_counter() - start) * 1000)
            _until(lambda node=b: _depth(node, "q") > 0)
            first_ms.append((time.perf_counter() - start) * 1000)
            with b.client() as c:
                c.purge("q")
        return {
            "scenario": "link-resume",
            "rounds": rounds,
            "link_up_ms_p50_max": [round(statistics.median(up_ms)), round(max(up_ms))],
            "first_message_ms_p50_max": [round(statistics.median(first_ms)), round(max(first_ms))],
        }
    finally:
        a.stop()
        b.stop()


def egress(n: int, payload: bytes, tmp: Path) -> dict[str, object]:
    out: dict[str, object] = {"scenario": "link-egress", "n": n, "payload": len(payload)}
    for mode in ("store", "memory"):
        a, b = Node(tmp / mode, "a"), Node(tmp / mode, "b")
        try:
            with b.client() as c:
                c.create_queue(QueueConfig("far", subscriptions=("far/>",)))
            a.link_to(b)
            _until(lambda a=a: _reaches(a, "b"))
            with b.client() as c:
                c.set_link_egress("a", mode, 1.0)
            got = 0
            done = threading.Event()

            def drain(b: Node = b, done: threading.Event = done) -> None:
                nonlocal got
                with b.client() as c:
                    while got < n:
                        batch = c.fetch("far", 256, wait=1)
                        if batch:
                            c.delete("far", [m.key for m in batch])
                            got += len(batch)
                done.set()

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            start = time.perf_counter()
            with a.client() as c:
                _publish_windowed(c, "far/x", n, payload, "e")
            if not done.wait(600):
                raise SystemExit("bench: the consumer on b did not get every message")
            took = time.perf_counter() - start
            with b.client() as c:
                written = c.query("SELECT count(*) FROM messages")[1][0][0]
            out[f"{mode}_consumed_per_s"] = round(n / took)
            out[f"{mode}_written_at_b"] = written
        finally:
            a.stop()
            b.stop()
    return out


def run(scenario: str, n: int, rounds: int, payload: bytes, tmp: Path) -> dict[str, object]:
    if scenario == "link-throughput":
        return throughput(n, rounds, payload, tmp)
    if scenario == "link-egress":
        return egress(n, payload, tmp)
    if scenario == "link-latency":
        return latency(n, payload, tmp)
    return resume(n, payload, tmp)
