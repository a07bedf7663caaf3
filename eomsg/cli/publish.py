"""``eomsg publish``: one message from the command line, or one per line of stdin."""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    fail,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import print_json, say
from eomsg.core.durations import parse_duration
from eomsg.core.message import Outgoing, PublishResult
from eomsg.errors import ExitCode, InvalidHeader


def parse_headers(items: list[str]) -> dict[str, str]:
    """``["k=v", …]`` to a dict; InvalidHeader for an item without ``=``."""
    headers = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidHeader(f"header {item!r} must be name=value")
        headers[name] = value
    return headers


def _lines(batch: int) -> Iterator[list[bytes]]:
    """Stdin's lines in chunks of ``batch``, each without its one line end (``\\n`` or
    ``\\r\\n``); every other byte kept."""
    chunk: list[bytes] = []
    for line in sys.stdin.buffer:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        chunk.append(line)
        if len(chunk) >= batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@handles_errors
def publish(
    topic: Annotated[str, typer.Argument(help="Topic, levels separated by '/'.")],
    payload: Annotated[
        str | None,
        typer.Argument(
            help="Message payload; '-' publishes all of stdin exactly (a final newline too)."
        ),
    ] = None,
    id: Annotated[
        str | None, typer.Option("--id", help="Message id: publishing it again is a no-op.")
    ] = None,
    ttl: Annotated[
        str | None, typer.Option(help="Time to live, e.g. 30s, 1h; never delivered after.")
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Header name=value; repeatable.")
    ] = None,
    stdin: Annotated[
        bool, typer.Option("--stdin", help="Publish each line of stdin as one message.")
    ] = False,
    id_prefix: Annotated[
        str | None,
        typer.Option(help="With --stdin: id each line PREFIX<line number>, so a rerun is a no-op."),
    ] = None,
    batch: Annotated[
        int, typer.Option(min=1, max=100_000, help="With --stdin: lines per commit.")
    ] = 5000,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Publish a message; prints its sequence number once it is durable.

    \b
    Examples:
      eomsg publish orders/eu/new '{"order": 1}' --id order-1 --ttl 1h
      seq 1000 | eomsg publish orders/us/new --stdin --id-prefix batch7-
      eomsg publish images/raw - < photo.jpg
    """
    ttl_s = None if ttl is None else parse_duration(ttl)
    headers = parse_headers(header or [])
    if stdin:
        if payload is not None or id is not None:
            raise fail(
                "with --stdin, give no payload and no --id (use --id-prefix)", ExitCode.USAGE
            )
        _publish_lines(topic, ttl_s, headers, id_prefix, batch, data, json)
        return
    if id_prefix is not None:
        raise fail("--id-prefix goes with --stdin (use --id for one message)", ExitCode.USAGE)
    if payload is None:
        raise fail("give a payload, '-' to read stdin, or --stdin for one per line", ExitCode.USAGE)
    # The argument's bytes as given: os.fsencode undoes the decoding of argv, so a payload
    # that is not UTF-8 (printf 'p\xff') is published exactly, never refused or altered.
    body = sys.stdin.buffer.read() if payload == "-" else os.fsencode(payload)
    with open_broker(data) as broker:
        result = broker.publish_batch([Outgoing(topic, body, id, ttl_s, headers)])[0]
    if json:
        print_json(result.to_json())
    else:
        _say(result, topic)


def _publish_lines(
    topic: str,
    ttl: float | None,
    headers: dict[str, str],
    id_prefix: str | None,
    batch: int,
    data: Path,
    as_json: bool,
) -> None:
    published = duplicates = 0
    first = last = None
    line_no = 0
    in_flight: deque[Future[list[PublishResult]]] = deque()

    def acknowledge(results: list[PublishResult]) -> None:
        nonlocal published, duplicates, first, last
        for r in results:
            if as_json:
                print_json(r.to_json())
            if r.duplicate:
                duplicates += 1
            else:
                published += 1
                first = r.seq if first is None else first
                last = r.seq
        if as_json:
            sys.stdout.flush()

    with open_broker(data) as broker:
        # Two batches in flight: the next is prepared while the last commits. Each
        # batch is acknowledged, in order, only once its commit has returned.
        for chunk in _lines(batch):
            messages = []
            for body in chunk:
                line_no += 1
                msg_id = None if id_prefix is None else f"{id_prefix}{line_no}"
                messages.append(Outgoing(topic, body, msg_id, ttl, headers))
            in_flight.append(broker.publish_batch_async(messages))
            if len(in_flight) > 1:
                acknowledge(in_flight.popleft().result())
        while in_flight:
            acknowledge(in_flight.popleft().result())
    if not as_json:
        span = (
            ""
            if first is None
            else f" (seq {first})"
            if first == last
            else f" (seq {first}..{last})"
        )
        say(f"published {_count(published, 'message')}{span}, {_count(duplicates, 'duplicate')}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _say(result: PublishResult, topic: str) -> None:
    if result.duplicate:
        say(f"duplicate of seq {result.seq} (id {result.id}): stored once")
        return
    say(f"published seq {result.seq}")
    if result.queues == 0:
        say(f"warning: no queue subscribes to {topic}; the message is only in the log", err=True)
