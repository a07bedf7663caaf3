"""A session's subscriptions: each a flow (seed 002) bound to a queue, and the pump that
pushes the queue's messages to the client while its flow is active.

The node's election decides whether a flow is active; the session pushes the changes
as FlowChanged frames, resent until the client acknowledges each (the resend timer is
:class:`~eomsg.server.keepalive.KeepAlive`'s). A subscription pushes at most
``prefetch`` undeleted messages, and nothing while the client is not reading. A flow is
unbound when its subscription is cancelled, when the client disconnects or falls silent
past the keep-alive, or by an administrator; what it held in flight goes to the next
active flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING

from eomsg.core import access
from eomsg.core.election import FlowEvent
from eomsg.core.message import Deliveries
from eomsg.errors import EomsgError, FrameTooLarge, InvalidConfig, NotAllowed
from eomsg.wire import events as ev

if TYPE_CHECKING:
    from eomsg.server.session import Session

log = logging.getLogger("eomsg.server")

MAX_PREFETCH = 100_000
FETCH_CHUNK = 1000  # messages fetched from the node at a time


@dataclass(eq=False)
class Subscription:
    rid: int
    queue: str
    prefetch: int
    priority: int
    flow: int = 0  # 0 until the node has bound it
    epoch: int = 0  # the flow's current epoch; 0 while it is not active
    held: dict[int, int] = field(default_factory=dict)  # seq -> attempt
    unacked: list[ev.FlowChanged] = field(default_factory=list)
    dry: bool = False  # told the client it has nothing more for now (an empty Deliver)
    more: bool = True  # the queue held more than the last fetch took
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    closed: bool = False


def forget_settled(held: dict[int, int], keys: Iterable[tuple[int, int]]) -> int:
    """Drop from ``held`` (seq → attempt in flight) each of ``keys`` it holds at that
    attempt — a newer attempt of the same message stays held — and say how many: a step
    in C per key, not in Python (every delete passes here)."""
    before = len(held)
    settled = list(map(_FIRST, filter(held.items().__contains__, keys)))
    deque(map(held.pop, settled, repeat(None)), maxlen=0)  # a key named twice: once
    return before - len(held)


_FIRST = itemgetter(0)


class Subscriptions:
    """The subscriptions of one connection, by request id (the event loop's only)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.open: dict[int, Subscription] = {}

    def take_all(self) -> list[Subscription]:
        """Every open subscription, now no longer the session's (it is ending): the
        caller stops and unbinds them."""
        subscriptions = list(self.open.values())
        self.open.clear()
        return subscriptions

    def wake_all(self) -> None:
        """Something every pump may wait for changed (the client reads again)."""
        for sub in self.open.values():
            sub.wake.set()

    def settled(self, queue: str, keys: tuple[tuple[int, int], ...]) -> None:
        """Settled deliveries no longer count against the windows of ``queue``'s
        subscriptions (a newer attempt of the same message still does)."""
        for sub in self.open.values():
            if sub.queue == queue and sub.held and forget_settled(sub.held, keys):
                sub.wake.set()

    def subscribe(self, event: ev.Subscribe) -> None:
        session = self.session
        if not 1 <= event.prefetch <= MAX_PREFETCH:
            session.send(
                ev.Error(
                    event.rid,
                    InvalidConfig.code,
                    f"prefetch must be between 1 and {MAX_PREFETCH}",
                )
            )
            return
        if event.rid in self.open:
            session.send(ev.Error(event.rid, InvalidConfig.code, "subscription id in use"))
            return
        sub = Subscription(event.rid, event.queue, event.prefetch, event.priority)
        self.open[event.rid] = sub
        session.start(event.rid, self._bind(sub))

    async def cancel(self, event: ev.Cancel) -> None:
        sub = self.open.pop(event.subscription, None)
        if sub is None:
            self.session.send(ev.Result(event.rid, 0))
            return
        self.stop(sub)
        released = await self.unbind(sub, event.seen)
        self.session.send(ev.Result(event.rid, released))

    def acked(self, ack: ev.FlowAck) -> None:
        """The client applied a FlowChanged: it is not sent again."""
        sub = self.open.get(ack.rid)
        if sub is not None:
            sub.unacked = [c for c in sub.unacked if (c.active, c.epoch) != (ack.active, ack.epoch)]

    def resend(self) -> None:
        """Send every unacknowledged FlowChanged again, in order."""
        for sub in self.open.values():
            for change in sub.unacked:
                self.session.send(change)

    def stop(self, sub: Subscription) -> None:
        """Let the pump run out by itself (within a poll interval): cancelling it could
        lose a fetch already running on the pool, whose messages it must give back."""
        sub.closed = True
        sub.wake.set()

    async def unbind(
        self, sub: Subscription, seen: tuple[tuple[int, int], ...] | None = None
    ) -> int:
        """Unbind the flow; what it held goes to the next active flow (un-counted but
        for ``seen``, when the client said what it handed to its application). 0 if it
        is gone already (unbound by an administrator, its queue deleted, the node
        closing)."""
        if not sub.flow:
            return 0
        session = self.session
        try:
            released: int = await session.server.blocking(
                session.node.elections.unbind, sub.queue, sub.flow, seen=seen
            )
        except EomsgError as e:
            log.info("could not unbind flow %d of %s: %s", sub.flow, sub.queue, e)
            return 0
        return released

    async def _bind(self, sub: Subscription) -> None:
        """Bind the subscription's flow. The answer (a Result with the flow's state) is
        sent by :meth:`_on_flow` when the node reports ``bound``, so that it goes out
        before any FlowChanged of the same flow."""
        session = self.session
        notify = functools.partial(self._from_node, sub)
        owner = f"{session.client_name or '?'}@{session.peer}"
        try:
            await session.server.blocking(
                session.node.elections.bind,
                sub.queue,
                priority=sub.priority,
                owner=owner,
                notify=notify,
            )
        except BaseException:
            self.open.pop(sub.rid, None)
            raise
        if session.closing or sub.closed:  # gone while binding: connection_lost missed it
            await self.unbind(sub)

    def _from_node(self, sub: Subscription, event: FlowEvent) -> None:
        """The node's notify callback: runs under its lock on any thread, so only hands
        the event to the loop (in order: call_soon_threadsafe is FIFO)."""
        session = self.session
        with contextlib.suppress(RuntimeError):  # loop closed: the process is exiting
            session.loop.call_soon_threadsafe(session.safely, self._on_flow, sub, event)

    def _on_flow(self, sub: Subscription, event: FlowEvent) -> None:
        session = self.session
        sub.flow = event.flow
        if event.kind == "unbound":
            self.open.pop(sub.rid, None)
            self.stop(sub)
            sub.held.clear()  # the node gave them back when it unbound the flow
            session.send(ev.Unbound(sub.rid, event.flow, "unbound by an administrator"))
            return
        sub.epoch = event.epoch if event.active else 0
        if not event.active:
            sub.held.clear()  # the node gave them back when the flow lost activity
        if event.kind == "bound":
            state = {"flow": event.flow, "active": event.active, "epoch": event.epoch}
            session.send(ev.Result(sub.rid, state))
            if not sub.closed and sub.task is None:
                sub.task = session.spawn(self._pump(sub))
        elif not sub.closed:
            change = ev.FlowChanged(sub.rid, event.flow, event.active, event.epoch)
            sub.unacked.append(change)
            session.send(change)
        sub.wake.set()

    async def _pump(self, sub: Subscription) -> None:
        """Push the queue's messages while the flow is active, the subscription has room
        and the client reads; when the queue runs dry, wait for new ones (or poll, for
        redeliveries that come due by time)."""
        session = self.session
        poll = session.server.settings.poll
        while not sub.closed:
            room = sub.prefetch - len(sub.held)
            if room <= 0 or not session.backpressure.writable or not sub.epoch:
                sub.wake.clear()  # set by a delete, a release, resume_writing, an
                if not sub.epoch:  # activation or a stop (from here on: not lost)
                    self._dry(sub)  # on standby: nothing for it
                elif room <= 0 and not sub.more:
                    self._dry(sub)  # the window holds all there was
                await sub.wake.wait()
                continue
            try:  # at each take: a right revoked since ends the subscription
                session.guard.check(
                    f"receive from queue {sub.queue}", lambda: access.consuming(sub.queue)
                )
            except NotAllowed as e:
                await self._end(sub, e)  # what it held goes to the next consumer
                break
            ready = session.server.ready_waiter(sub.queue)
            try:
                try:
                    taken, sub.more = await self._take(sub, min(room, FETCH_CHUNK))
                except EomsgError as e:  # the queue was deleted, or the node is closing
                    if not sub.closed:
                        session.send(ev.Error(sub.rid, e.code, e.message))
                    sub.closed = True
                    break
                if taken and taken.epoch != sub.epoch:
                    continue  # the flow lost that epoch meanwhile; the node took them back
                if sub.closed:
                    break  # unbinding gives them back
                if not taken:
                    self._dry(sub)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ready, poll)
                    continue
                sub.held.update(zip(taken.seqs, taken.attempts, strict=True))
                sub.dry = False
                try:
                    session.send_deliveries(sub.rid, taken, final=False, epoch=sub.epoch)
                except FrameTooLarge as e:  # the subscription ends; what it held goes back
                    log.warning("session %s: %s", session.peer, e)
                    await self._end(sub, e)
                    break
            finally:  # not waited for, or done: not left among the queue's waiters
                ready.cancel()

    async def _take(self, sub: Subscription, limit: int) -> tuple[Deliveries, bool]:
        """Up to ``limit`` messages for ``sub``, their delivery records durable, and
        whether the queue holds more. Taken here on the loop, where a delete that made
        room for them ran: both go into one commit, and no thread is waited for but
        the writer (the messages are read on the pool only if one is not in memory)."""
        delivery, server = self.session.node.delivery, self.session.server
        if delivery.may_read_store(sub.queue):  # (rare: it dead-letters) on a thread
            taken: Deliveries
            taken, more = await server.blocking(
                delivery.take_batch, sub.queue, limit, flow=sub.flow, holder=self.session.holder
            )
            return taken, more
        take, more = delivery.take_async(
            sub.queue, limit, flow=sub.flow, holder=self.session.holder
        )
        if take.committed is not None:
            await asyncio.wrap_future(take.committed)
        found = delivery.read_from_memory(take)
        if found is None:
            found = await server.blocking(delivery.read, take)
        return found, more

    async def _end(self, sub: Subscription, error: EomsgError) -> None:
        """End the subscription for ``error``, which the client is told; its flow is
        unbound, so what it held goes to the next consumer."""
        self.session.send(ev.Error(sub.rid, error.code, error.message))
        self.open.pop(sub.rid, None)
        sub.closed = True
        await self.unbind(sub)

    def _dry(self, sub: Subscription) -> None:
        """Tell the client, once per dry spell, that nothing is ready for it now (an
        empty Deliver): a consumer that drains a queue and stops knows when to."""
        if not sub.dry and not sub.closed:
            sub.dry = True
            now = self.session.node.clock()
            self.session.send(ev.Deliver(sub.rid, sub.queue, (), epoch=sub.epoch, now=now))
