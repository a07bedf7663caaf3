"""A session's hello, and what it makes of the connection: a client of this node
(proved by its token, welcomed), a client of another node relayed over the link toward
it (``via``: :mod:`eomsg.server.tunnel`), or — a ``LinkHello`` — a link's connection
(:mod:`eomsg.server.link`).

The token is checked here and not sent onward: a node that relays a client vouches for
it, and the far node gives it the rights its link grants (``@PEER``). A hello refused
ends the connection with an Error frame that says why.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from eomsg.core.access import OWNER
from eomsg.errors import (
    AuthenticationFailed,
    EomsgError,
    RemoteProtocolError,
    StorageError,
    Unavailable,
)
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.protocol import Connection, Role

if TYPE_CHECKING:
    from eomsg.server.session import Session


def hello(session: Session, hello: ev.Hello) -> None:
    """Authenticate the client (unless a link brought it: its node vouched for it) and
    welcome it — or relay it on, if it names another node to reach."""
    server = session.server
    if server.down is not None:
        session.fail(StorageError(server.down))
        return
    session.node = server.node  # reopened since this connection was made, perhaps
    # (A hello of another protocol version was refused as it was read: wire.events.)
    if session.through is None:
        principal = authenticate(session, hello.token)
        if principal is None:
            session.fail(
                AuthenticationFailed(
                    "wrong or missing token; pass the node's token (eomsg.token in its "
                    "data directory) or a principal's (eomsg user add) with --token or "
                    "EOMSG_TOKEN"
                )
            )
            return
        session.guard.principal = principal
    session.client_name = hello.name
    if hello.via is not None and hello.via != server.node_name:
        _relay(session, hello)
        return
    welcome = ev.Welcome(
        ev.PROTOCOL_VERSION,
        server.node_name,
        session.conn.max_frame,
        server.settings.heartbeat,
        session.node.settings.limits.max_payload,
    )
    session.send(welcome)
    session.keepalive.welcomed()


def authenticate(session: Session, token: str | None) -> str | None:
    """The principal ``token`` proves, or None: the node's own token (or none at all on
    the owner-only Unix socket) is the owner's; any other must be a principal's."""
    if not token:
        return None if session.needs_token else OWNER
    if hmac.compare_digest(token.encode(), session.server.token.encode()):
        return OWNER
    return session.node.access.principal_of(token)


def hand_over(session: Session, hello: lev.LinkHello) -> None:
    """Another node dialled: the connection is a link's, not a client's. The session
    ends here (without a word: the link answers)."""
    server = session.server
    if server.down is not None:
        session.fail(StorageError(server.down))
        return
    if session.through is not None:
        session.fail(RemoteProtocolError("a link cannot be made through another link"))
        return
    _end_here(session)
    server.spawn(server.links.accept(session, hello))  # the link's, from now on


def _relay(session: Session, hello: ev.Hello) -> None:
    """The client reaches node ``hello.via`` through this one: its connection goes on
    as a channel over the link toward it (server/tunnel.py), and the session ends here.
    Unavailable if no link toward that node is up."""
    try:
        hop = session.server.links.toward(hello.via or "")
        if hop.peer == session.through:  # routes changing under it: never ping-pong
            raise Unavailable(
                f"node {hello.via!r} is reached back through {hop.peer!r}, which sent "
                "this connection: the routes are changing; try again shortly"
            )
    except EomsgError as e:
        session.fail(e)
        return
    onward = ev.Hello(
        hello.version,
        hello.name,
        None,  # this node vouches for it: its token stays here
        None if hello.via == hop.peer else hello.via,
        hello.max_frame,
    )
    first = Connection(Role.CLIENT).send(onward) + session.conn.hand_over()
    _end_here(session)
    assert session.transport is not None
    hop.channels.open_relay(session.transport, first)


def _end_here(session: Session) -> None:
    """The connection goes on elsewhere (a link, a channel): the session is over
    without a word, and without giving anything back (it took nothing)."""
    session.closing = True
    session.keepalive.cancel_all()
    session.server.forget(session)
