"""One interface to a node, wherever it runs.

:class:`Broker` is what the CLI, the Spark jobs, the scripts and an application written
against either backend take: a :class:`~eomsg.client.sync.Client` of a running node, or
a :class:`~eomsg.embedded.LocalClient` over a node embedded in this process. Both offer
the declared operations (:mod:`eomsg.core.operations`), publishing, fetching and
settling, a :meth:`~Broker.consumer` bound to a queue, :meth:`~Broker.elect` and
:meth:`~Broker.transaction`, with the same contracts; what differs is where the node
lives, which :attr:`~Broker.embedded` says (an embedded node is reachable by this
process only: nobody else can publish to it meanwhile).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Key, Outgoing, PublishResult
from eomsg.core.operations import Operation, Operations
from eomsg.core.queues import QueueConfig
from eomsg.core.txn import DEFAULT_TIMEOUT
from eomsg.errors import QueueExists, UsageError

if TYPE_CHECKING:  # drivers of application databases, asyncio: only where used
    from eomsg.client.consumer import Received
    from eomsg.client.resources import Resource
    from eomsg.client.transaction import Transaction

T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """The future of one publish or deletion: a :class:`concurrent.futures.Future` or
    the synchronous client's cheaper ``Ack``."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> T_co: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...


class BoundConsumer(Protocol):
    """A flow bound to one queue, read from a thread (see
    :class:`~eomsg.client.blocking.BlockingConsumer`)."""

    @property
    def active(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    @property
    def flow(self) -> int: ...

    def wait_active(self, timeout: float | None = None) -> bool: ...

    def __iter__(self) -> Iterator[Received]: ...

    def events(self) -> Iterator[Received | FlowEvent]: ...

    def batches(
        self, max_messages: int, limit: int | None = None
    ) -> Iterator[list[Received] | FlowEvent]: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> BoundConsumer: ...

    def __exit__(self, *exc: object) -> None: ...


class Broker(Operations, Protocol):
    """A node as its users see it; see the module's docstring. Both implementations
    subclass it, inheriting the operations, :meth:`elect` and :meth:`transaction`."""

    @property
    def address(self) -> str:
        """Where the node is: its socket or TCP address, or its data directory when it
        is embedded."""
        ...

    @property
    def embedded(self) -> bool:
        """Whether the node runs in this process (and no other can reach it)."""
        ...

    def run_operation(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any: ...

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> PublishResult: ...

    def publish_async(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Pending[PublishResult]: ...

    def publish_batch(self, messages: Sequence[Outgoing]) -> list[PublishResult]: ...

    def publish_batch_async(self, messages: Sequence[Outgoing]) -> Future[list[PublishResult]]: ...

    def fetch(self, queue: str, max_messages: int = 100, wait: float = 0.0) -> list[Delivered]: ...

    def delete(self, queue: str, keys: Sequence[Key], *, epoch: int = 0) -> list[bool]: ...

    def delete_async(
        self, queue: str, keys: Sequence[Key], *, epoch: int = 0
    ) -> Future[list[bool]]: ...

    def release(
        self, queue: str, keys: Sequence[Key], delay: float = 0.0, *, epoch: int = 0
    ) -> None: ...

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
    ) -> BoundConsumer: ...

    def elect(
        self,
        name: str,
        *,
        priority: int = 0,
        max_active: int = 1,
        immediate: bool = False,
        on_active: Callable[[FlowEvent], Any] | None = None,
        on_inactive: Callable[[FlowEvent], Any] | None = None,
    ) -> BoundConsumer:
        """Stand for election on the queue ``name`` (seed 002: the queue as an election
        mechanism), creating it with ``max_active`` and ``immediate`` if missing (an
        existing queue keeps its settings). Use the result as a context manager;
        ``wait_active()`` blocks until elected, ``active`` says whether it still is. The
        same on every backend: a consumer that takes one message at a time."""
        config = QueueConfig.create(name, max_active=max_active, immediate=immediate)
        with contextlib.suppress(QueueExists):
            self.create_queue(config)
        return self.consumer(
            name, prefetch=1, priority=priority, on_active=on_active, on_inactive=on_inactive
        )

    def transaction(
        self, resources: Sequence[Resource] = (), *, timeout: float | None = DEFAULT_TIMEOUT
    ) -> Transaction:
        """A transaction over this node and at most one application database: use it as
        a context manager (see :mod:`eomsg.client.transaction`)."""
        from eomsg.client.transaction import Transaction

        return Transaction(self, resources, timeout=timeout)

    def close(self) -> None: ...

    def __enter__(self) -> Broker: ...

    def __exit__(self, *exc: object) -> None: ...


def require_served(broker: Broker, what: str) -> None:
    """UsageError unless ``broker`` reaches a running node: ``what`` needs one (another
    process must be able to publish to it, or it acts on a flow such a node holds)."""
    if broker.embedded:
        raise UsageError(
            f"{what} needs a running node; start one with `eomsg serve --data DIR` "
            "(or give --broker)"
        )
