"""A consumer read from threads: what the synchronous client's consumer and the embedded
one share.

The application iterates on its own thread; changes of activity are applied as they
arrive (so :attr:`active` and :meth:`wait_active` need no iteration) and the activity
callbacks run on a thread of the consumer's own, so a slow callback stalls neither the
node nor the connection. The flavours differ only in where the next item comes from —
pushed over a connection, or taken from a node in this process — and how a message is
settled.
"""

from __future__ import annotations

import abc
import logging
import queue as queuelib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

from eomsg.client.consumer import BaseConsumer, Item, Received, Renew
from eomsg.client.prefetch import Prefetch
from eomsg.core.election import FlowEvent
from eomsg.errors import StaleDelivery

log = logging.getLogger("eomsg.client")

PRUNE_AT = 4096  # settlements remembered before the resolved ones are dropped


class Settled(Protocol):
    """The future of one settlement (a :class:`concurrent.futures.Future` or the
    synchronous client's cheaper ``Ack``)."""

    def done(self) -> bool: ...

    def exception(self, timeout: float | None = None) -> BaseException | None: ...


class BlockingConsumer(BaseConsumer):
    """A consumer iterated from a thread; use it as a context manager."""

    def __init__(self, queue: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(queue, *args, **kwargs)
        # None: the consumer was closed, an iteration under way on another thread ends
        self._inbox: queuelib.SimpleQueue[Item | None] = queuelib.SimpleQueue()
        self._changed = threading.Condition()
        self._callbacks: queuelib.SimpleQueue[tuple[Callable[[FlowEvent], Any], FlowEvent] | None]
        self._callbacks = queuelib.SimpleQueue()
        self._caller: threading.Thread | None = None
        self._pending: list[Settled] = []
        self._prune_at = PRUNE_AT

    @abc.abstractmethod
    def _next_item(self) -> Item | None:
        """Wait for the next item; None once ``idle_timeout`` passed without one, or
        the consumer was closed."""

    @abc.abstractmethod
    def _more_arrived(self) -> bool:
        """Whether an item is there to be read without waiting."""

    @abc.abstractmethod
    def _renew_lease(self) -> None:
        """Hear from the node before handing anything more out (see ``Renew``)."""

    def _entering(self) -> None:
        """Entered — again, perhaps, after a close: afresh, without what the last
        binding left (its buffer, the end of its iteration)."""
        self._left, self._buffer, self._inbox = False, Prefetch(), queuelib.SimpleQueue()

    def _leave(self) -> None:
        """Closed: :attr:`active` is False from now on, a :meth:`wait_active` under way
        returns, and an iteration under way on another thread ends (the next item it
        reads is the end) rather than waiting for what will never come."""
        with self._changed:
            self._left = True
            self._changed.notify_all()
        self._inbox.put(None)

    def wait_active(self, timeout: float | None = None) -> bool:
        """Block until the flow is active; False if ``timeout`` passed first, or once
        the consumer is closed."""
        with self._changed:
            self._changed.wait_for(lambda: self.activity.active or self._left, timeout)
            return self.active

    def flush(self) -> None:
        """Block until every deletion so far is durable; raise the first that failed.
        A delete or release refused as stale is not raised again here: it changed
        nothing, and its own future said so."""
        pending, self._pending = self._pending, []
        for f in pending:
            error = f.exception()
            if error is not None and not isinstance(error, StaleDelivery):
                raise error

    def __iter__(self) -> Iterator[Received]:
        return cast(Iterator[Received], self._items(messages_only=True))

    def events(self) -> Iterator[Received | FlowEvent]:
        """Messages and changes of activity, in the order the node made them."""
        for item in self._items():
            if item is not None:
                yield item

    def batches(
        self, max_messages: int, limit: int | None = None
    ) -> Iterator[list[Received] | FlowEvent]:
        """:meth:`events` with the messages in lists of at most ``max_messages``: each
        list holds what had arrived when it was handed out — it goes out before the
        consumer would wait for anything more, never held while it waits — so a batch
        costs no latency, and none of its deliveries grows old in it. Ends after
        ``limit`` messages, if given (the rest stay unseen in the buffer)."""
        batch: list[Received] = []
        left = limit
        for item in self._items():
            if isinstance(item, Received):
                batch.append(item)
                if left is not None:
                    left -= 1
                if len(batch) < max_messages and left != 0:
                    continue
            if batch:
                yield batch
                batch = []
            if left == 0:
                return
            if isinstance(item, FlowEvent):
                yield item
        if batch:
            yield batch

    def _items(self, messages_only: bool = False) -> Iterator[Received | FlowEvent | None]:
        """:meth:`events`, with None each time the next item may have to be waited for:
        the buffer is empty and nothing more has arrived, or the lease must be renewed
        first. What a caller gathers must go out then (a batch held across a wait would
        hand out deliveries that may be over by the time it ends). With
        ``messages_only``, the messages alone: :meth:`__iter__`, with no generator of
        its own in between (one resumed for every message)."""
        self._check_bound()
        settle = self._settle
        while True:
            while (d := self._next_buffered()) is not None:
                if d is Renew.LEASE:
                    if not messages_only:
                        yield None
                    self._renew_lease()
                    continue
                yield Received(d, settle)
            if not messages_only and not self._more_arrived():
                yield None
            item = self._next_item()
            if item is None:
                return
            step = self._step(item)
            if step is False:
                return
            if isinstance(step, FlowEvent) and not messages_only:
                yield step

    def _noted(self, event: FlowEvent) -> None:
        """Apply a change of activity at once, waking :meth:`wait_active`."""
        with self._changed:
            self.activity.apply(event)
            self._changed.notify_all()

    def _track(self, future: Settled) -> None:
        """Remember a settlement, for :meth:`flush` to wait on. The resolved ones are
        dropped once the list has doubled since (so each is looked at about once, even
        with more than :data:`PRUNE_AT` in flight)."""
        self._pending.append(future)
        if len(self._pending) > self._prune_at:
            self._pending = [f for f in self._pending if not f.done() or f.exception()]
            self._prune_at = max(PRUNE_AT, 2 * len(self._pending))

    def _start_caller(self) -> None:
        if self.activity.has_callbacks:
            self._caller = threading.Thread(
                target=self._call_back, name=f"eomsg-activity-{self.queue}", daemon=True
            )
            self._caller.start()

    def _dispatch(self, callback: Callable[[FlowEvent], Any], event: FlowEvent) -> None:
        self._callbacks.put((callback, event))

    def _call_back(self) -> None:
        while (job := self._callbacks.get()) is not None:
            callback, event = job
            try:
                callback(event)
            except Exception:
                log.exception("the %s callback of queue %s failed", event.kind, self.queue)

    def _stop_caller(self) -> None:
        if self._caller is not None:
            self._callbacks.put(None)
            if self._caller is not threading.current_thread():
                self._caller.join()
            self._caller = None
