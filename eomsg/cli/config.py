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
from eomsg.core.durations import format_duration
from eomsg.core.limits import format_bytes

app = typer.Typer(help="Show and change node settings.", no_args_is_help=True)


# The settings that are sizes (bytes); the others are durations (seconds).
SIZES = frozenset({"max-payload", "disk-reserve"})


def _number(name: str, canonical: str) -> int | float:
    """A setting's canonical text as the number it is (bytes, or seconds)."""
    seconds = float(canonical)
    return int(canonical) if name in SIZES or seconds.is_integer() else seconds


def _human(name: str, canonical: str) -> str:
    """``64 MiB (67108864 bytes)``, ``7d (604800 s)``: as a person reads it, and exactly."""
    value = _number(name, canonical)
    if name in SIZES:
        return f"{format_bytes(int(value))} ({value} bytes)" if value else "0 (none)"
    return f"{format_duration(value) if value else '0s'} ({value:g} s)"


@app.command()
@handles_errors
def show(data: DataOption = DEFAULT_DATA, json: JsonOption = False) -> None:
    """Show every setting: retention and gc-interval (durations), max-payload and
    disk-reserve (sizes); --json gives seconds and bytes as numbers."""
    with open_broker(data) as broker:
        settings = broker.saved_settings()
    if json:
        print_json({name: _number(name, value) for name, value in settings.items()})
        return
    grid = table("setting", "value")
    for name, value in settings.items():
        grid.add_row(name, _human(name, value))
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
        free = broker.node_info().disk_free if name == "disk-reserve" else 0
    if json:
        print_json({name: _number(name, canonical)})
    else:
        say(f"{name} = {_human(name, canonical)}")
    if name == "disk-reserve" and int(canonical) > free:
        say(
            f"warning: the disk holding the data directory has {format_bytes(free)} free, "
            f"under this reserve: every publish is refused until more is free (or lower it)",
            err=True,
        )
