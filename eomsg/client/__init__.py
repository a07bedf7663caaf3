"""The Python API applications write against: :func:`connect` (threads) and
:func:`connect_async` (asyncio) to a running node.

Each name is imported when first asked for: a module that needs one part of the client
(``eomsg.client.broker`` for the command line's ``--help``) does not pay for the rest."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eomsg.client.aio import AsyncClient, connect_async
    from eomsg.client.consumer import AsyncConsumer, Received
    from eomsg.client.sync import Client, Consumer, connect

_WHERE = {
    "AsyncClient": "eomsg.client.aio",
    "connect_async": "eomsg.client.aio",
    "AsyncConsumer": "eomsg.client.consumer",
    "Received": "eomsg.client.consumer",
    "Client": "eomsg.client.sync",
    "Consumer": "eomsg.client.sync",
    "connect": "eomsg.client.sync",
}
__all__ = [
    "AsyncClient",
    "AsyncConsumer",
    "Client",
    "Consumer",
    "Received",
    "connect",
    "connect_async",
]


def __getattr__(name: str) -> Any:
    """One of the names above, or a module of the package (``eomsg.client.sync``), as
    when they were all imported with the package."""
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
