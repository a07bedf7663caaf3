"""``eomsg inspect``: queues, flows, transactions, replay jobs, the retained log, and
read-only SQL over the store."""

from __future__ import annotations

import base64
import datetime as dt
import math
import signal
import sys
import time
from typing import Annotated, Any

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    SEQ_MAX,
    DataOption,
    JsonOption,
    complete_queue,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import print_json, say, show, shown_payload, styled, table
from eomsg.client.broker import Broker, require_served
from eomsg.core.durations import format_duration
from eomsg.core.limits import format_bytes
from eomsg.core.message import Message
from eomsg.core.replay import parse_time
from eomsg.errors import UsageError

app = typer.Typer(help="Look at queues, the log and the store.", no_args_is_help=True)


@app.command()
@handles_errors
def queues(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Depth (of its max-messages, if limited), in flight, deleted, expired,
    dead-lettered, oldest age, payload bytes held (of its max-bytes), and messages in
    and out per second over the last minute (through a running node) per queue; with a
    limited queue, how many messages its overflow refused or dead-lettered since the
    node started.

    \b
    Examples:
      eomsg inspect queues
      eomsg inspect queues --json | jq '.[].depth'
    """
    with open_broker(data) as broker:
        stats = broker.stats()
    if json:
        print_json([s.to_json() for s in stats])
        return
    limited = any(s.max_messages is not None or s.max_bytes is not None for s in stats)
    columns = ["queue", "subscriptions", "depth", "in flight", "deleted", "expired"]
    columns += ["dead-lettered", "oldest", "bytes", "in/s", "out/s"]
    grid = table(*columns, *(["overflowed"] if limited else []))
    for s in stats:
        depth = str(s.depth) if s.max_messages is None else f"{s.depth}/{s.max_messages}"
        grid.add_row(
            s.name,
            " ".join(s.subscriptions) or "-",
            depth,
            str(s.in_flight),
            str(s.deleted),
            str(s.expired),
            str(s.dead_lettered),
            "-" if s.oldest_age is None else format_duration(s.oldest_age),
            format_bytes(s.bytes)
            if s.max_bytes is None
            else f"{format_bytes(s.bytes)}/{format_bytes(s.max_bytes)}",
            _rate(s.in_rate),
            _rate(s.out_rate),
            *([str(s.overflowed)] if limited else []),
        )
    show(grid)


@app.command()
@handles_errors
def links(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Per link to another node: state, messages owed (in flight, the oldest's age),
    resends, messages out and in per second over the last minute and since start, and
    the nodes reached through it.

    \b
    Examples:
      eomsg inspect links
      eomsg inspect links --json | jq '.[] | select(.state == "down")'
    """
    from eomsg.cli.link import show_links

    show_links(data, json, detail=True)


@app.command()
@handles_errors
def memory(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Where the node's memory goes: each part that grows with the traffic against its
    share of the node's limit (`eomsg serve --memory-limit`) — DuckDB's buffers, the
    dedup window in memory (and the ids it keeps on disk), the queues (what their cursors
    keep, and messages journaled but not yet in DuckDB) — and the process's resident
    memory.

    \b
    Examples:
      eomsg inspect memory
      eomsg inspect memory --json | jq .rss
    """
    with open_broker(data) as broker:
        use = broker.memory()
    if json:
        print_json(use.to_json())
        return
    grid = table("part", "uses", "share", "holds")
    grid.add_row("node (resident)", format_bytes(use.rss), format_bytes(use.limit), "")
    grid.add_row("duckdb", format_bytes(use.duckdb), format_bytes(use.duckdb_limit), "")
    grid.add_row(
        "dedup window",
        format_bytes(use.dedup),
        format_bytes(use.dedup_limit),
        f"{use.dedup_ids} ids; {use.spilled_ids} on disk ({format_bytes(use.spilled_bytes)})",
    )
    grid.add_row(
        "queues",
        format_bytes(use.queues + use.journaled),
        format_bytes(use.queues_limit),
        f"{use.backlog} messages; {format_bytes(use.journaled)} journaled, not in DuckDB yet",
    )
    grid.add_row(
        "latest messages",
        format_bytes(use.recent),
        format_bytes(use.recent_limit),
        "kept after DuckDB holds them",
    )
    show(grid)


def _rate(per_second: float | None) -> str:
    return "-" if per_second is None else f"{per_second:,.1f}"


@app.command()
@handles_errors
def flows(
    queue: Annotated[
        str | None,
        typer.Argument(help="Queue (default: every queue).", autocompletion=complete_queue),
    ] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Consumers bound to queues: priority, active or standby, epoch, messages held."""
    with open_broker(data) as broker:
        bound = broker.flows(queue)
        now = time.time()
    if json:
        print_json([f.to_json() for f in bound])
        return
    grid = table("queue", "flow", "consumer", "priority", "state", "epoch", "in flight", "bound")
    for f in bound:
        grid.add_row(
            f.queue,
            str(f.flow),
            f.owner or "-",
            str(f.priority),
            styled("active", "green") if f.active else "standby",
            str(f.epoch) if f.active else "-",
            str(f.in_flight),
            format_duration(max(0.0, now - f.bound_at)) + " ago",
        )
    show(grid)


@app.command()
@handles_errors
def txns(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Prepared transactions: age, coordinator (where the outcome is recorded), whether it
    is still connected or in doubt, and what each would publish and holds."""
    with open_broker(data) as broker:
        prepared = broker.txns()
        now = time.time()
    if json:
        print_json([t.to_json() for t in prepared])
        return
    grid = table("txid", "state", "age", "coordinator", "publishes", "holds")
    for t in prepared:
        grid.add_row(
            t.txid,
            "prepared" if t.connected else styled("in doubt", "yellow"),
            format_duration(max(0.0, now - t.prepared_at)),
            t.coordinator,
            str(t.publishes),
            str(t.deletes),
        )
    show(grid)


@app.command()
@handles_errors
def jobs(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Replay jobs (eomsg spark-replay): status, sequence range, rows, output digest."""
    with open_broker(data) as broker:
        found = broker.replay_jobs()
    if json:
        print_json([j.to_json() for j in found])
        return
    grid = table("job", "status", "range", "rows", "digest", "recorded")
    for j in found:
        grid.add_row(
            j.job_id,
            j.status.value,
            f"{j.lo}..{j.hi - 1}" if j.hi > j.lo else "empty",
            "" if j.rows is None else str(j.rows),
            (j.digest or "")[:12],
            when(j.recorded_at),
        )
    show(grid)


def when(seconds: float | None) -> str:
    """A time as the tables show it (UTC, to the second)."""
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command()
@handles_errors
def grants(
    principal: Annotated[str | None, typer.Argument(help="Only this principal's.")] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """The grants in force: who may do what on which queue, topic or the node."""
    with open_broker(data) as broker:
        found = broker.grants(principal)
    if json:
        print_json([g.to_json() for g in found])
        return
    grid = table("principal", "right", "on")
    for g in found:
        grid.add_row(g.principal, g.right.value, str(g.target))
    show(grid)


@app.command()
@handles_errors
def audit(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Who changed what, newest first: queues created, deleted, purged, (un)subscribed,
    requeued; consumers unbound; links, settings, principals and grants.

    \b
    Examples:
      eomsg inspect audit --limit 20
      eomsg inspect audit --json | jq 'map(select(.action == "purge"))'
    """
    with open_broker(data) as broker:
        entries = broker.audit(limit)
    if json:
        print_json([e.to_json() for e in entries])
        return
    grid = table("at", "principal", "action", "target", "detail")
    for e in entries:
        grid.add_row(when(e.at), e.principal, e.action, e.target, e.detail)
    show(grid)


@app.command()
@handles_errors
def log(
    topic: Annotated[str | None, typer.Option(help="Only topics matching this pattern.")] = None,
    from_seq: Annotated[int, typer.Option(min=0, max=SEQ_MAX, help="First sequence number.")] = 0,
    limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=100_000,
            help="At most this many, 20 unless told (with --follow: the last this many).",
        ),
    ] = None,
    last: Annotated[
        int | None,
        typer.Option(
            min=1, max=100_000, metavar="N", help="The last N messages selected (tail -n N)."
        ),
    ] = None,
    to_seq: Annotated[
        int | None, typer.Option(min=0, max=SEQ_MAX, help="Last sequence number (inclusive).")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            metavar="TIME",
            help="Published before: ISO date/time (UTC unless given) or a duration ago (2h).",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print the last --limit messages, then each new message as it is logged, "
            "until interrupted (needs a running node).",
        ),
    ] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Messages in the retained log, oldest first: the first --limit from --from-seq on
    (up to --to-seq, published before --until); --last N, the last N of them; with
    --follow, the last --limit of them, then each new one (tail -n N -f).

    \b
    Examples:
      eomsg inspect log --topic 'orders/>' --from-seq 10 --limit 20
      eomsg inspect log --last 5 --until 2026-11-01T08:00:00
      eomsg inspect log --json | jq .topic
      eomsg inspect log --follow --limit 5 --topic 'orders/>'"""
    if last is not None and limit is not None:
        raise UsageError("--last N and --limit N do not combine (--last is the last N)")
    if follow and (to_seq is not None or until is not None):
        raise UsageError("--follow has no end: it does not combine with --to-seq or --until")
    before = None if until is None else parse_time(until, time.time())
    newest = follow or last is not None
    count = last if last is not None else limit or 20
    with open_broker(data) as broker:
        if follow:
            require_served(broker, "--follow")  # nothing else can log while this holds it
        messages = broker.log(topic, from_seq, count, newest, to_seq, before)
        if not follow:
            _show_messages(messages, json)
            return
        _follow(broker, topic, messages, from_seq, json)


FOLLOW_POLL = 0.2  # seconds between looks at the log while following it


class _Following:
    """Ctrl-C and SIGTERM while following the log: they end it at once while it sleeps
    between looks, and after the look under way otherwise — raised inside a call to the
    node, the interruption would abandon the call's coroutine half-sent. A second one
    ends it at once, whatever it is doing (a node that stopped answering, a full pipe)."""

    def __init__(self) -> None:
        self.sleeping = False
        self.stopped = False

    def on_signal(self, signum: int, frame: object) -> None:
        if self.sleeping or self.stopped:
            raise KeyboardInterrupt
        self.stopped = True

    def pause(self) -> None:
        self.sleeping = True
        try:
            if not self.stopped:
                time.sleep(FOLLOW_POLL)
        finally:
            self.sleeping = False


def _follow(
    broker: Broker, topic: str | None, first: list[Message], from_seq: int, as_json: bool
) -> None:
    """Print ``first`` (the newest messages from ``from_seq`` on), then each message
    logged after them, one per line, until Ctrl-C or SIGTERM: a view of the log, so
    payloads are shown (:func:`shown_payload`), not written raw."""
    following = _Following()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, following.on_signal)
    messages, after = first, from_seq
    try:
        while not following.stopped:
            for m in messages:
                if as_json:
                    print_json(m.to_json())
                else:
                    say(f"{m.seq} {m.topic} {shown_payload(m.payload)}")
                after = m.seq + 1
            sys.stdout.flush()
            if not messages:
                following.pause()
            if not following.stopped:
                messages = broker.log(topic, after, 1000)
    except KeyboardInterrupt:
        return


@handles_errors
def browse(
    queue: Annotated[
        str, typer.Argument(help="Queue to look into.", autocompletion=complete_queue)
    ],
    from_seq: Annotated[int, typer.Option(min=0, max=SEQ_MAX, help="First sequence number.")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="At most this many.")] = 20,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Peek at the messages waiting in a queue (in flight included), oldest first, without
    consuming them: nothing is taken, counted or deleted.

    \b
    Examples:
      eomsg browse orders
      eomsg browse orders-dlq --from-seq 1200 --limit 5 --json"""
    with open_broker(data) as broker:
        messages = broker.browse(queue, from_seq, limit)
    _show_messages(messages, json)


def _show_messages(messages: list[Message], as_json: bool) -> None:
    """Messages as JSON lines, or as a table with their payloads as text views show them
    (:func:`shown_payload`, cut at 60 characters)."""
    if as_json:
        for m in messages:
            print_json(m.to_json())
        return
    grid = table("seq", "published (UTC)", "topic", "id", "bytes", "payload")
    for m in messages:
        text = shown_payload(m.payload)
        grid.add_row(
            str(m.seq),
            when(m.published_at),
            m.topic,
            m.id or "-",
            str(len(m.payload)),
            text if len(text) <= 60 else text[:57] + "...",
        )
    show(grid)


def _cell(value: Any) -> Any:
    """A query's value as JSON carries it: text as is, bytes as UTF-8 text or base64,
    times in ISO form, lists and structs cell by cell, and what JSON has no form for —
    decimals, UUIDs, intervals, NaN and infinities — as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _cell(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cell(v) for v in value]
    return str(value)


@app.command()
@handles_errors
def sql(
    query: Annotated[str, typer.Argument(help="A read-only SQL query.")],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Run a read-only SQL query against the store (tables: messages, queues, ...).

    \b
    Examples:
      eomsg inspect sql "SELECT topic, count(*) FROM messages GROUP BY 1"
    """
    with open_broker(data) as broker:
        columns, rows = broker.query(query)
    if json:
        print_json([{c: _cell(v) for c, v in zip(columns, row, strict=True)} for row in rows])
        return
    grid = table(*columns)
    for row in rows:
        grid.add_row(*("NULL" if v is None else str(_cell(v)) for v in row))
    show(grid)
