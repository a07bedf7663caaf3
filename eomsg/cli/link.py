"""``eomsg link``: join this node to others (add, remove, list)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from eomsg.cli.common import DEFAULT_DATA, DataOption, JsonOption, handles_errors, open_broker
from eomsg.cli.output import print_json, say, show, styled, table
from eomsg.core.durations import format_duration
from eomsg.core.links import check_node_name
from eomsg.errors import UsageError
from eomsg.wire.address import parse_address

if TYPE_CHECKING:
    from rich.text import Text

app = typer.Typer(
    help="Join this node to other nodes: add, remove, list links.", no_args_is_help=True
)


@app.command()
@handles_errors
def add(
    peer: Annotated[str, typer.Argument(help="The other node's name (its serve --node-name).")],
    address: Annotated[
        str | None,
        typer.Argument(help="Where it listens, tcp://HOST:PORT (none: wait for it to dial)."),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="File holding the other node's token (its DIR/eomsg.token), owner-only."),
    ] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Link this node to another: each sends the other the messages its queues want,
    exactly once, for as long as the link exists (a no-op if the same link exists).
    Add it on one side: the other learns of it when this one dials.

    \b
    Examples:
      eomsg link add b tcp://10.0.0.2:7501 --token-file b.token
    """
    check_node_name(peer)
    if address is not None:
        parse_address(address)
        if token_file is None:
            raise UsageError(
                f"the node at {address} needs its token to accept the link "
                "(use --token-file FILE, a copy of its DIR/eomsg.token)"
            )
    token = None
    if token_file is not None:  # read here: the node never reads a file a client names
        try:
            mode = os.stat(token_file).st_mode
            token = token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or "not text"
            raise UsageError(f"cannot read token file {token_file}: {why}") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(
                f"token file {token_file} is open to other users: make it owner-only "
                f"(chmod 600 {token_file})"
            )
        if not token:
            raise UsageError(f"token file {token_file} is empty")
    with open_broker(data) as broker:
        added = broker.add_link(peer, address, token)
    if json:
        print_json({"peer": peer, "address": address, "added": added})
    else:
        say(f"{'linked to' if added else 'exists: link to'} {peer}")


@app.command()
@handles_errors
def remove(
    peer: Annotated[str, typer.Argument(help="The other node's name.")],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Remove a link: what it still owed the other node is forgotten, and the routes
    through it go."""
    with open_broker(data) as broker:
        owed = broker.remove_link(peer)
    if json:
        print_json({"peer": peer, "owed": owed})
    else:
        say(f"removed link to {peer}" + (f" ({owed} messages it owed are dropped)" if owed else ""))


@app.command("list")
@handles_errors
def list_(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Every link: state, what it owes the other node and the nodes it reaches (see
    `eomsg inspect links` for the rest)."""
    show_links(data, json, detail=False)


def show_links(data: Path, json: bool, *, detail: bool) -> None:
    """The links' table (``inspect links`` with ``detail``)."""
    with open_broker(data) as broker:
        links = broker.link_info()
    if json:
        print_json([i.to_json() for i in links])
        return
    headers = ["peer", "address", "state", "pending", "reaches"]
    if detail:
        headers += ["in flight", "oldest", "resends", "out/s", "in/s", "taken", "received"]
    grid = table(*headers)
    for i in links:
        row: list[str | Text] = [
            i.peer,
            i.address or "(dials here)",
            styled("up", "green") if i.connected else styled(_down(i.error), "red"),
            str(i.pending),
            " ".join(i.reaches) or "-",
        ]
        if detail:
            row += [
                str(i.in_flight),
                "-" if i.oldest_age is None else format_duration(i.oldest_age),
                str(i.resends),
                "-" if i.out_rate is None else f"{i.out_rate:,.0f}",
                "-" if i.in_rate is None else f"{i.in_rate:,.0f}",
                str(i.taken),
                str(i.received),
            ]
        grid.add_row(*row)
    show(grid)


def _down(error: str | None) -> str:
    return "down" if error is None else f"down ({error})"
