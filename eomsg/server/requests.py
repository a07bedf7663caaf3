"""A session's requests: publish, delete, fetch, release and the declared operations
(Call), each run on the node and answered.

Every answer that acknowledges a write (Published, Deleted) is sent only after the
writer thread's commit holding it returned. Work that blocks — a fetch waits for its
delivery records to commit, then reads payloads; a call waits for its own commit — runs
on the server's thread pool, never on the event loop. An answer that is a list goes in
as many Result frames as the client's frame limit needs; one message or item that no
frame the client accepts could carry fails its request with an error saying so, never
the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from eomsg.core import access
from eomsg.core.message import PublishResult
from eomsg.core.operations import Operation
from eomsg.errors import EomsgError, FrameTooLarge, InvalidConfig, NotAllowed
from eomsg.server import calls
from eomsg.server.pump import MAX_PREFETCH, forget_settled
from eomsg.wire import events as ev
from eomsg.wire.calls import listed_result
from eomsg.wire.codec import FRAME_SLACK

if TYPE_CHECKING:
    from eomsg.server.session import Session

log = logging.getLogger("eomsg.server")

ANSWER_SLACK = 64 << 10  # room left in an answer the node sizes by estimate (read_log)


class Requests:
    """The requests of one connection, and what its Fetches took and it has not settled
    (the event loop's only)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.fetched: dict[str, dict[int, int]] = {}  # queue -> seq -> attempt (Fetch)
        self.owns_txns = False  # prepared a transaction: disown them when it ends

    def take_held(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """What the client fetched and did not settle, by queue, now no longer the
        session's (it is ending): the caller gives it back."""
        held = [(q, list(h.items())) for q, h in self.fetched.items()]
        self.fetched.clear()
        return held

    def settled(self, queue: str, keys: tuple[tuple[int, int], ...]) -> None:
        """Settled deliveries no longer count against prefetch windows (a newer attempt
        of the same message still does)."""
        held = self.fetched.get(queue)
        if held:
            forget_settled(held, keys)
        self.session.subscriptions.settled(queue, keys)

    async def release_held(self, queue: str, held: list[tuple[int, int]]) -> int:
        """Give back what the client held of ``queue``: redelivered at once. 0 if the
        node cannot now (the queue deleted, the node closing): redelivery by timeout."""
        if not held:
            return 0
        session = self.session
        try:
            released: int = await session.server.blocking(
                session.node.delivery.release_held, queue, held, session.holder
            )
        except EomsgError as e:  # queue deleted or node closing: redelivery by timeout
            log.info("could not release %d messages of %s: %s", len(held), queue, e)
            return 0
        return released

    def publish(self, event: ev.Publish) -> None:
        session = self.session
        size = sum(len(m.payload) for m in event.messages) + 64 * len(event.messages)
        arrived = session.loop.time()
        try:
            committed = session.node.ingress.publish_batch_async(event.messages)
        except EomsgError as e:
            session.send(ev.Error(event.rid, e.code, e.message))
            return
        session.backpressure.track(size)
        committed.add_done_callback(session.from_writer(self._published, event.rid, size, arrived))

    def _published(
        self, rid: int, size: int, arrived: float, f: Future[list[PublishResult]]
    ) -> None:
        session = self.session
        session.backpressure.untrack(size)
        error = f.exception()
        if error is not None:
            session.send_error(rid, error)
            return
        session.send(ev.Published(rid, tuple(f.result())))
        metrics = session.server.metrics
        if metrics is not None:
            metrics.publish_latency.observe(session.loop.time() - arrived)

    def delete(self, event: ev.Delete) -> None:
        session = self.session
        arrived = session.loop.time()
        try:
            committed = session.node.delivery.delete_async(
                event.queue, event.keys, epoch=event.epoch, holder=session.holder
            )
        except EomsgError as e:
            session.send(ev.Error(event.rid, e.code, e.message))
            return
        self.settled(event.queue, event.keys)
        session.backpressure.track(0)
        committed.add_done_callback(session.from_writer(self._deleted, event.rid, arrived))

    def _deleted(self, rid: int, arrived: float, f: Future[list[bool]]) -> None:
        session = self.session
        session.backpressure.untrack(0)
        error = f.exception()
        if error is not None:
            session.send_error(rid, error)
            return
        session.send(ev.Deleted(rid, tuple(f.result())))
        metrics = session.server.metrics
        if metrics is not None:
            metrics.delete_latency.observe(session.loop.time() - arrived)

    async def fetch(self, event: ev.Fetch) -> None:
        if not 1 <= event.max <= MAX_PREFETCH:
            raise InvalidConfig(f"fetch max must be between 1 and {MAX_PREFETCH}")
        if not 0 <= event.wait <= 3600:
            raise InvalidConfig("fetch wait must be between 0 and 3600 seconds")
        session = self.session
        deadline = session.loop.time() + event.wait
        while True:
            # Each round: a right revoked while it waits ends the wait (NotAllowed).
            session.guard.check(
                f"fetch from queue {event.queue}", lambda: access.consuming(event.queue)
            )
            ready = session.server.ready_waiter(event.queue)
            try:
                taken = await session.server.blocking(
                    session.node.delivery.fetch_batch, event.queue, event.max, holder=session.holder
                )
                remaining = deadline - session.loop.time()
                if taken or remaining <= 0 or session.closing or session.draining:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready, min(remaining, session.server.settings.poll))
            finally:  # not waited for, or done: not left among the queue's waiters
                ready.cancel()
        if session.closing:
            await self.release_held(event.queue, taken.keys())
            return
        self.fetched.setdefault(event.queue, {}).update(
            zip(taken.seqs, taken.attempts, strict=True)
        )
        try:
            session.send_deliveries(event.rid, taken, final=True)
        except FrameTooLarge as e:  # the fetch fails: none of it reaches the application
            log.warning("session %s: %s", session.peer, e)
            keys = taken.keys()
            self.settled(event.queue, tuple(keys))
            await self.release_held(event.queue, keys)
            raise

    async def release(self, event: ev.Release) -> None:
        session = self.session
        if event.unseen:
            await session.server.blocking(
                session.node.delivery.return_unseen,
                event.queue,
                event.keys,
                epoch=event.epoch,
                holder=session.holder,
            )
        else:
            await session.server.blocking(
                session.node.delivery.release,
                event.queue,
                event.keys,
                event.delay,
                epoch=event.epoch,
                holder=session.holder,
            )
        self.settled(event.queue, event.keys)
        session.send(ev.Result(event.rid, None))

    async def call(self, event: ev.Call) -> None:
        session = self.session
        op = calls.operation(event.op)
        limit = session.conn.peer_max_frame  # an estimated answer leaves room to spare
        budget = max(limit - ANSWER_SLACK, limit // 2)
        caller = calls.Caller(session.owner, session.holder, session.guard.principal, budget)
        args = calls.decode(op, event.args, caller)
        if op.admin and session.through is not None:
            me = session.server.node_name
            raise NotAllowed(
                f"a client that came through node {session.through!r} may not "
                f"{access.doing(op.name, args)} on node {me!r}: that changes its set-up "
                f"(run it on {me!r} itself)"
            )
        session.guard.check(
            access.doing(op.name, args), lambda: access.operation_needs(op.name, args)
        )
        if "owner" in op.caller:
            self.owns_txns = True
        value = await session.server.blocking(calls.run, session.node, op, args)
        if "holder" in op.caller:
            if session.closing and "owner" in op.caller:  # lost while preparing: in doubt
                await session.server.blocking(session.node.participant.disown_txns, session.owner)
            by_queue: dict[str, list[tuple[int, int]]] = {}
            for queue, seq, _, attempt in args.get("deletes", ()):
                by_queue.setdefault(queue, []).append((seq, attempt))
            for queue, keys in by_queue.items():
                self.settled(queue, tuple(keys))
        await self._answer(event.rid, op, value)

    async def _answer(self, rid: int, op: Operation[Any, Any], value: Any) -> None:
        """Send a call's answer: one Result frame, or — a list that no frame the client
        accepts could carry — as many as it takes, each sent once the client has read
        the one before (so the node holds the answer, not the frames too). FrameTooLarge
        if an answer (or an item of it) alone does not fit."""
        session = self.session
        budget = session.conn.peer_max_frame - FRAME_SLACK
        split = listed_result(op) and ev.value_bound(value) > budget
        parts = _split(value, budget) if split else [value]
        what = f"an item of the answer to {op.name}" if split else f"{op.name}'s answer"
        for i, part in enumerate(parts):
            more = i < len(parts) - 1
            try:
                session.send(ev.Result(rid, part, more))
            except FrameTooLarge as e:
                raise FrameTooLarge(
                    f"{what} cannot reach this client: {e.message} (the limit its hello said)"
                ) from None
            if more:
                await session.backpressure.can_write.wait()


def _split(items: list[Any], budget: int) -> list[list[Any]]:
    """``items`` in runs of at most ``budget`` bytes each (:func:`ev.value_bound`), in
    order; an item larger than that alone."""
    parts: list[list[Any]] = []
    part: list[Any] = []
    size = 0
    for item in items:
        n = ev.value_bound(item)
        if part and size + n > budget:
            parts.append(part)
            part, size = [], 0
        part.append(item)
        size += n
    parts.append(part)
    return parts
