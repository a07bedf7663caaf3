"""What every command shares: the ``--data`` and ``--json`` options, opening the node,
and turning eomsg errors into ``Error: …`` on stderr with the error's exit code."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer

from eomsg.cli.output import say
from eomsg.client.broker import Broker
from eomsg.client.sync import Client, connect
from eomsg.embedded import LocalClient
from eomsg.errors import EomsgError, ExitCode, Unavailable
from eomsg.node.node import NodeSettings
from eomsg.wire.address import socket_path

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_DATA = Path("eomsg-data")

DataOption = Annotated[
    Path,
    typer.Option(
        "--data",
        envvar="EOMSG_DATA",
        help="Data directory (env EOMSG_DATA).",
        show_default=True,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]


def fail(message: str, code: ExitCode) -> typer.Exit:
    """Print ``Error: message`` on stderr, literally, and return the Exit to raise."""
    say(f"Error: {message}", err=True)
    return typer.Exit(int(code))


def handles_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a command so an EomsgError becomes ``Error: …`` and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except EomsgError as e:
            raise fail(e.message, e.exit_code) from e

    return wrapper


class Target:
    """Where commands find their node: ``--broker`` (env EOMSG_BROKER) if given, set by
    the root command; else the data directory's socket, else the embedded store."""

    broker: str | None = None


@contextlib.contextmanager
def open_broker(data: Path, *, create: bool = True) -> Iterator[Broker]:
    """The node for one command: a client of the running node when there is one (the
    ``--broker`` or the data directory's socket), else the node of ``data`` embedded in
    this process for the command's duration. A named broker that does not answer is an
    error, never a reason to fall back."""
    name = f"eomsg-cli:{os.getpid()}"
    if Target.broker is not None:
        with connect(Target.broker, name=name) as named:
            yield named
        return
    client: Client | None = None
    if socket_path(data).exists():
        with contextlib.suppress(Unavailable):  # a socket left by a node that died
            client = connect(data, name=name)
    if client is not None:
        with client:
            yield client
        return
    with LocalClient.open(data, NodeSettings(tick=None), create=create, name=name) as local:
        yield local
