"""``eomsg consume``: take messages from a queue, print them or run a command on each,
and delete each only once it has been handled.

The command binds to the queue as a consumer (seed 002): on an exclusive or limited queue
it may start on standby, and it reports each change of activity — on stderr as text, or
with ``--json`` as its own ``{"event": "active" | "inactive", …}`` line between the
message lines."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json as jsonlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eomsg.cli import formats
from eomsg.cli.common import (
    DEFAULT_DATA,
    SEQ_MAX,
    DataOption,
    JsonOption,
    complete_queue,
    handles_errors,
    open_broker,
    open_served,
)
from eomsg.cli.output import print_json, say
from eomsg.client.broker import BoundConsumer, Broker, require_served
from eomsg.client.consumer import Received
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered
from eomsg.errors import HandlerFailed, NotActive, Unavailable, Unprintable, UsageError

if TYPE_CHECKING:
    from eomsg.client.sink import TableSink


@handles_errors
def consume(
    queue: Annotated[
        str, typer.Argument(help="Queue to consume from.", autocompletion=complete_queue)
    ],
    max: Annotated[
        int | None, typer.Option("--max", min=1, max=SEQ_MAX, help="Stop after this many messages.")
    ] = None,
    exec_: Annotated[
        str | None,
        typer.Option(
            "--exec",
            help="Shell command run per message (payload on stdin, EOMSG_* variables); "
            "the message is deleted only if it exits 0.",
        ),
    ] = None,
    batch: Annotated[
        int,
        typer.Option(
            min=1,
            max=10_000,
            help="Messages taken at a time; with --into, one transaction each, and twice "
            "as many taken ahead, so the next batch arrives while one commits.",
        ),
    ] = 1000,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep waiting for new messages (needs a running node)."
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0.0,
            metavar="SECONDS",
            help="Wait for new messages as --follow does, but stop after this many seconds "
            "without one (needs a running node).",
        ),
    ] = None,
    priority: Annotated[
        int,
        typer.Option(help="Priority of this consumer on a queue that limits active ones."),
    ] = 0,
    into: Annotated[
        str | None,
        typer.Option(
            "--into",
            metavar="KIND:PATH:TABLE",
            help="Insert each message exactly once into a table of your database "
            "(duckdb:PATH:TABLE or sqlite:PATH:TABLE; created if missing), up to --batch "
            "per transaction, instead of printing it.",
        ),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Write each payload's bytes exactly, followed by --delimiter, instead of "
            "SEQ TOPIC PAYLOAD lines.",
        ),
    ] = False,
    delimiter: Annotated[
        str | None,
        typer.Option(
            help="With --raw: what follows each payload (\\n unless told), with escapes "
            "(\\n, \\0, \\x1e); a payload holding it is given back and stops the command.",
        ),
    ] = None,
    activity: Annotated[
        bool | None,
        typer.Option(
            "--activity/--no-activity",
            help="Report changes of this consumer's activity (default: on exclusive and "
            "limited queues only).",
        ),
    ] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Consume messages until the queue has none ready for this consumer (or --max is
    reached); with --follow, until interrupted, waiting on standby while others are
    active, and riding out restarts of the node (it connects again, backing off, and
    carries on: what it held comes again, as any undeleted message does); with
    --timeout, likewise until that long passes without a message. Text lines show any
    payload, what a line cannot carry escaped (\\n, \\t, \\x1b, \\xff); --json and --raw
    carry it exactly. With --raw, a payload holding the delimiter is given back, not
    deleted, and stops the command (exit 3).

    \b
    Examples:
      eomsg consume orders --max 10 --json
      eomsg consume images --raw --delimiter '\\0' > dump
      eomsg consume orders --exec './handle.sh'
      eomsg consume orders --into duckdb:app.duckdb:orders"""
    # SIGTERM ends the command as Ctrl-C does: what was handled is deleted, the rest is
    # given back, and the flow is unbound — not left to the ack timeout.
    signal.signal(signal.SIGTERM, _Stop.on_sigterm)
    _check_options(into, exec_, raw, delimiter, json)
    handler, batch, prefetch = _handler(into, exec_, raw, delimiter, json, batch, max)
    waits = follow or timeout is not None
    last: FlowEvent | None = None
    left = max  # messages still to take (None: no limit)
    outage = _Outage(timeout)
    with handler:
        while left is None or left > 0:
            try:
                with open_served(data) if outage.lost else open_broker(data) as broker:
                    if waits:  # waiting for others' publishes needs a node they can reach
                        require_served(broker, "--timeout" if not follow else "--follow")
                    outage.over(broker)
                    if activity is None:
                        activity = broker.queue_config(queue).max_active > 0
                    with _bound(broker, queue, prefetch, priority, waits, timeout) as c:
                        for item in c.batches(batch, left):
                            if isinstance(item, FlowEvent):
                                last = item
                                if activity:
                                    _announce(item, json)
                                continue
                            with _Stop.deferred():
                                handler(item)
                            if left is not None:
                                left -= len(item)
                break
            except Unavailable as e:
                if not (waits and outage.began(e)):
                    raise
        handler.report()
    if last is not None and not last.active:
        raise NotActive(
            f"flow {last.flow} on {queue} is on standby: another consumer is active "
            "(use --follow to wait for its turn)"
        )


