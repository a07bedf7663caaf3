"""The local consumer: a flow bound to a queue of a node in this process, read from a
thread as :class:`~eomsg.client.sync.Consumer` is read (the same
:class:`~eomsg.client.blocking.BlockingConsumer`), with the same contracts.

Nothing is pushed: when its buffer is empty, the consumer takes from the node itself,
under its flow's epoch, as many as its prefetch window has room for — the window counts
the deliveries it took and that are not settled yet (deleted, released, or held by a
transaction), as a served node's session counts them. Deletes go to the node from a
thread of the consumer's own (:mod:`eomsg.embedded.deleter`), as the client over the
wire sends them from its loop: each future resolves without being waited on, and the
deletes made meanwhile share one call and one commit. A buffered delivery the
application did not get to before its hand-out-by time (see
:mod:`eomsg.client.prefetch`) is given back unseen at the next take. The flow's changes
of activity come from the node's ``notify`` as they happen; an administrator's unbind
(or the queue's deletion) ends the iteration with Unbound, the client's closing with
Unavailable (after an inactive change), and the node's closing with NodeClosed — within
a poll for a consumer that is not active.
"""

from __future__ import annotations

import contextlib
import queue as queuelib
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from eomsg.client.blocking import BlockingConsumer
from eomsg.client.consumer import Item, Pushed
from eomsg.client.futures import failed
from eomsg.core.election import FlowEvent
from eomsg.core.message import Delivered, Key
from eomsg.embedded.deleter import Deleter
from eomsg.errors import EomsgError, Unbound

if TYPE_CHECKING:
    from eomsg.embedded.local import LocalClient


POLL = 1.0  # seconds an idle consumer waits before looking for redeliveries come due


