"""The local client: a :class:`~eomsg.node.node.Node` in this process, as a
:class:`~eomsg.client.broker.Broker`.

Every declared operation runs as the node's method of the same name, with the
arguments the operation fixes for every caller (``node_args``) and who calls
(``holder``, ``owner``) filled in as the server fills them in for a connection; the rest
is the node's own calls. So a program, the CLI or a Spark job written against a
:class:`Broker` behaves the same on a node it embeds as on one it reaches over a socket,
with one difference that :attr:`embedded` reports: no other process can reach this node
while it is open.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from eomsg.client.broker import Broker
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Key, Outgoing, PublishResult
from eomsg.core.operations import Operation
from eomsg.embedded.consumer import LocalConsumer
from eomsg.errors import EomsgError
from eomsg.node.node import Node, NodeSettings


class LocalClient(Broker):
    """A broker over ``node``; closing it closes the node only if it ``owns`` it (see
    :meth:`open`). ``holder`` names this client's deliveries, as a connection's do on a
    served node; ``name`` is the owner of the transactions it prepares. Thread-safe."""

    def __init__(self, node: Node, *, name: str = "", holder: int = 0, owns: bool = False):
        self.node = node
        self.name = name
        self.holder = holder
        self._owns = owns
        self._closed = False
        self._consumers: set[LocalConsumer] = set()
        self._consumers_lock = threading.Lock()
        node.add_listener(self._on_ready)

    @classmethod
    def open(
        cls,
        data_dir: Path | str,
        settings: NodeSettings | None = None,
        *,
        create: bool = True,
        name: str = "",
    ) -> LocalClient:
        """Open the node of ``data_dir`` in this process (see :meth:`Node.open`), owned
        by the client: closing the client closes it."""
        return cls(Node.open(data_dir, settings, create=create), name=name, owns=True)

    @property
    def address(self) -> str:
        return str(self.node.store.data_dir)

    @property
    def embedded(self) -> bool:
        """True: the node runs in this process."""
        return True

    def close(self) -> None:
        """Close this client's consumers still open (as a connection that ends cancels
        its subscriptions), then the node if this client owns it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            with self._consumers_lock:
                consumers = list(self._consumers)
            for consumer in consumers:
                with contextlib.suppress(EomsgError):
                    consumer.close()
        finally:
            if self._owns:
                self.node.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_operation(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any:
        """Run a declared operation as the node's method of the same name."""
        caller = {"holder": self.holder, "owner": self.name}
        method = getattr(self.node, op.name)
        return method(**args, **op.node_args, **{c: caller[c] for c in op.caller})

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> PublishResult:
        """Publish one message; returns once it is durable."""
        return self.node.publish(topic, payload, id=id, ttl=ttl, headers=headers)

    def publish_async(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Future[PublishResult]:
        """Queue one message for the next group commit; the future resolves once it is
        durable. Invalid input raises here."""
        batch = self.node.publish_batch_async([Outgoing(topic, payload, id, ttl, headers or {})])
        one: Future[PublishResult] = Future()

        def done(f: Future[list[PublishResult]]) -> None:
            error = f.exception()
            if error is not None:
                one.set_exception(error)
            else:
                one.set_result(f.result()[0])

        batch.add_done_callback(done)
        return one

    def publish_batch(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish messages atomically; durable on return."""
        return self.node.publish_batch(messages)

    def publish_batch_async(self, messages: Sequence[Outgoing]) -> Future[list[PublishResult]]:
        """Queue a batch; the future resolves once all of it is durable."""
        return self.node.publish_batch_async(messages)

    # -- consuming -------------------------------------------------------------------------

    def fetch(self, queue: str, max_messages: int = 100, wait: float = 0.0) -> list[Delivered]:
        """Take up to ``max_messages`` from ``queue``, waiting up to ``wait`` seconds for
        the first. Delete (or release) each before its deadline."""
        return self.node.fetch(queue, max_messages, wait, holder=self.holder)

    def delete(self, queue: str, keys: Sequence[Key], *, epoch: int = 0) -> list[bool]:
        """Delete deliveries made to this client; durable on return."""
        return self.node.delete(queue, keys, epoch=epoch, holder=self.holder)

    def delete_async(
        self, queue: str, keys: Sequence[Key], *, epoch: int = 0
    ) -> Future[list[bool]]:
        return self.node.delete_async(queue, keys, epoch=epoch, holder=self.holder)

    def release(
        self, queue: str, keys: Sequence[Key], delay: float = 0.0, *, epoch: int = 0
    ) -> None:
        """Give deliveries back for redelivery after ``delay`` seconds."""
        self.node.release(queue, keys, delay, epoch=epoch, holder=self.holder)

    def consumer(
        self,
        queue: str,
        prefetch: int = 256,
        idle_timeout: float | None = None,
        *,
        priority: int = 0,
        on_active: Callable[[FlowEvent], Any] | None = None,
        on_inactive: Callable[[FlowEvent], Any] | None = None,
        until_empty: bool = False,
    ) -> LocalConsumer:
        """Bind to ``queue`` as :meth:`Client.consumer <eomsg.client.sync.Client.consumer>`
        does, on the embedded node."""
        return LocalConsumer(
            self, queue, prefetch, idle_timeout, priority, on_active, on_inactive, until_empty
        )

    # -- the consumers' wake-ups -----------------------------------------------------------

    def _attach(self, consumer: LocalConsumer) -> None:
        with self._consumers_lock:
            self._consumers.add(consumer)

    def _detach(self, consumer: LocalConsumer) -> None:
        with self._consumers_lock:
            self._consumers.discard(consumer)

    def _on_ready(self, queue: str) -> None:
        """The node made messages ready in ``queue``: wake its consumers (on whichever
        thread made them ready, so this only hands the news on)."""
        with self._consumers_lock:
            waiting = [c for c in self._consumers if c.queue == queue]
        for c in waiting:
            c.poke()
