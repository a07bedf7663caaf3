"""``eomsg queue``: create, list, subscribe, limit, purge and delete queues."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    SEQ_MAX,
    DataOption,
    JsonOption,
    complete_queue,
    fail,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import print_json, say, show, shown, table
from eomsg.client.broker import require_served
from eomsg.core.durations import parse_duration
from eomsg.core.limits import format_bytes, parse_size
from eomsg.core.queues import (
    DEFAULT_ACK_TIMEOUT,
    MAX_BYTES_LIMIT,
    OVERFLOWS,
    REFUSE,
    QueueConfig,
)
from eomsg.errors import ExitCode, UsageError

app = typer.Typer(
    help="Create, list, subscribe, limit, purge and delete queues.", no_args_is_help=True
)

QueueName = Annotated[str, typer.Argument(help="Queue name.", autocompletion=complete_queue)]
MaxMessagesOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Most messages the queue holds, in flight included (default: no limit).",
    ),
]
MaxBytesOption = Annotated[
    str | None,
    typer.Option(
        metavar="SIZE",
        help="Most payload bytes the queue holds, in flight included: 64MiB (powers of "
        "1024) or 64MB (of 1000) (default: no limit).",
        show_default=False,
    ),
]
OverflowOption = Annotated[
    str,
    typer.Option(
        help=f"What a publish past --max-messages or --max-bytes does: "
        f"{' or '.join(OVERFLOWS)} (the oldest waiting go to --dead-letter to make room).",
        autocompletion=lambda: list(OVERFLOWS),
    ),
]


@app.command()
@handles_errors
def create(
    name: Annotated[str, typer.Argument(help="Queue name.")],
    subscribe: Annotated[
        list[str] | None,
        typer.Option(
            "--subscribe", "-s", help="Topic pattern ('*' one level, '>' the rest); repeatable."
        ),
    ] = None,
    max_redeliveries: Annotated[
        int | None, typer.Option(min=0, help="Redeliveries before a message is dead-lettered.")
    ] = None,
    dead_letter: Annotated[
        str | None, typer.Option(help="Dead-letter queue (created if missing).")
    ] = None,
    ack_timeout: Annotated[
        str, typer.Option(help="How long a delivery may stay unacknowledged.")
    ] = f"{int(DEFAULT_ACK_TIMEOUT)}s",
    max_active: Annotated[
        int,
        typer.Option(
            min=0,
            help="Consumers receiving at once: 1 exclusive, N limited, 0 no limit; the "
            "others wait on standby.",
        ),
    ] = 0,
    immediate: Annotated[
        bool,
        typer.Option(
            help="A newly bound consumer of higher priority takes over at once "
            "(--no-immediate: it waits for a free slot).",
        ),
    ] = True,
    max_messages: MaxMessagesOption = None,
    max_bytes: MaxBytesOption = None,
    overflow: OverflowOption = REFUSE,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Create a queue (a no-op if an identical one exists).

    \b
    Examples:
      eomsg queue create orders --subscribe 'orders/>'
      eomsg queue create billing -s 'billing/*' --max-active 1
      eomsg queue create jobs -s 'jobs/>' --max-redeliveries 5 --dead-letter jobs-dlq
      eomsg queue create t -s 't/>' --max-messages 9 --dead-letter d --overflow dead-letter-oldest
      eomsg queue create uploads -s 'uploads/>' --max-bytes 1GiB
    """
    config = QueueConfig.create(
        name,
        subscribe or [],
        max_redeliveries=max_redeliveries,
        dead_letter=dead_letter,
        ack_timeout=parse_duration(ack_timeout),
        max_active=max_active,
        immediate=immediate,
        max_messages=max_messages,
        overflow=overflow,
        max_bytes=_size(max_bytes),
    )
    with open_broker(data) as broker:
        created = broker.create_queue(config)
    if json:
        print_json({**config.to_json(), "created": created})
    else:
        say(f"{'created' if created else 'exists:'} queue {name}")


