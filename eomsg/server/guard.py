"""Who a session's client is and what it may do: the principal it proved at its hello
(:mod:`eomsg.server.handshake`), and every request checked against the node's grants
for it (:mod:`eomsg.core.access`) before it runs.

A refused request is answered NotAllowed and changes nothing; the first denials of a
connection are logged (not all: a client cannot flood the log with them). A principal
removed since its hello is cut off, after the answer that says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from eomsg.core import access
from eomsg.core.access import OWNER, Need, link_principal
from eomsg.errors import AuthenticationFailed, NotAllowed
from eomsg.wire import events as ev

if TYPE_CHECKING:
    from eomsg.server.session import Session

log = logging.getLogger("eomsg.server")

LOGGED_DENIALS = 20  # denied requests logged per connection


class Guard:
    """The principal of one connection and the checks of its requests (the event
    loop's only). Until the hello proves otherwise the principal is the owner, or the
    linked node's (``@PEER``) for a client that came through a link."""

    def __init__(self, session: Session, through: str | None) -> None:
        self.session = session
        self.principal = OWNER if through is None else link_principal(through)
        self.denied = 0  # requests refused for want of a right

    def permits(self, rid: int, doing: str, needs: Callable[[], list[Need]]) -> bool:
        """Whether the client's principal holds what ``needs()`` lists (not computed for
        the owner); if not, the request is answered NotAllowed and logged."""
        try:
            self.check(doing, needs)
        except NotAllowed as e:
            self.session.send(ev.Error(rid, e.code, e.message))
            return False
        return True

    def consumes(self, rid: int, queue: str, doing: str) -> bool:
        """:meth:`permits` for a request that takes from ``queue``."""
        return self.permits(rid, f"{doing} queue {queue}", lambda: access.consuming(queue))

    def check(self, doing: str, needs: Callable[[], list[Need]]) -> None:
        """NotAllowed (logged) unless the principal holds what ``needs()`` lists; a
        principal removed since the hello is cut off."""
        if self.principal == OWNER:
            return
        session = self.session
        node = session.node  # the node of the hello: it may have been reopened since
        policy = node.access.policy
        if not (self.principal.startswith("@") or node.access.has_principal(self.principal)):
            gone = f"principal {self.principal} was removed"
            session.loop.call_soon(session.fail, AuthenticationFailed(gone))  # after its answer
            raise NotAllowed(gone)
        try:
            policy.check(self.principal, needs(), doing)
        except NotAllowed as e:
            self.denied += 1
            if self.denied <= LOGGED_DENIALS:  # a client cannot flood the log with them
                more = " (further denials of this connection are not logged)"
                log.warning(
                    "denied %s (%s, %s): %s%s",
                    session.peer,
                    session.client_name or "?",
                    self.principal,
                    e,
                    more if self.denied == LOGGED_DENIALS else "",
                )
            raise
