"""A node embedded in this process, offered as a :class:`~eomsg.client.broker.Broker`:
:class:`LocalClient` and its :class:`LocalConsumer` (imported when asked for: a command
that only publishes or looks never loads the consumers, nor asyncio with them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eomsg.embedded.local import LocalClient

if TYPE_CHECKING:
    from eomsg.embedded.consumer import LocalConsumer

__all__ = ["LocalClient", "LocalConsumer"]


def __getattr__(name: str) -> Any:
    if name == "LocalConsumer":
        from eomsg.embedded.consumer import LocalConsumer

        return LocalConsumer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
