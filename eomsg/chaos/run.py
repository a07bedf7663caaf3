"""A fault-injection run on one node: producers and consumers in processes of their own,
faults injected at random times (reproducibly, from a seed), then healed and drained,
and the whole history checked (:mod:`eomsg.chaos.check`).

The plan is computed separately from its execution (:func:`schedule`), so a run can be
printed before it starts and repeated from its seed. Queues (:data:`QUEUES`): ``q``,
exclusive (one active consumer at a time: ordered), and ``s``, shared, both consumed
through an inbox; ``t``, exclusive, consumed in two-phase transactions; every message
is for all three."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
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
from eomsg.chaos.powerloss import Disk, Lost, build
from eomsg.chaos.process import Node, Process
from eomsg.chaos.proxy import FaultProxy
from eomsg.chaos.workers import PARENT, RESOURCES, applied, open_database
from eomsg.errors import EomsgError
from eomsg.failpoints import ENV as FAILPOINTS_ENV


@dataclass(frozen=True)
class Role:
    """What a queue of the run is: ``exclusive`` (one active consumer at a time),
    ``transactional`` (consumed in two-phase transactions, not through an inbox),
    ``ordered`` (its order is checked: what eomsg promises of it); the application
    database its consumers apply into (``db``: one all of them share; DuckDB, which one
    process opens at a time, has one consumer: ``single``)."""

    exclusive: bool
    transactional: bool
    ordered: bool
    db: str = "sqlite"
    single: bool = False


QUEUES = {
    "q": Role(exclusive=True, transactional=False, ordered=True),
    "s": Role(exclusive=False, transactional=False, ordered=False),
    # Exclusive too, but a transaction that aborts — or that a consumer which lost its
    # flow left prepared — gives its messages back after later ones were taken: order
    # is not promised there (docs/cli.md, "queue create"). In PostgreSQL, which prepares
    # (a real two-phase commit), when the run is given one (Plan.postgres).
    "t": Role(exclusive=True, transactional=True, ordered=False, db="postgresql"),
    "d": Role(exclusive=True, transactional=False, ordered=True, db="duckdb", single=True),
}
TOPIC = "chaos/m"

# The named steps (eomsg.failpoints) a run crashes the node at: publishing, deleting,
# each move of a transaction, the writer's commits, the journal's append, apply, forget.
NODE_FAILPOINTS = (
    "publish.before_commit", "publish.after_commit", "delete.before_commit",
    "txn.prepare.before_commit", "txn.prepare.after_commit", "txn.commit.before_commit",
    "txn.commit.after_commit", "txn.abort.before_commit", "store.commit.before",
    "store.commit.after", "store.job.before_commit", "journal.append.before",
    "journal.append.before_sync", "journal.apply.before_commit",
    "journal.apply.after_commit", "journal.forget.before",
)  # fmt: skip
# … and a transactional consumer at: its coordinator's and its database's steps.
CLIENT_FAILPOINTS = (
    "coordinator.before_prepare", "coordinator.after_prepare", "coordinator.after_decision",
    "coordinator.before_forget", "resource.before_prepare", "resource.after_prepare",
    "resource.before_commit", "resource.after_commit", "resource.before_finish",
    "resource.after_finish",
)  # fmt: skip
FAILPOINTS = NODE_FAILPOINTS + CLIENT_FAILPOINTS
FAILPOINT_WAIT = 10.0  # seconds a process set to crash at a step is given to reach it
FAILPOINT_PASSES = 20  # it crashes at its 1st to 20th pass through the step
DISK_SIZE = 256 * MiB  # the node's disk in a run that fills it
DISK_RESERVE = 32 * MiB  # … and the node's reserve there


@dataclass(frozen=True)
class Plan:
    """What a run does: its clients, how many of each fault, and the seed that places
    them in time."""

    seed: int = 0
    producers: int = 2
    messages: int = 1000  # each producer's
    consumers: int = 2  # of each queue
    node_kills: int = 5
    consumer_kills: int = 5
    producer_kills: int = 3
    consumer_pauses: int = 2  # each past the keep-alive
    power_losses: int = 0  # the node killed and its unsynced writes dropped
    clock_jumps: int = 0  # the node's wall clock moved an hour (and back at the next)
    failpoint_crashes: int = 0  # the node or a transactional consumer crashing at a step
    postgres: str | None = None  # an empty PostgreSQL database for "t" (else SQLite)
    disk_fulls: int = 0  # the node's disk filled up, for a pause (needs a tmpfs: root)
    lose_reply: float = 0.002  # of the node's frames to a client: lost, the client cut off
    heartbeat: float = 1.0
    gap: tuple[float, float] = (0.3, 1.2)  # seconds between faults

    @property
    def pause(self) -> float:
        """How long a paused consumer stays stopped: past the keep-alive (three
        heartbeats), so its flow ends and another consumer takes over."""
        return 3 * self.heartbeat + 0.5

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, the seconds to wait before it, and its target's index."""

    kind: str
    after: float
    target: int

    @property
    def failpoint(self) -> tuple[str, int]:
        """A failpoint crash's step and the pass through it that crashes."""
        return FAILPOINTS[self.target // FAILPOINT_PASSES], self.target % FAILPOINT_PASSES + 1

    def __str__(self) -> str:
        if self.kind == "failpoint_crash":
            return "failpoint_crash {}@{}".format(*self.failpoint)
        return f"{self.kind} {self.target}"


def schedule(plan: Plan) -> list[Fault]:
    """The faults of ``plan``, in order: the same for the same plan, every time."""
    rng = random.Random(plan.seed)
    counts = {
        "node_kill": plan.node_kills,
        "consumer_kill": plan.consumer_kills,
        "producer_kill": plan.producer_kills,
        "consumer_pause": plan.consumer_pauses,
        "power_loss": plan.power_losses,
        "clock_jump": plan.clock_jumps,
        "failpoint_crash": plan.failpoint_crashes,
        "disk_full": plan.disk_fulls,
    }
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    # a clock jump's "target": the way it moves a clock that is right (0 ahead, 1 back)
    # … a failpoint crash's: the step (a FAILPOINTS index) and the pass through it
    clients = {
        "node_kill": 1, "power_loss": 1, "clock_jump": 2, "producer_kill": plan.producers,
        "disk_full": 2,  # 0: no room at all (writes fail), 1: under the node's reserve
        "failpoint_crash": len(FAILPOINTS) * FAILPOINT_PASSES,
    }  # fmt: skip
    return [
        Fault(
            kind,
            round(rng.uniform(*plan.gap), 3),
            rng.randrange(clients.get(kind, len(consumer_names(plan)))),
        )
        for kind in kinds
    ]


def consumer_names(plan: Plan) -> list[tuple[str, str]]:
    """Each consumer of the run, and its queue."""
    return [
        (f"{q}{i}", q)
        for q, role in QUEUES.items()
        for i in range(1 if role.single else plan.consumers)
    ]


def database(plan: Plan, workdir: Path, queue: str) -> str:
    """Where the consumers of ``queue`` apply (``KIND:WHERE``, eomsg.chaos.workers)."""
    role = QUEUES[queue]
    if role.db == "postgresql" and plan.postgres is not None:
        return f"postgresql:{plan.postgres}"
    if role.db == "duckdb":
        return f"duckdb:{workdir / queue}.duckdb"
    return f"sqlite:{workdir / queue}.sqlite"


def duration(plan: Plan, faults: list[Fault]) -> float:
    """The seconds ``faults`` take to inject."""
    waits = {
        "consumer_pause": plan.pause,
        "disk_full": plan.pause,
        "failpoint_crash": FAILPOINT_WAIT / 2,
    }
    return sum(f.after + waits.get(f.kind, 0.0) for f in faults)


@dataclass
class Result:
    """What a run found: the checker's report, the faults injected, how long it took."""

    report: Report
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "faults": dict(self.faults), "seconds": self.seconds}


