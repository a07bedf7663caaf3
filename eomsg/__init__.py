"""eomsg: durable, exactly-once messaging for applications that keep their own databases.

``eomsg.connect(...)`` talks to a running node (``eomsg serve``);
``eomsg.LocalClient.open(...)`` embeds one in this process; ``eomsg.open_dir(DIR)`` does
what the command line does: the node serving DIR, else DIR embedded. Both are an
:class:`eomsg.Broker`: the same operations, consumers, elections and transactions.
``broker.transaction(resources=[eomsg.DuckDBResource(app)])`` publishes, deletes and
changes the application's database atomically.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Where each public name lives. Imported on first use (PEP 562): ``import eomsg`` — and
# every command through a running node — loads neither the store (DuckDB, Arrow) nor the
# application databases' drivers.
_HOMES = {
    "AsyncClient": "eomsg.client.aio",
    "ClientTls": "eomsg.transport.tls",
    "Broker": "eomsg.client.broker",
    "Client": "eomsg.client.sync",
    "Delivered": "eomsg.core.message",
    "DuckDBResource": "eomsg.client.resources",
    "FlowEvent": "eomsg.core.election",
    "FlowInfo": "eomsg.core.election",
    "Inbox": "eomsg.client.inbox",
    "LocalClient": "eomsg.embedded.local",
    "Message": "eomsg.core.message",
    "Node": "eomsg.node.node",
    "NodeSettings": "eomsg.node.node",
    "Outgoing": "eomsg.core.message",
    "PostgresResource": "eomsg.client.resources",
    "PublishResult": "eomsg.core.message",
    "QueueConfig": "eomsg.core.queues",
    "Received": "eomsg.client.consumer",
    "SQLiteResource": "eomsg.client.resources",
    "TableSink": "eomsg.client.sink",
    "Transaction": "eomsg.client.transaction",
    "TxnInfo": "eomsg.core.txn",
    "connect": "eomsg.client.sync",
    "connect_async": "eomsg.client.aio",
    "open_dir": "eomsg.embedded.reach",
    "recover_resource": "eomsg.client.transaction",
    "settle_collector": "eomsg.node.collector",
}

if TYPE_CHECKING:
    from eomsg.client.aio import AsyncClient, connect_async
    from eomsg.client.broker import Broker
    from eomsg.client.consumer import Received
    from eomsg.client.inbox import Inbox
    from eomsg.client.resources import DuckDBResource, PostgresResource, SQLiteResource
    from eomsg.client.sink import TableSink
    from eomsg.client.sync import Client, connect
    from eomsg.client.transaction import Transaction, recover_resource
    from eomsg.core.election import FlowEvent, FlowInfo
    from eomsg.core.message import Delivered, Message, Outgoing, PublishResult
    from eomsg.core.queues import QueueConfig
    from eomsg.core.txn import TxnInfo
    from eomsg.embedded.local import LocalClient
    from eomsg.embedded.reach import open_dir
    from eomsg.node.collector import settle_collector
    from eomsg.node.node import Node, NodeSettings
    from eomsg.transport.tls import ClientTls


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'eomsg' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "AsyncClient",
    "Broker",
    "Client",
    "ClientTls",
    "Delivered",
    "DuckDBResource",
    "FlowEvent",
    "FlowInfo",
    "Inbox",
    "LocalClient",
    "Message",
    "Node",
    "NodeSettings",
    "Outgoing",
    "PostgresResource",
    "PublishResult",
    "QueueConfig",
    "Received",
    "SQLiteResource",
    "TableSink",
    "Transaction",
    "TxnInfo",
    "connect",
    "connect_async",
    "open_dir",
    "recover_resource",
    "settle_collector",
]
