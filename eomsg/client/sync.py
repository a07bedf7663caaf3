"""The synchronous client: the asyncio client on an event loop thread of its own.

Calls from any number of threads are handed to that loop. The per-message calls —
:meth:`Client.publish_async` and a received message's ``delete()`` — are gathered on the
caller's side and cross to the loop once per batch, so their cost stays a few
microseconds however fast they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue as queuelib
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Generic, TypeVar

from eomsg.client.aio import DEFAULT_WINDOW, AsyncClient, connect_async
from eomsg.client.blocking import BlockingConsumer
from eomsg.client.broker import Broker
from eomsg.client.consumer import Item, Pushes
from eomsg.client.futures import failed
from eomsg.core.durations import ttl_seconds
from eomsg.core.election import FlowEvent
from eomsg.core.limits import check_outgoing
from eomsg.core.message import Delivered, Key, Outgoing, PublishResult
from eomsg.core.operations import Operation
from eomsg.errors import EomsgError, Unavailable
from eomsg.transport.tls import ClientTls

T = TypeVar("T")
WAKE_EVERY = 0.5  # seconds a consumer's wait lasts at most before it looks again
STOP_WAIT = 1.0  # seconds the loop's last tasks get to end when the client stops


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _cancel_the_rest() -> None:
    """Cancel every other task on this loop and wait until they end."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


