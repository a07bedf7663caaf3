"""A session's flow control, both ways: what it has in flight from the client, and
whether the client reads what it is sent.

In: a session stops reading from its socket while the bytes of its unacknowledged
publishes (or everyone's) exceed the server's limits (``Server.over_limit``), so a
writer that falls behind slows producers down instead of filling memory. Out: while
the transport's write buffer is full the subscriptions push nothing, a long answer
waits between its frames, and the watchdog measures how long the client has read
nothing (:meth:`Backpressure.blocked_for`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eomsg.server.session import Session


class Backpressure:
    """The counts and flags of one connection's flow control; the event loop's only."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.inflight_bytes = 0  # of publishes received and not yet acknowledged
        self.pending = 0  # requests received and not yet answered
        self.reading_paused = False
        self.writable = True  # False while the transport's write buffer is full
        self.blocked_since = 0.0  # since when it has been full without draining
        self.blocked_size = 0  # how full it was then
        self.idle = asyncio.Event()  # set while no request is pending
        self.idle.set()
        self.can_write = asyncio.Event()  # clear while the transport's buffer is full
        self.can_write.set()

    def begin(self) -> None:
        """A request is received: the session is not idle until it is answered
        (:meth:`done_one`)."""
        self.pending += 1
        self.idle.clear()

    def track(self, size: int) -> None:
        """A request of ``size`` bytes is in flight to the writer: past the server's
        limits, the session stops reading until enough of them are answered."""
        self.begin()
        self.inflight_bytes += size
        session = self.session
        session.server.inflight_bytes += size
        transport = session.transport
        if transport is not None and not self.reading_paused and session.server.over_limit(session):
            self.reading_paused = True
            transport.pause_reading()

    def untrack(self, size: int) -> None:
        """The writer answered a request :meth:`track` counted: reading resumes once
        under the limits again (with their hysteresis)."""
        self.inflight_bytes -= size
        session = self.session
        session.server.inflight_bytes -= size
        if self.reading_paused and not session.server.over_limit(session, resume=True):
            self.reading_paused = False
            if session.transport is not None and not session.closing:
                session.transport.resume_reading()
        self.done_one()

    def done_one(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.idle.set()

    def stop_reading(self) -> None:
        """Read nothing more from the client (the session drains); idempotent."""
        if not self.reading_paused and self.session.transport is not None:
            self.reading_paused = True
            self.session.transport.pause_reading()

    def pause_writing(self) -> None:
        """The transport's buffer is full: note since when, and how full."""
        self.writable = False
        self.can_write.clear()
        self.blocked_since = self.session.loop.time()
        self.blocked_size = self.buffered()

    def resume_writing(self) -> None:
        self.writable = True
        self.can_write.set()

    def blocked_for(self, now: float) -> float:
        """How long the client has read nothing of what it was sent (0 while the
        transport can write): a buffer that shrank since it filled counts as read, if
        slowly, and the measure starts again."""
        if not self.writable and (size := self.buffered()) < self.blocked_size:
            self.blocked_since, self.blocked_size = now, size  # it reads, if slowly
        return 0.0 if self.writable else now - self.blocked_since

    def buffered(self) -> int:
        transport = self.session.transport
        return 0 if transport is None else transport.get_write_buffer_size()