def _check_options(
    into: str | None, exec_: str | None, raw: bool, delimiter: str | None, json: bool
) -> None:
    """UsageError if the options ask for what does not combine."""
    if into is not None and exec_ is not None:
        raise UsageError("--into and --exec do not combine (use one)")
    if delimiter is not None and not raw:
        raise UsageError("--delimiter goes with --raw (text and JSON lines end with a newline)")
    if raw and (json or into is not None or exec_ is not None):
        raise UsageError(
            "--raw writes payloads to stdout: it does not combine with --json, --into or --exec"
        )


def _handler(
    into: str | None,
    exec_: str | None,
    raw: bool,
    delimiter: str | None,
    json: bool,
    batch: int,
    max: int | None,
) -> tuple[_Handler, int, int]:
    """What the options ask done with each batch (options checked by
    :func:`_check_options`), with the messages taken at a time and taken ahead."""
    prefetch = batch
    handler: _Handler
    if into is not None:
        from eomsg.client.sink import open_sink  # the application database's driver

        handler = _Land(open_sink(into), json)
        # Two batches ahead: the node sends the next while one commits (with one, each
        # batch waited a round trip). Only here, where a batch is one transaction of the
        # application's database: the next batch's deliveries age while this one is
        # handled, and a reader of stdout or a command may be slow.
        prefetch = 2 * batch
    elif exec_ is not None:
        handler, batch, prefetch = _Exec(exec_), 1, 1
    elif raw:
        handler = _Print(formats.raw(_delimiter("\\n" if delimiter is None else delimiter, max)))
    else:
        handler = _Print(formats.json_line if json else formats.text_line)
    if max is not None:  # take ahead no more than will be handed out
        batch, prefetch = min(batch, max), min(prefetch, max)
    return handler, batch, prefetch


def _delimiter(text: str, max: int | None) -> bytes:
    """The --raw delimiter: empty only for one message, whose end the output's end is."""
    delimiter = formats.parse_delimiter(text)
    if not delimiter and max != 1:
        raise UsageError("an empty --delimiter cannot separate payloads (use --max 1)")
    return delimiter


class _Stop:
    """SIGTERM, deferred while a message is between being handled and being deleted, so
    that stopping never leaves a handled message to be handled again."""

    handling = False
    requested: int | None = None

    @classmethod
    def on_sigterm(cls, signum: int, frame: object) -> None:
        if cls.handling:
            cls.requested = 128 + signum
        else:
            raise SystemExit(128 + signum)

    @classmethod
    @contextlib.contextmanager
    def deferred(cls) -> Iterator[None]:
        cls.handling = True
        try:
            yield
        finally:
            cls.handling = False
        if cls.requested is not None:
            raise SystemExit(cls.requested)


def _bound(
    broker: Broker, queue: str, prefetch: int, priority: int, waits: bool, idle: float | None
) -> BoundConsumer:
    """This command's consumer of ``queue``: until the queue has nothing ready for it,
    or if it ``waits`` until interrupted (or ``idle`` seconds pass without a message)."""
    return broker.consumer(
        queue, prefetch, idle_timeout=idle, priority=priority, until_empty=not waits
    )


class _Outage:
    """A waiting consumer whose node went away (killed, restarted, stopped): it connects
    again — to a running node only, never opening the directory itself, which the node
    is about to take back — after 0.1 s, then twice as long each time up to 1 s, saying
    on stderr when it lost the node and when it has it again. With ``--timeout``, an
    outage longer than that ends it as the node's error (exit 9)."""

    FIRST, LONGEST = 0.1, 1.0

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.connected = False  # once: a node that never answered is an error at once
        self.lost = False
        self.since = 0.0  # when it was lost
        self.delay = self.FIRST

    def began(self, error: Unavailable) -> bool:
        """The node went away (``error``): False if it never answered, or has been gone
        longer than the timeout (give up); else wait before the next attempt, say why
        the first time, and True."""
        if not self.connected:
            return False
        if not self.lost:
            say(f"warning: lost the node ({error.message}); connecting again", err=True)
            self.lost, self.since = True, time.monotonic()
        elif self.timeout is not None and time.monotonic() - self.since >= self.timeout:
            return False
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, self.LONGEST)
        return True

    def over(self, broker: Broker) -> None:
        """Connected (again) to ``broker``'s node."""
        if self.lost:
            say(f"connected again to the node at {broker.address}", err=True)
        self.connected, self.lost, self.delay = True, False, self.FIRST


