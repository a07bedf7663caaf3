"""``eomsg consume``: take messages from a queue, print them or run a command on each,
and delete each only once it has been handled."""

from __future__ import annotations

import json as jsonlib
import os
import subprocess
import sys
from concurrent.futures import Future
from typing import Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    open_node,
    require_client,
)
from eomsg.client.sync import Client
from eomsg.core.message import Delivered
from eomsg.errors import HandlerFailed
from eomsg.node.node import Node

FOLLOW_WAIT = 30.0  # seconds one long poll waits for a message before asking again


@handles_errors
def consume(
    queue: Annotated[str, typer.Argument(help="Queue to consume from.")],
    max: Annotated[
        int | None, typer.Option("--max", min=1, help="Stop after this many messages.")
    ] = None,
    exec_: Annotated[
        str | None,
        typer.Option(
            "--exec",
            help="Shell command run per message (payload on stdin, EOMSG_* variables); "
            "the message is deleted only if it exits 0.",
        ),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Messages per fetch.")] = 1000,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep waiting for new messages (needs a running node)."
        ),
    ] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Consume messages until the queue has none ready (or --max is reached); with
    --follow, until interrupted."""
    remaining = max
    deletions: list[Future[list[bool]]] = []
    with open_node(data) as node:
        client = require_client(node, "--follow") if follow else None
        while remaining is None or remaining > 0:
            size = 1 if exec_ is not None else batch
            size = size if remaining is None else min(size, remaining)
            if client is not None:
                taken = client.fetch(queue, size, wait=FOLLOW_WAIT)
                if not taken:
                    continue
            else:
                taken = node.fetch(queue, size)
            if not taken:
                break
            if exec_ is not None:
                _run_handler(node, exec_, taken[0])
            else:
                deletions.append(_print_then_delete(node, taken, json))
            if remaining is not None:
                remaining -= len(taken)
        for deleted in deletions:  # every deletion is durable before we exit 0
            deleted.result()


def _print_then_delete(
    node: Node | Client, taken: list[Delivered], as_json: bool
) -> Future[list[bool]]:
    """Write the batch to stdout, flush, and only then delete it; if stdout fails, give
    the batch back so nothing is lost. Returns the deletion's commit, which shares a
    group commit with the next fetch."""
    try:
        out = sys.stdout
        for d in taken:
            out.write(_render(d, as_json))
        out.flush()
    except (BrokenPipeError, OSError):
        node.release(taken[0].queue, [d.seq for d in taken])
        # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(1) from None
    return node.delete_async(taken[0].queue, [d.seq for d in taken])


def _render(d: Delivered, as_json: bool) -> str:
    if as_json:
        return jsonlib.dumps(d.to_json(), ensure_ascii=False) + "\n"
    body = d.message.payload_json_fields()
    text = body.get("payload", f"<{len(d.message.payload)} bytes>")
    return f"{d.seq} {d.message.topic} {text}\n"


def _run_handler(node: Node | Client, command: str, d: Delivered) -> None:
    m = d.message
    env = {
        **os.environ,
        "EOMSG_QUEUE": d.queue,
        "EOMSG_SEQ": str(m.seq),
        "EOMSG_ID": m.id or "",
        "EOMSG_TOPIC": m.topic,
        "EOMSG_ATTEMPT": str(d.attempt),
        "EOMSG_HEADERS": jsonlib.dumps(m.headers),
    }
    code = subprocess.run(command, shell=True, input=m.payload, env=env, check=False).returncode
    if code == 0:
        node.delete(d.queue, [m.seq])
        return
    node.release(d.queue, [m.seq])
    raise HandlerFailed(
        f"handler exited {code} on message {m.seq} (attempt {d.attempt}); it was released "
        "for redelivery"
    )
