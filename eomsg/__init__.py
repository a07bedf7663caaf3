"""eomsg: durable, exactly-once messaging for applications that keep their own databases.

``eomsg.connect(...)`` talks to a running node (``eomsg serve``);
``eomsg.LocalClient.open(...)`` embeds one in this process. Both are an
:class:`eomsg.Broker`: the same operations, consumers, elections and transactions.
``broker.transaction(resources=[eomsg.DuckDBResource(app)])`` publishes, deletes and
changes the application's database atomically.
"""

from eomsg.client import AsyncClient, Client, Received, connect, connect_async
from eomsg.client.broker import Broker
from eomsg.client.inbox import Inbox
from eomsg.client.resources import DuckDBResource, PostgresResource, SQLiteResource
from eomsg.client.sink import TableSink
from eomsg.client.transaction import Transaction, recover_resource
from eomsg.core.election import FlowEvent, FlowInfo
from eomsg.core.message import Delivered, Message, Outgoing, PublishResult
from eomsg.core.queues import QueueConfig
from eomsg.core.txn import TxnInfo
from eomsg.embedded import LocalClient
from eomsg.node.node import Node, NodeSettings

__all__ = [
    "AsyncClient",
    "Broker",
    "Client",
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
    "recover_resource",
]
