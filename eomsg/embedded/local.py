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
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eomsg.client.broker import Broker
from eomsg.client.futures import failed, first
from eomsg.core.access import OWNER
from eomsg.core.durations import ttl_seconds
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Key, Outgoing, PublishResult
from eomsg.core.operations import Operation
from eomsg.errors import EomsgError, InvalidInput, Unavailable
from eomsg.node.node import Node, NodeSettings

if TYPE_CHECKING:  # its consumers (and asyncio) are imported once one is made
    from eomsg.embedded.consumer import LocalConsumer

_holders = itertools.count(1 << 40)  # apart from the server's sessions, which count from 1


class LocalClient(Broker):
    """A broker over ``node``; closing it closes the node only if it ``owns`` it (see
    :meth:`open`). Like a connection to a served node, each client is a holder of its
    own (only it settles the deliveries made to it) and the owner of the transactions it
    prepares; closing it gives back what it fetched and did not settle, and leaves its
    prepared transactions in doubt (for recovery), as a connection that ends does.
    Thread-safe."""

    def __init__(self, node: Node, *, name: str | None = None, owns: bool = False):
        self.node = node
        self.holder = next(_holders)
        self.name = name if name is not None else f"local-{self.holder}"
        self._owns = owns
        self._closed = False
        self._closing = False
        self._lock = threading.Lock()  # guards _closing and the next two
        self._consumers: set[LocalConsumer] = set()
        self._fetched: dict[str, dict[int, int]] = {}  # queue -> seq -> attempt, unsettled
        node.add_listener(self._on_ready)

    @classmethod
    def open(
        cls,
        data_dir: Path | str,
        settings: NodeSettings | None = None,
        *,
        create: bool = True,
        name: str | None = None,
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
        """End this client as a connection ends: its consumers still open are unbound
        (an iteration under way raises Unavailable), what it fetched and did not settle
        is given back, its prepared transactions are in doubt from now on; then the node
        is closed if this client owns it. Idempotent."""
        if self._closed:
            return
        try:
            with self._lock:
                self._closing = True  # no consumer is attached from now on
                consumers = list(self._consumers)
            # Each step alone: one that fails (a queue deleted meanwhile, a delete
            # refused — its future says so —, the node closed) must not skip the rest.
            for consumer in consumers:  # each sends its deletes, then unbinds
                with contextlib.suppress(EomsgError):
                    consumer.lost(Unavailable("the client is closed"))
            with self._lock:
                self._closed = True
                fetched, self._fetched = self._fetched, {}
            for queue, held in fetched.items():
                with contextlib.suppress(EomsgError):
                    self.node.delivery.release_held(queue, list(held.items()), self.holder)
            with contextlib.suppress(EomsgError):
                self.node.participant.disown_txns(self.name)
        finally:
            self._closed = True
            self.node.remove_listener(self._on_ready)
            if self._owns:
                self.node.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_operation(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any:
        """Run a declared operation as the node's method of the same name, with the
        arguments the server would add for a connection."""
        self._check_open()
        caller = {"holder": self.holder, "owner": self.name, "by": OWNER}  # its own node
        method = self.node.operation(op.name)
        value = method(**args, **op.node_args, **{c: caller[c] for c in op.caller})
        for queue, seq, _, attempt in args.get("deletes", ()) if "holder" in op.caller else ():
            self._settled(queue, [(seq, attempt)])  # held by a transaction, or deleted
        return value

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> PublishResult:
        """Publish one message; returns once it is durable."""
        self._check_open()
        return self.node.ingress.publish(
            topic, payload, id=id, ttl=ttl_seconds(ttl), headers=headers
        )

    def publish_async(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Future[PublishResult]:
        """Queue one message for the next group commit; the future resolves once it is
        durable, or fails with the node's refusal (DiskFull, …). Invalid input raises
        here."""
        message = Outgoing(topic, payload, id, ttl_seconds(ttl), headers or {})
        return first(self.publish_batch_async([message]))

    def publish_batch(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish messages atomically; durable on return."""
        self._check_open()
        return self.node.ingress.publish_batch(messages)

    def publish_batch_async(self, messages: Sequence[Outgoing]) -> Future[list[PublishResult]]:
        """Queue a batch; the future resolves once all of it is durable, or fails with
        the node's refusal. Invalid input raises here."""
        self._check_open()
        try:
            return self.node.ingress.publish_batch_async(messages)
        except InvalidInput:
            raise
        except EomsgError as e:
            return failed(e)

    # -- consuming -------------------------------------------------------------------------

    def fetch(self, queue: str, max_messages: int = 100, wait: float = 0.0) -> list[Delivered]:
        """Take up to ``max_messages`` from ``queue``, waiting up to ``wait`` seconds for
        the first. Delete (or release) each before its deadline; what is neither when
        this client closes is given back."""
        self._check_open()
        taken = self.node.delivery.fetch(queue, max_messages, wait, holder=self.holder)
        if taken:
            with self._lock:
                self._fetched.setdefault(queue, {}).update(d.key for d in taken)
        return taken

    def delete(self, queue: str, keys: Sequence[Key], *, epoch: int = 0) -> list[bool]:
        """Delete deliveries made to this client; durable on return."""
        return self.delete_async(queue, keys, epoch=epoch).result()

    def delete_async(
        self, queue: str, keys: Sequence[Key], *, epoch: int = 0
    ) -> Future[list[bool]]:
        """Queue the deletion of ``keys``; the future resolves once it is durable, or
        fails with the node's refusal (StaleDelivery, QueueNotFound, …)."""
        try:
            return self._delete(queue, keys, epoch)
        except Unavailable:
            raise
        except EomsgError as e:
            return failed(e)

    def _delete(self, queue: str, keys: Sequence[Key], epoch: int) -> Future[list[bool]]:
        """:meth:`delete_async`, with what the node refuses at once raised here (a
        consumer's deleter splits a batch refused as stale)."""
        self._check_open()
        done = self.node.delivery.delete_async(queue, keys, epoch=epoch, holder=self.holder)
        self._settled(queue, keys)
        return done

    def release(
        self, queue: str, keys: Sequence[Key], delay: float = 0.0, *, epoch: int = 0
    ) -> None:
        """Give deliveries back for redelivery after ``delay`` seconds."""
        self._check_open()
        self.node.delivery.release(queue, keys, delay, epoch=epoch, holder=self.holder)
        self._settled(queue, keys)

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
        from eomsg.embedded.consumer import LocalConsumer

        return LocalConsumer(
            self, queue, prefetch, idle_timeout, priority, on_active, on_inactive, until_empty
        )

    # -- what this client holds, as a connection's session keeps it ------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the client is closed")

    def _attach(self, consumer: LocalConsumer) -> None:
        with self._lock:
            if self._closing:
                raise Unavailable("the client is closed")
            self._consumers.add(consumer)

    def _detach(self, consumer: LocalConsumer) -> None:
        with self._lock:
            self._consumers.discard(consumer)

    def _settled(self, queue: str, keys: Iterable[Key]) -> None:
        """Settled deliveries (deleted, released, held by a transaction) are no longer
        this client's to give back, nor count against its consumers' prefetch."""
        keys = list(keys)
        with self._lock:
            fetched = self._fetched.get(queue)
            for seq, attempt in keys if fetched else ():
                if fetched is not None and fetched.get(seq) == attempt:
                    del fetched[seq]
            consumers = [c for c in self._consumers if c.queue == queue]
        for c in consumers:
            c.settled(keys)

    def _on_ready(self, queue: str) -> None:
        """The node made messages ready in ``queue``: wake its consumers (on whichever
        thread made them ready, so this only hands the news on)."""
        with self._lock:
            waiting = [c for c in self._consumers if c.queue == queue]
        for c in waiting:
            c.poke()
