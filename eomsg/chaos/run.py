"""A fault-injection run: a node — or several, linked into a network through fault
proxies — producers and consumers in processes of their own, faults injected at random
times (reproducibly, from a seed: :mod:`eomsg.chaos.plan`), then healed and drained,
and the whole history checked (:mod:`eomsg.chaos.check`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eomsg.chaos.check import Report, check
from eomsg.chaos.clock import HOUR, WallClock
from eomsg.chaos.disk import MiB, SmallDisk
from eomsg.chaos.history import (
    Applied,
    Event,
    Outcome,
    Published,
    QueueDeclared,
    Resolved,
    Transacted,
    read,
)
from eomsg.chaos.plan import (
    FAILPOINT_WAIT,
    NODE_FAILPOINTS,
    QUEUES,
    TOPIC,
    Fault,
    Plan,
    consumer_names,
    duration,
    schedule,
)
from eomsg.chaos.powerloss import Disk, Lost, build
from eomsg.chaos.process import Node, Process
from eomsg.chaos.proxy import FaultProxy
from eomsg.chaos.workers import PARENT, RESOURCES, applied, open_database
from eomsg.errors import EomsgError
from eomsg.failpoints import ENV as FAILPOINTS_ENV

DISK_SIZE = 256 * MiB  # the nodes' disk in a run that fills it
DISK_RESERVE = 32 * MiB  # … and each node's reserve there
SETTLE = 120.0  # seconds a network is given to reach every node and learn every queue
FRAME_FAULTS = ("dropped", "duplicated", "reordered")  # what a link's proxy did, counted


def database(plan: Plan, workdir: Path, queue: str) -> str:
    """Where the consumers of ``queue`` apply (``KIND:WHERE``, eomsg.chaos.workers)."""
    role = QUEUES[queue]
    if role.db == "postgresql" and plan.postgres is not None:
        return f"postgresql:{plan.postgres}"
    if role.db == "duckdb":
        return f"duckdb:{workdir / queue}.duckdb"
    return f"sqlite:{workdir / queue}.sqlite"


@dataclass
class Result:
    """What a run found: the checker's report, the faults injected, how long it took."""

    report: Report
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "faults": dict(self.faults), "seconds": self.seconds}


class _Node(Node):
    """A node of the run, in ``data``; its clients reach it through ``proxy``, its peers
    through the proxies it is ``dialled`` by, and each follows it to the port each start
    listens on. With ``disk``, it runs on a disk that can lose power (what it wrote and
    did not sync, ``lost`` tells how much, goes with each power loss); with ``clock``, on
    a wall clock the run moves."""

    data: Path
    proxy: FaultProxy
    dialled: list[FaultProxy]
    disk: Disk | None = None
    lost: Lost
    clock: WallClock | None = None

    @property
    def token(self) -> str:
        return (self.data / "eomsg.token").read_text().strip()

    def clock_jump(self, ahead: bool) -> None:
        """Move the node's wall clock an hour — back to the machine's if it was moved,
        else ``ahead`` or back — under load, while it runs."""
        assert self.clock is not None
        self.clock.jump(-self.clock.offset if self.clock.offset else HOUR if ahead else -HOUR)

    def power_loss(self) -> None:
        assert self.disk is not None
        self.kill()
        lost = self.disk.power_off()
        self.lost.files += lost.files
        self.lost.blocks += lost.blocks

    def start(self) -> None:
        super().start()
        port = int(self.ready["listen"][1].rsplit(":", 1)[1])
        for proxy in (self.proxy, *self.dialled):
            proxy.upstream = port


