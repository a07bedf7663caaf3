"""``eomsg recover``: resolve in-doubt transactions (seed 000, presumed abort)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import print_json, say
from eomsg.core.durations import format_duration, parse_duration
from eomsg.core.txn import Verdict
from eomsg.errors import ExitCode

if TYPE_CHECKING:
    from eomsg.client.recovery import Step

_SAID = {
    Verdict.COMMIT: "committed",
    Verdict.ABORT: "aborted",
    Verdict.FORCE_ABORT: "aborted by your decision",
    Verdict.WAIT: "left in doubt",
}


@handles_errors
def recover(
    abort_older_than: Annotated[
        str | None,
        typer.Option(
            help="Abort in-doubt transactions whose outcome cannot be read and that were "
            "prepared longer ago than this (e.g. 10m): a heuristic decision, reported."
        ),
    ] = None,
    app: Annotated[
        list[str] | None,
        typer.Option(
            metavar="DESCRIPTOR",
            help="Also settle what this application database holds prepared on its own, "
            "its node part finished or never prepared (PostgreSQL), e.g. "
            "'postgresql:host=db dbname=shop' (append #TABLE for another marker table). "
            "Repeatable.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; change nothing.")
    ] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Commit the in-doubt transactions their coordinator decided, abort those it did not,
    and list those whose outcome cannot be read (exit 12) — never silently.

    \b
    Examples:
      eomsg recover --dry-run
      eomsg recover --abort-older-than 10m
    """
    limit = None if abort_older_than is None else parse_duration(abort_older_than, allow_zero=True)
    from eomsg.client.recovery import execute, plan  # the application databases' drivers
    from eomsg.client.resources import DEFAULT_MARKERS

    apps = [a if "#" in a else f"{a}#{DEFAULT_MARKERS}" for a in app or []]
    with open_broker(data) as broker:
        steps = plan(broker, now=time.time(), abort_older_than=limit, apps=apps)
        if not dry_run:
            steps = execute(broker, steps)
    if json:
        print_json([s.to_json() for s in steps])
    else:
        _report(steps, dry_run)
    if any(s.verdict is Verdict.WAIT for s in steps):
        raise typer.Exit(int(ExitCode.IN_DOUBT))


def _report(steps: list[Step], dry_run: bool) -> None:
    if not steps:
        say("nothing in doubt")
        return
    now = time.time()
    for s in steps:
        said = (
            f"would be {_SAID[s.verdict]}"
            if dry_run and s.verdict is not Verdict.WAIT
            else _SAID[s.verdict]
        )
        age = format_duration(max(0.0, now - s.txn.prepared_at))
        t = s.txn
        held = f", {t.publishes} to publish, {t.deletes} held" if s.node else ""
        line = f"{t.txid}: {said} ({s.reason}; prepared {age} ago{held})"
        say(line, err=s.verdict is Verdict.WAIT)
    waiting = sum(s.verdict is Verdict.WAIT for s in steps)
    if waiting:
        say(
            f"Error: {waiting} transaction(s) in doubt: free their database (stop the "
            "application that holds it) and run recover again, or decide with "
            "--abort-older-than",
            err=True,
        )
