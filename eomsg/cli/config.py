"""``eomsg config``: node settings saved in the data directory."""

from __future__ import annotations

from typing import Annotated

import typer

from eomsg.cli import output
from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import print_json, say, table

app = typer.Typer(help="Show and change node settings.", no_args_is_help=True)


@app.command()
@handles_errors
def show(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Show every setting: retention and gc-interval (seconds), max-payload and
    disk-reserve (bytes)."""
    with open_broker(data) as broker:
        settings = broker.saved_settings()
    if json:
        print_json(settings)
        return
    grid = table("setting", "value")
    for name, value in settings.items():
        grid.add_row(name, value)
    output.show(grid)


# A value may start with '-' (retention -1 is refused as a bad value, not as an option).
@app.command("set", context_settings={"ignore_unknown_options": True})
@handles_errors
def set_(
    name: Annotated[
        str, typer.Argument(help="retention, gc-interval, max-payload or disk-reserve.")
    ],
    value: Annotated[
        str, typer.Argument(help="A duration, or a size for max-payload and disk-reserve.")
    ],
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Save a setting: `retention 7d` keeps consumed messages in the log for replay;
    `gc-interval 5m` sets how often the log is collected; `max-payload 4MiB` is the
    largest payload a publish may carry (at most 512MiB; refused while the node serves
    with a --max-frame that cannot carry it); `disk-reserve 1GiB` is the free disk space
    below which publishes are refused (0: never refuse).

    \b
    Examples:
      eomsg config set retention 7d
      eomsg config set max-payload 4MiB
    """
    with open_broker(data) as broker:
        canonical = broker.configure(name, value)
    if json:
        print_json({name: canonical})
    else:
        say(f"{name} = {canonical}")
