"""Three node processes linked as a chain, a fan-out and a ring, every link through a
fault proxy that drops, duplicates and reorders 10 % of its frames each; meanwhile links
are cut and restored and every node is SIGKILLed and restarted (each at least twice),
while each node's producer publishes. The history checker then finds every acknowledged
message in every node's queue exactly once, in its origin's order, and no message
twice."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import eomsg
from eomsg.chaos.check import check
from eomsg.chaos.history import Applied, Event, Outcome, Published, QueueDeclared
from eomsg.chaos.proxy import FaultProxy
from eomsg.core.queues import QueueConfig
from eomsg.errors import EomsgError
from tests.conftest import NodeProcess, eventually

pytestmark = pytest.mark.slow

TOPOLOGIES = {  # (dialler, dialled)
    "chain": [("a", "b"), ("b", "c")],
    "fan-out": [("a", "b"), ("a", "c")],
    "ring": [("a", "b"), ("b", "c"), ("c", "a")],
}
PER_NODE = 1500  # messages each node publishes
QUEUES = ("a/q", "b/q", "c/q")  # the queue q of each node: every message is for all three
FAULTS = {"drop": 0.1, "duplicate": 0.1, "reorder": 0.1}


class Cluster:
    def __init__(self, eomsg_bin: str, tmp: Path, env: dict[str, str], seed: int) -> None:
        self.eomsg_bin, self.tmp, self.env = eomsg_bin, tmp, env
        self.rng = random.Random(seed)
        self.procs: dict[str, NodeProcess] = {}
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        self.lock = threading.Lock()  # a node being restarted is not looked at meanwhile

    def start(self, name: str) -> None:
        proc = NodeProcess(
            self.eomsg_bin, self.tmp / name, self.env, "--node-name", name, "--heartbeat", "1"
        ).start()
        port = proc.tcp.rsplit(":", 1)[1]
        proc.cmd = [c if c != "tcp://127.0.0.1:0" else f"tcp://127.0.0.1:{port}" for c in proc.cmd]
        self.procs[name] = proc

    def restart(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()  # SIGKILL
        proc.start()  # on the same port: the proxies in front of it relay there

    def client(self, name: str) -> eomsg.Client:
        return eomsg.connect(self.tmp / name)

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.__exit__(None, None, None)
        for proc in self.procs.values():
            proc.kill()


@pytest.fixture
def cluster(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Cluster]:
    c = Cluster(eomsg_bin, tmp_path, cli_env, seed=7)
    yield c
    c.close()


def produce(
    cluster: Cluster, origin: str, ids: list[str], history: list[Event], stop: threading.Event
) -> None:
    """Publish ``ids`` in order as payloads, each attempt recorded in ``history`` with
    its outcome. Every other message carries its name as a publish id and is retried
    until acknowledged; the others carry no id, so only the links' own exactly-once
    transfer keeps them from arriving twice: they are sent once, and one whose publish
    failed has an unknown outcome (it may arrive, never twice)."""
    for n, name in enumerate(ids):
        with_id = n % 2 == 0
        while not stop.is_set():
            invoked = time.monotonic()
            try:
                with cluster.client(origin) as client:
                    client.publish(f"t/{origin}", name.encode(), id=name if with_id else None)
                done = time.monotonic()
                history.append(Published(name, origin, QUEUES, Outcome.OK, invoked, done))
                break
            except (EomsgError, OSError):
                # the node is down or restarting: the outcome is unknown
                done = time.monotonic()
                history.append(Published(name, origin, QUEUES, Outcome.UNKNOWN, invoked, done))
                time.sleep(0.05)
                if not with_id:
                    break
        time.sleep(0.002)


def owed(cluster: Cluster) -> int:
    total = 0
    for name in cluster.procs:
        with cluster.client(name) as client:
            total += sum(i.pending for i in client.link_info())
    return total


def drain(cluster: Cluster, name: str) -> list[str]:
    got: list[str] = []
    with cluster.client(name) as client:
        while batch := client.fetch("q", 1000):
            got.extend(m.message.payload.decode() for m in batch)
            client.delete("q", [m.key for m in batch])
    return got


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_every_message_reaches_every_queue_once_in_order_through_faults_and_kills(
    cluster: Cluster, topology: str
) -> None:
    links = TOPOLOGIES[topology]
    for name in "abc":
        cluster.start(name)
        with cluster.client(name) as client:
            client.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    for dialler, dialled in links:
        port = int(cluster.procs[dialled].tcp.rsplit(":", 1)[1])
        proxy = FaultProxy(port, seed=hash((dialler, dialled)) & 0xFFFF, **FAULTS).__enter__()
        cluster.proxies[(dialler, dialled)] = proxy
        with cluster.client(dialler) as client:
            token = cluster.procs[dialled].token
            client.add_link(dialled, f"tcp://127.0.0.1:{proxy.port}", token)

    def converged() -> bool:
        """Every node reaches every other, each linked peer by its own link: the
        routes are final (a route that changes while messages flow may reorder them)."""
        for name in "abc":
            with cluster.client(name) as client:
                info = client.link_info()
            if {n for i in info for n in i.reaches} != set("abc") - {name}:
                return False
            if any(i.peer not in i.reaches for i in info):
                return False
        return True

    assert eventually(converged, 120), "the routes never reached every node"

    published = {o: [f"{o}-{i}" for i in range(PER_NODE)] for o in "abc"}
    history: list[Event] = [QueueDeclared(q, False, True) for q in QUEUES]  # one consumer each
    stop = threading.Event()
    producers = [
        threading.Thread(target=produce, args=(cluster, o, ids, history, stop), daemon=True)
        for o, ids in published.items()
    ]
    for p in producers:
        p.start()
    kills = {name: 0 for name in "abc"}
    cuts = 0
    try:
        while any(p.is_alive() for p in producers) or min(kills.values()) < 2 or cuts < 3:
            time.sleep(cluster.rng.uniform(0.3, 1.0))
            if cluster.rng.random() < 0.5:
                name = min(kills, key=lambda n: (kills[n], cluster.rng.random()))
                cluster.restart(name)
                kills[name] += 1
            else:
                proxy = cluster.rng.choice(list(cluster.proxies.values()))
                proxy.cut()
                time.sleep(cluster.rng.uniform(0.1, 0.8))
                proxy.restore()
                cuts += 1
    finally:
        stop.set()
        for p in producers:
            p.join(60)
    acked = {e.id for e in history if isinstance(e, Published) and e.outcome is Outcome.OK}
    assert len(acked) >= 3 * PER_NODE // 2  # every retried publish was acknowledged in the end
    assert eventually(lambda: owed(cluster) == 0, 300), "the links never delivered it all"
    for name in "abc":
        history += [Applied(name, f"{name}/q", i) for i in drain(cluster, name)]
    report = check(history)
    assert report.ok, str(report)
    assert report.checked["applied"] >= 3 * len(acked)
    faults = sum((p.counts for p in cluster.proxies.values()), start=Counter())
    assert min(kills.values()) >= 2 and cuts >= 3
    assert faults["dropped"] and faults["duplicated"] and faults["reordered"], faults