class _Node(Node):
    """The node; its clients reach it through ``proxy``, which follows it to the port
    each start listens on. With ``disk``, it runs on a disk that can lose power (what
    it wrote and did not sync, ``lost`` tells how much, goes with each power loss); with
    ``clock``, on a wall clock the run moves."""

    proxy: FaultProxy
    disk: Disk | None = None
    lost: Lost
    clock: WallClock | None = None
    small: SmallDisk | None = None

    def disk_full(self, none_left: bool, hold: float) -> None:
        """Fill the node's disk — all of it, so that writes fail, or to under its
        reserve, so that it refuses publishes — for ``hold`` seconds, then free it."""
        assert self.small is not None
        self.small.fill(leave=0 if none_left else DISK_RESERVE // 2)
        time.sleep(hold)
        self.small.empty()

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
        self.proxy.upstream = int(self.ready["listen"][1].rsplit(":", 1)[1])


def run(plan: Plan, workdir: Path, say: Callable[[str], None] = lambda _: None) -> Result:
    """Run ``plan`` in ``workdir`` (made if missing: the node's data, the histories,
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


def _run(
    plan: Plan,
    workdir: Path,
    faults: list[Fault],
    small: SmallDisk | None,
    say: Callable[[str], None],
) -> tuple[Result, list[Event]]:
    """The run itself: what was injected, and the history to check."""
    data = str((workdir if small is None else small.root) / "node")
    node = _Node(
        "node",
        [sys.executable, "-m", "eomsg", "serve", "--data", data, "--json",
         "--heartbeat", str(plan.heartbeat), "--listen", "tcp://127.0.0.1:0"],
        workdir,
    )  # fmt: skip
    if plan.power_losses:
        node.disk = Disk(Path(data), workdir / "durable", build(workdir))
        node.env, node.lost = node.disk.env(), Lost()
    if plan.clock_jumps:
        node.clock = WallClock(workdir)
        node.env = node.clock.env(node.env or dict(os.environ))
    node.small = small
    result = Result(Report())
    workers: list[Process] = []
    with FaultProxy(0, lose_reply=plan.lose_reply, seed=plan.seed) as node.proxy:
        try:
            node.start()
            producers, consumers = _workers(plan, faults, workdir, node, data)
            workers = [*consumers, *producers]
            for p in workers:
                p.start()
            for fault in faults:
                time.sleep(fault.after)
                if _inject(fault, node, producers, consumers, plan):
                    result.faults[fault.kind] += 1
                elif fault.kind == "failpoint_crash":  # the step not reached in time
                    result.faults["failpoint_missed"] += 1
                say(str(fault))
            _heal(node, workers)
            _drain(plan, data, workdir, producers)
            for p in workers:
                p.stop()
            prepared = _recover(plan, data, workdir)
        finally:
            for p in workers:
                p.stop()
            node.stop()
        result.faults["reply_lost"] = node.proxy.counts["replies lost"]
        if node.disk is not None:
            result.faults["unsynced_blocks_dropped"] = node.lost.blocks
    return result, _history(plan, workdir, workers, prepared)


def _workers(
    plan: Plan, faults: list[Fault], workdir: Path, node: _Node, data: str
) -> tuple[list[Process], list[Process]]:
    """The queues made on the node, and the producers and consumers of the run: every
    one reaches the node through its proxy, where a reply may be lost on the way."""
    import eomsg
    from eomsg.core.queues import QueueConfig

    with eomsg.connect(data) as client:
        for name, role in QUEUES.items():
            config = QueueConfig.create(name, (TOPIC,), max_active=int(role.exclusive))
            if name not in {s.name for s in client.stats()}:
                client.create_queue(config)
        if plan.disk_fulls:  # a reserve the small disk has room for
            client.configure("disk-reserve", str(DISK_RESERVE))
    address = f"tcp://127.0.0.1:{node.proxy.port}"
    token = (Path(data) / "eomsg.token").read_text().strip()
    env = {**os.environ, "EOMSG_TOKEN": token, PARENT: str(os.getpid())}
    # slow enough that every producer is still publishing when the last fault comes
    rate = max(0.1, round(plan.messages / (1.5 * max(1.0, duration(plan, faults))), 1))
    worker = [sys.executable, "-m", "eomsg.chaos.workers"]
    expect = [a for q in QUEUES for a in ("--expect", q)]
    producers = [
        Process(
            f"p{i}",
            [*worker, "produce", address, f"p{i}.jsonl", f"p{i}", str(plan.messages),
             "--origin", "node", "--topic", TOPIC, *expect, "--rate", str(rate)],
            workdir,
            env,
        )
        for i in range(plan.producers)
    ]  # fmt: skip
    consumers = [
        Process(name, [*worker, "consume", address, f"{name}.jsonl", name, q,
                       database(plan, workdir, q), *(["--txn"] if QUEUES[q].transactional else [])],
                workdir, env)
        for name, q in consumer_names(plan)
    ]  # fmt: skip
    return producers, consumers


def _inject(
    fault: Fault, node: _Node, producers: list[Process], consumers: list[Process], plan: Plan
) -> bool:
    """Inject ``fault``; whether it was (a producer that has finished is not killed, a
    failpoint not reached in time is not counted)."""
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
        case "disk_full":
            node.disk_full(none_left=fault.target == 0, hold=plan.pause)
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


def _heal(node: _Node, workers: list[Process]) -> None:
    """Every process up again: one that died is started again (a producer that has
    finished its messages is left)."""
    if not node.alive:
        node.start()
    for p in workers:
        assert p.proc is not None
        if p.proc.poll() not in (None, 0):
            p.start()


def _drain(
    plan: Plan, data: str, workdir: Path, producers: list[Process], timeout: float = 600.0
) -> None:
    """Wait until every producer has finished and the queues are empty. What the
    transactional consumers left in doubt is recovered meanwhile: a message whose delete
    waits in a prepared transaction is no consumer's until then, and the consumer that
    would recover it — at its next transaction — may have no message left to run one."""
    import eomsg

    deadline = time.monotonic() + timeout
    next_recovery = time.monotonic()
    while time.monotonic() < deadline:
        if not any(p.alive for p in producers):
            for p in producers:
                assert p.proc is not None
                if p.proc.returncode != 0:
                    raise EomsgError(
                        f"producer {p.name} exited with {p.proc.returncode}: see "
                        f"{workdir / p.name}.log"
                    )
            with eomsg.connect(data) as client:
                if all(s.depth == 0 for s in client.stats() if s.name in QUEUES):
                    return
                if time.monotonic() >= next_recovery:
                    _recover_in_doubt(plan, client, workdir)
                    next_recovery = time.monotonic() + 2.0
        time.sleep(0.2)
    raise EomsgError(f"the run did not drain within {timeout:.0f} s")


def _recover(plan: Plan, data: str, workdir: Path) -> set[str]:
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


def _history(plan: Plan, workdir: Path, workers: list[Process], prepared: set[str]) -> list[Event]:
    """Every event of the run: the workers' histories, what each queue's database
    applied, and where each transaction stands (``prepared`` at the node: in doubt;
    with its rows applied: committed; else aborted)."""
    events: list[Event] = [
        QueueDeclared(q, role.exclusive, role.ordered) for q, role in QUEUES.items()
    ]
    for p in workers:
        path = workdir / f"{p.name}.jsonl"
        if path.exists():
            events += read(path)
    committed: set[str] = set()
    for q in QUEUES:
        rows = applied(database(plan, workdir, q))
        events += [Applied(q, queue, msg_id) for queue, msg_id, _ in rows]
        committed |= {txid for _, _, txid in rows if txid is not None}
    tried = {e.txid for e in events if isinstance(e, Transacted)}
    for txid in sorted(tried | prepared | committed):
        state = "prepared" if txid in prepared else "committed" if txid in committed else "aborted"
        events.append(Resolved(txid, state))
    return events
