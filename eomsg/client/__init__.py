"""The Python API applications write against: :func:`connect` (threads) and
:func:`connect_async` (asyncio) to a running node."""

from eomsg.client.aio import AsyncClient, connect_async
from eomsg.client.consumer import AsyncConsumer, Received
from eomsg.client.sync import Client, Consumer, connect

__all__ = [
    "AsyncClient",
    "AsyncConsumer",
    "Client",
    "Consumer",
    "Received",
    "connect",
    "connect_async",
]
