"""A session's clocks: the handshake's deadline, the heartbeat, the watchdog that cuts
off a client gone silent or stuck, the resending of unacknowledged FlowChanged frames,
and the grace a closing connection has to flush its last frames.

A client silent for three heartbeats, or one that has read nothing for as long, is cut
off (``transport.abort``, not a close that would wait for a client that does not
read), so that its flows end within three heartbeats and their messages go to the next
active consumer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from eomsg.errors import RemoteProtocolError
from eomsg.wire import events as ev
from eomsg.wire.protocol import State

if TYPE_CHECKING:
    from eomsg.server.session import Session

log = logging.getLogger("eomsg.server")

CLOSE_GRACE = 2.0  # seconds a closing connection may take to flush its last frames


class KeepAlive:
    """The timers of one connection and when the client was last heard; every one is
    cancelled when the connection ends (:meth:`cancel_all`)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.last_heard = session.loop.time()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def heard(self) -> None:
        """Bytes came from the client: it is alive."""
        self.last_heard = self.session.loop.time()

    def expect_hello(self) -> None:
        """The client has the server's handshake timeout to say its hello."""
        session = self.session
        self._timers["handshake"] = session.loop.call_later(
            session.server.settings.handshake_timeout, self._handshake_timeout
        )

    def welcomed(self) -> None:
        """The handshake is done: the handshake's deadline is off, the heartbeat, the
        watchdog and the FlowChanged resends start."""
        loop, s = self.session.loop, self.session.server.settings
        self._timers["handshake"].cancel()
        self._timers["heartbeat"] = loop.call_later(s.heartbeat, self._heartbeat)
        self._timers["watchdog"] = loop.call_later(3 * s.heartbeat, self._watchdog)
        self._timers["resend"] = loop.call_later(s.resend, self._resend)

    def abort_after_grace(self, transport: asyncio.Transport) -> None:
        """A closing transport waits for its write buffer to drain, which a client that
        does not read never lets happen: past a grace period, drop what it holds."""
        self._timers["abort"] = self.session.loop.call_later(CLOSE_GRACE, transport.abort)

    def cancel_all(self) -> None:
        """The connection ended (or went on elsewhere): no timer of it fires again."""
        for timer in self._timers.values():
            timer.cancel()

    def cut_off(self, why: str) -> None:
        """Keep-alive loss: drop the connection at once, whatever its buffers hold (a
        graceful close would wait for a client that does not read), so that its flows
        end now and their messages go to the next active consumer."""
        session = self.session
        log.info("cutting off %s (%s): %s", session.peer, session.client_name or "no hello", why)
        session.closing = True
        if session.transport is not None:
            session.transport.abort()

    def _handshake_timeout(self) -> None:
        session = self.session
        if session.conn.state is not State.OPEN and not session.closing:
            session.fail(
                RemoteProtocolError(
                    f"no handshake within {session.server.settings.handshake_timeout:g} s"
                )
            )

    def _heartbeat(self) -> None:
        """Ping the client every heartbeat (a live client answers, so it is heard)."""
        session = self.session
        if session.closing:
            return
        session.send(ev.Ping(0))
        self._timers["heartbeat"] = session.loop.call_later(
            session.server.settings.heartbeat, self._heartbeat
        )

    def _watchdog(self) -> None:
        """Cut off a client silent for three heartbeats, or one that has read nothing
        for as long (its socket buffers full and not draining), the moment that is so:
        it is gone or stuck, and its flows must end within three heartbeats. Re-armed
        for the moment that could next be true (checking progress at least every
        heartbeat)."""
        session = self.session
        if session.closing:
            return
        limit = 3 * session.server.settings.heartbeat
        now = session.loop.time()
        silent = now - self.last_heard
        blocked = session.backpressure.blocked_for(now)
        if silent >= limit:
            self.cut_off(f"no word from the client for {silent:.3g} s")
        elif blocked >= limit:
            self.cut_off(f"the client has read nothing for {blocked:.3g} s")
        else:
            self._timers["watchdog"] = session.loop.call_later(
                min(limit - max(silent, blocked), limit / 3), self._watchdog
            )

    def _resend(self) -> None:
        """Send every unacknowledged FlowChanged again, in order (seed 002: indications
        are acknowledged and retransmitted until they are), every ``resend`` seconds."""
        session = self.session
        if session.closing:
            return
        session.subscriptions.resend()
        self._timers["resend"] = session.loop.call_later(
            session.server.settings.resend, self._resend
        )
