"""``eomsg ping`` and ``eomsg node info``: is the node up, and who is it."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    open_broker,
    open_served,
)
from eomsg.cli.output import print_json, say, show, table
from eomsg.core.durations import format_duration
from eomsg.core.limits import format_bytes
from eomsg.core.nodeinfo import NodeInfo
from eomsg.errors import UsageError

if TYPE_CHECKING:
    from rich.table import Table

app = typer.Typer(
    help="The node itself: who it is and how it stands.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@handles_errors
def ping(
    data: DataOption = DEFAULT_DATA,
    count: Annotated[
        int, typer.Option("--count", "-c", metavar="N", help="Round trips to make (1 unless told).")
    ] = 1,
    interval: Annotated[
        float, typer.Option("--interval", metavar="SECONDS", help="Pause between round trips.")
    ] = 1.0,
    json: JsonOption = False,
) -> None:
    """Whether a node answers: connect to the running node (--broker, or the one serving
    --data) and time a round trip. Never opens the data directory itself, so it is the
    check for scripts, health probes and orchestrators: exit 0 when the node answered
    every ping, 9 when no node answers (or one stopped answering), 10 when the token is
    refused.

    \b
    Examples:
      eomsg ping
      EOMSG_TOKEN=$(cat prod.token) eomsg ping --broker tcp://10.0.0.5:7420 -c 3
      until eomsg ping 2>/dev/null; do sleep 1; done   # wait for a node to come up
    """
    if count < 1:
        raise UsageError(f"--count must be 1 or more, not {count}")
    if not 0 <= interval <= 3600:
        raise UsageError(f"--interval must be 0 to 3600 seconds, not {interval:g}")
    with open_served(data) as client:
        for i in range(count):
            if i:
                time.sleep(interval)
            rtt = client.ping()
            if json:
                print_json({"node": client.node, "address": client.address, "rtt_ms": rtt * 1000})
            else:
                say(f"pong from {client.node} at {client.address} in {rtt * 1000:.2f} ms")


@app.command()
@handles_errors
def info(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Who the node is and how it stands: its name, the eomsg version it runs, its pid
    and uptime, its data directory and the addresses it serves, the versions of its
    store and wire formats, its queues, links (how many connected), transactions in
    doubt and the disk's free space against the node's reserve. Through the running node
    when there is one; otherwise the data directory opened in this process (nothing
    served, protocol 0).

    \b
    Examples:
      eomsg node info
      eomsg node info --json | jq .uptime
    """
    with open_broker(data) as broker:
        info = broker.node_info()
    if json:
        print_json(info.to_json())
        return
    show(_grid(info))


def _grid(info: NodeInfo) -> Table:
    started = dt.datetime.fromtimestamp(info.started_at, dt.UTC).isoformat(timespec="seconds")
    disk = f"{format_bytes(info.disk_free)} free"
    if info.disk_reserve:
        disk += f", reserve {format_bytes(info.disk_reserve)}"
        if info.disk_state == "full":
            disk += " (under it: publishing refused)"
    rows = [
        ("name", info.name),
        ("version", f"eomsg {info.version}"),
        ("pid", str(info.pid)),
        ("uptime", f"{format_duration(info.uptime)} (since {started})"),
        ("data", info.data_dir),
        ("serving", ", ".join(info.listening) or "nothing (opened by this command)"),
        ("store schema", str(info.schema_version)),
        ("protocol", str(info.protocol_version) if info.protocol_version else "-"),
        ("queues", str(info.queues)),
        ("links", f"{info.links} ({info.links_up} connected)"),
        ("in doubt", f"{info.in_doubt} transactions"),
        ("disk", disk),
    ]
    grid = table("", "", show_header=False)
    for key, value in rows:
        grid.add_row(key, value)
    return grid