class LocalConsumer(BlockingConsumer):
    """``with local.consumer(queue) as consumer: for msg in consumer: …; msg.delete()``."""

    def __init__(self, client: LocalClient, queue: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(queue, *args, **kwargs)
        self.client = client
        self._woken = threading.Condition()  # guards the next three
        self._wakes = 0
        self._held: dict[int, int] = {}  # seq -> attempt: taken, not settled
        self._closing = False
        self._deleter: Deleter | None = None

    def __enter__(self) -> LocalConsumer:
        self._entering()
        with self._woken:
            self._closing = False
            self._held.clear()
        self._start_caller()
        try:
            self.client._attach(self)
            flow = self.client.node.elections.bind(
                self.queue, priority=self.priority, owner=self.client.name, notify=self._sink
            )
        except BaseException:
            self.client._detach(self)
            self._stop_caller()
            raise
        self._subscription = flow.flow
        self._deleter = Deleter(self.client, self.queue)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait until every deletion made through this consumer is durable, then unbind:
        messages handed out and not deleted go back to the queue, for the next active
        flow (those never handed out un-counted). Idempotent."""
        try:
            if self._deleter is not None:
                self._deleter.stop()
            self.flush()
        finally:
            with self._woken:
                self._closing = True  # its own unbind is not news to anyone
                flow, self._subscription = self._subscription, None
            if flow is not None:
                with contextlib.suppress(EomsgError):  # unbound already, or node closed
                    self.client.node.elections.unbind(self.queue, flow, seen=self._buffer.seen())
            self.client._detach(self)
            self._leave()
            self.poke()
            self._stop_caller()

    def lost(self, error: EomsgError) -> None:
        """The client closed under this consumer, which counts as losing activity (as
        losing its connection does for a served one): if active, it becomes inactive
        at once — nothing more is handed out, ``on_inactive`` hears it — then an
        iteration under way raises ``error``; then unbind."""
        activity = self.activity
        if activity.active:
            self._apply(self._change(activity.flow, False, activity.epoch))
        self._inbox.put(error)
        self.poke()
        self.close()

    def poke(self) -> None:
        """Something changed for this consumer (messages ready, its activity, its
        window): stop waiting and look again."""
        with self._woken:
            self._wakes += 1
            self._woken.notify_all()

    def settled(self, keys: Iterable[Key]) -> None:
        """These deliveries were settled: they leave the prefetch window."""
        with self._woken:
            for seq, attempt in keys:
                if self._held.get(seq) == attempt:
                    del self._held[seq]
            self._wakes += 1
            self._woken.notify_all()

    def _sink(self, event: FlowEvent) -> None:
        """The node's notify, under its lock: note the change and hand it on, as the
        client over the wire applies a subscription's (each change once, in epoch
        order; an administrator's unbind is an inactive change, then Unbound)."""
        with self._woken:
            if self._closing:
                return
            if not event.active or event.kind == "unbound":
                self._held.clear()  # the node gave them back for the next active flow
        activity = self.activity
        if event.kind == "bound":
            change: FlowEvent | None = self._change(event.flow, event.active, event.epoch)
        elif event.kind == "unbound":
            change = self._change(event.flow, False, activity.epoch) if activity.active else None
        elif event.epoch > activity.epoch or (
            event.epoch == activity.epoch and activity.active and not event.active
        ):
            change = self._change(event.flow, event.active, event.epoch)
        else:
            change = None
        if change is not None:
            self._apply(change)
        if event.kind == "unbound":
            self._inbox.put(
                Unbound(f"flow {event.flow} of queue {self.queue!r}: unbound by an administrator")
            )
        self.poke()

    def _apply(self, change: FlowEvent) -> None:
        """Note a change of activity at once and queue it for the iteration; an
        inactive one forgets what the buffer holds (the node takes it back)."""
        if not change.active:
            self._buffer.drop()
        self._noted(change)
        self._inbox.put(change)

    def _change(self, flow: int, active: bool, epoch: int) -> FlowEvent:
        kind = "active" if active else "inactive"
        return FlowEvent(self.queue, flow, kind, active, epoch)

    def _next_item(self) -> Item | None:
        """The next change of activity or error, else what the node has for this
        consumer now; waits (up to ``idle_timeout``) while there is neither — unless
        ``until_empty``, which ends at the first take that finds nothing."""
        node = self.client.node
        deadline = None if self.idle_timeout is None else time.monotonic() + self.idle_timeout
        while True:
            with self._woken:
                wakes = self._wakes
                room = self.prefetch - len(self._held)
                flow = self._subscription
            with contextlib.suppress(queuelib.Empty):
                return self._inbox.get_nowait()
            self._give_back_late()
            taken: list[Delivered] = []
            if flow is not None and self.activity.active and room > 0:
                try:
                    taken, _ = node.delivery.take(
                        self.queue, room, flow=flow, holder=self.client.holder
                    )
                except EomsgError:
                    if self._subscription is None:
                        continue  # closed meanwhile: its inbox says how the iteration ends
                    raise
                with self._woken:
                    self._held.update(d.key for d in taken)
            if taken or (self.until_empty and room > 0):
                node_now, now = node.clock(), time.monotonic()
                self._buffer.arrived(taken, node_now, now, node_now - now)
                return Pushed(taken, node_now)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            node.check_open()  # a standby consumer never calls the node: it looks here
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
                self.client.node.delivery.return_unseen(
                    self.queue, late, epoch=self.activity.epoch, holder=self.client.holder
                )
            self.settled(late)

    def _settle(self, how: str, d: Delivered, delay: float | None) -> Future[Any]:
        """Delete (through the consumer's deleter) or release (now) one received
        message, through the client, so the window and the client's records follow; a
        refusal is the future's error."""
        self._buffer.settled(d.key)
        future: Future[Any]
        try:
            if how == "delete":
                assert self._deleter is not None  # bound: _check_bound ran before the hand-out
                future = self._deleter.delete(d)
            elif how == "unseen":
                self.client.node.delivery.return_unseen(
                    self.queue, [d.key], epoch=d.epoch, holder=self.client.holder
                )
                future = Future()
                future.set_result(None)
            else:
                self.client.release(self.queue, [d.key], delay or 0.0, epoch=d.epoch)
                future = Future()
                future.set_result(None)
        except EomsgError as e:
            future = failed(e)
        self._track(future)
        return future
