"""``eomsg compact`` and ``eomsg salvage``: the store's files, with no node running.

Both take the data directory's lock, so a running node makes them refuse at once (stop
it first); both are atomic (see :mod:`eomsg.store.compact` and
:mod:`eomsg.store.salvage`)."""

from __future__ import annotations

from typing import Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
)
from eomsg.cli.output import print_json, say, shown
from eomsg.core.seqs import written, written_runs
from eomsg.errors import DataDirLocked


def _offline(e: DataDirLocked, what: str) -> DataDirLocked:
    return DataDirLocked(f"{e.message.split('; ')[0]}: stop it first ({what} rewrites the store)")


@handles_errors
def compact(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Give back the disk space deleted messages left: copy the store into a file of
    just what it holds and swap it in, atomically (killed at any point, the store is
    the old one or the new one, whole). Needs the node stopped."""
    try:
        from eomsg.store import compact as compaction

        done = compaction.compact(data)
    except DataDirLocked as e:
        raise _offline(e, "compaction") from e
    if json:
        print_json(done.to_json())
    else:
        say(
            f"compacted {data}: {_mib(done.before)} -> {_mib(done.after)} "
            f"({_mib(done.before - done.after)} given back)"
        )


@handles_errors
def salvage(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be done; change nothing.")
    ] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Open a damaged store again with everything still readable, accepting the loss of
    the rest: the damaged files are kept in DIR/damaged-<time>/, every table is copied
    into a new store skipping unreadable blocks, and what was lost is reported. Needs
    the node stopped; a salvage that was killed is finished by running it again."""
    try:
        from eomsg.store import salvage as salvaging

        p = salvaging.plan(data)
        if dry_run or not p.needed:
            if json:
                print_json(p.to_json())
            else:
                for line in p.lines():
                    say(line)
            return
        done = salvaging.execute(p)
    except DataDirLocked as e:
        raise _offline(e, "salvage") from e
    if json:
        print_json(done.to_json())
        return
    kept = sum(done.tables.values())
    say(f"salvaged {data}: {kept} rows kept; the damaged files are in {done.backup}")
    for table, lost in sorted(done.lost_rows.items()):
        say(f"lost       {lost} rows of {table} (unreadable blocks)")
    if done.wal_dropped:
        say(f"lost       {done.wal_dropped} bytes of the WAL after its damage")
    if done.acknowledged_seq is not None and done.acknowledged_seq > done.last_seq:
        say(
            f"lost       messages {done.last_seq + 1} .. {done.acknowledged_seq} at least, "
            "which had been acknowledged"
        )
    if done.journal_kept:
        say(f"kept       {done.journal_kept} readable records of the journal")
    if p.journal_loss:
        say(f"lost       {p.journal_loss}")
    for queue, seqs in sorted(done.lost_waiting.items()):
        waited = f"{len(seqs)} messages queue {shown(queue)} waited for"
        say(f"lost       {waited}: seqs {written(seqs)}")
    if done.log_gaps:
        say(f"missing    from the log: seqs {written_runs(done.log_gaps)}")


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
