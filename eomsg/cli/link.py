"""``eomsg link``: join this node to others (add, remove, list)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    make_secret,
    open_broker,
    read_secret,
)
from eomsg.cli.output import print_json, say, show, shown, styled, table
from eomsg.client.broker import Broker
from eomsg.core.durations import format_duration, parse_duration
from eomsg.core.links import LinkConfig, LinkInfo, check_node_name
from eomsg.errors import AuthenticationFailed, NotAllowed, UsageError
from eomsg.transport.address import parse_address
from eomsg.transport.tls import ClientTls

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
        typer.Argument(
            help="Where it listens, tcp://HOST:PORT or tls://HOST:PORT (none: wait for it to dial)."
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="With ADDRESS: the token the other node accepts (its DIR/eomsg.token, or the "
            "file its `link add` made). Without: the token it must present, made here "
            "(owner-only) if the file does not exist.",
        ),
    ] = None,
    peer_ca: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="For tls://: the CA that signed the other node's certificate (default: "
            "the system's).",
        ),
    ] = None,
    wait: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="With ADDRESS: how long to wait for the link to be up, or refused (0: do "
            "not wait).",
        ),
    ] = "10s",
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Link this node to another: each sends the other the messages its queues want,
    exactly once, for as long as the link exists (a no-op if the same link exists).
    One side dials (it has the other's address); the other learns of the link when it
    does, or is told first, with a token of the link's own. The side that dials waits
    until the link is up (the other node's queues known here) and says so; a link the
    other node refuses is an error (exit 10) that says why, and is kept (fix what is
    wrong, or remove it).

    \b
    Examples:
      eomsg link add a --token-file a.token --data b    # b: a may dial, with a.token
      eomsg link add b tls://10.0.0.2:7501 --token-file a.token --peer-ca ca.pem --data a
      eomsg link add b tcp://10.0.0.2:7501 --token-file b/eomsg.token   # b's node token
    """
    check_node_name(peer)
    seconds = parse_duration(wait)
    made = False
    ca = None
    if address is not None:
        parse_address(address)
        if token_file is None:
            raise UsageError(
                f"the node at {address} needs a token to accept the link (use --token-file "
                "FILE: its DIR/eomsg.token, or the file its `link add` made)"
            )
        token: str | None = read_secret(token_file, "token file")
        if peer_ca is not None:
            ca = _read_ca(peer_ca, address)
    elif peer_ca is not None:
        raise UsageError("--peer-ca is for the side that dials: give the other node's ADDRESS")
    elif token_file is None:
        token = None  # the other node presents this node's own token
    elif token_file.exists():
        token = read_secret(token_file, "token file")
    else:
        token, made = make_secret(token_file, "token file"), True
    info, unseen = None, None
    with open_broker(data) as broker:
        added = broker.add_link(peer, address, token, ca)
        served = not broker.embedded
        if address is not None and served:
            try:
                info = _first_outcome(broker, peer, seconds)
            except NotAllowed as e:  # may add links, not look at them: the link is added
                unseen = e.message
    said: dict[str, object] = {"peer": peer, "address": address, "added": added}
    if address is not None:
        said.update(state=None if info is None else info.state)
        said.update(error=None if info is None else info.error)
    if json:
        print_json({**said, "token_made": made})
    else:
        up = info is not None and info.connected
        say(f"{'linked to' if added else 'exists: link to'} {peer}" + (" (up)" if up else ""))
        if made:
            say(f"{peer} dials this node with the token now in {token_file} (give it a copy)")
    if address is not None and not served:
        say(f"warning: no node serves {data}: it dials {peer} once `eomsg serve` runs on it",
            err=True)  # fmt: skip
    elif unseen is not None:
        say(f"warning: whether the link to {peer} is up cannot be seen: {unseen}", err=True)
    elif info is not None and info.refusal:
        raise AuthenticationFailed(
            f"the link to {peer} is {info.error} (the link is kept and dialled again now and "
            f"then: fix that, or `eomsg link remove {peer}`)"
        )
    elif address is not None and (info is None or not info.connected) and seconds > 0:
        why = f": {info.error}" if info is not None and info.error else ""
        say(f"warning: the link to {peer} is not up yet{why}; this node keeps dialling it "
            "(see `eomsg inspect links`)", err=True)  # fmt: skip


