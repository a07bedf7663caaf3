"""A node embedded in this process, offered as a :class:`~eomsg.client.broker.Broker`:
:class:`LocalClient` and its :class:`LocalConsumer`."""

from eomsg.embedded.consumer import LocalConsumer
from eomsg.embedded.local import LocalClient

__all__ = ["LocalClient", "LocalConsumer"]