@app.command("list")
@handles_errors
def list_(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """List queues and their settings."""
    with open_broker(data) as broker:
        configs = [broker.queue_config(n) for n in broker.queue_names()]
    if json:
        print_json([c.to_json() for c in configs])
        return
    grid = table(
        "queue",
        "subscriptions",
        "max redeliveries",
        "dead letter",
        "ack timeout",
        "active consumers",
        "limit",
    )
    for c in configs:
        grid.add_row(
            c.name,
            " ".join(c.subscriptions) or "-",
            "-" if c.max_redeliveries is None else str(c.max_redeliveries),
            c.dead_letter or "-",
            f"{c.ack_timeout:g}s",
            _active_limit(c),
            _limit(c),
        )
    show(grid)


@app.command()
@handles_errors
def limit(
    name: QueueName,
    max_messages: MaxMessagesOption = None,
    max_bytes: MaxBytesOption = None,
    overflow: OverflowOption = REFUSE,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Set or lift the queue's limits: the messages and the payload bytes it holds, in
    flight included, and what a publish past one does — refused (exit 14, nothing
    stored), or the oldest waiting messages dead-lettered to make room. A queue already
    past a new limit keeps what it holds; a limit left out is lifted.

    \b
    Examples:
      eomsg queue limit orders --max-messages 100000
      eomsg queue limit ticks --max-messages 10000 --overflow dead-letter-oldest
      eomsg queue limit uploads --max-bytes 512MiB
      eomsg queue limit orders
    """
    size = _size(max_bytes)
    with open_broker(data) as broker:
        config = broker.limit_queue(name, max_messages, overflow, size)
    if json:
        print_json(config.to_json())
    else:
        say(f"queue {name}: {_limit(config, lifted='no limit')}")


def _limit(c: QueueConfig, lifted: str = "-") -> str:
    if not c.limited:
        return lifted
    said = [] if c.max_messages is None else [f"{c.max_messages} messages"]
    said += [] if c.max_bytes is None else [format_bytes(c.max_bytes)]
    return f"{', '.join(said)}, {c.overflow}"


def _size(max_bytes: str | None) -> int | None:
    """--max-bytes as bytes (None: no limit)."""
    return None if max_bytes is None else parse_size(max_bytes, high=MAX_BYTES_LIMIT)


@app.command()
@handles_errors
def subscribe(
    name: QueueName,
    pattern: Annotated[str, typer.Argument(help="Topic pattern.")],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Route messages published from now on to matching topics into the queue."""
    _change_subscription(name, pattern, data, json, add=True)


@app.command()
@handles_errors
def unsubscribe(
    name: QueueName,
    pattern: Annotated[str, typer.Argument(help="Topic pattern.")],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Stop routing a pattern into the queue (messages already in it stay)."""
    _change_subscription(name, pattern, data, json, add=False)


def _change_subscription(name: str, pattern: str, data: Path, as_json: bool, *, add: bool) -> None:
    with open_broker(data) as broker:
        changed = broker.subscribe(name, pattern) if add else broker.unsubscribe(name, pattern)
    if as_json:
        print_json({"queue": name, "pattern": pattern, "changed": changed})
    elif add:
        say(f"{'subscribed' if changed else 'already subscribed:'} {name} to {pattern}")
    else:
        say(f"{'unsubscribed' if changed else 'was not subscribed:'} {name} from {pattern}")


YesOption = Annotated[
    bool, typer.Option("--yes", "-y", help="Do it without asking (needed when not at a terminal).")
]


def _confirm(question: str, yes: bool) -> None:
    """Go on if ``yes``, or if the person at the terminal says so; else stop, saying so
    (exit 2)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question}: confirm with --yes")
    if not typer.confirm(shown(question) + "?", default=False):
        raise fail("not confirmed: nothing changed", ExitCode.USAGE)


@app.command()
@handles_errors
def purge(
    name: QueueName,
    yes: YesOption = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Drop every message waiting in the queue (they stay in the log). Asks first, unless
    --yes."""
    with open_broker(data) as broker:
        broker.queue_config(name)  # QueueNotFound before the question
        _confirm(f"purge drops every message waiting in {name}", yes)
        count = broker.purge(name)
    if json:
        print_json({"queue": name, "purged": count})
        return
    say(f"purged {count} messages from {name}")


@app.command()
@handles_errors
def delete(
    name: QueueName,
    force: Annotated[
        bool, typer.Option("--force", help="Delete even if it holds messages.")
    ] = False,
    yes: YesOption = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Delete a queue (refused while it holds messages, unless --force). Asks first,
    unless --yes."""
    with open_broker(data) as broker:
        broker.queue_config(name)  # QueueNotFound before the question
        _confirm(f"delete queue {name} and its records", yes)
        dropped = broker.delete_queue(name, force=force)
    if json:
        print_json({"queue": name, "deleted": True, "dropped": dropped})
        return
    say(f"deleted queue {name} ({dropped} messages dropped)")


REQUEUE_BATCH = 10_000  # messages moved per commit by `queue requeue`


@app.command()
@handles_errors
def requeue(
    name: Annotated[
        str,
        typer.Argument(
            help="Queue to move messages out of (a dead-letter queue).",
            autocompletion=complete_queue,
        ),
    ],
    to: Annotated[
        str | None,
        typer.Option(
            metavar="QUEUE",
            help="Queue to move them into (default: the one that dead-letters into NAME).",
        ),
    ] = None,
    max: Annotated[
        int | None, typer.Option("--max", min=1, max=SEQ_MAX, help="Move at most this many.")
    ] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Move the messages waiting in a queue — a dead-letter queue, usually — back into
    another, oldest first: each is published again into that queue alone (same topic,
    payload and headers, plus eomsg-requeued-from) and leaves this one in the same
    commit, so none is lost or doubled. Messages in flight stay.

    \b
    Examples:
      eomsg queue requeue orders-dlq
      eomsg queue requeue orders-dlq --to orders-retry --max 100"""
    moved = 0
    with open_broker(data) as broker:
        while True:  # in commits of REQUEUE_BATCH: a long dead-letter queue is no one commit
            ask = REQUEUE_BATCH if max is None else min(REQUEUE_BATCH, max - moved)
            n, target = broker.requeue(name, to, ask)
            moved += n
            if n < ask or moved == max:
                break
    if json:
        print_json({"queue": name, "to": target, "requeued": moved})
        return
    say(f"requeued {moved} messages from {name} to {target}")


def _active_limit(c: QueueConfig) -> str:
    if not c.max_active:
        return "any"
    return f"{c.kind} ({c.max_active}{'' if c.immediate else ', not immediate'})"


@app.command()
@handles_errors
def unbind(
    name: QueueName,
    flow: Annotated[int, typer.Argument(help="Flow id (see `eomsg inspect flows`).")],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Unbind a consumer from the queue as an administrator: it is told so, and the next
    consumer in line becomes active and receives what it held."""
    with open_broker(data) as broker:
        require_served(broker, "unbind")  # flows live in a running node
        released = broker.unbind(name, flow)
    if json:
        print_json({"queue": name, "flow": flow, "unbound": True, "released": released})
        return
    say(f"unbound flow {flow} from {name} ({released} messages go to the next consumer)")
