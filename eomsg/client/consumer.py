"""A consumer: a flow bound to one queue, as the application reads it.

The node pushes deliveries to the subscription on the asyncio client's loop; a consumer
keeps them in its prefetch buffer (:mod:`eomsg.client.prefetch`) and hands the
application only those it cannot know to be over, follows its flow's activity (seed 002)
and settles what the application deletes or releases. :class:`BaseConsumer` holds all of
that; :class:`AsyncConsumer` (here) and :class:`~eomsg.client.sync.Consumer` differ only in
how they wait for the next item, renew their lease and settle a message.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eomsg.client.prefetch import Prefetch
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Key, Message
from eomsg.errors import EomsgError, UsageError

if TYPE_CHECKING:
    from eomsg.client.aio import AsyncClient


@dataclass(frozen=True, slots=True)
class Pushed:
    """Deliveries a node pushed to a subscription (none: nothing is ready for it now),
    and the node's clock when it sent them."""

    deliveries: list[Delivered]
    node_now: float


Item = Pushed | FlowEvent | BaseException
"""What a subscription's sink receives, in wire order: deliveries, a change of its
flow's activity, or the error that ended it."""


class Renew(enum.Enum):
    """What a consumer's buffer says when it may hand nothing out before the node has
    been heard from again."""

    LEASE = "lease"


class Received:
    """A delivered message in a consumer's hands: read it, then :meth:`delete` it (or
    :meth:`release` it to have it delivered again)."""

    __slots__ = ("_settle", "delivered")

    def __init__(self, delivered: Delivered, settle: Callable[[str, Delivered, float | None], Any]):
        self.delivered = delivered
        self._settle = settle

    @property
    def message(self) -> Message:
        return self.delivered.message

    @property
    def seq(self) -> int:
        return self.delivered.message.seq

    @property
    def topic(self) -> str:
        return self.delivered.message.topic

    @property
    def payload(self) -> bytes:
        return self.delivered.message.payload

    @property
    def id(self) -> str | None:
        return self.delivered.message.id

    @property
    def headers(self) -> dict[str, str]:
        return self.delivered.message.headers

    @property
    def attempt(self) -> int:
        return self.delivered.attempt

    @property
    def queue(self) -> str:
        return self.delivered.queue

    @property
    def epoch(self) -> int:
        return self.delivered.epoch

    def delete(self) -> Any:
        """Delete the message from its queue. Returns a future (of the flavour of the
        client) that resolves once the deletion is durable — or fails with StaleDelivery
        (StaleEpoch) if this delivery is over: it timed out and was handed out again, or
        this consumer lost activity since and the message went to another (so is a
        delete made after the consumer's exit, which gave the message back), or with
        Unavailable once the client is closed. The consumer's exit waits for all of
        them."""
        return self._settle("delete", self.delivered, None)

    def release(self, delay: float = 0.0) -> Any:
        """Give the message back, to be delivered again after ``delay`` seconds (0 to
        100 years: InvalidInput otherwise)."""
        return self._settle("release", self.delivered, delay)

    def return_unseen(self) -> Any:
        """Give the message back as if it had never been handed out: its attempt is not
        counted (so it does not move toward the dead-letter queue). For a message nothing
        acted on — one the application could not even take, as ``eomsg consume`` a
        payload its output format cannot carry; a message a handler tried is released."""
        return self._settle("unseen", self.delivered, None)

    def __repr__(self) -> str:
        return f"Received(queue={self.queue!r}, seq={self.seq}, topic={self.topic!r})"


class Activity:
    """The activity of a consumer's flow as its application sees it (seed 002), fed the
    FlowEvents of the subscription in order. ``dispatch`` runs the application's
    callbacks — on the loop for the asyncio consumer, on a thread of their own for the
    synchronous one, so a slow callback never stalls the connection."""

    __slots__ = ("_dispatch", "_on_active", "_on_inactive", "active", "epoch", "flow")

    def __init__(
        self,
        on_active: Callable[[FlowEvent], Any] | None,
        on_inactive: Callable[[FlowEvent], Any] | None,
        dispatch: Callable[[Callable[[FlowEvent], Any], FlowEvent], None],
    ) -> None:
        self.flow = 0
        self.active = False
        self.epoch = 0
        self._on_active = on_active
        self._on_inactive = on_inactive
        self._dispatch = dispatch

    @property
    def has_callbacks(self) -> bool:
        return self._on_active is not None or self._on_inactive is not None

    def apply(self, event: FlowEvent) -> None:
        self.flow, self.active, self.epoch = event.flow, event.active, event.epoch
        callback = self._on_active if event.active else self._on_inactive
        if callback is not None:
            self._dispatch(callback, event)

    def current(self, d: Delivered) -> bool:
        """False for a delivery of an epoch that is over: the node took it back when the
        flow lost activity, and the active flow gets it; the application must not."""
        return self.active and d.epoch == self.epoch