class _Handler(abc.ABC):
    """What ``consume`` does with each batch it takes: settles every message of it
    before it returns (deleted once handled, or given back), SIGTERM deferred meanwhile.
    Used as a context manager around the consumer; :meth:`report` says what was done."""

    @abc.abstractmethod
    def __call__(self, batch: list[Received]) -> None: ...

    def report(self) -> None:  # noqa: B027  (a hook: most handlers have nothing to add)
        """After the last batch: what was done, where the messages do not say it."""

    def __enter__(self) -> _Handler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Print(_Handler):
    """Each batch written to stdout in a format and flushed, then deleted. A message the
    format refuses (raw, holding the delimiter) stops the command: it and the rest of the
    batch are given back, what was written before it is deleted."""

    def __init__(self, fmt: formats.Format) -> None:
        self.format = fmt

    def __call__(self, batch: list[Received]) -> None:
        written, refused = _write(batch, self.format)
        for msg in batch[:written]:
            msg.delete()  # durable before the consumer's exit returns
        if refused is not None:
            for msg in batch[written:]:
                msg.return_unseen()  # not acted on: it does not count as an attempt
            raise refused


class _Exec(_Handler):
    """A shell command run on each message (batches of one); deleted if it exits 0."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __call__(self, batch: list[Received]) -> None:
        (msg,) = batch
        _run_handler(self.command, msg.delivered, msg.delete, msg.release)


class _Land(_Handler):
    """Each batch inserted into the application's table exactly once, in one of its
    transactions (see :class:`~eomsg.client.sink.TableSink`)."""

    def __init__(self, sink: TableSink, as_json: bool) -> None:
        from eomsg.client.sink import Written

        self.sink = sink
        self.as_json = as_json
        self.total = Written(0, 0, 0)

    def __call__(self, batch: list[Received]) -> None:
        self.total += self.sink.write(batch)

    def __exit__(self, *exc: object) -> None:
        self.sink.conn.close()

    def report(self) -> None:
        total = self.total
        if self.as_json:
            print_json({"table": self.sink.table, **dataclasses.asdict(total)})
        else:
            say(
                f"inserted {total.inserted} messages into {self.sink.table} "
                f"({total.duplicates} already there, {total.expired} expired)"
            )


def _announce(event: FlowEvent, as_json: bool) -> None:
    """A change of this consumer's activity: a JSON line among the messages, or a note
    on stderr (so that stdout carries only messages)."""
    if as_json:
        print_json(event.to_json())
        sys.stdout.flush()
    elif event.active:
        say(f"active: flow {event.flow} on {event.queue} (epoch {event.epoch})", err=True)
    else:
        say(f"standby: flow {event.flow} on {event.queue}", err=True)


def _write(messages: list[Received], fmt: formats.Format) -> tuple[int, Unprintable | None]:
    """Write messages to stdout and flush, before they are deleted: how many were
    written, and the refusal of the first the format could not carry. If stdout fails,
    give them all back so nothing is lost."""
    sys.stdout.flush()  # an activity line written as text goes before these bytes
    chunks: list[bytes] = []
    refused = None
    for msg in messages:
        try:
            chunks.append(fmt(msg.delivered))
        except Unprintable as e:
            refused = e
            break
    try:
        out = sys.stdout.buffer
        out.write(b"".join(chunks))
        out.flush()
    except (BrokenPipeError, OSError):
        for msg in messages:
            msg.release()
        # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(1) from None
    return len(chunks), refused


def _run_handler(
    command: str, d: Delivered, delete: Callable[[], Any], release: Callable[[], Any]
) -> None:
    m = d.message
    env = {
        **os.environ,
        "EOMSG_QUEUE": d.queue,
        "EOMSG_SEQ": str(m.seq),
        "EOMSG_ID": m.id or "",
        "EOMSG_TOPIC": m.topic,
        "EOMSG_ATTEMPT": str(d.attempt),
        "EOMSG_EPOCH": str(d.epoch),
        "EOMSG_HEADERS": jsonlib.dumps(m.headers),
    }
    code = subprocess.run(command, shell=True, input=m.payload, env=env, check=False).returncode
    if code == 0:
        delete().result()  # durable before the next message
        return
    release()
    raise HandlerFailed(
        f"handler exited {code} on message {m.seq} (attempt {d.attempt}); it was released "
        "for redelivery"
    )
