"""The server's links: a dialler per link with an address, the handshake's checks on
either side, and the connections up (one per peer: the newer wins).

The handshake proves each side knows the link's token without sending it: the dialling
node says who it is, how far it has taken the peer's messages, and a nonce; the dialled
node answers likewise with its proofs (an HMAC of that nonce, keyed by the token's hash)
and a nonce of its own; the dialler checks them — a node that is not the peer is refused
there, before it can take anything — and answers with its proof, which the dialled node
checks before it takes anything of the link or changes anything. Then both sides act
alike (:class:`~eomsg.server.link.LinkConnection`).

A refusal is named on both sides: the dialled node answers with an error that says what
does not fit, and a dialler that does not believe the welcome (a name or proof that
does not fit) says why in its goodbye, which the dialled node logs.

The dialling side redials with backoff (0.1 s doubling to 5 s, with jitter), for as
long as the link exists; after a refusal, which asking again soon would only meet
again, from 5 s doubling to a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
import secrets
import ssl
from typing import TYPE_CHECKING, Any

from eomsg.core.links import LinkConfig, link_proof, token_hash
from eomsg.errors import (
    AuthenticationFailed,
    EomsgError,
    LinkNotFound,
    RemoteProtocolError,
    Unavailable,
    one_line,
)
from eomsg.server.link import LinkConnection
from eomsg.transport.address import Address, parse_address
from eomsg.transport.tls import ClientTls, tls_refused
from eomsg.wire import link_events as lev
from eomsg.wire.protocol import Connection, Role

if TYPE_CHECKING:
    from eomsg.server.server import Server

log = logging.getLogger("eomsg.link")

BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0
REFUSED_FIRST, REFUSED_MAX = 5.0, 60.0  # the backoff after the dialled node said no
WAITING_PROOFS = 3  # at most, to a node of a name this node has no link to (see accept)


class LinkManager:
    """The server's links: a dialler per link with an address, and the connections up."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._diallers: dict[str, tuple[LinkConfig, asyncio.Task[None]]] = {}
        self.connections: dict[str, LinkConnection] = {}

    def reconcile(self) -> None:
        """Dial every link with an address that is not dialled yet; stop dialling those
        removed or changed (and drop their connections)."""
        wanted = {c.peer: c for c in self.server.node.links.link_configs() if c.address}
        for peer, (config, task) in list(self._diallers.items()):
            now = wanted.get(peer)
            if now is None or now.dialling() != config.dialling():
                task.cancel()
                del self._diallers[peer]
        known = {c.peer for c in self.server.node.links.link_configs()}
        for peer, connection in list(self.connections.items()):
            if peer not in known:
                connection.abort()
        for peer, config in wanted.items():
            if peer not in self._diallers:
                self._diallers[peer] = (config, self.server.spawn(self._dial(config)))

    def stop(self) -> None:
        for _, task in self._diallers.values():
            task.cancel()
        self._diallers.clear()
        for connection in list(self.connections.values()):
            connection.abort()

    async def _dial(self, config: LinkConfig) -> None:
        """Keep a connection to ``config.peer`` up, redialling with backoff."""
        assert config.address is not None
        wait = BACKOFF_FIRST
        while True:
            refused = False
            try:
                address = parse_address(config.address)
                connection = await self._connect(config, address)
            except (OSError, EomsgError) as e:
                why = one_line(e)
                log.info("link to %s: cannot connect to %s: %s", config.peer, config.address, why)
                self.server.node.transfer.link_failed(config.peer, f"cannot connect: {why}")
            else:
                with contextlib.suppress(TimeoutError):  # no answer: try again
                    await asyncio.wait_for(
                        connection.started.wait(), self.server.settings.handshake_timeout
                    )
                if not connection.was_linked:
                    connection.abort()
                await connection.closed.wait()
                if connection.was_linked:
                    wait = BACKOFF_FIRST
                refused = connection.refused
            if refused:  # asked again soon, it would only say no again
                wait = max(wait, REFUSED_FIRST)
            await asyncio.sleep(wait * random.uniform(0.5, 1.0))
            wait = min(wait * 2, REFUSED_MAX if refused else BACKOFF_MAX)

    async def _connect(self, config: LinkConfig, address: Address) -> LinkConnection:
        server = self.server
        node = server.node
        # What this node's frame limit is now: its max-payload may have changed since
        # it started.
        conn = Connection(Role.CLIENT, node.settings.frame_limit)
        connection = LinkConnection(server, config.peer, conn)
        assert config.token is not None  # a link that dials has one (LinkConfig.make)
        connection.key = token_hash(config.token)
        connection.nonce = secrets.token_hex(16)
        if address.is_unix:
            await server.loop.create_unix_connection(lambda: connection, address.path)
        else:
            context = None
            if address.is_tls:
                own = server.settings.tls
                tls = (
                    ClientTls(ca_pem=config.peer_ca)
                    if own is None
                    else own.as_client(config.peer_ca)
                )
                context = tls.context()
            try:
                await server.loop.create_connection(
                    lambda: connection,
                    address.host,
                    address.port,
                    ssl=context,
                    server_hostname=address.host if context is not None else None,
                    ssl_handshake_timeout=server.settings.handshake_timeout if context else None,
                )
            except ssl.SSLError as e:
                raise tls_refused(f"the node at {address}", e) from e
        peer_incarnation, read = node.transfer.link_read(config.peer)
        connection.send(
            lev.LinkHello(
                lev.LINK_VERSION,
                node.node_name,
                node.incarnation,
                peer_incarnation,
                read,
                conn.max_frame,
                connection.nonce,
            )
        )
        self._track(connection)
        return connection

    def welcomed(self, connection: LinkConnection, welcome: lev.LinkWelcome) -> None:
        """The dialled node answered: check it is the peer meant — its name, and a proof
        that it knows the link's token — then prove this side knows it too. The link
        starts when the dialled node starts it (its first frame of the link), so one it
        refuses after the proof never counted as up. What does not fit is said to the
        dialled node (in the goodbye) and kept for ``inspect links``."""
        node, me, peer = connection.node, connection.node.node_name, connection.peer
        address = self._address(peer)
        if welcome.node != peer:
            why = (
                f"{me!r} dialled {peer!r} at {address}, and the node there is {welcome.node!r}: "
                f"check the address of {me!r}'s link to {peer!r}"
            )
        else:
            expected = link_proof(connection.key, connection.nonce, me, welcome.node, "dialled")
            if any(hmac.compare_digest(p.encode(), expected.encode()) for p in welcome.proofs):
                connection.send(
                    lev.LinkProof(link_proof(connection.key, welcome.nonce, me, peer, "dialler"))
                )
                connection.accepted = (welcome.incarnation, welcome.read)
                return
            why = (
                f"{peer!r} at {address} did not prove it knows the token {me!r} dials it with: "
                f"it accepts no such token from a node named {me!r} (a wrong --token-file, "
                f"{peer!r} knowing this node by another name, or not {peer!r} at that address)"
            )
        connection.refused = True
        node.transfer.link_failed(peer, f"refused: {why}", refused=True)
        connection.fail(AuthenticationFailed(why))

    def _address(self, peer: str) -> str:
        configs = self.server.node.links.link_configs()
        return next((c.address or "?" for c in configs if c.peer == peer), "?")

    async def accept(self, session: Any, hello: lev.LinkHello) -> None:
        """A node dialled this one (on ``session``'s connection): check what it says,
        answer with this node's proofs and a nonce, and wait for its own proof
        (:meth:`proven`) before anything of the link is taken or changed. A node whose
        link this node removed is refused at once, whatever its token.

        To a node of a name this node has no link to, the welcome also proves the keys
        of a few links still waiting for their peer's first dial: if it holds one, its
        proof says which, and it is refused with both names — the mistake of a node
        started under another name than its peer knows it by."""
        server = self.server
        node = server.node
        conn: Connection = session.conn
        transport: asyncio.Transport = session.transport
        if transport.is_closing():
            return
        connection = LinkConnection(server, hello.node, conn)
        connection.transport = transport
        transport.set_protocol(connection)
        try:
            if hello.version != lev.LINK_VERSION:
                raise RemoteProtocolError(
                    f"link protocol version {hello.version} is not supported; this node "
                    f"speaks version {lev.LINK_VERSION}"
                )
            if hello.node == node.node_name:
                raise RemoteProtocolError(f"a node named {hello.node!r} dialled itself")
            if node.links.dialled_after_removal(hello.node):
                raise LinkNotFound(
                    f"{node.node_name!r} removed its link to {hello.node!r} (on "
                    f"{node.node_name!r}, `eomsg link add {hello.node}` makes it again)"
                )
            dials = {c.peer for c in node.links.link_configs() if c.address}
            if hello.node in dials and node.node_name < hello.node:
                raise EomsgError(
                    f"both {node.node_name!r} and {hello.node!r} dial this link: only "
                    f"{node.node_name!r} does (remove the address on one side)"
                )
            keys = self._keys(hello.node)
            read = node.transfer.link_peek(hello.node, hello.incarnation)  # changes nothing yet
            me, s = node.node_name, server.settings
            nonce = secrets.token_hex(16)
            proofs = tuple(link_proof(k, hello.nonce, hello.node, me, "dialled") for k, _ in keys)
            connection.awaiting = (hello, keys, nonce)
            connection.send(
                lev.LinkWelcome(
                    lev.LINK_VERSION, me, node.incarnation, read, node.settings.frame_limit,
                    s.heartbeat, proofs, nonce,
                )
            )  # fmt: skip
        except EomsgError as e:
            connection.fail(e)
            return

        def too_slow() -> None:
            if connection.awaiting is not None:
                why = (
                    f"no proof came within {server.settings.handshake_timeout:g} s of the "
                    "welcome, nor a word of why (a stuck node, or an older eomsg)"
                )
                self._refused(hello.node, why)
                connection.fail(RemoteProtocolError(why))

        server.loop.call_later(server.settings.handshake_timeout, too_slow)
        connection.process()  # what came after the hello, buffered meanwhile

    def proven(self, connection: LinkConnection, proof: lev.LinkProof) -> None:
        """The dialling node's proof: checked against the keys the welcome offered; if
        good, the link is taken on (made, if it was dialled with this node's own token
        and this side did not know it) and started. AuthenticationFailed if not. What
        the dialler sent after its proof waits meanwhile."""
        if connection.awaiting is None:
            raise RemoteProtocolError("a link proof came unasked")
        hello, keys, nonce = connection.awaiting
        connection.awaiting = None
        me = self.server.node_name
        expected = {kind: link_proof(k, nonce, hello.node, me, "dialler") for k, kind in keys}
        given = proof.proof.encode()
        good = [kind for kind, p in expected.items() if hmac.compare_digest(given, p.encode())]
        theirs = [kind.removeprefix("for:") for kind in good if kind.startswith("for:")]
        if theirs and "node" not in good:
            meant = " or ".join(repr(t) for t in theirs)
            why = (
                f"a node dialled as {hello.node!r} with the token {me!r} made for {meant}: "
                f"a link's token is good for its own name only (start that node as "
                f"--node-name {theirs[0]}, or link {hello.node!r} on {me!r})"
            )
            for name in theirs:
                self._refused(name, why)
            raise AuthenticationFailed(why)
        if not good:
            why = (
                f"wrong or missing token for a link from {hello.node!r}: give the token this "
                "node made for it (`eomsg link add` here with --token-file) or its node token "
                "(DIR/eomsg.token)"
            )
            self._refused(hello.node, why)
            raise AuthenticationFailed(why)
        # Only now may it replace a connection of that name: one that did not
        # authenticate must not be able to keep a link down.
        self._track(connection)
        connection.proving = True
        self.server.spawn(self._take_on(connection, hello, "node" in good))

    async def _take_on(
        self, connection: LinkConnection, hello: lev.LinkHello, may_make: bool
    ) -> None:
        """Take the link on for ``connection`` — made first if it proved this node's
        own token and the link is not known — and start it, unless the connection ended
        (or another replaced it) meanwhile."""
        node = self.server.node

        def gone() -> bool:
            return (
                connection.ending
                or connection.closed.is_set()
                or self.connections.get(hello.node) is not connection
            )

        try:
            if gone():
                return
            try:
                node.transfer.link_hello(hello.node, hello.incarnation)
            except LinkNotFound:
                # Its link was removed since the welcome, or (found here) since the hello.
                if not may_make or node.links.dialled_after_removal(hello.node):
                    raise
                await self.server.blocking(node.links.add_link, hello.node, None, None)
                if gone():
                    return
                node.transfer.link_hello(hello.node, hello.incarnation)
            theirs = hello.read if hello.peer_incarnation == node.incarnation else 0
            connection.start(theirs)
        except EomsgError as e:  # the node closed meanwhile
            connection.fail(e)
            return
        finally:
            connection.proving = False
        connection.process()  # what the dialler sent after its proof

    def toward(self, node: str) -> LinkConnection:
        """The link connection a client reaching ``node`` goes through now (the first
        hop of the route toward it); Unavailable if no route reaches it or its link is
        down."""
        me = self.server.node_name
        hop = self.server.node.links.link_hop(node)
        if hop is None:
            raise Unavailable(
                f"node {me!r} has no route to a node named {node!r} (see `eomsg inspect links`)"
            )
        connection = self.connections.get(hop)
        if connection is None or not connection.linked:
            via = "" if hop == node else f" is reached through {hop!r}, and"
            raise Unavailable(
                f"node {node!r}{via} the link to {hop!r} is down now; try again shortly"
                if via
                else f"the link from {me!r} to node {node!r} is down now; try again shortly"
            )
        return connection

    def given_up(self, connection: LinkConnection, reason: str) -> None:
        """The dialler left after the welcome, without its proof: it did not believe
        this node (a name or proof that did not fit), and ``reason`` says why."""
        assert connection.awaiting is not None
        hello = connection.awaiting[0]
        connection.awaiting = None
        said = "".join(c if c.isprintable() else " " for c in reason)[:500]  # its words
        why = f"{hello.node!r} gave up the link after this node's welcome, saying: {said}"
        if not any(c.peer == hello.node for c in self.server.node.links.link_configs()):
            waiting = [peer for peer, _ in self.server.node.links.links_waiting()]
            why += f" (this node has no link to {hello.node!r}" + (
                f"; links waiting for their peer here: {', '.join(waiting)})" if waiting else ")"
            )
        log.warning("link from %s: %s", hello.node, why)
        self._refused(hello.node, why)

    def _refused(self, peer: str, why: str) -> None:
        """The link to ``peer`` (if this node has one) was refused for ``why``: kept for
        ``inspect links``."""
        self.server.node.transfer.link_failed(peer, f"refused: {why}", refused=True)

    def _keys(self, peer: str) -> list[tuple[str, str]]:
        """The keys (tokens' hashes) a node dialling as ``peer`` may prove it knows, with
        what each is: the token this node made for that link, and this node's own token
        (which may also make the link). For a name this node has no link to, also the
        keys of a few links waiting for their peer (``for:PEER``: see :meth:`accept`)."""
        configs = self.server.node.links.link_configs()
        config = next((c for c in configs if c.peer == peer), None)
        keys = [] if config is None or config.accepts is None else [(config.accepts, "link")]
        if config is None:
            waiting = self.server.node.links.links_waiting()[:WAITING_PROOFS]
            keys += [(key, f"for:{name}") for name, key in waiting]
        return [*keys, (token_hash(self.server.token), "node")]

    def _track(self, connection: LinkConnection) -> None:
        old = self.connections.get(connection.peer)
        if old is not None and old is not connection:
            old.abort()  # the newer connection wins: the old one is likely dead
        self.connections[connection.peer] = connection

        def forget(_: object) -> None:
            if self.connections.get(connection.peer) is connection:
                del self.connections[connection.peer]

        self.server.spawn(connection.closed.wait()).add_done_callback(forget)
