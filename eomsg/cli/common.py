"""What every command shares: the global options (``--data``, ``--json``, ``--broker``,
``--token``, ``--init``), opening the node, and turning eomsg errors into ``Error: …`` on
stderr with the error's exit code."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer

from eomsg.cli.output import print_json, say
from eomsg.client.broker import Broker
from eomsg.errors import (
    DataDirError,
    DataDirLocked,
    EomsgError,
    ExitCode,
    InvalidConfig,
    InvalidInput,
    NotAllowed,
    Unavailable,
    UsageError,
)
from eomsg.store.files import holds_store
from eomsg.transport.address import socket_path

if TYPE_CHECKING:
    from eomsg.client.sync import Client

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_DATA = Path("eomsg-data")
SEQ_MAX = (1 << 63) - 1  # the largest sequence number or count a command takes


def connect(*args: Any, **kwargs: Any) -> Client:
    """:func:`eomsg.client.sync.connect`, imported once a command reaches for a node:
    ``eomsg --help`` never does."""
    from eomsg.client.sync import connect as connect_client

    return connect_client(*args, **kwargs)


def before_the_name(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A global option's value in a command: as given after the command's name, else as
    given before it (``eomsg --data d queue list``), else its environment or default."""
    name, root = param.name or "", ctx.find_root()
    Globals.command = ctx.command_path  # what this process is, if it holds a directory
    if name == "data" and any(_said(c, name) for c in (ctx, root) if name in c.params):
        Globals.data_given = True  # a directory named: it, not the current context
    if _given(ctx, name) or name not in root.params or not _given(root, name):
        return value
    return root.params[name]


