"""``eomsg top``: a live view of the queues (depth, rates) and the consumers bound to
them (active or on standby), refreshed until Ctrl-C."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import console, print_json, styled, table
from eomsg.client.broker import Broker
from eomsg.core.election import FlowInfo
from eomsg.core.limits import format_bytes
from eomsg.core.queues import QueueStats

if TYPE_CHECKING:
    from rich.console import Group


@dataclass(frozen=True)
class Frame:
    """One refresh: every queue with its rates over the last interval, every flow."""

    at: float  # wall clock, for people
    tick: float  # monotonic, for rates
    queues: list[QueueStats]
    flows: list[FlowInfo]
    rates: dict[str, tuple[float, float]]  # queue -> (in/s, out/s)

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "queues": [
                {**q.to_json(), "in_rate": self.rates[q.name][0], "out_rate": self.rates[q.name][1]}
                for q in self.queues
            ],
            "flows": [f.to_json() for f in self.flows],
        }


def _arrived(q: QueueStats) -> int:
    return q.depth + q.deleted + q.expired + q.dead_lettered + q.purged


def take_frame(broker: Broker, previous: Frame | None) -> Frame:
    """Look at the node once; rates are the change since ``previous`` (0 on the first)."""
    now = time.monotonic()
    queues, flows = broker.stats(), broker.flows()
    before = {q.name: q for q in previous.queues} if previous is not None else {}
    rates = {}
    for q in queues:
        old = before.get(q.name)
        span = now - previous.tick if previous is not None else 0.0
        if old is None or span <= 0:
            rates[q.name] = (0.0, 0.0)
        else:
            rates[q.name] = (
                max(0, _arrived(q) - _arrived(old)) / span,
                max(0, q.deleted - old.deleted) / span,
            )
    return Frame(time.time(), now, queues, flows, rates)


def render(frame: Frame) -> Group:
    from rich.console import Group

    queues = table(
        "queue",
        "kind",
        "depth",
        "bytes",
        "in flight",
        "in/s",
        "out/s",
        "consumers",
        title="queues",
    )
    bound: dict[str, list[FlowInfo]] = {}
    for f in frame.flows:
        bound.setdefault(f.queue, []).append(f)
    for q in frame.queues:
        flows = bound.get(q.name, [])
        active = sum(f.active for f in flows)
        kind = f"{q.kind} {q.max_active}" if q.kind == "limited" else q.kind
        in_rate, out_rate = frame.rates[q.name]
        queues.add_row(
            q.name,
            kind,
            str(q.depth),
            format_bytes(q.bytes),
            str(q.in_flight),
            f"{in_rate:,.0f}",
            f"{out_rate:,.0f}",
            f"{active} active, {len(flows) - active} standby" if flows else "-",
        )
    flows_table = table(
        "queue", "flow", "consumer", "priority", "state", "epoch", "in flight", title="flows"
    )
    for f in frame.flows:
        flows_table.add_row(
            f.queue,
            str(f.flow),
            f.owner or "-",
            str(f.priority),
            styled("active", "green") if f.active else styled("standby", "yellow"),
            str(f.epoch) if f.active else "-",
            str(f.in_flight),
        )
    return Group(queues, flows_table)


@handles_errors
def top(
    interval: Annotated[
        float, typer.Option(min=0.1, max=3600, help="Seconds between refreshes.")
    ] = 1.0,
    count: Annotated[
        int | None,
        typer.Option("--count", "-n", min=1, help="Stop after this many refreshes."),
    ] = None,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Watch queues (depth, in and out rates) and their consumers (active or standby)
    live, until Ctrl-C or --count refreshes; --json prints one line per refresh.

    \b
    Examples:
      eomsg top
      eomsg top --count 5 --json
    """
    with open_broker(data, view=True) as broker:
        frame = take_frame(broker, None)
        shown = 0
        if json:  # Ctrl-C ends it as it ends the live view: exit 0
            with contextlib.suppress(KeyboardInterrupt):
                while count is None or shown < count:
                    time.sleep(interval)
                    frame = take_frame(broker, frame)
                    print_json(frame.to_json())
                    sys.stdout.flush()
                    shown += 1
            return
        from rich.live import Live

        with Live(render(frame), console=console(), auto_refresh=False) as live:
            try:
                while count is None or shown < count:
                    time.sleep(interval)
                    frame = take_frame(broker, frame)
                    live.update(render(frame), refresh=True)
                    shown += 1
            except KeyboardInterrupt:
                pass
        console().line()
