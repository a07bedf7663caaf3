#!/usr/bin/env python3
"""A fault-injection run on one node or a network of them, checked whole (eomsg.chaos):

    python scripts/chaos.py --seed 7 --node-kills 20 --consumer-kills 20 --json
    python scripts/chaos.py --seed 7 --nodes 3 --topology ring --link-cuts 10 --json

Producers and consumers run in processes of their own — the consumers of each queue
applying into the queue's SQLite database through an inbox — while the node, the
consumers and the producers are SIGKILLed and consumers are paused past the keep-alive,
at times drawn from ``--seed`` (``--power-losses``: the node killed and what it wrote
and did not fsync dropped, see eomsg.chaos.powerloss; ``--clock-jumps``: the node's wall
clock moved an hour while it runs, see eomsg.chaos.clock), and every client reaches the node
through a proxy that loses a reply now and then (the request landed, the client is cut
off); then everything is healed and drained and the checker reads the whole history.
With ``--nodes N`` the nodes are linked (``--topology``), each link through a proxy that
drops, duplicates and reorders ``--link-faults`` of its frames, and cut now and then
(``--link-cuts``); the producers publish on every node (at least one a node; by
default as many as the nodes, if more than two), the queues are on the first (the second
consumer of q, s and t reaches it through the last node), and a queue on each other node
is drained at the end: every message must reach each queue once, in its origin's order;
a network that does not settle after the drain ends the run unfinished (exit 3).
``--dry-run`` prints the faults it would inject. Exit status: 0 when no violation was
found, 1 when one was (the report says which), 2 for a usage error, 3 when the run could
not be completed (the node did not start, the queues did not drain, a producer failed:
the message says where to look).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from eomsg.chaos.plan import TOPOLOGIES, Plan, duration, schedule
from eomsg.chaos.run import run
from eomsg.errors import EomsgError

VIOLATION = 1
USAGE = 2
NOT_COMPLETED = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    d = Plan()
    p.add_argument("--seed", type=int, default=d.seed, help="places the faults in time")
    p.add_argument(
        "--producers", type=int,
        help=f"spread over the nodes, one by one (default: {d.producers}, or one a node)",
    )  # fmt: skip
    p.add_argument("--messages", type=int, default=d.messages, help="each producer's")
    p.add_argument("--consumers", type=int, default=d.consumers, help="of each queue")
    p.add_argument("--node-kills", type=int, default=d.node_kills)
    p.add_argument("--consumer-kills", type=int, default=d.consumer_kills)
    p.add_argument("--producer-kills", type=int, default=d.producer_kills)
    p.add_argument("--consumer-pauses", type=int, default=d.consumer_pauses)
    p.add_argument(
        "--power-losses", type=int, default=d.power_losses,
        help="node kills that also drop what it did not fsync (needs a C compiler)",
    )  # fmt: skip
    p.add_argument(
        "--failpoint-crashes", type=int, default=d.failpoint_crashes,
        help="the node, or a transactional consumer, started again set to crash at a "
        "named step (eomsg.failpoints) drawn from the seed",
    )  # fmt: skip
    p.add_argument(
        "--clock-jumps", type=int, default=d.clock_jumps,
        help="the node's wall clock moved an hour, ahead or back, and back again at the "
        "next (needs a C compiler)",
    )  # fmt: skip
    p.add_argument(
        "--lose-reply", type=float, default=d.lose_reply, help="of the node's frames to a client"
    )
    p.add_argument("--heartbeat", type=float, default=d.heartbeat, help="the node's, seconds")
    p.add_argument(
        "--disk-fulls", type=int, default=d.disk_fulls,
        help="the node's disk (a tmpfs of its own: root, or sudo -n) filled for a few "
        "seconds — all of it, or to under the node's reserve",
    )  # fmt: skip
    p.add_argument(
        "--postgres", metavar="CONNINFO",
        help="an empty PostgreSQL database (max_prepared_transactions > 0) for queue t's "
        "transactional consumers, which then prepare there (default: SQLite)",
    )  # fmt: skip
    p.add_argument(
        "--nodes", type=int, default=d.nodes,
        help="linked into a network, each link through a proxy that drops, duplicates and "
        "reorders its frames; the consumers on the first node, which holds the queues, and "
        "a queue on each other node that the run drains at the end",
    )  # fmt: skip
    p.add_argument("--topology", choices=TOPOLOGIES, default=d.topology, help="of the links")
    p.add_argument(
        "--link-cuts", type=int, default=d.link_cuts,
        help="a link cut (its connections refused), within a keep-alive or past it",
    )  # fmt: skip
    p.add_argument(
        "--link-faults", type=float, default=d.link_faults,
        help="of a link's frames: each dropped, duplicated and reordered",
    )  # fmt: skip
    p.add_argument("--dir", type=Path, help="keep the run here (default: a temporary one)")
    p.add_argument("--dry-run", action="store_true", help="print the faults, run nothing")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    args = p.parse_args(argv)
    try:
        plan = _plan(args)
    except ValueError as e:
        print(f"Error: {e}")
        return USAGE
    faults = schedule(plan)
    if args.dry_run:
        for f in faults:
            print(f"after {f.after:.3f} s: {f}")
        print(f"{len(faults)} faults over {duration(plan, faults):.1f} s")
        return 0
    if args.dir is not None and args.dir.exists() and any(args.dir.iterdir()):
        print(f"Error: {args.dir} is not empty: a run starts afresh (use a new --dir)")
        return USAGE
    try:
        if args.dir is not None:
            outcome = run(plan, args.dir, say=lambda s: print(s, file=sys.stderr))
        else:
            with tempfile.TemporaryDirectory(prefix="eomsg-chaos-") as tmp:
                outcome = run(plan, Path(tmp), say=lambda s: print(s, file=sys.stderr))
    except EomsgError as e:
        print(f"Error: the run could not be completed: {e.message}")
        return NOT_COMPLETED
    if args.json:
        print(json.dumps({"plan": plan.to_json(), **outcome.to_json()}))
    else:
        print(outcome.report)
        print(f"faults: {dict(outcome.faults)}; checked: {dict(outcome.report.checked)}")
    return 0 if outcome.report.ok else VIOLATION


def _plan(args: argparse.Namespace) -> Plan:
    """The plan the arguments ask for; ValueError if it cannot be run."""
    return Plan(
        seed=args.seed,
        producers=max(Plan().producers, args.nodes) if args.producers is None else args.producers,
        messages=args.messages,
        consumers=args.consumers,
        node_kills=args.node_kills,
        consumer_kills=args.consumer_kills,
        producer_kills=args.producer_kills,
        consumer_pauses=args.consumer_pauses,
        power_losses=args.power_losses,
        clock_jumps=args.clock_jumps,
        failpoint_crashes=args.failpoint_crashes,
        postgres=args.postgres,
        disk_fulls=args.disk_fulls,
        lose_reply=args.lose_reply,
        nodes=args.nodes,
        topology=args.topology,
        link_cuts=args.link_cuts,
        link_faults=args.link_faults,
        heartbeat=args.heartbeat,
    )


if __name__ == "__main__":
    sys.exit(main())