class BaseConsumer(abc.ABC):
    """What every flavour of consumer shares: the binding's settings, the activity of its
    flow, its prefetch buffer (see :mod:`eomsg.client.prefetch`), and how the items of
    its inbox are read. The flavours differ in how they wait for the next item, renew
    their lease, run the activity callbacks and settle a message."""

    def __init__(
        self,
        queue: str,
        prefetch: int,
        idle_timeout: float | None,
        priority: int = 0,
        on_active: Callable[[FlowEvent], Any] | None = None,
        on_inactive: Callable[[FlowEvent], Any] | None = None,
        until_empty: bool = False,
    ) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self.idle_timeout = idle_timeout
        self.priority = priority
        self.until_empty = until_empty
        self.activity = Activity(on_active, on_inactive, self._dispatch)
        self._batch: list[Delivered] = []
        self._subscription: int | None = None
        self._buffer = Prefetch()
        self._left = False  # closed (by the application, or with its client)

    @property
    def active(self) -> bool:
        """Whether this consumer's flow is active: False once the connection is lost,
        and once the consumer is closed (leaving an election is not losing it — no
        ``on_inactive`` — but a leader that left leads no more)."""
        return self.activity.active and not self._left

    @property
    def epoch(self) -> int:
        return self.activity.epoch

    @property
    def flow(self) -> int:
        return self.activity.flow

    def _check_bound(self) -> None:
        if self._subscription is None:
            raise UsageError(
                f"the consumer of {self.queue!r} is not open: use it in a `with` block "
                "(`async with` for the asyncio client) before iterating"
            )

    def _next_buffered(self) -> Delivered | Renew | None:
        """The next buffered delivery the application may have now (it counts as seen),
        None when the buffer is empty, or :attr:`Renew.LEASE` when the lease must be
        renewed first (the node may have cut this consumer off: ask it before handing
        anything out).
        Skips deliveries of an epoch that is over (the node took them back for the
        active flow), superseded ones and those too close to their deadline."""
        batch, activity = self._batch, self.activity
        while batch:
            d = batch[-1]
            if not activity.current(d):
                batch.pop()
                continue
            if not self._lease_valid():
                return Renew.LEASE
            batch.pop()
            if self._buffer.claim(d, time.monotonic()):
                return d
        return None

    def _step(self, item: Item) -> FlowEvent | bool:
        """Take one inbox item: raise the error that ended the subscription, return a
        change of activity to hand out, True to read on, or False to stop (an
        ``until_empty`` consumer told that nothing is ready for it)."""
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, FlowEvent):
            return item
        if not item.deliveries:
            return not self.until_empty
        self._batch = item.deliveries
        self._batch.reverse()
        return True

    @abc.abstractmethod
    def _lease_valid(self) -> bool:
        """Whether the node can still be taken to hold this consumer's deliveries for
        it (it may have cut off a consumer it has not heard from)."""

    @abc.abstractmethod
    def _dispatch(self, callback: Callable[[FlowEvent], Any], event: FlowEvent) -> None:
        """Run an activity callback, where this flavour runs them."""

    @abc.abstractmethod
    def _settle(self, how: str, d: Delivered, delay: float | None) -> Any:
        """Delete, release or give back unseen one received message, as this flavour's
        client does."""