class Client(Broker):
    """A connection to one node, usable from any thread. Make one with :func:`connect`;
    close it (or use ``with``)."""

    def __init__(
        self,
        target: str | Path | None = None,
        *,
        token: str | None = None,
        name: str | None = None,
        timeout: float = 10.0,
        window: int = DEFAULT_WINDOW,
        tls: ClientTls | None = None,
        via: str | None = None,
    ) -> None:
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="eomsg-client")
        self._thread.daemon = True
        self._thread.start()
        self._window = window
        self._signal = _Signal()
        self._sent = itertools.count(1)
        self._outbox: deque[tuple[Outgoing, Ack[PublishResult]]] = deque()
        self._deletes: deque[tuple[str, Key, int, Ack[bool]]] = deque()
        self._scheduled = False
        self._closed = False
        try:
            self._ac: AsyncClient = self._run(
                connect_async(
                    target,
                    token=token,
                    name=name,
                    timeout=timeout,
                    window=window,
                    tls=tls,
                    via=via,
                )
            )
        except BaseException:
            self._stop_loop()
            raise

    @property
    def address(self) -> str:
        return str(self._ac.address)

    @property
    def node(self) -> str:
        """The name of the node this client talks to (through ``address``'s, with
        ``via``)."""
        return self._ac.node

    @property
    def embedded(self) -> bool:
        """False: the node is another process (see :class:`~eomsg.client.broker.Broker`)."""
        return False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coro`` on the loop. Unavailable once the client is closed (then the
        loop is gone, and nothing would ever answer)."""
        if self._closed:
            coro.close()
            raise Unavailable("the client is closed")
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError as e:  # closed by another thread since the check
            coro.close()
            raise Unavailable("the client is closed") from e

    def close(self) -> None:
        """Send what is queued, wait for every answer, and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(EomsgError):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result()
        self._stop_loop()

    async def _close(self) -> None:
        self._flush()
        await self._ac.close()

    def _stop_loop(self) -> None:
        """Stop the loop and its thread. What still runs on the loop — a connect that an
        interrupt cut short — is cancelled first and given ``STOP_WAIT`` to end, so no
        task is destroyed pending."""
        with contextlib.suppress(Exception):  # a task that outlives the wait: left as is
            asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self._loop).result(STOP_WAIT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        # What was queued after the last flush (by a thread that passed the closed
        # check just before the close) gets its answer; from now on _wake fails it.
        self._scheduled = False
        self._fail_queued(Unavailable("the client is closed"))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """Publish one message; returns once it is durable on the node."""
        return self.publish_async(topic, payload, id=id, ttl=ttl, headers=headers).result()

    def publish_async(
        self,
        topic: str,
        payload: bytes,
        *,
        id: str | None = None,
        ttl: float | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Ack[PublishResult]:
        """Queue one message and return a future for its acknowledgement (durable once
        resolved). Blocks while ``window`` messages are unacknowledged. Invalid input
        raises here; retry a failed publish with the same ``id`` to keep it once-only."""
        message = check_outgoing(
            Outgoing(topic, payload, id, ttl_seconds(ttl), headers or {}), self._ac.limits
        )
        self._check()
        n = next(self._sent)
        signal = self._signal
        if n - signal.acked > self._window:
            signal.wait_for(lambda: n - signal.acked <= self._window or self._failed())
            self._check()
        ack: Ack[PublishResult] = Ack(signal, True)
        self._outbox.append((message, ack))  # deque.append: atomic, no lock needed
        self._wake()
        return ack

    def publish_batch(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish messages in order; durable on return."""
        return self.publish_batch_async(messages).result()

    def publish_batch_async(self, messages: Sequence[Outgoing]) -> Future[list[PublishResult]]:
        """Send a batch now; the future resolves once all of it is durable. Invalid
        input raises here, in the caller's thread, before anything is sent."""
        limits = self._ac.limits
        for m in messages:
            check_outgoing(m, limits)
        return self._submit(self._send_checked(messages))

    async def _send_checked(self, messages: Sequence[Outgoing]) -> list[PublishResult]:
        return await self._ac.send_checked(messages)

    def _check(self) -> None:
        if self._closed:
            raise Unavailable("the client is closed")
        self._ac.check_open()

    def _failed(self) -> bool:
        return self._closed or self._ac.failure is not None

    def _wake(self) -> None:
        """Have the loop send the outboxes. Callers append first and look at the flag
        second, and the loop clears the flag before it drains: so whatever is appended
        is either drained by a flush under way or schedules the next one."""
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop closed since the caller's check: nothing sends
                self._scheduled = False
                self._fail_queued(Unavailable("the client is closed"))

    def _fail_queued(self, error: EomsgError) -> None:
        """Fail what the outboxes hold: it was never sent."""
        for _ in range(len(self._outbox)):
            with contextlib.suppress(IndexError):
                self._outbox.popleft()[1].set_exception(error)
        for _ in range(len(self._deletes)):
            with contextlib.suppress(IndexError):
                self._deletes.popleft()[3].set_exception(error)

    def _flush(self) -> None:
        """On the loop: move the outboxes into the asyncio client's, which sends them
        as batch frames."""
        self._scheduled = False
        outbox, deletes = self._outbox, self._deletes
        self._ac.enqueue(
            [outbox.popleft() for _ in range(len(outbox))],
            [deletes.popleft() for _ in range(len(deletes))],
        )

    # -- consuming -------------------------------------------------------------------------

    def fetch(self, queue: str, max_messages: int = 100, wait: float = 0.0) -> list[Delivered]:
        """Take up to ``max_messages`` from ``queue``, waiting up to ``wait`` seconds for
        the first. Delete (or release) each before its deadline."""
        return self._run(self._ac.fetch(queue, max_messages, wait))

    def delete(self, queue: str, keys: Sequence[Key], *, epoch: int = 0) -> list[bool]:
        """Delete the deliveries ``keys`` (``(seq, attempt)``, :attr:`Delivered.key`)
        made to this client under ``epoch`` (0: fetched without a flow); True for each
        deleted now. Durable on return."""
        return self.delete_async(queue, keys, epoch=epoch).result()

    def delete_async(
        self, queue: str, keys: Sequence[Key], *, epoch: int = 0
    ) -> Future[list[bool]]:
        return self._submit(self._ac.delete(queue, list(keys), epoch=epoch))

    def release(
        self, queue: str, keys: Sequence[Key], delay: float = 0.0, *, epoch: int = 0
    ) -> None:
        """Give deliveries back for redelivery after ``delay`` seconds (0 to 100 years:
        InvalidInput otherwise, and nothing is given back)."""
        self._run(self._ac.release(queue, list(keys), delay, epoch=epoch))

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
    ) -> Consumer:
        """Bind to ``queue`` with ``priority`` (seed 002) and receive its messages while
        this consumer is active, at most ``prefetch`` undeleted at a time. Iterating
        waits for messages; it ends after ``idle_timeout`` seconds without one (never,
        if None), or with ``until_empty`` as soon as the node has nothing ready for this
        consumer. ``on_active`` / ``on_inactive`` hear each change of activity, the
        state at bind included, on a thread of the consumer's own; losing the
        connection counts as becoming inactive."""
        return Consumer(
            self, queue, prefetch, idle_timeout, priority, on_active, on_inactive, until_empty
        )

    def _delete_later(self, queue: str, key: Key, epoch: int = 0) -> Ack[bool]:
        if self._closed or self._ac.failure is not None:
            self._check()
        ack: Ack[bool] = Ack(self._signal, False)
        self._deletes.append((queue, key, epoch, ack))
        if not self._scheduled:
            self._wake()
        return ack

    # -- operations (declared in eomsg.core.operations) ----------------------------------------

    def ping(self) -> float:
        """A round trip to the node, in seconds (:meth:`AsyncClient.ping`)."""
        self._check()
        return self._run(self._ac.ping())

    def run_operation(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any:
        """Run a declared operation (this client's methods of the same names call it)."""
        return self._run(self._ac.run_operation_async(op, args))


class _Signal:
    """What threads waiting on :class:`Ack` results sleep on. The loop notifies only
    when someone waits, so a pipelined producer pays nothing for it."""

    __slots__ = ("acked", "cond", "waiters")

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiters = 0
        self.acked = 0  # publishes acknowledged (or failed): the window's lower edge

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        with self.cond:
            self.waiters += 1
            try:
                return self.cond.wait_for(predicate, timeout)
            finally:
                self.waiters -= 1

    def pulse(self) -> None:
        if self.waiters:
            with self.cond:
                self.cond.notify_all()


_PENDING, _VALUE, _ERROR = 0, 1, 2


class Ack(Generic[T]):
    """The future of one publish or deletion made through :class:`Client`: ``result()``,
    ``exception()``, ``done()`` and ``add_done_callback()`` as on
    :class:`concurrent.futures.Future`, at a fraction of its cost per message (callbacks
    run on the client's loop thread)."""

    __slots__ = ("_callbacks", "_counts", "_signal", "_state", "_value")

    def __init__(self, signal: _Signal, counts: bool) -> None:
        """``counts``: a publish's, which moves the publish window when it resolves
        (positional: one is made for every publish and delete, and keywords cost)."""
        self._signal = signal
        self._counts = counts
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[[Ack[T]], None]] | None = None

    def done(self) -> bool:
        return self._state != _PENDING

    def result(self, timeout: float | None = None) -> T:
        if self._state == _PENDING and not self._signal.wait_for(self.done, timeout):
            raise TimeoutError("no acknowledgement yet")
        if self._state == _ERROR:
            raise self._value
        value: T = self._value
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == _PENDING and not self._signal.wait_for(self.done, timeout):
            raise TimeoutError("no acknowledgement yet")
        error: BaseException | None = self._value if self._state == _ERROR else None
        return error

    def add_done_callback(self, fn: Callable[[Ack[T]], None]) -> None:
        if self._state != _PENDING:
            fn(self)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def set_result(self, value: T) -> None:
        if self._state == _PENDING:
            self._value, self._state = value, _VALUE
            if self._counts or self._callbacks or self._signal.waiters:
                self._finished()

    def set_exception(self, error: BaseException) -> None:
        if self._state == _PENDING:
            self._value, self._state = error, _ERROR
            self._finished()

    def _finished(self) -> None:
        signal = self._signal
        if self._counts:
            signal.acked += 1  # only the loop thread writes it
        if signal.waiters:
            signal.pulse()
        if self._callbacks:
            for fn in self._callbacks:
                fn(self)


class Consumer(BlockingConsumer):
    """``with client.consumer(queue) as consumer: for msg in consumer: …; msg.delete()``."""

    def __init__(self, client: Client, queue: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(queue, *args, **kwargs)
        self.client = client
        self._pushes = Pushes(self, client._ac)

    def _lease_valid(self) -> bool:
        return self.client._ac.lease_valid()

    def __enter__(self) -> Consumer:
        self._entering()
        self._start_caller()
        try:
            self._subscription = self.client._run(
                self.client._ac.subscribe_raw(self.queue, self.prefetch, self._sink, self.priority)
            )
        except BaseException:
            self._stop_caller()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait until every deletion made through this consumer is durable, then unbind:
        messages received and not deleted go back to the queue, for the next active
        flow. Callbacks already due still run before this returns."""
        try:
            self.flush()
        finally:
            if self._subscription is not None:
                subscription, self._subscription = self._subscription, None
                # Deletes still queued on this side (say, one whose caller was interrupted
                # before it could wait) must reach the node before the cancel, or the
                # unbind would give their messages back and refuse them as stale.
                self.client._wake()
                with contextlib.suppress(EomsgError):
                    self.client._run(self._cancel(subscription))
            self._leave()
            self._stop_caller()

    async def _cancel(self, subscription: int) -> None:
        """On the loop, where the buffer's timer lives: unbind, saying which deliveries
        the application saw (the rest go back un-counted)."""
        await self.client._ac.cancel(subscription, self._pushes.unseen_on_close())

    def _next_item(self) -> Item | None:
        """The next item, waiting up to ``idle_timeout`` (None: for ever) — in steps
        of :data:`WAKE_EVERY`: a signal the kernel handed to another thread (the loop's)
        leaves a thread blocked in a lock asleep, and Python runs the handler only on
        the main thread, so a main thread that never woke would never stop."""
        deadline = None if self.idle_timeout is None else time.monotonic() + self.idle_timeout
        while True:
            step = WAKE_EVERY if deadline is None else min(WAKE_EVERY, deadline - time.monotonic())
            try:
                return self._inbox.get(timeout=max(step, 0.0))
            except queuelib.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def _more_arrived(self) -> bool:
        return not self._inbox.empty()

    def _renew_lease(self) -> None:
        with contextlib.suppress(EomsgError):  # lost: the activity says so
            self.client._run(self.client._ac.ping())

    def _sink(self, item: Item) -> None:
        """On the loop thread: note a change of activity at once, then queue the item
        for iteration."""
        self._pushes.on_loop(item)
        if isinstance(item, FlowEvent):
            self._noted(item)
        self._inbox.put(item)

    def _settle(self, how: str, d: Delivered, delay: float | None) -> Ack[Any] | Future[Any]:
        """Delete (batched by the loop) or release one received message; a refusal —
        the client closed, too — is the future's error, as on the embedded backend."""
        key = (d.message.seq, d.attempt)
        self._buffer.settled(key)
        future: Ack[Any] | Future[Any]
        try:
            if how == "delete":
                future = self.client._delete_later(self.queue, key, d.epoch)
            elif how == "unseen":
                future = self.client._submit(
                    self.client._ac.return_unseen(self.queue, [d.key], epoch=d.epoch)
                )
            else:
                future = self.client._submit(
                    self.client._ac.release(self.queue, [d.key], delay or 0.0, epoch=d.epoch)
                )
        except EomsgError as e:
            future = failed(e)
        self._track(future)
        return future


def connect(
    target: str | Path | None = None,
    *,
    token: str | None = None,
    name: str | None = None,
    timeout: float = 10.0,
    window: int = DEFAULT_WINDOW,
    tls: ClientTls | None = None,
    via: str | None = None,
) -> Client:
    """Connect to the node at ``target``: a data directory, ``unix://PATH``,
    ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (default: env ``EOMSG_BROKER``, else
    ``./eomsg-data``). TCP needs the node's token (``token=`` or env ``EOMSG_TOKEN``);
    TLS checks the node's certificate (``tls``, default :meth:`ClientTls.from_env`).
    ``via``: talk to that node of the network through this one (see
    :func:`~eomsg.client.aio.connect_async`). Raises Unavailable when no node answers,
    AuthenticationFailed when TLS fails."""
    return Client(target, token=token, name=name, timeout=timeout, window=window, tls=tls, via=via)
