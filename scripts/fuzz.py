#!/usr/bin/env python3
"""Fuzz a running node with what no well-behaved client sends (eomsg.chaos.fuzz):

    python scripts/fuzz.py --seconds 600 --seed 7 --json

Sessions past a valid hello send every request a client may send — every operation among
the calls — with values drawn to hurt (names past their limits, markup, paths, hostile
SQL, numbers at the edges, sequences of real deliveries), bodies with values of every
wrong kind, frames with bytes flipped, and random bytes; after each session a fresh
client must get a welcome and a pong. Found: crashes (the node's process ended: it is
started again, the frames that did it kept in ``crash-N.txt``), no answer within a
minute, internal errors (answers saying so, and tracebacks in the node's log), and files
a query wrote outside the data directory. Exit status: 0 when nothing was found, 1 when
something was (the report says what), 2 for a usage error, 3 when the node would not
start.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from eomsg.chaos.fuzz import Findings, fuzz
from eomsg.errors import EomsgError

FOUND = 1
USAGE = 2
NOT_COMPLETED = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    p.add_argument("--seed", type=int, default=1, help="draws the frames")
    p.add_argument("--dir", type=Path, help="keep the run here (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = p.parse_args(argv)
    if args.seconds <= 0:
        print("Error: --seconds must be above 0 (use --seconds 600 for ten minutes)")
        return USAGE
    if args.dir is not None and args.dir.exists() and any(args.dir.iterdir()):
        print(f"Error: {args.dir} is not empty: a run starts afresh (use a new --dir)")
        return USAGE
    say = lambda s: print(s, file=sys.stderr)  # noqa: E731
    try:
        if args.dir is not None:
            found = fuzz(args.dir, args.seconds, args.seed, say)
        else:
            with tempfile.TemporaryDirectory(prefix="eomsg-fuzz-") as tmp:
                found = fuzz(Path(tmp), args.seconds, args.seed, say)
    except EomsgError as e:
        print(f"Error: the run could not be completed: {e.message}")
        return NOT_COMPLETED
    if args.json:
        print(json.dumps({"seed": args.seed, **found.to_json()}))
    else:
        print(_report(found))
    return FOUND if found.failed else 0


def _report(found: Findings) -> str:
    counts = found.to_json()
    lines = [
        f"{counts['frames']} frames in {counts['sessions']} sessions over {counts['seconds']} s",
        f"crashes: {counts['crashes']}  unresponsive: {counts['unresponsive']}  "
        f"internal errors: {counts['internal_errors']}  tracebacks: {counts['tracebacks']}  "
        f"escapes: {counts['escapes']}",
    ]
    lines += [f"  crash: frames in {c}" for c in found.crashes]
    lines += [f"  internal: {m!r}" for m in found.internal]
    lines += [f"  raised: {m!r}" for m in found.tracebacks]
    lines += [f"  written outside: {p!r}" for p in found.escapes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
