"""The ``eomsg`` command: each subcommand is a thin skin over one node call."""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer

from eomsg.cli import config, inspect, queue
from eomsg.cli.common import (
    Target,
)
from eomsg.cli.consume import consume
from eomsg.cli.publish import publish
from eomsg.cli.recover import recover
from eomsg.cli.replay import spark_replay
from eomsg.cli.serve import serve
from eomsg.cli.storage import compact, salvage
from eomsg.cli.top import top

app = typer.Typer(
    help="Durable, exactly-once messaging for applications that keep their own databases.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command()(publish)
app.command()(consume)
app.command()(serve)
app.command()(top)
app.command()(recover)
app.command("spark-replay")(spark_replay)
app.command()(compact)
app.command()(salvage)
app.add_typer(queue.app, name="queue")
app.add_typer(inspect.app, name="inspect")
app.add_typer(config.app, name="config")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"eomsg {version('eomsg')}")
        raise typer.Exit()


@app.callback()
def root(
    _: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            envvar="EOMSG_BROKER",
            help="Talk to the node at unix://PATH or tcp://HOST:PORT (env EOMSG_BROKER; "
            "TCP needs env EOMSG_TOKEN). Default: the node serving --data, if any, else "
            "the data directory in-process.",
        ),
    ] = None,
) -> None:
    """Durable, exactly-once messaging for applications that keep their own databases."""
    Target.broker = broker


def main() -> None:
    app()
