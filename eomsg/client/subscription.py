"""A subscription of an :class:`~eomsg.client.aio.AsyncClient`, as the client sees it:
the flow it is bound to, that flow's activity as last heard (seed 002), and where what
the node pushes for it goes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eomsg.client.consumer import Item
from eomsg.core.election import FlowEvent


class Subscription:
    """The Subscribe request ``rid`` on ``queue``: the flow's state at bind, each later
    change of its activity, each batch and the error that ends it go to ``sink``, on
    the loop and in order."""

    def __init__(self, rid: int, queue: str, sink: Callable[[Item], None]):
        self.rid = rid
        self.queue = queue
        self.sink = sink
        self.flow = 0
        self.epoch = 0  # the latest epoch heard of
        self.active = False
        self.bound = False

    def bind(self, answer: dict[str, Any]) -> None:
        """The bind's answer: the flow's first state, said before any change of it."""
        self.bound, self.flow = True, answer.get("flow", 0)
        active, epoch = bool(answer.get("active")), answer.get("epoch", 0)
        self.epoch, self.active = epoch, active
        kind = "active" if active else "inactive"
        self.sink(FlowEvent(self.queue, self.flow, kind, active, epoch))

    def change(self, active: bool, epoch: int) -> None:
        """Apply a change of activity once: resends, and anything older, are ignored."""
        if epoch > self.epoch or (epoch == self.epoch and self.active and not active):
            self.epoch, self.active = epoch, active
            kind = "active" if active else "inactive"
            self.sink(FlowEvent(self.queue, self.flow, kind, active, epoch))

    def end(self, error: BaseException) -> None:
        """It is over, ``error`` says why: inactive first (if it was active), then the
        error."""
        self.change(False, self.epoch)
        self.sink(error)
