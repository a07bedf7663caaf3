"""What every command shares: the ``--data`` and ``--json`` options, opening the node,
and turning eomsg errors into ``Error: …`` on stderr with the error's exit code."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console

from eomsg.errors import EomsgError, ExitCode
from eomsg.node.node import Node, NodeSettings

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

# Piped output is not squeezed into 80 columns: a table is read whole or parsed.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: ExitCode) -> typer.Exit:
    """Print ``Error: message`` on stderr and return the Exit to raise."""
    err_console.print(f"Error: {message}", markup=False)
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


@contextlib.contextmanager
def open_node(data: Path, *, create: bool = True) -> Iterator[Node]:
    """The node for one command, embedded in this process: opened, then closed."""
    with Node.open(data, NodeSettings(tick=None), create=create) as node:
        yield node


def print_json(obj: Any) -> None:
    """One JSON document on one line of stdout."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
