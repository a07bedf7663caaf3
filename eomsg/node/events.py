"""Events between the node's components, by explicit subscription.

A component that something else must hear about says so with a :class:`Signal` it owns
(``NodeState.queue_dropped``, ``Egress.done``, …); the node subscribes the components
that listen when it assembles them (:class:`~eomsg.node.node.Node`), so who hears what
is written in one place — rather than a hook left empty in one class and overridden in
another further down an inheritance chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Signal(Generic[P]):
    """An event with its subscribers, called in the order they subscribed, on the thread
    that emits it and under whatever lock it holds (each signal's owner documents which):
    so a subscriber must be quick and must not take a lock its emitter may hold."""

    __slots__ = ("_subscribers",)

    def __init__(self) -> None:
        self._subscribers: tuple[Callable[P, None], ...] = ()

    def subscribe(self, subscriber: Callable[P, None]) -> None:
        """Call ``subscriber`` at each emit from now on."""
        self._subscribers = (*self._subscribers, subscriber)

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for subscriber in self._subscribers:
            subscriber(*args, **kwargs)