def _given(ctx: Any, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _said(ctx: Any, name: str) -> bool:
    """Whether the command line or the environment gave ``name`` a value."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


DataOption = Annotated[
    Path,
    typer.Option(
        "--data",
        envvar="EOMSG_DATA",
        metavar="DIR",
        callback=before_the_name,
        help="Data directory (env EOMSG_DATA).",
        show_default=True,
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", callback=before_the_name, help="Machine-readable JSON output."),
]


def check_owner_only(path: Path, what: str) -> None:
    """InvalidConfig unless ``path`` (a secret: a token, a private key) can be read and is
    its owner's alone."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise InvalidConfig(f"cannot read {what} {path}: {e.strerror}") from e
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidConfig(
            f"{what} {path} is open to other users: make it owner-only (chmod 600 {path})"
        )


def read_secret(path: Path, what: str) -> str:
    """The text of the owner-only file ``path`` (a token), stripped; InvalidConfig if it is
    open to others, unreadable or empty."""
    check_owner_only(path, what)
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not text"
        raise InvalidConfig(f"cannot read {what} {path}: {why}") from e
    if not text:
        raise InvalidConfig(f"{what} {path} is empty")
    return text


def make_secret(path: Path, what: str) -> str:
    """A new random token, written to the new file ``path`` (owner-only); UsageError if
    the file cannot be made (or appeared meanwhile: it is never overwritten)."""
    token = secrets.token_urlsafe(32)
    write_secret(path, token, what)
    return token


def write_secret(path: Path, secret: str, what: str) -> None:
    """Write ``secret`` to the new file ``path`` (owner-only); UsageError if the file
    cannot be made (or exists: it is never overwritten)."""
    with os.fdopen(open_secret(path, what), "w") as f:
        f.write(secret + "\n")


def open_secret(path: Path, what: str) -> int:
    """The descriptor of the new, empty, owner-only file ``path``, to write a secret
    into; UsageError if it cannot be made (or exists: it is never overwritten)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise UsageError(f"cannot make {what} {path}: {e.strerror}") from e


def fail(message: str, code: ExitCode, *, kind: str = "error", as_json: bool = False) -> typer.Exit:
    """Print ``Error: message`` on stderr, literally — or with ``as_json`` the line
    ``{"error": KIND, "message": …, "exit_code": N}`` — and return the Exit to raise."""
    if as_json:
        print_json({"error": kind, "message": message, "exit_code": int(code)}, err=True)
    else:
        say(f"Error: {message}", err=True)
    return typer.Exit(int(code))


def handles_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a command so an EomsgError becomes ``Error: …`` (a JSON line on stderr
    under ``--json``, naming the error's code) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        as_json = bool(kwargs.get("json"))
        try:
            return fn(*args, **kwargs)
        except NotAllowed as e:  # said as what the user ran, which the node cannot know
            said = f"{Globals.command or 'eomsg'}: {e.message}"
            raise fail(said, e.exit_code, kind=e.code, as_json=as_json) from e
        except EomsgError as e:
            raise fail(e.message, e.exit_code, kind=e.code, as_json=as_json) from e

    return wrapper


class Globals:
    """What the global options without a parameter of their own said — before the
    command's name or after it (after wins): where the node is (``--broker``, env
    EOMSG_BROKER), its token for TCP (``--token``, env EOMSG_TOKEN), the CA for TLS
    (``--tls-ca``, env EOMSG_TLS_CA), the node to reach through it (``--via``, env
    EOMSG_VIA), whether a
    missing data directory may be created (``--init``), and the node's name
    (``--node-name``, env EOMSG_NODE_NAME)."""

    broker: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    via: str | None = None
    init: bool = False
    node_name: str | None = None
    context: str | None = None  # --context, env EOMSG_CONTEXT (eomsg.cli.context)
    data_given: bool = False  # --data or EOMSG_DATA said: the current context stands aside
    command: str | None = None  # the command running ("eomsg queue purge")


# How long a command waits for a data directory another command holds, before it says
# so: the holder lends it through its socket within LEND_AFTER (0.5 s), and a quick
# command is done before that.
LOCKED_WAIT = 3.0


@contextlib.contextmanager
def open_broker(data: Path, *, view: bool = False) -> Iterator[Broker]:
    """The node for one command: a client of the running node when there is one (the
    ``--broker`` or the data directory's socket), else the node of ``data`` embedded in
    this process for the command's duration — created if missing only with ``--init``
    (a mistyped --data is an error, not a new directory). A named broker that does not
    answer is an error, never a reason to fall back. A directory another command holds
    is waited for up to :data:`LOCKED_WAIT` seconds, going through its socket as soon
    as it lends it.

    Embedded, the command lends the directory through its socket while it runs: for
    looking only, or — a ``view``, which itself changes nothing (``eomsg top``) — whole,
    so that the writers it would otherwise turn away go through it as through a node."""
    from eomsg.cli.context import apply_context

    apply_context()
    name = f"eomsg-cli:{os.getpid()}"
    via = Globals.via
    if Globals.broker is not None:
        with _named(Globals.broker, name) as named:
            yield named
        return
    if via is not None:  # only a node reaches other nodes: no falling back
        if not socket_path(data).exists():
            raise Unavailable(
                f"--via {via} goes through a running node, and none serves {data} "
                "(start `eomsg serve`, or name one with --broker)"
            )
        with connect(data, token=Globals.token, name=name, via=via) as through:
            yield through
        return
    with contextlib.ExitStack() as stack:
        yield _node_of(data, name, view, stack)


def _node_of(data: Path, name: str, view: bool, stack: contextlib.ExitStack) -> Broker:
    """:func:`open_broker`'s node for ``data``, closed with ``stack``: the one serving
    it, else embedded here — waiting out a holder that is about to lend it."""
    deadline = time.monotonic() + LOCKED_WAIT
    while True:
        client: Client | None = None
        if socket_path(data).exists():
            with contextlib.suppress(Unavailable):  # a socket left by a node that died
                client = connect(data, token=Globals.token, name=name)
        if client is not None:
            stack.enter_context(client)
            _check_name(client, data)
            return client
        try:
            return _embedded(data, name, view, stack)
        except DataDirLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _embedded(data: Path, name: str, view: bool, stack: contextlib.ExitStack) -> Broker:
    if not Globals.init and not holds_store(data):
        raise DataDirError(
            f"no eomsg data in {data} yet (check --data; `eomsg serve` or --init creates it)"
        )
    # Only now the store (DuckDB, Arrow): a command through a running node never loads it.
    from eomsg.embedded.local import LocalClient
    from eomsg.node.node import NodeSettings
    from eomsg.server.lend import lending
    from eomsg.store import lock

    lock.PURPOSE = Globals.command
    local = stack.enter_context(
        LocalClient.open(
            data,
            NodeSettings(tick=None, node_name=Globals.node_name),
            create=Globals.init,
            name=name,
        )
    )
    # Others reach the directory meanwhile through its socket: to look, or (a view's)
    # for everything.
    if view:  # at once: it may run for long, and writers must not wait for it
        stack.enter_context(lending(data, local.node, None, after=0.0))
    else:
        stack.enter_context(lending(data, local.node, _lent(data)))
    return local


@contextlib.contextmanager
def open_served(data: Path) -> Iterator[Client]:
    """A client of the running node (``--broker``, or the one serving ``data``), never an
    embedded one: for what asks whether a node is up. Unavailable if none answers."""
    from eomsg.cli.context import apply_context

    apply_context()
    name = f"eomsg-cli:{os.getpid()}"
    if Globals.broker is not None:
        with _named(Globals.broker, name) as named:
            yield named
        return
    if not socket_path(data).exists():
        raise Unavailable(f"no node serves {data} (start one with `eomsg serve`, or give --broker)")
    with connect(data, token=Globals.token, name=name, via=Globals.via) as client:
        _check_name(client, data)
        yield client


def _named(broker: str, name: str) -> Client:
    """A client of the node ``--broker`` names: a URL, never a directory (``--data``)."""
    if "://" not in broker:
        hint = (
            f" (tcp://{broker}?)" if re.fullmatch(r"[\w.\-]+:\d+|\[[\w:.]+\]:\d+", broker) else ""
        )
        raise InvalidInput(
            f"--broker {broker!r} is not a URL{hint}: give tcp://HOST:PORT, tls://HOST:PORT "
            "or unix://PATH (a data directory is --data)"
        )
    tls = None
    if broker.startswith("tls://"):  # only then ssl: an embedded command never loads it
        from eomsg.transport.tls import ClientTls

        tls = ClientTls.from_env(Globals.tls_ca)
    return connect(broker, token=Globals.token, name=name, tls=tls, via=Globals.via)


def complete_queue(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of a queue's name: those of the node serving ``--data`` (or
    ``--broker``) that start with what was typed. Only a running node is asked — never
    the directory opened here, which would hold it from the node — and anything that
    goes wrong completes nothing."""
    data = Path(ctx.params.get("data") or os.environ.get("EOMSG_DATA") or DEFAULT_DATA)
    broker = os.environ.get("EOMSG_BROKER")
    try:
        if broker is None and not socket_path(data).exists():
            return []
        token = os.environ.get("EOMSG_TOKEN")
        with connect(broker or data, token=token, name="eomsg-complete", timeout=2.0) as c:
            return [name for name in c.queue_names() if name.startswith(incomplete)]
    except Exception:  # a completion must never print a traceback into the prompt
        return []


def _check_name(client: Client, data: Path) -> None:
    wanted = Globals.node_name
    if wanted is not None and client.node != wanted:
        raise InvalidConfig(
            f"the node serving {data} is named {client.node!r}, not {wanted!r} (a "
            "running node is named by `eomsg serve --node-name`)"
        )


def _lent(data: Path) -> str:
    """What a command that would change a directory this one lends for looking is told."""
    from eomsg.store.lock import holder_of

    return (
        f"data directory {data} is in use by {holder_of(data)}, which lets other commands "
        "look at it but not change it; wait for it to finish"
    )
