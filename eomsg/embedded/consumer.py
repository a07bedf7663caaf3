"""The local consumer: a flow bound to a queue of a node in this process, read from a
thread as :class:`~eomsg.client.sync.Consumer` is read (the same
:class:`~eomsg.client.blocking.BlockingConsumer`).

Nothing is pushed: when its buffer is empty, the consumer takes up to ``prefetch`` less
what the application holds from the node itself, under its flow's epoch. The deletes
the application makes meanwhile are gathered and go to the node as one call just before
that take, so they share its group commit (and :meth:`LocalConsumer.close` sends what is
left). Waiting on a delete's future sends the gathered ones at once.
A buffered delivery the application did not get to before its hand-out-by time
(see :mod:`eomsg.client.prefetch`) is given back unseen at the next take; the changes of
the flow's activity come from the node's ``notify``, as they happen.
"""

from __future__ import annotations

import contextlib
import queue as queuelib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from eomsg.client.blocking import BlockingConsumer
from eomsg.client.consumer import Item, Pushed
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Key
from eomsg.errors import EomsgError, StaleDelivery

if TYPE_CHECKING:
    from eomsg.embedded.local import LocalClient

POLL = 1.0  # seconds an idle consumer waits before looking for redeliveries come due


class LocalConsumer(BlockingConsumer):
    """``with local.consumer(queue) as consumer: for msg in consumer: …; msg.delete()``."""

    def __init__(self, client: LocalClient, queue: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(queue, *args, **kwargs)
        self.client = client
        self._woken = threading.Condition()
        self._wakes = 0
        self._deletes: list[tuple[int, Key, Future[bool]]] = []  # epoch, key, its future
        self._deletes_lock = threading.Lock()

    def __enter__(self) -> LocalConsumer:
        self._start_caller()
        try:
            self.client._attach(self)
            flow = self.client.node.bind(
                self.queue, priority=self.priority, owner=self.client.name, notify=self._sink
            )
        except BaseException:
            self.client._detach(self)
            self._stop_caller()
            raise
        self._subscription = flow.flow
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait until every deletion made through this consumer is durable, then unbind:
        messages handed out and not deleted go back to the queue, for the next active
        flow (those never handed out un-counted). Idempotent."""
        try:
            self._send_deletes()
            self.flush()
        finally:
            if self._subscription is not None:
                flow, self._subscription = self._subscription, None
                with contextlib.suppress(EomsgError):  # unbound already, or node closed
                    self.client.node.unbind(self.queue, flow, seen=self._buffer.seen())
            self.client._detach(self)
            self._stop_caller()

    def poke(self) -> None:
        """Something changed for this consumer (messages ready, or its activity): stop
        waiting and look again."""
        with self._woken:
            self._wakes += 1
            self._woken.notify_all()

    def _sink(self, event: FlowEvent) -> None:
        """The node's notify, under its lock: note the change and hand it on. A flow
        that is bound starts active or inactive; one unbound by an administrator is
        inactive from now on."""
        active = event.active and event.kind != "unbound"
        epoch = event.epoch if event.kind != "unbound" else self.activity.epoch
        kind = "active" if active else "inactive"
        change = FlowEvent(event.queue, event.flow, kind, active, epoch)
        if not active:
            self._buffer.drop()  # the node took them back for the next active flow
        self._noted(change)
        self._inbox.put(change)
        self.poke()

    def _next_item(self) -> Item | None:
        """The next change of activity, else what the node has for this consumer now;
        waits (up to ``idle_timeout``) while there is neither — unless ``until_empty``,
        which ends at the first take that finds nothing."""
        node = self.client.node
        deadline = None if self.idle_timeout is None else time.monotonic() + self.idle_timeout
        while True:
            with self._woken:
                wakes = self._wakes
            with contextlib.suppress(queuelib.Empty):
                return self._inbox.get_nowait()
            self._give_back_late()
            self._send_deletes()
            room = self.prefetch - len(self._buffer.seen())
            taken: list[Delivered] = []
            if self.activity.active and room > 0 and self._subscription is not None:
                taken, _ = node.take(
                    self.queue, room, flow=self._subscription, holder=self.client.holder
                )
            if taken or self.until_empty:
                node_now, now = node.clock(), time.monotonic()
                self._buffer.arrived(taken, node_now, now, node_now - now)
                return Pushed(taken, node_now)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            with self._woken:
                if self._wakes == wakes:
                    self._woken.wait(POLL if left is None else min(POLL, left))

    def _more_arrived(self) -> bool:
        return not self._inbox.empty()

    def _lease_valid(self) -> bool:
        return True  # the node is in this process: it cannot lose sight of us

    def _renew_lease(self) -> None:
        """Never asked for: see :meth:`_lease_valid`."""

    def _give_back_late(self) -> None:
        late = self._buffer.expire(time.monotonic())
        if late:
            with contextlib.suppress(EomsgError):  # over already: nothing to give back
                self.client.node.return_unseen(
                    self.queue, late, epoch=self.activity.epoch, holder=self.client.holder
                )

    def _settle(self, how: str, d: Delivered, delay: float | None) -> Future[Any]:
        self._buffer.settled(d.key)
        future: Future[Any]
        if how == "delete":
            future = _Deletion(self)
            with self._deletes_lock:
                self._deletes.append((d.epoch, d.key, future))
        else:
            future = Future()
            try:
                self.client.release(self.queue, [d.key], delay or 0.0, epoch=d.epoch)
            except EomsgError as e:
                future.set_exception(e)
            else:
                future.set_result(None)
        self._track(future)
        return future

    def _send_deletes(self) -> None:
        """Send the gathered deletes, one call per epoch; a call refused for a stale
        delivery is sent again one message at a time, so each gets its own verdict."""
        with self._deletes_lock:
            gathered, self._deletes = self._deletes, []
        by_epoch: dict[int, list[tuple[Key, Future[bool]]]] = {}
        for epoch, key, future in gathered:
            by_epoch.setdefault(epoch, []).append((key, future))
        for epoch, items in by_epoch.items():
            self._delete(epoch, items)

    def _delete(self, epoch: int, items: list[tuple[Key, Future[bool]]]) -> None:
        client = self.client
        try:
            committed = client.node.delete_async(
                self.queue, [k for k, _ in items], epoch=epoch, holder=client.holder
            )
        except StaleDelivery as e:
            if len(items) == 1:
                items[0][1].set_exception(e)
                return
            for item in items:
                self._delete(epoch, [item])
            return
        except EomsgError as e:
            for _, future in items:
                future.set_exception(e)
            return
        committed.add_done_callback(_fan_out([f for _, f in items]))


class _Deletion(Future[bool]):
    """The future of a gathered delete: waiting on it sends what is gathered first."""

    def __init__(self, consumer: LocalConsumer) -> None:
        super().__init__()
        self._consumer = consumer

    def result(self, timeout: float | None = None) -> bool:
        self._consumer._send_deletes()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._consumer._send_deletes()
        return super().exception(timeout)


def _fan_out(futures: list[Future[bool]]) -> Callable[[Future[list[bool]]], None]:
    """The callback that gives each message its part of a batch's outcome."""

    def done(f: Future[list[bool]]) -> None:
        error = f.exception()
        for i, future in enumerate(futures):
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(f.result()[i])

    return done
