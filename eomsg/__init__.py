"""eomsg: durable, exactly-once messaging for applications that keep their own databases.

``eomsg.connect(...)`` talks to a running node (``eomsg serve``); ``eomsg.Node.open(...)``
embeds one in this process.
"""

from eomsg.client import AsyncClient, Client, Received, connect, connect_async
from eomsg.client.inbox import Inbox
from eomsg.core.election import FlowEvent, FlowInfo
from eomsg.core.message import Delivered, Message, Outgoing, PublishResult
from eomsg.core.queues import QueueConfig
from eomsg.node.node import Node, NodeSettings

__all__ = [
    "AsyncClient",
    "Client",
    "Delivered",
    "FlowEvent",
    "FlowInfo",
    "Inbox",
    "Message",
    "Node",
    "NodeSettings",
    "Outgoing",
    "PublishResult",
    "QueueConfig",
    "Received",
    "connect",
    "connect_async",
]
