"""``eomsg context``: named ways to reach a node, kept in the user's config file, so that
``--broker``, ``--token`` and ``--tls-ca`` need not be typed at every call (as ``nats
context`` does).

The file is ``$XDG_CONFIG_HOME/eomsg/contexts.json`` (``~/.config/eomsg/contexts.json``),
the user's alone (mode 0600 in a 0700 directory; a file open to others is refused). A
context names its token by file, never by value: the token stays in the owner-only file
it was written to (``eomsg user add NAME --token-file FILE``, or the node's
``eomsg.token``). A command uses ``--context NAME``, else env ``EOMSG_CONTEXT``, else the
context ``eomsg context use`` chose; what the command line or the environment says
itself (``--broker``, ``EOMSG_TOKEN``, …) wins over the context."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from eomsg.cli import output
from eomsg.cli.common import Globals, JsonOption, check_owner_only, handles_errors, read_secret
from eomsg.cli.output import print_json, say, table
from eomsg.errors import ContextNotFound, InvalidConfig, UsageError
from eomsg.transport.address import parse_address

app = typer.Typer(
    help="Named ways to reach a node (broker, token file, CA), chosen with --context.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class Context:
    """How to reach one node: its URL, the file holding the token, the CA for TLS, and
    the node to reach through it."""

    broker: str
    token_file: str | None = None
    tls_ca: str | None = None
    via: str | None = None


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "eomsg" / "contexts.json"


def _load() -> dict[str, Any]:
    path = config_file()
    if not path.exists():
        return {"current": None, "contexts": {}}
    check_owner_only(path, "the contexts file")
    try:
        found = json.loads(path.read_text())
        contexts = {n: _context(c) for n, c in found.get("contexts", {}).items()}
        current = found.get("current")
        if not (current is None or current in contexts):
            raise ValueError(f"the current context {current!r} is none of them")
    except (ValueError, TypeError, AttributeError, RecursionError) as e:
        raise InvalidConfig(f"the contexts file {path} is not one eomsg wrote: {e}") from e
    return {"current": current, "contexts": contexts}


def _context(fields: dict[str, Any]) -> Context:
    """A context as the file holds it: text fields (the broker one always), or nulls."""
    context = Context(**fields)
    if type(context.broker) is not str or not all(
        v is None or type(v) is str for v in (context.token_file, context.tls_ca, context.via)
    ):
        raise ValueError("a context's fields are text")
    return context


def _save(state: dict[str, Any]) -> None:
    """Write the file whole, owner-only, replacing the old one at once."""
    path = config_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fresh = path.with_name(path.name + ".new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        contexts = {n: asdict(c) for n, c in state["contexts"].items()}
        json.dump({"current": state["current"], "contexts": contexts}, f, indent=2)
        f.write("\n")
    os.replace(fresh, path)


def apply_context() -> None:
    """Fill what the command line and the environment left unsaid (``Globals``) from the
    context chosen (``--context``, env EOMSG_CONTEXT, or the current one); nothing when
    none is. NotFound for a context that does not exist."""
    state = _load() if Globals.context or config_file().exists() else None
    if state is None:
        return
    name = Globals.context or (None if Globals.data_given else state["current"])
    if name is None:
        return
    context = state["contexts"].get(name)
    if context is None:
        raise ContextNotFound(f"no context {name!r} (see `eomsg context list`)")
    if Globals.broker is None:
        Globals.broker = context.broker
        if Globals.token is None and context.token_file is not None:
            Globals.token = read_secret(Path(context.token_file), f"context {name}'s token file")
        if Globals.tls_ca is None:
            Globals.tls_ca = context.tls_ca
        if Globals.via is None:
            Globals.via = context.via


def _check_name(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= _NAME_CHARS:
        raise InvalidConfig(f"context name {name!r}: 1-64 of a-z A-Z 0-9 . _ -")
    return name


@app.command()
@handles_errors
def add(
    name: Annotated[str, typer.Argument(help="The context's name.")],
    broker: Annotated[
        str, typer.Option("--broker", metavar="URL", help="The node: tcp://, tls:// or unix://.")
    ],
    token_file: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="The owner-only file holding the token (not the token)."),
    ] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(metavar="FILE", help="The CA that signed the node's certificate.")
    ] = None,
    via: Annotated[
        str | None, typer.Option(metavar="NODE", help="Reach NODE through that node.")
    ] = None,
    use: Annotated[bool, typer.Option("--use", help="Make it the current context too.")] = False,
    json: JsonOption = False,
) -> None:
    """Add (or replace) a context: how to reach a node, by name.

    \b
    Examples:
      eomsg context add prod --broker tls://mq:7501 --token-file prod.token --use
      eomsg --context prod inspect queues
    """
    parse_address(broker)  # InvalidInput for what is no address
    token = None if token_file is None else str(token_file.expanduser().absolute())
    if token is not None:
        read_secret(Path(token), "--token-file")  # owner-only and readable, now
    ca = None if tls_ca is None else str(tls_ca.expanduser().absolute())
    if ca is not None and not Path(ca).is_file():
        raise InvalidConfig(f"--tls-ca {ca} is not a file")
    state = _load()
    state["contexts"][_check_name(name)] = Context(broker, token, ca, via)
    if use:
        state["current"] = name
    _save(state)
    if json:
        print_json({"name": name, "current": state["current"] == name})
    else:
        say(f"added context {name}" + (" (current)" if use else ""))


@app.command()
@handles_errors
def use(
    name: Annotated[str | None, typer.Argument(help="The context to use from now on.")] = None,
    none: Annotated[
        bool, typer.Option("--none", help="Use no context: commands reach --data's node.")
    ] = False,
    json: JsonOption = False,
) -> None:
    """Make NAME the context every command uses unless told otherwise (--none: no
    context, so commands go back to the data directory's node)."""
    if (name is None) == (not none):
        raise UsageError("give a context's NAME or --none")
    state = _load()
    if name is not None and name not in state["contexts"]:
        raise ContextNotFound(f"no context {name!r} (see `eomsg context list`)")
    state["current"] = name
    _save(state)
    if json:
        print_json({"current": name})
    else:
        say(f"using context {name}" if name else "using no context")


@app.command("list")
@handles_errors
def list_(json: JsonOption = False) -> None:
    """The contexts, the current one marked."""
    state = _load()
    rows = [
        {"name": n, "current": n == state["current"], **asdict(c)}
        for n, c in sorted(state["contexts"].items())
    ]
    if json:
        print_json(rows)
        return
    grid = table("", "name", "broker", "token file", "tls ca", "via")
    for r in rows:
        grid.add_row(
            "*" if r["current"] else "", r["name"], r["broker"], r["token_file"] or "-",
            r["tls_ca"] or "-", r["via"] or "-",
        )  # fmt: skip
    output.show(grid)


@app.command()
@handles_errors
def remove(
    name: Annotated[str, typer.Argument(help="The context to remove.")],
    json: JsonOption = False,
) -> None:
    """Remove a context (its token file stays where it is)."""
    state = _load()
    if state["contexts"].pop(name, None) is None:
        raise ContextNotFound(f"no context {name!r} (see `eomsg context list`)")
    if state["current"] == name:
        state["current"] = None
    _save(state)
    if json:
        print_json({"removed": name})
    else:
        say(f"removed context {name}")