class Pushes:
    """What a node pushes to ``consumer`` over ``connection`` (the asyncio client its
    subscription lives on), kept on the connection's loop: each batch noted in the
    consumer's buffer as it arrives (the buffer it holds then: it takes a new one each
    time it is entered), and a timer that gives back, unseen, what was not handed out
    in time. The asyncio and the synchronous consumer each hold one."""

    def __init__(self, consumer: BaseConsumer, connection: AsyncClient) -> None:
        self.consumer = consumer
        self.connection = connection
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_due = float("inf")  # monotonic time the timer fires at

    def on_loop(self, item: Item) -> None:
        """On the connection's loop, as each item arrives: note pushed deliveries in the
        buffer and arm the timer that gives back those not handed out in time; forget
        the buffer when the node took it back."""
        buffer = self.consumer._buffer
        if isinstance(item, Pushed):
            if item.deliveries:
                first = buffer.arrived(
                    item.deliveries,
                    item.node_now,
                    time.monotonic(),
                    self.connection.clock_offset,
                )
                self._arm(first)
        elif isinstance(item, BaseException) or not item.active:
            buffer.drop()

    def _arm(self, due: float) -> None:
        """Have the timer fire by ``due`` (monotonic). Whatever is pending has a timer
        due no later than its own hand-out-by time, so the earliest among deliveries
        that just arrived is all there is to compare."""
        if due >= self._expiry_due:
            return  # none pending, or an earlier timer re-arms itself
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_due = due
        self._expiry = self.connection.loop.call_later(
            max(0.0, due - time.monotonic()), self._expire
        )

    def _expire(self) -> None:
        """Give back, unseen, the deliveries not handed out before their hand-out-by
        time (the node un-counts them and hands them out again)."""
        self._expiry, self._expiry_due = None, float("inf")
        consumer, client = self.consumer, self.connection
        late = consumer._buffer.expire(time.monotonic())
        if late and client.failure is None and consumer._subscription is not None:
            epoch = consumer.activity.epoch
            task = client.loop.create_task(client.return_unseen(consumer.queue, late, epoch=epoch))
            task.add_done_callback(_ignore_error)
        self._arm(consumer._buffer.next_expiry())

    def unseen_on_close(self) -> list[Key]:
        """Stop the expiry timer; the deliveries handed out and not settled (the node
        takes back the rest un-counted)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry, self._expiry_due = None, float("inf")
        return self.consumer._buffer.seen()


def _ignore_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a give-back that failed is redelivered by timeout


class AsyncConsumer(BaseConsumer):
    """``async with client.consumer(queue) as consumer: async for msg in consumer``."""

    def __init__(self, client: AsyncClient, queue: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(queue, *args, **kwargs)
        self.client = client
        self._pushes = Pushes(self, client)
        # None: the consumer was closed, an iteration under way in another task ends
        self._inbox: asyncio.Queue[Item | None] = asyncio.Queue()
        self._became_active = asyncio.Event()
        self._pending: set[asyncio.Future[Any]] = set()

    def _dispatch(self, callback: Callable[[FlowEvent], Any], event: FlowEvent) -> None:
        callback(event)  # on the loop: the application's callbacks are its coroutines' peers

    def _lease_valid(self) -> bool:
        return self.client.lease_valid()

    async def wait_active(self, timeout: float | None = None) -> bool:
        """Wait until the flow is active; False if ``timeout`` passed first, or once the
        consumer is closed."""
        try:
            await asyncio.wait_for(self._became_active.wait(), timeout)
        except TimeoutError:
            return False
        return self.active

    def _sink(self, item: Item) -> None:
        self._pushes.on_loop(item)
        if isinstance(item, FlowEvent):
            self.activity.apply(item)
            if item.active:
                self._became_active.set()
            else:
                self._became_active.clear()
        self._inbox.put_nowait(item)

    async def __aenter__(self) -> AsyncConsumer:
        # entered again after a close: afresh, without the last iteration's end
        self._left, self._buffer, self._inbox = False, Prefetch(), asyncio.Queue()
        self._became_active.clear()
        self._subscription = await self.client.subscribe_raw(
            self.queue, self.prefetch, self._sink, self.priority
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Wait until every deletion made through this consumer is durable, then unbind
        (undeleted messages go back to the queue, for the next active flow; those never
        handed out un-counted)."""
        self.client.flush()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        seen = self._pushes.unseen_on_close()
        if self._subscription is not None:
            with contextlib.suppress(EomsgError):
                await self.client.cancel(self._subscription, seen)
            self._subscription = None
        self._left = True
        self._became_active.set()  # a wait_active under way returns (False)
        self._inbox.put_nowait(None)  # an iteration under way in another task ends

    def __aiter__(self) -> AsyncIterator[Received]:
        self._check_bound()
        return self._messages()

    async def _messages(self) -> AsyncIterator[Received]:
        async for item in self.events():
            if isinstance(item, Received):
                yield item

    async def events(self) -> AsyncIterator[Received | FlowEvent]:
        """Messages and changes of activity, in the order the node sent them."""
        self._check_bound()
        while True:
            while (d := self._next_buffered()) is not None:
                if d is Renew.LEASE:
                    with contextlib.suppress(EomsgError):  # lost: the activity says so
                        await self.client.ping()
                    continue
                yield Received(d, self._settle)
            try:
                item = await asyncio.wait_for(self._inbox.get(), self.idle_timeout)
            except TimeoutError:
                return
            if item is None:
                return
            step = self._step(item)
            if step is False:
                return
            if isinstance(step, FlowEvent):
                yield step

    def _settle(self, how: str, d: Delivered, delay: float | None) -> asyncio.Future[Any]:
        self._buffer.settled(d.key)
        future: asyncio.Future[Any]
        if how == "delete":
            future = self.client.delete_later(self.queue, d.key, d.epoch)
        elif how == "unseen":
            future = asyncio.ensure_future(
                self.client.return_unseen(self.queue, [d.key], epoch=d.epoch)
            )
        else:
            future = asyncio.ensure_future(
                self.client.release(self.queue, [d.key], delay or 0.0, epoch=d.epoch)
            )
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future
