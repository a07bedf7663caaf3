"""``eomsg user`` (add, list, remove), ``eomsg grant`` and ``eomsg revoke``: who may
connect with a token of their own, and what each may do (see docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    open_broker,
    open_secret,
)
from eomsg.cli.inspect import when
from eomsg.cli.output import print_json, say, show, table
from eomsg.core.access import validate_principal
from eomsg.errors import UsageError

app = typer.Typer(
    help="Principals: clients with a token of their own (add, list, remove).",
    no_args_is_help=True,
)

RIGHT_HELP = "publish (topics), consume, inspect or admin (queues), or any of them on --node."


@app.command()
@handles_errors
def add(
    name: Annotated[str, typer.Argument(help="The principal's name (a-z 0-9 . _ -).")],
    token_file: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Write the token to this new file (owner-only) instead of showing it.",
        ),
    ] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Add a principal with a new token, shown (or written) this once: the node keeps
    only its digest. The principal connects with --token (or EOMSG_TOKEN) and may do
    only what it is granted (eomsg grant).

    \b
    Examples:
      eomsg user add billing --token-file billing.token
      eomsg grant billing consume --queue invoices
    """
    validate_principal(name)
    # The file first: a token made and then not written anywhere would be lost.
    fd = None if token_file is None else open_secret(token_file, "token file")
    try:
        with open_broker(data) as broker:
            token = broker.add_principal(name)
    except BaseException:
        if fd is not None and token_file is not None:
            os.close(fd)
            token_file.unlink()
        raise
    if fd is not None:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    if json:
        kept = {"token_file": str(token_file)} if token_file else {"token": token}
        print_json({"name": name, **kept})
    elif token_file is not None:
        say(f"added {name}; its token is in {token_file}")
    else:
        say(f"added {name}; its token (shown only now):")
        say(token)


@app.command("list")
@handles_errors
def list_(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Every principal: when it was added and how many grants it holds (never a token;
    `eomsg inspect grants` shows the grants)."""
    with open_broker(data) as broker:
        found = broker.principals()
    if json:
        print_json([p.to_json() for p in found])
        return
    grid = table("principal", "added", "grants")
    for p in found:
        grid.add_row(p.name, when(p.created_at), str(p.grants))
    show(grid)


@app.command()
@handles_errors
def remove(
    name: Annotated[str, typer.Argument(help="The principal's name.")],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Remove a principal and its grants: its token no longer connects."""
    with open_broker(data) as broker:
        grants = broker.remove_principal(name)
    if json:
        print_json({"name": name, "grants_removed": grants})
    else:
        say(f"removed {name}" + (f" and its {grants} grant{'s' * (grants != 1)}" if grants else ""))


def _target(queue: str | None, topic: str | None, node: bool) -> tuple[str, str]:
    given = [(k, v) for k, v in (("queue", queue), ("topic", topic)) if v is not None]
    if node:
        given.append(("node", ""))
    if len(given) != 1:
        raise UsageError("say what the right is on: one of --queue, --topic or --node")
    return given[0]


QueueOption = Annotated[
    str | None,
    typer.Option("--queue", metavar="NAME", help="On this queue ('*': every queue)."),
]
TopicOption = Annotated[
    str | None,
    typer.Option("--topic", metavar="PATTERN", help="On topics matching this (publish)."),
]
NodeOption = Annotated[
    bool, typer.Option("--node", help="On the node: every queue and topic, and the node's own.")
]


@handles_errors
def grant(
    principal: Annotated[str, typer.Argument(help="Who: a principal, or @NODE (see below).")],
    right: Annotated[str, typer.Argument(metavar="RIGHT", help=RIGHT_HELP)],
    queue: QueueOption = None,
    topic: TopicOption = None,
    node: NodeOption = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Grant a principal a right. The node denies by default: each principal may do only
    what it is granted (the node's owner, with the node's token or on its Unix socket,
    always may). A no-op if granted already. @NODE is every client that comes through
    the link from NODE: the link grants it every right on the node (never an admin
    operation through a link);
    a grant or revoke naming it says what changes for them.

    \b
    Examples:
      eomsg grant billing publish --topic 'invoices/>'
      eomsg grant billing consume --queue invoices
      eomsg grant ops inspect --node
      eomsg grant @b consume --queue audit     # clients that come through node b
    """
    _change(principal, right, _target(queue, topic, node), data, json, given=True)


@handles_errors
def revoke(
    principal: Annotated[str, typer.Argument(help="Who: a principal, or @NODE.")],
    right: Annotated[str, typer.Argument(metavar="RIGHT", help=RIGHT_HELP)],
    queue: QueueOption = None,
    topic: TopicOption = None,
    node: NodeOption = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Take back a grant (a no-op if it was not given), at once: on open connections
    too.

    \b
    Examples:
      eomsg revoke billing consume --queue invoices
    """
    _change(principal, right, _target(queue, topic, node), data, json, given=False)


def _change(
    principal: str, right: str, target: tuple[str, str], data: Path, json: bool, *, given: bool
) -> None:
    kind, name = target
    with open_broker(data) as broker:
        run = broker.grant if given else broker.revoke
        changed = run(principal, right, kind, name)
    on = kind if kind == "node" else f"{kind} {name}"
    if json:
        print_json({"principal": principal, "right": right, "kind": kind, "name": name,
                    "granted" if given else "revoked": changed})  # fmt: skip
    elif given:
        say(f"{'granted' if changed else 'held already:'} {principal} {right} on {on}")
    else:
        say(f"{'revoked' if changed else 'not granted:'} {principal} {right} on {on}")
    if changed and principal.startswith("@"):  # what a linked node's clients may do here
        peer = principal[1:]
        said = (
            f"every client that comes through node {peer} may now {right} on {on} here "
            f"({principal} stands for them all, as one)"
            if given
            else f"the clients that come through node {peer} may do here only what "
            f"{principal} still holds (`eomsg inspect grants {principal}`)"
        )
        say(f"warning: {said}", err=True)
