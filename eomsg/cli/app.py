"""The ``eomsg`` command: each subcommand is a thin skin over one node call.

Only the command that runs is built: typer turns every command's parameters into click
objects (and pydantic adapters) when the group is called, which cost more than the
command itself took for ``eomsg publish`` through a node; ``eomsg --help``, completion
and a name that is no command build them all."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from eomsg.cli.common import DEFAULT_DATA, Globals
from eomsg.cli.root import (
    BROKER_HELP,
    CONTEXT_HELP,
    INIT_HELP,
    NODE_NAME_HELP,
    TLS_CA_HELP,
    TOKEN_HELP,
    VIA_HELP,
    EomsgGroup,
)

# Each command, in the order ``eomsg --help`` lists them: its module and the function
# (or, for a group of commands, the ``typer.Typer``) there.
COMMANDS: dict[str, tuple[str, str]] = {
    "publish": ("eomsg.cli.publish", "publish"),
    "consume": ("eomsg.cli.consume", "consume"),
    "browse": ("eomsg.cli.inspect", "browse"),
    "serve": ("eomsg.cli.serve", "serve"),
    "top": ("eomsg.cli.top", "top"),
    "recover": ("eomsg.cli.recover", "recover"),
    "ping": ("eomsg.cli.node", "ping"),
    "spark-replay": ("eomsg.cli.replay", "spark_replay"),
    "compact": ("eomsg.cli.storage", "compact"),
    "salvage": ("eomsg.cli.storage", "salvage"),
    "grant": ("eomsg.cli.access", "grant"),
    "revoke": ("eomsg.cli.access", "revoke"),
    "queue": ("eomsg.cli.queue", "app"),
    "link": ("eomsg.cli.link", "app"),
    "inspect": ("eomsg.cli.inspect", "app"),
    "config": ("eomsg.cli.config", "app"),
    "node": ("eomsg.cli.node", "app"),
    "context": ("eomsg.cli.context", "app"),
    "user": ("eomsg.cli.access", "app"),
}
# The root's options that take a value (``--data DIR``): the word after one is its value,
# not a command's name (tests/test_cli_habits.py holds this to the root's parameters).
VALUED = ("--data", "--broker", "--token", "--tls-ca", "--via", "--node-name", "--context")


def build(only: str | None = None) -> typer.Typer:
    """The ``eomsg`` application with every command, or with command ``only`` alone."""
    app = typer.Typer(
        cls=EomsgGroup,
        help="Durable, exactly-once messaging for applications that keep their own databases.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # help as plain text: nothing in it is markup
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    for name, (module, attribute) in COMMANDS.items():
        if only is None or name == only:
            # __import__, not importlib's: -X importtime sees it (tests/test_cli_habits.py)
            target = getattr(__import__(module, fromlist=[attribute]), attribute)
            if isinstance(target, typer.Typer):
                app.add_typer(target, name=name)
            else:
                app.command(name)(target)
    app.callback()(root)
    return app


def command_named(words: list[str]) -> str | None:
    """The command ``words`` (the command line after ``eomsg``) run, if that is all they
    need built: ``None`` for the root's help, shell completion, or no known command."""
    if "_EOMSG_COMPLETE" in os.environ:
        return None
    takes_value = False
    for word in words:
        if takes_value:
            takes_value = False
        elif word in VALUED:
            takes_value = True
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
        elif word.split("=", 1)[0] not in VALUED and word not in ("--init", "--json"):
            return None  # --help, --version, completion, or a mistake said with every name
    return None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"eomsg {version('eomsg')}")
        raise typer.Exit()


def root(
    _: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
    data: Annotated[
        Path,
        typer.Option(
            "--data", envvar="EOMSG_DATA", metavar="DIR", help="Data directory (env EOMSG_DATA)."
        ),
    ] = DEFAULT_DATA,
    broker: Annotated[
        str | None,
        typer.Option("--broker", envvar="EOMSG_BROKER", metavar="URL", help=BROKER_HELP),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="EOMSG_TOKEN", metavar="TOKEN", help=TOKEN_HELP),
    ] = None,
    tls_ca: Annotated[
        str | None,
        typer.Option("--tls-ca", envvar="EOMSG_TLS_CA", metavar="FILE", help=TLS_CA_HELP),
    ] = None,
    via: Annotated[
        str | None,
        typer.Option("--via", envvar="EOMSG_VIA", metavar="NODE", help=VIA_HELP),
    ] = None,
    init: Annotated[bool, typer.Option("--init", envvar="EOMSG_INIT", help=INIT_HELP)] = False,
    node_name: Annotated[
        str | None,
        typer.Option("--node-name", envvar="EOMSG_NODE_NAME", metavar="NAME", help=NODE_NAME_HELP),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option("--context", envvar="EOMSG_CONTEXT", metavar="NAME", help=CONTEXT_HELP),
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")] = False,
) -> None:
    """Durable, exactly-once messaging for applications that keep their own databases.

    The options above may also follow the command's name (eomsg queue list --data d);
    given in both places, the one after the name counts."""
    Globals.broker, Globals.token, Globals.init = broker, token, init
    Globals.tls_ca, Globals.via, Globals.node_name = tls_ca, via, node_name
    Globals.context = context


def __getattr__(name: str) -> Any:
    """``app``: the application with every command (what tests and documentation run)."""
    if name == "app":
        return build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    build(command_named(sys.argv[1:]))()