def run(plan: Plan, workdir: Path, say: Callable[[str], None] = lambda _: None) -> Result:
    """Run ``plan`` in ``workdir`` (made if missing: the nodes' data, the histories,
    the applications' databases and each process's log) and check what happened."""
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    started = time.monotonic()
    faults = schedule(plan)
    small = SmallDisk(workdir / "disk", DISK_SIZE) if plan.disk_fulls else None
    try:
        result, events = _run(plan, workdir, faults, small, say)
    finally:
        if small is not None:
            small.unmount()
    acked = {e.id for e in events if isinstance(e, Published) and e.outcome is Outcome.OK}
    if len(acked) < plan.producers * plan.messages:  # a run that checked less than planned
        raise EomsgError(
            f"only {len(acked)} of {plan.producers * plan.messages} messages were published"
        )
    result.report = check(events)
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _nodes(plan: Plan, workdir: Path, root: Path) -> dict[str, _Node]:
    """The run's nodes (not started), each with its data in ``root``."""
    nodes = {}
    shim = build(workdir) if plan.power_losses else None
    for name in plan.node_names:
        data = root / name
        node = _Node(
            name,
            [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json",
             "--heartbeat", str(plan.heartbeat), "--listen", "tcp://127.0.0.1:0",
             *(["--node-name", name] if plan.nodes > 1 else [])],
            workdir,
        )  # fmt: skip
        node.data, node.dialled = data, []
        if shim is not None:
            node.disk = Disk(data, workdir / f"{name}.durable", shim)
            node.env, node.lost = node.disk.env(), Lost()
        if plan.clock_jumps:
            node.clock = WallClock(workdir, f"{name}.clock")
            node.env = node.clock.env(node.env or dict(os.environ))
        nodes[name] = node
    return nodes


def _run(
    plan: Plan,
    workdir: Path,
    faults: list[Fault],
    small: SmallDisk | None,
    say: Callable[[str], None],
) -> tuple[Result, list[Event]]:
    """The run itself: what was injected, and the history to check."""
    nodes = _nodes(plan, workdir, workdir if small is None else small.root)
    result = Result(Report())
    workers: list[Process] = []
    with contextlib.ExitStack() as proxies:
        for i, node in enumerate(nodes.values()):
            node.proxy = proxies.enter_context(
                FaultProxy(0, lose_reply=plan.lose_reply, seed=plan.seed + i)
            )
        f = plan.link_faults
        links = {
            f"{a}-{b}": proxies.enter_context(
                FaultProxy(0, drop=f, duplicate=f, reorder=f, seed=plan.seed + 100 + i)
            )
            for i, (a, b) in enumerate(plan.links)
        }
        for a, b in plan.links:
            nodes[b].dialled.append(links[f"{a}-{b}"])
        try:
            for node in nodes.values():
                node.start()
            _network(plan, nodes, links, workdir)
            producers, consumers = _workers(plan, faults, workdir, nodes)
            workers = [*consumers, *producers]
            for p in workers:
                p.start()
            for fault in faults:
                time.sleep(fault.after)
                if _inject(fault, nodes, links, producers, consumers, plan, small):
                    result.faults[fault.kind] += 1
                elif fault.kind == "failpoint_crash":  # the step not reached in time
                    result.faults["failpoint_missed"] += 1
                say(str(fault))
            _heal(nodes, workers)
            _drain(plan, nodes, workdir, producers)
            for p in workers:
                p.stop()
            prepared = _recover(plan, nodes[plan.home].data, workdir)
            taken = _settle(plan, nodes, in_doubt=bool(prepared))
        finally:
            for p in workers:
                p.stop()
            for node in nodes.values():
                node.stop()
        result.faults["reply_lost"] = sum(n.proxy.counts["replies lost"] for n in nodes.values())
        for kind in FRAME_FAULTS if links else ():
            result.faults[f"frames_{kind}"] = sum(p.counts[kind] for p in links.values())
        if plan.power_losses:
            result.faults["unsynced_blocks_dropped"] = sum(n.lost.blocks for n in nodes.values())
    return result, _history(plan, workdir, workers, prepared, taken)


def _network(
    plan: Plan, nodes: dict[str, _Node], links: dict[str, FaultProxy], workdir: Path
) -> None:
    """The run's queues made; its nodes linked (each through its link's proxy); wait
    until the routes have settled — every node reaching every other, each linked peer
    by its own link, and knowing where each queue is: a route that changes while
    messages flow may reorder them, and interest not yet learned routes nothing."""
    import eomsg
    from eomsg.core.queues import QueueConfig

    holders = {**{q: plan.home for q in QUEUES}, **plan.network_queues}
    for queue, holder in holders.items():
        role = QUEUES.get(queue)
        exclusive = role is not None and role.exclusive
        with eomsg.connect(nodes[holder].data) as client:
            if queue not in {s.name for s in client.stats()}:
                client.create_queue(QueueConfig.create(queue, (TOPIC,), max_active=int(exclusive)))
    for a, b in plan.links:
        with eomsg.connect(nodes[a].data) as client:
            if b not in {i.peer for i in client.link_info()}:
                client.add_link(b, f"tcp://127.0.0.1:{links[f'{a}-{b}'].port}", nodes[b].token)

    def settled() -> bool:
        for name, node in nodes.items():
            with eomsg.connect(node.data) as client:
                info = client.link_info()
                if {n for i in info for n in i.reaches} != set(nodes) - {name}:
                    return False
                if any(i.peer not in i.reaches for i in info):
                    return False
                if any(client.locate_queue(q) != h for q, h in holders.items()):
                    return False
        return True

    deadline = time.monotonic() + SETTLE
    while len(nodes) > 1 and not settled():
        if time.monotonic() > deadline:
            raise EomsgError(
                f"the network did not settle within {SETTLE:.0f} s: see the nodes' logs in "
                f"{workdir}"
            )
        time.sleep(0.2)


