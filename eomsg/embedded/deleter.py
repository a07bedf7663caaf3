"""A local consumer's deletes, sent to the node from a thread of their own — as the
client over the wire sends them from its loop: ``delete()`` only queues, so its future
resolves without anyone waiting on it (and no delete waits for the application's next
step), and the deletes queued meanwhile go as one call per epoch, sharing one commit.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING

from eomsg.core.message import Delivered, Key
from eomsg.errors import EomsgError, StaleDelivery

if TYPE_CHECKING:
    from eomsg.embedded.local import LocalClient


class Deleter:
    """The deletes of one consumer of ``queue``; :meth:`stop` sends what is queued and
    ends the thread. A delete made after that (a message kept past its consumer's exit)
    is sent at once, from the caller's thread, so it gets the node's verdict — as it
    would over the wire — rather than waiting for a thread that is gone."""

    def __init__(self, client: LocalClient, queue: str) -> None:
        self._client = client
        self._queue = queue
        self._outbox: deque[tuple[int, Key, Future[bool]]] = deque()
        self._scheduled = False
        self._stopping = False
        self._stopped = False
        self._kick = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"eomsg-deletes-{queue}", daemon=True
        )
        self._thread.start()

    def delete(self, d: Delivered) -> Future[bool]:
        """Queue the deletion of ``d``; the future resolves once it is durable (True), or
        with the node's refusal."""
        future: Future[bool] = Future()
        self._outbox.append((d.epoch, d.key, future))  # deque.append: atomic
        # Append first, look at the flag second; the thread clears it before it drains:
        # so whatever is appended is either drained by a pass under way or kicks the next.
        if self._stopped:  # set before stop's last drain: this one is drained by it or here
            self._send()
        elif not self._scheduled:
            self._scheduled = True
            self._kick.set()
        return future

    def stop(self) -> None:
        """Send everything queued so far, then end the thread. Idempotent."""
        self._stopping = True
        self._kick.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._stopped = True
        self._send()  # anything appended after the thread's last pass

    def _run(self) -> None:
        while True:
            self._kick.wait()
            self._kick.clear()
            self._scheduled = False
            self._send()
            if self._stopping:
                self._send()  # anything appended while the flag was being cleared
                return

    def _send(self) -> None:
        outbox = self._outbox
        by_epoch: dict[int, list[tuple[Key, Future[bool]]]] = {}
        for _ in range(len(outbox)):
            try:
                epoch, key, future = outbox.popleft()
            except IndexError:  # another drain (stop's, or a late delete's) took it
                break
            by_epoch.setdefault(epoch, []).append((key, future))
        for epoch, items in by_epoch.items():
            try:
                self._delete(epoch, items)
            except BaseException as e:  # never leave a deletion without its outcome
                for _, future in items:
                    if not future.done():
                        future.set_exception(e)

    def _delete(self, epoch: int, items: list[tuple[Key, Future[bool]]]) -> None:
        """One call for ``items``; refused for a stale delivery, one call per message,
        so that each gets its own verdict."""
        try:
            committed = self._client._delete(self._queue, [k for k, _ in items], epoch)
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
        futures = [f for _, f in items]

        def done(f: Future[list[bool]]) -> None:
            error = f.exception()
            for i, future in enumerate(futures):
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(f.result()[i])

        committed.add_done_callback(done)
