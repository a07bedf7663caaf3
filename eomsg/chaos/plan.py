"""What a fault-injection run does (:mod:`eomsg.chaos.run` does it): its queues, its
clients, its nodes and how they are linked, and its faults — placed in time from a seed,
so that a run can be printed before it starts (``--dry-run``) and repeated.

Queues (:data:`QUEUES`), on the first node: ``q``, exclusive (one active consumer at a
time: ordered), and ``s``, shared, both consumed through an inbox; ``t``, exclusive,
consumed in two-phase transactions; ``d``, exclusive, applied into DuckDB by one
consumer. Every message is for all of them — and, in a run of several nodes, for the
queue ``n-NODE`` of each other node, which the run drains once it has healed."""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass
from typing import Any


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

# The named steps (eomsg.failpoints) a run crashes the node at: publishing, taking
# (the deliveries' records, a run of first deliveries among them), deleting, each move
# of a transaction, the writer's commits, the journal's append, seal, apply, forget.
NODE_FAILPOINTS = (
    "publish.before_commit", "publish.after_commit", "take.before_commit",
    "take.after_commit", "delete.before_commit",
    "txn.prepare.before_commit", "txn.prepare.after_commit", "txn.commit.before_commit",
    "txn.commit.after_commit", "txn.abort.before_commit", "store.commit.before",
    "store.commit.after", "store.job.before_commit", "journal.append.before",
    "journal.append.before_sync", "journal.apply.before_commit",
    "journal.apply.after_commit", "journal.forget.before", "journal.seal.before_sync",
)  # fmt: skip
# … and a transactional consumer at: its coordinator's and its database's steps.
CLIENT_FAILPOINTS = (
    "coordinator.before_prepare", "coordinator.after_prepare", "coordinator.after_decision",
    "coordinator.before_forget", "resource.before_prepare", "resource.after_prepare",
    "resource.before_commit", "resource.after_commit", "resource.before_finish",
    "resource.after_finish",
)  # fmt: skip
FAILPOINTS = NODE_FAILPOINTS + CLIENT_FAILPOINTS
# … of which, in a network, only the node holding the queues passes these: the others
# take no deliveries or deletes and run no transactions while the faults come
ON_THE_QUEUES_NODE = ("take.", "delete.", "txn.")
ON_A_NODE = ("node_kill", "power_loss", "clock_jump", "failpoint_crash")  # at one node of several
MAX_NODES = 8
MAX_LINK_FAULTS = 0.25  # of a link's frames each dropped, duplicated, reordered: past it, no
# link would settle
TUNNELLED = ("q1", "s1", "t1")  # consumers that reach the queues' node through another
TOPOLOGIES = ("chain", "fan-out", "ring")
FAILPOINT_WAIT = 10.0  # seconds a process set to crash at a step is given to reach it
FAILPOINT_PASSES = 20  # it crashes at its 1st to 20th pass through the step


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
    nodes: int = 1  # linked into a network as ``topology`` says
    topology: str = "ring"
    link_cuts: int = 0  # a link cut (every connection of it refused) for a while
    link_faults: float = 0.1  # of a link's frames: each dropped, duplicated, reordered
    heartbeat: float = 1.0
    gap: tuple[float, float] = (0.3, 1.2)  # seconds between faults

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"a run has 1 to {MAX_NODES} nodes, not {self.nodes}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"no topology {self.topology!r}: {', '.join(TOPOLOGIES)}")
        if self.link_cuts and self.nodes == 1:
            raise ValueError("link cuts need a run of several nodes (use --nodes)")
        if self.nodes > 1 and self.producers < self.nodes:
            raise ValueError(
                f"a run of {self.nodes} nodes publishes on each: use --producers {self.nodes} "
                "or more"
            )
        if self.nodes > 1 and self.consumers < 2:
            raise ValueError(
                "in a run of several nodes each queue's second consumer reaches it through "
                "another node: use --consumers 2 or more"
            )
        if not 0 <= self.link_faults <= MAX_LINK_FAULTS:
            raise ValueError(
                f"--link-faults is a share of the frames from 0 to {MAX_LINK_FAULTS}, not "
                f"{self.link_faults}"
            )

    @property
    def node_names(self) -> list[str]:
        """The run's nodes, the first the one its consumers use: ``node`` alone, else
        ``a``, ``b``, … (also their names in the network and the origins of what is
        published on them)."""
        return ["node"] if self.nodes == 1 else [chr(ord("a") + i) for i in range(self.nodes)]

    @property
    def home(self) -> str:
        """The node that holds the run's queues (:data:`QUEUES`): the first."""
        return self.node_names[0]

    @property
    def network_queues(self) -> dict[str, str]:
        """The queue of each node but the first, by name (``n-NODE``), and its node:
        every message is for each; the run drains them once it has healed."""
        return {f"n-{name}": name for name in self.node_names[1:]}

    def reaches_through(self, consumer: str) -> str:
        """The node ``consumer`` connects to: the queues' node — but in a network the
        second consumer of each queue but ``d`` reaches it through the last node, as a
        consumer anywhere may (flows, epochs, notices and transactions carried over a
        link that faults; ``q``'s order checked through it)."""
        return self.node_names[-1] if consumer in TUNNELLED else self.home

    @property
    def links(self) -> list[tuple[str, str]]:
        """The links of the network (dialler, dialled), as ``topology`` says: a
        ``chain`` a-b-c…, a ``ring`` (the chain closed), a ``fan-out`` from a."""
        names = self.node_names
        if self.topology == "fan-out":
            return [(names[0], n) for n in names[1:]]
        chain = list(itertools.pairwise(names))
        closes = self.topology == "ring" and self.nodes > 2
        return [*chain, (names[-1], names[0])] if closes else chain

    @property
    def pause(self) -> float:
        """How long a paused consumer stays stopped: past the keep-alive (three
        heartbeats), so its flow ends and another consumer takes over."""
        return 3 * self.heartbeat + 0.5

    def cut_for(self, fault: Fault) -> float:
        """How long a link cut lasts: within a keep-alive (its target 0), or past it."""
        return 0.5 if fault.target == 0 else self.pause

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, the seconds to wait before it, its target's index, and — in a
    run of several nodes — where it strikes (``at``: a node's name, or a link's
    ``dialler-dialled``)."""

    kind: str
    after: float
    target: int
    at: str | None = None

    @property
    def failpoint(self) -> tuple[str, int]:
        """A failpoint crash's step and the pass through it that crashes."""
        return FAILPOINTS[self.target // FAILPOINT_PASSES], self.target % FAILPOINT_PASSES + 1

    def __str__(self) -> str:
        said = (
            "failpoint_crash {}@{}".format(*self.failpoint)
            if self.kind == "failpoint_crash"
            else f"{self.kind} {self.target}"
        )
        return said if self.at is None else f"{said} at {self.at}"


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
        "link_cut": plan.link_cuts,
    }
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    # a clock jump's "target": the way it moves a clock that is right (0 ahead, 1 back)
    # … a failpoint crash's: the step (a FAILPOINTS index) and the pass through it
    clients = {
        "node_kill": 1, "power_loss": 1, "clock_jump": 2, "producer_kill": plan.producers,
        "disk_full": 2,  # 0: no room at all (writes fail), 1: under the node's reserve
        "failpoint_crash": len(FAILPOINTS) * FAILPOINT_PASSES,
        "link_cut": 2,  # 0: cut within a keep-alive, 1: past it (Plan.cut_for)
    }  # fmt: skip
    faults = []
    for kind in kinds:
        fault = Fault(
            kind,
            round(rng.uniform(*plan.gap), 3),
            rng.randrange(clients.get(kind, len(consumer_names(plan)))),
        )
        if plan.nodes > 1 and kind == "link_cut":
            fault = dataclasses.replace(fault, at="-".join(rng.choice(plan.links)))
        elif plan.nodes > 1 and kind in ON_A_NODE:
            at = rng.choice(plan.node_names)  # drawn for a consumer's step too: one draw each
            step = fault.failpoint[0] if kind == "failpoint_crash" else None
            if step is None or step in NODE_FAILPOINTS:
                first = step is not None and step.startswith(ON_THE_QUEUES_NODE)
                fault = dataclasses.replace(fault, at=plan.home if first else at)
        faults.append(fault)
    return faults


def consumer_names(plan: Plan) -> list[tuple[str, str]]:
    """Each consumer of the run, and its queue."""
    return [
        (f"{q}{i}", q)
        for q, role in QUEUES.items()
        for i in range(1 if role.single else plan.consumers)
    ]


def duration(plan: Plan, faults: list[Fault]) -> float:
    """The seconds ``faults`` take to inject."""
    waits = {
        "consumer_pause": plan.pause,
        "disk_full": plan.pause,
        "failpoint_crash": FAILPOINT_WAIT / 2,
    }
    return sum(
        f.after + (plan.cut_for(f) if f.kind == "link_cut" else waits.get(f.kind, 0.0))
        for f in faults
    )