def _workers(
    plan: Plan, faults: list[Fault], workdir: Path, nodes: dict[str, _Node]
) -> tuple[list[Process], list[Process]]:
    """The producers — spread over the nodes, each publishing on its own — and the
    consumers of the run, on the queues' node or through another
    (:meth:`Plan.reaches_through`); every one reaches its node through the node's
    proxy, where a reply may be lost on the way."""
    import eomsg

    first = nodes[plan.home]
    if plan.disk_fulls:  # a reserve the small disk has room for, on every node of it
        for node in nodes.values():
            with eomsg.connect(node.data) as client:
                client.configure("disk-reserve", str(DISK_RESERVE))
    env = {**os.environ, PARENT: str(os.getpid())}
    # slow enough that every producer is still publishing when the last fault comes
    rate = max(0.1, round(plan.messages / (1.5 * max(1.0, duration(plan, faults))), 1))
    worker = [sys.executable, "-m", "eomsg.chaos.workers"]
    expect = [a for q in [*QUEUES, *plan.network_queues] for a in ("--expect", q)]
    producers = []
    for i in range(plan.producers):
        node = list(nodes.values())[i % len(nodes)]
        producers.append(
            Process(
                f"p{i}",
                [*worker, "produce", f"tcp://127.0.0.1:{node.proxy.port}", f"p{i}.jsonl",
                 f"p{i}", str(plan.messages), "--origin", node.name, "--topic", TOPIC,
                 *expect, "--rate", str(rate)],
                workdir,
                {**env, "EOMSG_TOKEN": node.token},
            )
        )  # fmt: skip
    consumers = []
    for name, q in consumer_names(plan):
        node = nodes[plan.reaches_through(name)]
        via = ["--via", plan.home] if node is not first else []
        consumers.append(
            Process(
                name,
                [*worker, "consume", f"tcp://127.0.0.1:{node.proxy.port}", f"{name}.jsonl",
                 name, q, database(plan, workdir, q), *via,
                 *(["--txn"] if QUEUES[q].transactional else [])],
                workdir,
                {**env, "EOMSG_TOKEN": node.token},
            )
        )  # fmt: skip
    return producers, consumers


