"""The ``eomsg`` command: each subcommand is a thin skin over one node call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eomsg.cli import access, config, context, inspect, link, node, queue
from eomsg.cli.common import DEFAULT_DATA, Globals
from eomsg.cli.consume import consume
from eomsg.cli.publish import publish
from eomsg.cli.recover import recover
from eomsg.cli.replay import spark_replay
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
from eomsg.cli.serve import serve
from eomsg.cli.storage import compact, salvage
from eomsg.cli.top import top

app = typer.Typer(
    cls=EomsgGroup,
    help="Durable, exactly-once messaging for applications that keep their own databases.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help as plain text: nothing in it is markup
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command()(publish)
app.command()(consume)
app.command()(inspect.browse)
app.command()(serve)
app.command()(top)
app.command()(recover)
app.command()(node.ping)
app.command("spark-replay")(spark_replay)
app.command()(compact)
app.command()(salvage)
app.command()(access.grant)
app.command()(access.revoke)
app.add_typer(queue.app, name="queue")
app.add_typer(link.app, name="link")
app.add_typer(inspect.app, name="inspect")
app.add_typer(config.app, name="config")
app.add_typer(node.app, name="node")
app.add_typer(context.app, name="context")
app.add_typer(access.app, name="user")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"eomsg {version('eomsg')}")
        raise typer.Exit()


@app.callback()
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


def main() -> None:
    app()