def _first_outcome(broker: Broker, peer: str, seconds: float) -> LinkInfo | None:
    """The link to ``peer`` once it is up (the peer's table of routes heard: its queues
    known here), refused, or failed to connect — or as it is after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        info = next((i for i in broker.link_info() if i.peer == peer), None)
        if info is None or (info.connected and peer in info.reaches) or info.error:
            return info
        if time.monotonic() >= deadline:
            return info
        time.sleep(0.05)


def _read_ca(path: Path, address: str) -> str:
    """The PEM text of ``--peer-ca``, checked; the node keeps the text, never the path."""
    if not address.startswith("tls://"):
        raise UsageError(f"--peer-ca is for a tls:// address, not {address}")
    try:
        pem = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not text"
        raise UsageError(f"cannot read --peer-ca {path}: {why}") from e
    ClientTls(ca_pem=pem).context()  # InvalidConfig unless it holds PEM certificates
    return pem


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


@app.command("set")
@handles_errors
def set_(
    peer: Annotated[str, typer.Argument(help="The other node's name.")],
    egress: Annotated[
        str | None,
        typer.Option(
            metavar="MODE",
            help="What this node does with the messages the other sends for its own queues: "
            "'store' them, or hold them in 'memory' until settled here (or --hold passes).",
        ),
    ] = None,
    hold: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="With --egress memory: how long a message is held before it is stored.",
        ),
    ] = "1s",
    topic: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            metavar="PATTERN",
            help="Carry only topics matching PATTERN over this link, either way (repeatable).",
        ),
    ] = None,
    any_topic: Annotated[
        bool, typer.Option("--any-topic", help="Carry every topic over this link (the default).")
    ] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Set how a link works: how this node takes what the other sends for its own
    queues, and which topics the link carries. In memory, a message settled here within
    --hold is never written (the other node keeps it until then); one not settled by
    then is stored with what its queues recorded. A crash of this node then delivers
    again what its consumers took from memory: use publish ids and the inbox for exactly
    once. With --topic, messages of other topics are not sent to the other node, and
    those it sends are passed over (counted as withheld): set it on both sides.

    \b
    Examples:
      eomsg link set a --egress memory --hold 500ms
      eomsg link set a --topic 'orders/>' --topic 'audit/>'
      eomsg link set a --egress store --any-topic
    """
    if egress is None and hold != "1s":
        raise UsageError("--hold is for --egress memory (give it too)")
    if egress is None and not topic and not any_topic:
        raise UsageError("say what to set: --egress, --topic or --any-topic")
    if topic and any_topic:
        raise UsageError("--topic and --any-topic do not combine (use one)")
    seconds = parse_duration(hold)
    # Checked whole before anything is set: a bad pattern changes no egress.
    probe = LinkConfig(peer)
    if egress is not None:
        probe.with_egress(egress, seconds)
    if topic:
        probe.with_topics(topic)
    said: dict[str, object] = {"peer": peer}
    lines = []
    with open_broker(data) as broker:
        if egress is not None:
            changed = broker.set_link_egress(peer, egress, seconds)
            said.update(egress=egress, hold=seconds, egress_changed=changed)
            held = f", hold {format_duration(seconds)}" if egress == "memory" else ""
            lines.append(f"egress {egress}{held}" + ("" if changed else " (unchanged)"))
        if topic or any_topic:
            patterns = list(topic) if topic else None
            changed = broker.set_link_topics(peer, patterns)
            said.update(topics=patterns, topics_changed=changed)
            carries = "every topic" if patterns is None else "topics " + ", ".join(patterns)
            lines.append(carries + ("" if changed else " (unchanged)"))
    if json:
        print_json(said)
    else:
        say(f"link to {peer}: {'; '.join(lines)}")


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
        headers += [
            "in flight", "oldest", "resends", "out/s", "in/s", "taken", "received", "held",
            "topics", "withheld",
        ]  # fmt: skip
    grid = table(*headers)
    for i in links:
        row: list[str | Text] = [
            i.peer,
            "-" if i.removed else i.address or "(dials here)",
            styled("up", "green") if i.connected else styled(shown(_down(i)), "red"),
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
                str(i.held) if i.egress == "memory" else "-",
                "*" if i.topics is None else " ".join(i.topics),
                str(i.withheld),
            ]
        grid.add_row(*row)
    show(grid)


def _down(info: LinkInfo) -> str:
    """The state of a link that is not up, with why (as it is said: "refused by b: …")."""
    if info.error is None:
        return info.state
    return info.error if info.error.startswith(info.state) else f"{info.state} ({info.error})"