def _inject(
    fault: Fault,
    nodes: dict[str, _Node],
    links: dict[str, FaultProxy],
    producers: list[Process],
    consumers: list[Process],
    plan: Plan,
    small: SmallDisk | None,
) -> bool:
    """Inject ``fault``; whether it was (a producer that has finished is not killed, a
    failpoint not reached in time is not counted)."""
    node = nodes[plan.home if fault.at is None or fault.kind == "link_cut" else fault.at]
    match fault.kind:
        case "failpoint_crash":
            step, nth = fault.failpoint
            if step in NODE_FAILPOINTS:
                return _crash_at(node, step, nth)
            transactional = [c for c in consumers if QUEUES[c.name[0]].transactional]
            return _crash_at(transactional[fault.target % len(transactional)], step, nth)
        case "node_kill":
            node.kill()
            node.start()
        case "power_loss":
            node.power_loss()
            node.start()
        case "clock_jump":
            node.clock_jump(ahead=fault.target == 0)
        case "disk_full":  # the disk every node of the run keeps its data on
            assert small is not None
            small.fill(leave=0 if fault.target == 0 else DISK_RESERVE // 2)
            time.sleep(plan.pause)
            small.empty()
        case "link_cut":
            assert fault.at is not None
            links[fault.at].cut()
            time.sleep(plan.cut_for(fault))
            links[fault.at].restore()
        case "consumer_kill":
            victim = consumers[fault.target]
            victim.kill()
            victim.start()
        case "producer_kill":
            victim = producers[fault.target]
            if not victim.alive:
                return False
            victim.kill()
            victim.start()
        case "consumer_pause":
            victim = consumers[fault.target]
            if not victim.alive:
                return False
            victim.signal(signal.SIGSTOP)
            time.sleep(plan.pause)
            victim.signal(signal.SIGCONT)
    return True


def _crash_at(victim: Process, step: str, nth: int) -> bool:
    """Start ``victim`` again set to crash (SIGKILL itself) at its ``nth`` pass through
    failpoint ``step``; wait for it to, then start it again as it was. Whether it
    crashed there (if not in time, it is killed and started again all the same)."""
    env = victim.env
    victim.kill()
    victim.env = {**(env or os.environ), FAILPOINTS_ENV: f"{step}=crash@{nth}"}
    with contextlib.suppress(EomsgError):  # a node may crash before it is ready
        victim.start()
    victim.env = env
    assert victim.proc is not None
    try:
        victim.proc.wait(FAILPOINT_WAIT)
        crashed = victim.proc.returncode == -signal.SIGKILL
    except subprocess.TimeoutExpired:
        crashed = False
    victim.kill()
    victim.start()
    return crashed


def _heal(nodes: dict[str, _Node], workers: list[Process]) -> None:
    """Every process up again: one that died is started again (a producer that has
    finished its messages is left)."""
    for node in nodes.values():
        if not node.alive:
            node.start()
    for p in workers:
        assert p.proc is not None
        if p.proc.poll() not in (None, 0):
            p.start()


def _drain(
    plan: Plan,
    nodes: dict[str, _Node],
    workdir: Path,
    producers: list[Process],
    timeout: float = 600.0,
) -> None:
    """Wait until every producer has finished, no link owes its peer anything (twice
    over, all nodes: a message one node has just handed on is owed by the next) and the
    first node's queues are empty. What the transactional consumers left in doubt is
    recovered meanwhile: a message whose delete waits in a prepared transaction is no
    consumer's until then, and the consumer that would recover it — at its next
    transaction — may have no message left to run one."""
    import eomsg

    home = nodes[plan.home]
    deadline = time.monotonic() + timeout
    next_recovery = time.monotonic()
    delivered = 0  # consecutive looks at which no link owed anything
    while time.monotonic() < deadline:
        if not any(p.alive for p in producers):
            for p in producers:
                assert p.proc is not None
                if p.proc.returncode != 0:
                    raise EomsgError(
                        f"producer {p.name} exited with {p.proc.returncode}: see "
                        f"{workdir / p.name}.log"
                    )
            delivered = delivered + 1 if _owed(nodes) == 0 else 0
            with eomsg.connect(home.data) as client:
                empty = all(s.depth == 0 for s in client.stats() if s.name in QUEUES)
                if empty and delivered >= 2:
                    return
                if time.monotonic() >= next_recovery:
                    _recover_in_doubt(plan, client, workdir)
                    next_recovery = time.monotonic() + 2.0
        time.sleep(0.2)
    raise EomsgError(f"the run did not drain within {timeout:.0f} s: {_standing(nodes)}")


def _standing(nodes: dict[str, _Node]) -> str:
    """Where a run that does not drain stands: each node's queues that hold messages
    (how many in flight), its links that owe or are down (why, as the link last said)
    and its prepared transactions, or why the node cannot be asked."""
    import eomsg

    said = []
    for name, node in nodes.items():
        try:
            with eomsg.connect(node.data) as client:
                queues = [
                    f"{s.name}={s.depth}" + (f" ({s.in_flight} in flight)" if s.in_flight else "")
                    for s in client.stats()
                    if s.depth
                ]
                txns = client.txns()
                links = [
                    f"{i.peer}:"
                    + ("up" if i.connected else f"down({i.error})")
                    + f" owes {i.pending}"
                    for i in client.link_info()
                    if i.pending or not i.connected
                ]
        except EomsgError as e:
            said.append(f"{name}: cannot be asked ({e})")
            continue
        prepared = (
            f", {len(txns)} transactions prepared ({sum(not t.connected for t in txns)} in doubt)"
            if txns
            else ""
        )
        said.append(
            f"{name}: queues {queues or 'empty'}, links {links or 'all up, owing nothing'}"
            + prepared
        )
    return "; ".join(said)


def _owed(nodes: dict[str, _Node]) -> int:
    """What the links of every node owe their peers, in all."""
    import eomsg

    if len(nodes) == 1:
        return 0
    total = 0
    for node in nodes.values():
        with eomsg.connect(node.data) as client:
            total += sum(i.pending for i in client.link_info())
    return total


def _settle(plan: Plan, nodes: dict[str, _Node], in_doubt: bool) -> list[Applied]:
    """What reached the network's queues (:func:`_take_network`), taken until no link
    owes anything, those queues stay empty and so do the queues' node's — nothing is
    left to arrive unchecked after the run is judged (a message the drain's two looks
    missed in flight is taken here, not missed). Those held by a transaction still in
    doubt (``in_doubt``) are the checker's to report. EomsgError if the network does
    not settle."""
    import eomsg

    taken: list[Applied] = []
    deadline = time.monotonic() + SETTLE
    while True:
        owed = _owed(nodes)
        with eomsg.connect(nodes[plan.home].data) as client:
            stats = client.stats()
        left = 0 if in_doubt else sum(s.depth for s in stats if s.name in QUEUES)
        more = _take_network(plan, nodes)
        taken += more
        if owed == 0 and left == 0 and not more:
            return taken
        if time.monotonic() > deadline:
            raise EomsgError(
                f"the run did not settle after its drain: {owed} messages owed by links, "
                f"{left} left in the queues of {plan.home}"
            )
        time.sleep(0.5)


def _take_network(plan: Plan, nodes: dict[str, _Node]) -> list[Applied]:
    """Everything in the network's queues (each node's but the first's), taken in the
    order each gives it: what reached them."""
    import eomsg

    taken: list[Applied] = []
    for queue, holder in plan.network_queues.items():
        with eomsg.connect(nodes[holder].data) as client:
            while batch := client.fetch(queue, 1000):
                taken += [Applied(queue, queue, d.message.payload.decode()) for d in batch]
                client.delete(queue, [d.key for d in batch])
    return taken


def _recover(plan: Plan, data: Path, workdir: Path) -> set[str]:
    """Recover what the transactional consumers left in doubt, then the transactions
    the node still holds prepared."""
    import eomsg
    from eomsg.core.txn import TxnState

    with eomsg.connect(data) as client:
        _recover_in_doubt(plan, client, workdir)
        return {t.txid for t in client.txns() if t.state is TxnState.PREPARED}


def _recover_in_doubt(plan: Plan, client: Any, workdir: Path) -> None:
    """``eomsg recover`` on each transactional queue's database: transactions whose
    coordinator is gone are decided by their marker (one still connected is left)."""
    import eomsg

    for q in (q for q, role in QUEUES.items() if role.transactional):
        conn, kind = open_database(database(plan, workdir, q))
        try:
            eomsg.recover_resource(client, getattr(eomsg, RESOURCES[kind])(conn))
        finally:
            conn.close()


def _history(
    plan: Plan,
    workdir: Path,
    workers: list[Process],
    prepared: set[str],
    taken: list[Applied],
) -> list[Event]:
    """Every event of the run: the workers' histories, what each queue's database
    applied and what the network's queues held, and where each transaction stands
    (``prepared`` at the node: in doubt; with its rows applied: committed; else
    aborted)."""
    events: list[Event] = [
        QueueDeclared(q, role.exclusive, role.ordered) for q, role in QUEUES.items()
    ]
    # drained by one reader each, in order: ordered
    events += [QueueDeclared(q, False, True) for q in plan.network_queues]
    for p in workers:
        path = workdir / f"{p.name}.jsonl"
        if path.exists():
            events += read(path)
    committed: set[str] = set()
    for q in QUEUES:
        rows = applied(database(plan, workdir, q))
        events += [Applied(q, queue, msg_id) for queue, msg_id, _ in rows]
        committed |= {txid for _, _, txid in rows if txid is not None}
    events += taken
    tried = {e.txid for e in events if isinstance(e, Transacted)}
    for txid in sorted(tried | prepared | committed):
        state = "prepared" if txid in prepared else "committed" if txid in committed else "aborted"
        events.append(Resolved(txid, state))
    return events
