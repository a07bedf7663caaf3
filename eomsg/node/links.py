"""Links to other nodes (seeds 000, 003 and 004 across machines): the node's side of a
network of nodes. What travels and how is the server's; what is decided and kept is here.

- **Interest** (:class:`~eomsg.core.routing.Routes`): the patterns of this node's queues,
  announced to every linked peer with a version that only grows, and what the peers
  announce in turn, kept in ``node_meta`` so a restarted node routes as it did before.
- **Ingress** (seed 004 c, d): a message whose topic a node behind a link wants gets that
  link as a destination in the commit that stores it — a *route*: an id (negative, apart
  from the queues') naming the link and the nodes the peer is to carry it to. The
  destination is settled when the peer has taken it, so the log keeps it until then.
  What a peer has taken is always a prefix of what its link owes (acknowledgements are
  cumulative), so it is kept as one number per link, ``link/PEER/taken``, written with
  the next write after an acknowledgement (or by the ticker): every route's message up
  to it is settled. So the destination itself is stored as a run of seqs (a batch's
  messages going the same way: one row, ``route_runs``), not a row per message, which
  would cost the ingress node about as much as storing the message did; compaction
  drops the runs that end where the peer took them or before.
- **Transfer** (seeds 000, 003; :mod:`eomsg.core.transfer`): each link's
  :class:`~eomsg.core.transfer.Outbox` sends what it owes in sequence order and settles
  on the peer's cumulative acknowledgement; the receiving side keeps, per peer, its read
  sequence, stored in the same commit as the messages it took, so a resent or repeated
  frame is only acknowledged again. A peer rebuilt from nothing has a new incarnation,
  and its sequence starts afresh.
- **Forwarding** (seed 004 k): a message taken from a peer is stored here with its own
  destinations — the local queues if this node is a target, and a route onward for the
  other targets — so it is acknowledged upstream only once this node's store holds it.

Under the lock discipline of :mod:`eomsg.node.state`. Link settings change under
``_admin``; everything else under ``_lock``. A link's ``wake`` (the server's
connection: "there is work") only schedules work on the server's loop and never calls
the node, so it may be called under ``_lock``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, overload

from eomsg.core.access import OWNER, Grant, link_grants, link_principal
from eomsg.core.limits import check_outgoing
from eomsg.core.links import DEFAULT_HOLD, LinkConfig, LinkInfo, check_node_name
from eomsg.core.message import ORIGIN, ORIGIN_SEQ, Batch, Carried, Message
from eomsg.core.rates import Totals
from eomsg.core.routing import Route, Routes, Update, Withdraw
from eomsg.core.topics import Matcher
from eomsg.core.transfer import Outbox, Receiver, Verdict
from eomsg.errors import (
    DataDirDamaged,
    EomsgError,
    InvalidConfig,
    InvalidInput,
    LinkNotFound,
    QueueFull,
)
from eomsg.node.access import grant_record, granted, together
from eomsg.node.egress import SEQ_AT, Egress, Held
from eomsg.node.state import AuditRow, Destination, QueueState, to_us
from eomsg.store import secrets as link_secrets
from eomsg.store.store import US, MessageRow, Store
from eomsg.store.writer import RowBatch

log = logging.getLogger("eomsg.link")
LINK_TOTALS = "\0link:"  # rates' key prefix of a link's totals
REMOVED = "links_removed"  # node_meta: the peers whose link was removed here, and when
MADE = ("read", "offers", "taken")  # node_meta entries a link has once it was made
Wake = Callable[[], None]
Way = tuple["tuple[Destination, ...]", bool, "tuple[LinkState, ...]"]  # see _route_carried


class HopRoute:
    """A route out over one link: the messages the peer is to carry to ``targets``.
    Identity-hashed, a :class:`~eomsg.node.state.Destination`."""

    __slots__ = ("id", "link", "targets")

    def __init__(self, route_id: int, link: LinkState, targets: frozenset[str]) -> None:
        self.id = route_id
        self.link = link
        self.targets = targets

    def extend(self, seqs: list[int], expiry: list[float | None]) -> None:
        self.link.outbox.add(self.id, seqs)


@dataclass(eq=False)
class LinkState:
    """One link's runtime state; identity-hashed."""

    config: LinkConfig
    outbox: Outbox
    receiver: Receiver
    peer_incarnation: str = ""  # whose sequence ``receiver.read`` counts
    taken_through: int = 0  # the highest of this node's seqs the peer durably took
    connected: bool = False
    wake: Wake | None = None  # the server's connection, told when there is work
    updates: list[Update] = field(default_factory=list)  # routes to tell the peer
    routes: dict[frozenset[str], HopRoute] = field(default_factory=dict)
    taken: int = 0  # messages the peer took, since start (for rates)
    received: int = 0  # messages taken from the peer, since start
    last_taken_at: float = 0.0
    connected_at: float = 0.0
    error: str | None = None  # why the last attempt to connect failed
    refusal: bool = False  # … and whether it was refused (by either side)
    # Messages refused, since start: from the peer, that this node could not take, and
    # to it, that fit no frame it takes (passed over).
    refused: int = 0
    unroutable: int = 0  # messages from the peer for nodes this node has no route to
    # Egress in memory (node/egress.py): the peer's messages held now, by the peer's
    # seq (ascending); the last acknowledgement sent; the first peer seq of each frame
    # being stored, whose commit is not durable yet (ascending).
    held: dict[int, Held] = field(default_factory=dict)
    ack_sent: int = 0
    storing: deque[int] = field(default_factory=deque)
    carries: Matcher[bool] | None = None  # the topics it may carry (None: every topic)
    withheld: int = 0  # messages from the peer, or carried on, not the link's (since start)
    # Why the node last could not take a frame from the peer, as its log said; None once
    # the link moved on since (see Links.not_taken_is_news).
    not_taken: str | None = None

    def allows(self, topic: str) -> bool:
        return self.carries is None or bool(self.carries.match(topic))


class Links(Egress):
    """Linked peers: interest, routes, what each link owes and has taken."""

    # Set by _load_links, at recovery.
    _node_name: str
    _incarnation: str
    _routing: Routes
    _links: dict[str, LinkState]
    _route_ids: dict[int, HopRoute]
    _unsaved_routes: dict[int, HopRoute]
    _next_route: int
    _interest_version: int

    # -- identity -------------------------------------------------------------------------

    @property
    def node_name(self) -> str:
        return self._node_name

    @property
    def incarnation(self) -> str:
        return self._incarnation

    def _load_links(self, name: str | None) -> None:
        """At recovery: the node's name (``name``, else the one kept, else a new one),
        its links, what they owe and have taken, and the routes the peers offered.

        A node is renamed only while none of its links was ever made (no peer took
        anything from it, or told it anything): once one was, the peer knows the node by
        its name — its read sequence, its routes and the messages' origins say it — and
        another name is refused (InvalidConfig)."""
        store = self.store
        kept = store.meta("node_name")
        meta = store.meta_prefixed("link/")
        if name is not None:
            check_node_name(name)
            made = sorted({k.split("/")[1] for k in meta if k.split("/", 2)[2] in MADE})
            if kept is not None and kept != name and made:
                raise InvalidConfig(
                    f"this node is named {kept!r}, and its links to {', '.join(made)} know it "
                    f"by that name: start it as --node-name {kept} (or remove those links "
                    "first)"
                )
        self._node_name = name or kept or f"node-{secrets.token_hex(4)}"
        self._incarnation = store.meta("incarnation") or secrets.token_hex(8)
        if kept != self._node_name or store.meta("incarnation") is None:
            batch = RowBatch()
            batch.set_meta("node_name", self._node_name)
            batch.set_meta("incarnation", self._incarnation)
            self.store.writer.write(batch).result()
        self._routing = Routes(self._node_name)
        self._init_egress()
        self._links = {}
        self._links_listeners: list[Callable[[], None]] = []
        self._removed: dict[str, float] = json.loads(store.meta(REMOVED) or "{}")
        self._removed_dials: dict[str, int] = {}  # removed peers' dials refused since open
        self._route_ids = {}
        self._unsaved_routes = {}
        self._next_route = int(store.meta("route_next") or -1)
        now = self.clock()
        kept_secrets = link_secrets.load(store.data_dir)
        for key, value in meta.items():
            _, peer, what = key.split("/", 2)
            if what == "config":
                config = LinkConfig.from_json(peer, json.loads(value), kept_secrets.get(peer))
                self._links[peer] = self._new_link(config)
        for key, value in meta.items():
            _, peer, what = key.split("/", 2)
            link = self._links.get(peer)
            if link is None:
                continue
            if what == "taken":
                link.taken_through = int(value)
            elif what == "read":
                kept_read = json.loads(value)
                link.peer_incarnation = kept_read["incarnation"]
                link.receiver = Receiver(int(kept_read["read"]))
            elif what == "offers":
                self._routing.restore(peer, [_route(r) for r in json.loads(value)])
            elif what.startswith("route/"):
                route_id = int(what.removeprefix("route/"))
                hop = HopRoute(route_id, link, frozenset(json.loads(value)))
                link.routes[hop.targets] = hop
                self._route_ids[route_id] = hop
        for peer in self._links:
            self._routing.restore(peer, self._routing.offers(peer))
        self._interest_version = int(store.meta("interest_version") or 0)
        self._announce(now)
        self._links_ready = True

    def _restore_link_pending(self, runs: dict[int, list[tuple[int, int]]]) -> None:
        """At recovery: what each route still owes, from its runs of seqs (by route id,
        ascending): those past what its peer took."""
        by_link: dict[str, dict[int, list[int]]] = {}
        for route_id, route_runs in runs.items():
            hop = self._route_ids.get(route_id)
            if hop is not None:
                taken = hop.link.taken_through
                owed = (range(max(lo, taken + 1), hi + 1) for lo, hi in route_runs)
                by_link.setdefault(hop.link.config.peer, {})[route_id] = [*chain(*owed)]
                self._settled_since_compaction += sum(  # settled, not compacted yet
                    min(hi, taken) - lo + 1 for lo, hi in route_runs if lo <= taken
                )
        for peer, routes in by_link.items():
            self._links[peer].outbox.restore(routes)

    def _new_link(self, config: LinkConfig) -> LinkState:
        link = LinkState(config, Outbox(0, self.clock()), Receiver(0))
        link.carries = config.carries()
        return link

    # -- administration ---------------------------------------------------------------------

    def add_link(
        self,
        peer: str,
        address: str | None = None,
        token: str | None = None,
        peer_ca: str | None = None,
        *,
        by: str = OWNER,
    ) -> bool:
        """Link this node to ``peer``: dialling ``address`` with ``token`` (checking its
        certificate against ``peer_ca`` for tls://), or waiting for it to dial with
        ``token`` (kept hashed; none: this node's own token). ``@PEER``, whom the peer's
        clients act as here, is granted what a linked node's clients may do
        (:func:`~eomsg.core.access.link_grants`) unless some grant names it already.
        Idempotent: False if the same link exists; InvalidConfig if it exists with other
        settings."""
        config = LinkConfig.make(peer, address, token, peer_ca)
        if peer == self._node_name:
            raise InvalidConfig(f"{peer!r} is this node's own name: link it to another node")
        with self._admin:
            existing = self._links.get(peer)
            if existing is not None:
                kept = existing.config  # its egress is set apart (set_link_egress)
                if (kept.dialling(), kept.accepts) == (config.dialling(), config.accepts):
                    return False
                raise InvalidConfig(
                    f"a link to {peer!r} exists with other settings; remove it first "
                    f"(`eomsg link remove {peer}`)"
                )
            self._check_open()
            self._keep_secrets(peer, config.secrets())  # first: a link is never kept without
            saved = Store.save_meta_job(f"link/{peer}/config", json.dumps(config.to_json()))
            removed = {p: at for p, at in self._removed.items() if p != peer}
            jobs = [saved, Store.save_meta_job(REMOVED, json.dumps(removed))]
            entry = self._audit(by, "add-link", peer, address or "(dialled by the peer)")
            job = Store.audited(together(jobs), entry)
            grants: frozenset[Grant] = frozenset()
            if not self.access.policy.holds_any(link_principal(peer)):
                grants = link_grants(peer)
                job = granted(job, grants, grant_record(self._audit, by, "(with the link)"))
            self.store.writer.run(job).result()
            with self._lock:
                self._links[peer] = self._new_link(config)
                self._routing.restore(peer, ())
                self._removed = removed
                self._removed_dials.pop(peer, None)
                self.access.in_force(grants)
        self._links_changed()
        return True

    def set_link_egress(
        self, peer: str, egress: str, hold: float = DEFAULT_HOLD, *, by: str = OWNER
    ) -> bool:
        """What this node does with the messages ``peer`` sends for its own queues:
        ``store`` them, or hold them in ``memory`` for up to ``hold`` seconds (see
        :mod:`eomsg.node.egress`; to ``store``, what is held is stored at once).
        Idempotent: False if the link does so already. LinkNotFound; InvalidConfig."""
        written: list[Future[None] | None] = []

        def apply(link: LinkState, config: LinkConfig) -> None:
            link.config = config  # messages held already keep their hold…
            if egress == "store":  # … unless they are to be stored: now, then
                written.append(self._write_held(self.clock(), link=link, every=True))

        entry = self._audit(by, "set-link-egress", peer, f"{egress} (hold {hold:g} s)")
        changed = self._reconfigure(peer, lambda c: c.with_egress(egress, hold), apply, entry)
        for future in written:
            self._await_commit(future)
        return changed

    def set_link_topics(self, peer: str, topics: list[str] | None, *, by: str = OWNER) -> bool:
        """The topics the link to ``peer`` may carry, either way: only those matching
        ``topics`` (None: every topic). A message of another topic is not sent over it,
        and one the peer sends is passed over (both counted as ``withheld``). Messages
        owed already go as they are. Idempotent: False if it carries those already.
        LinkNotFound; InvalidPattern."""

        def apply(link: LinkState, config: LinkConfig) -> None:
            link.config, link.carries = config, config.carries()
            self._routes.clear()

        said = "every topic" if topics is None else " ".join(topics)
        entry = self._audit(by, "set-link-topics", peer, said)
        return self._reconfigure(peer, lambda c: c.with_topics(topics), apply, entry)

    def _reconfigure(
        self,
        peer: str,
        change: Callable[[LinkConfig], LinkConfig],
        apply: Callable[[LinkState, LinkConfig], None],
        entry: AuditRow,
    ) -> bool:
        """Save the link's config as ``change`` makes it, with its audit record
        ``entry``, then ``apply`` it (under ``_lock``); False if it was so already."""
        with self._admin:
            with self._lock:
                link = self._link(peer)
            config = change(link.config)
            if config == link.config:
                return False
            self._check_open()
            job = Store.save_meta_job(f"link/{peer}/config", json.dumps(config.to_json()))
            self.store.writer.run(Store.audited(job, entry)).result()
            with self._lock:
                apply(link, config)
        return True

    def remove_link(self, peer: str, *, by: str = OWNER) -> int:
        """Remove the link to ``peer`` and forget what it owed (returns how many
        messages that was) and what the peer offered; routes through it go. It leaves
        memory first, so no publish routes to it after its records are dropped. It stays
        removed, across restarts, until it is added again: the peer dialling this node
        is refused, whatever token it presents (see :meth:`dialled_after_removal`)."""
        with self._admin:
            self._check_open()
            with self._lock:
                link = self._link(peer)
                del self._links[peer]
                route_ids = [hop.id for hop in link.routes.values()]
                for route_id in route_ids:
                    self._route_ids.pop(route_id, None)
                    self._unsaved_routes.pop(route_id, None)
                self._later.pop(f"link/{peer}/taken", None)  # its records go (below)
                owed = link.outbox.sender.pending
                self._spread(self._routing.unlink(peer))
                self._routes.clear()
                # With the link gone, at once: a dial taken on meanwhile is refused.
                removed = self._removed = {**self._removed, peer: self.clock()}
            jobs = [
                Store.drop_link_job(f"link/{peer}/", route_ids),
                Store.save_meta_job(REMOVED, json.dumps(removed)),
            ]
            entry = self._audit(by, "remove-link", peer, f"{owed} messages owed" if owed else "")
            self.store.writer.run(Store.audited(together(jobs), entry)).result()
            self._keep_secrets(peer, None)
        self._links_changed()
        return owed

    def _keep_secrets(self, peer: str, kept: dict[str, Any] | None) -> None:
        """Keep (None: forget) ``peer``'s link secrets in the data directory's secrets
        file, apart from the store (:mod:`eomsg.store.secrets`). Under ``_admin``."""
        found = link_secrets.load(self.store.data_dir)
        if kept is None:
            if found.pop(peer, None) is None:
                return
        else:
            found[peer] = kept
        link_secrets.save(self.store.data_dir, found)

    def add_links_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after a link is added or removed (on the thread that did
        it; it must be quick and must not call the node)."""
        self._links_listeners.append(callback)

    def _links_changed(self) -> None:
        for callback in list(self._links_listeners):
            callback()

    def link_configs(self) -> list[LinkConfig]:
        with self._lock:
            return [self._links[p].config for p in sorted(self._links)]

    def link_info(self) -> list[LinkInfo]:
        now = self.clock()
        with self._lock:
            known = self._routing.known()
            rates = self._rates.rates(now, self._totals())
            removed = dict(self._removed_dials)
            rows = []
            for peer in sorted(self._links):
                link = self._links[peer]
                sender = link.outbox.sender
                rows.append((link, sender.pending, sender.in_flight if link.connected else 0,
                             link.outbox.lowest(), sender.resends, len(link.held)))  # fmt: skip
        published = self.store.published_at([r[3] for r in rows if r[3] is not None])
        out = []
        for link, pending, in_flight, lowest, resends, held in rows:
            peer = link.config.peer
            oldest = published.get(lowest) if lowest is not None else None
            received_rate, taken_rate = rates.get(LINK_TOTALS + peer, (None, None))
            out.append(
                LinkInfo(
                    peer,
                    link.config.address,
                    link.connected,
                    pending,
                    in_flight,
                    None if oldest is None else max(0.0, now - oldest),
                    resends,
                    link.taken,
                    link.received,
                    link.receiver.read,
                    tuple(n for n, (_, hop, _) in known.items() if hop == peer),
                    taken_rate,
                    received_rate,
                    None if link.connected else link.error,
                    link.refused,
                    link.unroutable,
                    link.config.egress,
                    held,
                    link.config.topics,
                    link.withheld,
                    link.refusal and not link.connected,
                )
            )
        for peer, dials in sorted(removed.items()):
            said = f"{peer} still dials this node: refused {dials} time{'s' * (dials != 1)}"
            out.append(LinkInfo(peer, None, False, 0, 0, None, 0, 0, 0, 0, (),
                                error=f"{said} since it started", removed=True))  # fmt: skip
        return out

    def _totals(self) -> Totals:
        """The queues' totals, and each link's (messages taken from the peer, and by
        it) under ``LINK_TOTALS`` and its name, which no queue's name can be."""
        totals = super()._totals()
        for peer, link in self._links.items():
            totals[LINK_TOTALS + peer] = (link.received, link.taken)
        return totals

    def _link(self, peer: str) -> LinkState:
        link = self._links.get(peer)
        if link is None:
            raise LinkNotFound(f"no link to {peer!r}; see `eomsg link list`")
        return link

    # -- a connection's life ------------------------------------------------------------

    def link_hello(self, peer: str, incarnation: str) -> int:
        """A connection to ``peer`` (of data directory ``incarnation``) is being made
        (the peer authenticated): how far this node has taken the peer's messages. A
        new incarnation starts its sequence afresh, and that is kept at once, so a
        restart does not go back to the old one's."""
        with self._lock:
            link = self._link(peer)
            if link.peer_incarnation != incarnation:
                log.log(
                    logging.WARNING if link.peer_incarnation else logging.INFO,
                    "link to %s: a new incarnation of it (%s, was %s): its sequence starts "
                    "afresh", peer, incarnation, link.peer_incarnation or "none",
                )  # fmt: skip
                # What the old one sent and is held here is written (it is this node's
                # now), and nothing of it counts toward what the new one is told.
                self._write_held(self.clock(), link=link, every=True)
                link.held.clear()
                link.storing.clear()
                link.peer_incarnation = incarnation
                link.receiver = Receiver(0)
                batch = RowBatch()
                batch.set_meta(
                    f"link/{peer}/read", json.dumps({"incarnation": incarnation, "read": 0})
                )
                self._queue_write(batch)
            link.ack_sent = self._ack_point(link)
            return link.ack_sent

    def link_peek(self, peer: str, incarnation: str) -> int:
        """How far this node has taken the messages of ``peer`` (of data directory
        ``incarnation``), changing nothing: 0 for a link it does not know, or another
        incarnation (said to a dialler before it has proved who it is)."""
        with self._lock:
            link = self._links.get(peer)
            if link is None or link.peer_incarnation != incarnation:
                return 0
            return self._ack_point(link)

    def link_read(self, peer: str) -> tuple[str, int]:
        """The peer's incarnation this node last took messages from, and how far."""
        with self._lock:
            link = self._link(peer)
            link.ack_sent = self._ack_point(link)
            return link.peer_incarnation, link.ack_sent

    def link_connected(self, peer: str, read: int, wake: Wake) -> Update:
        """The connection to ``peer`` is up, and the peer holds this node's messages up
        to ``read``: settles what that covers, starts sending after it, and returns this
        node's whole table of routes, to send first."""
        now = self.clock()
        with self._lock:
            self._check_open()
            link = self._link(peer)
            link.connected, link.wake, link.connected_at, link.error = True, wake, now, None
            link.refusal = False
            # Past what this node committed (and handed its links, in the same step): a
            # lie, or a confusion — believed, it would settle a message still committing.
            read = min(read, self._durable_seq)
            link.updates.clear()
            # Settlements need not be waited for: the peer holds the messages already.
            self._settle_link(link, link.outbox.reconnected(read, now), now)
            (update,) = self._routing.link_up(peer)
        return update

    def link_failed(self, peer: str, why: str, *, refused: bool = False) -> None:
        """An attempt to connect to ``peer`` failed (shown by ``inspect links``):
        ``refused`` if one side said no (a name or token that does not fit, a link
        removed), rather than could not be reached."""
        with self._lock:
            link = self._links.get(peer)
            if link is not None:
                link.error, link.refusal = why, refused

    def links_waiting(self) -> list[tuple[str, str]]:
        """The links that wait to be dialled with a token of their own and are not up:
        (peer, the token's hash), those never made first, then by name."""
        with self._lock:
            found = [
                (bool(link.peer_incarnation), peer, link.config.accepts)
                for peer, link in self._links.items()
                if link.config.address is None and link.config.accepts and not link.connected
            ]
        return [(peer, key) for _, peer, key in sorted(found) if key is not None]

    def dialled_after_removal(self, peer: str) -> bool:
        """Whether ``peer``, dialling this node now, is a peer whose link this node
        removed and has not added again: its dial is to be refused (and is counted for
        ``inspect links``)."""
        with self._lock:
            if peer in self._links or peer not in self._removed:
                return False
            self._removed_dials[peer] = self._removed_dials.get(peer, 0) + 1
            return True

    def link_disconnected(self, peer: str, wake: Wake) -> None:
        """The connection ``wake`` belonged to is gone. Nothing is forgotten: what the
        link owes waits for the next connection."""
        with self._lock:
            link = self._links.get(peer)
            if link is not None and link.wake == wake:  # (a bound method: a new object each time)
                link.connected, link.wake = False, None

    def link_table(self, peer: str) -> Update:
        """This node's whole table of routes for ``peer``: sent again now and then, so
        a route change lost on the way (a faulty network) is repaired."""
        with self._lock:
            self._link(peer)
            (update,) = self._routing.link_up(peer)
            return update

    def link_updates(self, peer: str) -> list[Update]:
        """The route changes to tell ``peer``, taken (so told once)."""
        with self._lock:
            link = self._link(peer)
            updates, link.updates = link.updates, []
            return updates

    def link_heard(self, peer: str, full: bool, moves: Sequence[Route | Withdraw]) -> None:
        """``peer`` sent routes (its whole table if ``full``). Kept, so a restart routes
        the same; the other peers hear what changed. InvalidInput if a route is bad
        (nothing of the frame is taken)."""
        with self._lock:
            self._check_open()
            self._link(peer)
            if full:
                spread = self._routing.heard_all(peer, [m for m in moves if isinstance(m, Route)])
            else:
                for move in moves:  # all checked before any is taken
                    if isinstance(move, Route) and move.check().path[-1] != peer:
                        raise InvalidInput(f"route to {move.node!r} does not end with {peer!r}")
                spread = [u for m in moves for u in self._routing.heard(peer, m)]
            batch = RowBatch()
            offers = [_route_json(r) for r in self._routing.offers(peer)]
            batch.set_meta(f"link/{peer}/offers", json.dumps(offers))
            self._queue_write(batch)
            self._spread(spread)
            self._routes.clear()

    # -- sending ------------------------------------------------------------------------

    @overload
    def link_frames(self, peer: str) -> list[tuple[int, Batch]]: ...
    @overload
    def link_frames(self, peer: str, *, memory_only: bool) -> list[tuple[int, Batch]] | None: ...

    def link_frames(
        self, peer: str, *, memory_only: bool = False
    ) -> list[tuple[int, Batch]] | None:
        """What to send ``peer`` now, as (prev, messages) frames, within its window.
        ``memory_only``: None, and nothing taken, if a message must be read from DuckDB
        (not the writer's overlay) — for the server's event loop, which asks again on
        a thread then; a busy link's messages are still in memory when they go."""
        now = self.clock()
        with self._lock:
            link = self._link(peer)
            if not link.connected:
                return []
            sender = link.outbox.sender
            frames = sender.frames(now, take=False)
            if not frames:
                return []
            seqs = list(chain.from_iterable(f.seqs for f in frames))
            rows = self.store.fetch_rows(seqs, memory_only=True)
            if rows is None and memory_only:
                return None
            sender.frames(now)  # the same frames, now taken
            routes = [link.outbox.routes_of(f.seqs) for f in frames]
            targets = {r: self._route_ids[r].targets for table, _ in routes for r in table}
        if rows is None:
            rows = self.store.fetch_rows(seqs)
        if None in rows:  # what a link owes is kept until the peer took it
            lost = seqs[rows.index(None)]
            raise DataDirDamaged(f"message {lost}, owed to {peer}, is not in the log")
        now_us, name = to_us(now), self._node_name
        to_of = {r: tuple(sorted(t)) for r, t in targets.items()}
        out, at = [], 0
        for frame, (table, route_of) in zip(frames, routes, strict=True):
            part, at = rows[at : at + len(frame.seqs)], at + len(frame.seqs)
            route_targets = tuple(to_of[r] for r in table)
            out.append((frame.prev, _batch(name, part, now_us, route_targets, route_of)))
        return out

    def link_passed_over(self, peer: str, seq: int, size: int, limit: int) -> None:
        """This node's message ``seq``, with a payload of ``size`` bytes, fits no frame
        of the ``limit`` bytes ``peer`` takes, and ``peer`` acknowledged it passed over
        (it took it as refused): counted as refused, and logged."""
        with self._lock:
            link = self._links.get(peer)
            if link is None:
                return
            link.refused += 1
        log.warning(
            "link to %s: message %d refused: its payload of %d bytes fits no frame %s takes (at "
            "most %d bytes): passed over", peer, seq, size, peer, limit,
        )  # fmt: skip

    def link_taken(self, peer: str, read: int, gap: bool) -> None:
        """``peer`` holds this node's messages up to ``read`` (``gap``: it missed what
        follows): settle what that covers; after a gap, send again from there."""
        now = self.clock()
        with self._lock:
            link = self._link(peer)
            read = min(read, link.outbox.sender.sent)  # it cannot hold what was not sent
            self._settle_link(link, link.outbox.acknowledged(read, now, gap=gap), now)

    def link_tick(self, peer: str) -> bool:
        """The link's timers: the peer's messages held past their hold are written
        (and acknowledged once durable); whether the link went back to resend (nothing
        acknowledged for a while)."""
        now = self.clock()
        with self._lock:
            link = self._links.get(peer)
            if link is None:
                return False
            if link.held:
                with contextlib.suppress(EomsgError):  # a failed store: the node reopens
                    self._write_held(now, link=link)
            return link.connected and link.outbox.sender.tick(now)

    def _settle_link(self, link: LinkState, done: dict[int, list[int]], now: float) -> None:
        """Settle the routes' messages the peer took (``done``, by route): one number,
        the highest of them — they are a prefix of what the link owes, so every message
        of the link's routes up to it is settled (see :meth:`_routes_taken`). Written
        with the next write: lost in a crash, it costs only a resend of what the peer
        holds, which it recognises and acknowledges again (and then says on
        reconnecting how far it holds). Under ``_lock``."""
        if not done:
            return
        count = sum(len(seqs) for seqs in done.values())
        link.taken_through = max(link.taken_through, *(seqs[-1] for seqs in done.values()))
        self._write_later(f"link/{link.config.peer}/taken", str(link.taken_through))
        link.taken += count
        link.last_taken_at = now
        self._settled_since_compaction += count

    def _routes_taken(self) -> dict[int, int]:  # see NodeState
        """Per route, the seq up to which its messages are settled (the peer took them).
        For compaction, which runs after every write queued before it, so the numbers it
        is given are durable by then. Under ``_lock``."""
        return {
            route_id: hop.link.taken_through
            for route_id, hop in self._route_ids.items()
            if hop.link.taken_through
        }

    # -- receiving ------------------------------------------------------------------------

    def accept_transfer(
        self, peer: str, prev: int, messages: Sequence[Carried]
    ) -> Future[tuple[int, bool]]:
        """Messages from ``peer`` continuing from its sequence ``prev``. Those not taken
        before are stored, with their destinations here and onward, in one commit with
        the new read sequence; the future resolves after it with ``(read, gap)`` — what
        to acknowledge. A frame all taken before resolves at once; one that does not
        follow what was taken says so (``gap``). A message this node cannot take is
        counted as refused and passed over; one for a node this node has no route to
        is not carried there (both logged once, and counted in :meth:`link_info`).

        On a link whose egress is ``memory``, a frame whose messages are all for this
        node's queues alone is held in memory instead (:mod:`eomsg.node.egress`): taken
        at once, and acknowledged as each is settled here or written."""
        limits = self.settings.limits
        outgoing: list[Carried | str] = []  # a str: refused here, and why (see below)
        for m in messages:
            try:
                check_outgoing(m, limits)
            except EomsgError as e:
                # A message this node cannot take (over its payload limit, a topic it
                # refuses) is taken as refused: held, it would block every message
                # behind it on the link for ever. Said in the log and in inspect links.
                outgoing.append(e.message)
                continue
            outgoing.append(m)
        return self._accept(peer, prev, [m.seq for m in messages], outgoing)

    def accept_oversize(
        self, peer: str, prev: int, seq: int, size: int, limit: int
    ) -> Future[tuple[int, bool]]:
        """``peer`` passed over its message ``seq`` (continuing from ``prev``), with a
        payload of ``size`` bytes: it fits no frame of the ``limit`` bytes this node
        takes from it. Taken as a message this node cannot take is — counted as
        refused, logged — so the link's sequence goes on past it; the future resolves
        as :meth:`accept_transfer`'s does."""
        why = (
            f"its payload of {size} bytes fits no frame this node takes (at most {limit} "
            f"bytes; its max-payload is {self.settings.limits.max_payload} bytes): {peer} "
            "passed it over"
        )
        return self._accept(peer, prev, [seq], [why])

    def not_taken_is_news(self, peer: str, why: str) -> bool:
        """Whether ``why`` this node could not take a frame from ``peer`` (a full queue,
        disk or memory) is news for its log: not what it said last for that link since
        the link last moved on. The peer sends the frame again every few seconds while
        it lasts, over one connection or the next: said once, not at each. Notes it."""
        with self._lock:
            link = self._links.get(peer)
            if link is None:
                return True
            news, link.not_taken = link.not_taken != why, why
            return news

    def _accept(
        self, peer: str, prev: int, seqs: list[int], outgoing: list[Carried | str]
    ) -> Future[tuple[int, bool]]:
        """Take the messages ``seqs`` of ``peer``, continuing from ``prev``: each is
        ``outgoing``'s message to store here and onward, or why it is refused. DiskFull
        or MemoryFull (the queues over their share) while this node cannot take more:
        the peer keeps them and sends them again, as a producer retries."""
        self._check_room()
        self._check_memory()
        now = self.clock()
        done: Future[tuple[int, bool]] = Future()
        with self._lock:
            self._check_open()
            link = self._link(peer)
            receiver = link.receiver
            offer = receiver.offer(prev, seqs)
            if offer.verdict is not Verdict.TAKE:
                done.set_result((self._acked(link), offer.verdict is Verdict.GAP))
                return done
            routes, kept, peer_seqs, refused = [], [], [], []
            routed: dict[tuple[str, tuple[str, ...]], Way] = {}
            ids = [m.id for m in outgoing[offer.start :] if not isinstance(m, str) and m.id]
            room = self._room(ids, now)
            read = before = prev if offer.start == 0 else seqs[offer.start - 1]
            for seq, m in zip(seqs[offer.start :], outgoing[offer.start :], strict=True):
                if isinstance(m, str):
                    refused.append((seq, m))
                    read = seq
                    continue
                if not link.allows(m.topic):  # not this link's to carry: passed over
                    link.withheld += 1
                    log.warning("link to %s: message %d's topic is not the link's", peer, m.seq)
                    read = seq
                    continue
                way = routed.get((m.topic, m.targets))  # a frame's messages share a few
                if way is None:
                    way = routed[m.topic, m.targets] = self._route_carried(link, m)
                route, unreachable, withheld = way
                if never := room.never_fits(route, len(m.payload)):
                    route = tuple(d for d in route if d not in never)
                    log.warning(
                        "link to %s: message %d not given to queue %s: its payload of %d "
                        "bytes can never fit its max-bytes", peer, m.seq,
                        ", ".join(q.config.name for q in never), len(m.payload),
                    )  # fmt: skip
                full = room.full(route, m.id, len(m.payload))
                if full is not None:  # it and the rest wait at the peer, sent again
                    if read == before:
                        receiver.refused()
                        raise full
                    receiver.took(read)
                    break
                read = seq
                link.unroutable += unreachable
                for out in withheld:  # not the next link's to carry
                    out.withheld += 1
                routes.append(route)
                kept.append(m)
                peer_seqs.append(m.seq)
            link.received += len(kept)
            if read != before:  # the link moves on: a refusal from now on is news again
                link.not_taken = None
            if self._holds(link, kept, routes):
                try:
                    wake = self._hold_frame(link, kept, routes, peer_seqs, now)
                except QueueFull:  # the peer keeps them and sends them again
                    link.received -= len(kept)
                    receiver.refused()
                    raise
                receiver.committed(read)  # taken by this process: never taken twice
                done.set_result((self._acked(link), False))
            else:
                wake = None
                first = seqs[offer.start]
                committed = self._store_frame(link, kept, routes, first, now)
            link.refused += len(refused)  # (not if the store refused the frame: sent again)
        for seq, why in refused:
            log.warning("link to %s: message %d refused: %s", peer, seq, why)
        if wake is not None:
            self._notify(wake)
            return done

        def on_commit(f: Future[None]) -> None:
            error = f.exception()
            if error is not None:
                done.set_exception(error)
                return
            with self._lock:
                if link.storing and link.storing[0] == first:  # commits come in order
                    link.storing.popleft()
                receiver.committed(read)
                point = self._acked(link)
            done.set_result((point, False))

        committed.add_done_callback(on_commit)
        return done

    def _route_carried(self, link: LinkState, m: Carried) -> Way:
        """Where a message from ``link`` goes: this node's queues if it is a target,
        and onward by next hop for the other targets, over links carrying its topic;
        whether some target has no route from here, and the links that do not carry
        it. Under ``_lock``."""
        here, onward, unreachable = self._routing.forward(m.targets)
        if unreachable:
            log.warning(
                "link to %s: no route to %s for message %d: not carried there",
                link.config.peer, ", ".join(sorted(unreachable)), m.seq,
            )  # fmt: skip
        route: list[Destination] = list(self._matcher.match(m.topic)) if here else []
        route.sort(key=lambda d: d.id)
        withheld = []
        for hop, to in onward.items():
            out = self._links[hop]
            if out.allows(m.topic):
                route.append(self._hop(out, to))
            else:
                withheld.append(out)
        return tuple(route), bool(unreachable), tuple(withheld)

    def _store_frame(
        self,
        link: LinkState,
        kept: list[Carried],
        routes: list[tuple[Destination, ...]],
        first: int,
        now: float,
    ) -> Future[None]:
        """Store a frame's messages (the peer's seqs from ``first``) with the link's
        read sequence, in one commit — and, with them, the messages of this link still
        held in memory, so that the read sequence kept on disk may pass them: a restart
        then takes nothing stored here twice. Under ``_lock``."""
        batch = RowBatch()
        first_seq = self._next_seq
        try:  # QueueFull (a queue refuses more) or a refused write: sent again
            _, fresh = self._stage(batch, kept, now, routes=routes)  # nothing staged if it raises
            held = [h for h in link.held.values() if not h.writing and self._held.get(h.seq) is h]
            if held:  # ahead of the frame's rows, whichever is put in first
                self._write_with(batch, held)
            batch.set_meta(
                f"link/{link.config.peer}/read",
                json.dumps({"incarnation": link.peer_incarnation, "read": link.receiver.accepted}),
            )
            committed = self._write_staged(batch, first_seq, fresh)
        except BaseException:
            link.received -= len(kept)
            link.receiver.refused()
            raise
        link.storing.append(first)
        return committed

    # -- egress in memory (node/egress.py) ------------------------------------------------

    def _holds(
        self, link: LinkState, kept: list[Carried], routes: list[tuple[Destination, ...]]
    ) -> bool:
        """Whether a frame is held in memory: the link says so, no frame of it stored
        before is waiting for its commit (the queues must get the peer's messages in its
        order), and every message of it is for this node's queues alone (none to carry
        further, none for no queue, none for a queue with a limit), within the room
        left. Under ``_lock``."""
        if link.config.egress != "memory" or not kept or link.storing:
            return False
        for route in routes:
            if not route or any(isinstance(d, HopRoute) for d in route):
                return False
            if any(isinstance(d, QueueState) and d.config.limited for d in route):
                return False  # making room records settlements of other messages: stored
        return self._hold_room(sum(len(m.payload) for m in kept))

    def _hold_frame(
        self,
        link: LinkState,
        kept: list[Carried],
        routes: list[tuple[Destination, ...]],
        peer_seqs: list[int],
        now: float,
    ) -> set[str]:
        """Number the frame's messages and hold them; their queues get them at once.
        The queues to wake once ``_lock`` is released. Under ``_lock``."""
        staged = RowBatch()
        results, fresh = self._stage(staged, kept, now, routes=routes)
        rows: dict[int, RowBatch] = {}
        for name, table in staged.tables.items():
            at = SEQ_AT.get(name)
            if at is None:
                continue  # the routes' records: saved with the next batch stored
            for row in table:
                rows.setdefault(row[at], RowBatch()).rows_of(name).append(row)
        deadline = now + link.config.hold
        for m, result, peer_seq, route in zip(kept, results, peer_seqs, routes, strict=True):
            if result.duplicate:
                continue
            held = Held(
                result.seq,
                peer_seq,
                link,
                Message(
                    result.seq,
                    m.topic,
                    m.payload,
                    m.id,
                    now,
                    None if m.ttl is None else now + m.ttl,
                    m.all_headers(),
                ),
                deadline,
                {d.id for d in route},
                rows[result.seq],
            )
            self._keep(held)
            link.held[peer_seq] = held
        return self._publish_held(fresh) if fresh else set()

    def _ack_point(self, link: LinkState) -> int:
        """How far the peer's messages may be acknowledged: what this node took, short
        of the first frame whose commit is not durable yet and of the first message
        still held (or being written). Under ``_lock``."""
        point = link.receiver.accepted
        if link.storing:
            point = min(point, link.storing[0] - 1)
        for peer_seq in link.held:  # ascending: the first is the lowest
            return min(point, peer_seq - 1)
        return point

    def _held_done(self, done: list[Held]) -> None:  # see Egress
        for held in done:
            if held.link.held.get(held.peer_seq) is held:  # (not one of a new incarnation)
                del held.link.held[held.peer_seq]
        for link in {held.link for held in done}:  # woken once: it sends one acknowledgement
            if link.wake is not None and self._ack_point(link) > link.ack_sent:
                link.wake()

    def link_ack(self, peer: str) -> int | None:
        """An acknowledgement to send ``peer`` now — how far its messages are taken —
        if it moved since the last (messages held in memory settled or written)."""
        with self._lock:
            link = self._links.get(peer)
            if link is None:
                return None
            point = self._ack_point(link)
            if point <= link.ack_sent:
                return None
            link.ack_sent = point
            return point

    def _acked(self, link: LinkState) -> int:
        """The acknowledgement to send now (noted as sent). Under ``_lock``."""
        point = self._ack_point(link)
        link.ack_sent = max(link.ack_sent, point)
        return point

    def _write_held(
        self, now: float, *, link: LinkState | None = None, every: bool = False
    ) -> Future[None] | None:
        """Write the held messages whose hold is over (``every``: all of them; ``link``:
        that link's only) with what was recorded about them, and each link's read
        sequence past them, in one commit; they are acknowledged once it is durable.
        Under ``_lock``."""
        due = [
            h
            for h in self._held.values()
            if not h.writing and (every or h.deadline <= now) and (link is None or h.link is link)
        ]
        if not due:
            return None
        batch = RowBatch()
        self._write_with(batch, due)
        for each in {h.link for h in due}:
            if self._links.get(each.config.peer) is not each:
                continue  # removed: nothing of it is kept
            # Frames stored before are durable before this commit, held ones in it or
            # before: the read kept may pass all but the held ones still to be written.
            point = each.receiver.accepted
            for peer_seq, h in each.held.items():
                if not h.writing:
                    point = min(point, peer_seq - 1)
                    break
            batch.set_meta(
                f"link/{each.config.peer}/read",
                json.dumps({"incarnation": each.peer_incarnation, "read": point}),
            )
        return self._write(batch)

    # -- interest and routes ------------------------------------------------------------

    def _elsewhere(self, queue: str) -> str | None:
        if not getattr(self, "_links_ready", False):
            return None
        holder = self._routing.locate(queue)
        return None if holder == self._node_name else holder

    def locate_queue(self, name: str) -> str | None:
        """The node that holds queue ``name``: this one, a linked node (the nearest if
        several announce it), or None if no node is known to."""
        with self._lock:
            return self._routing.locate(name)

    def link_hop(self, node: str) -> str | None:
        """The linked peer a connection to ``node`` goes through (``node`` itself when
        it is a neighbour), or None if no route reaches it."""
        with self._lock:
            return self._routing.hop(node)

    def _interest_changed(self) -> None:
        if getattr(self, "_links_ready", False):
            self._announce(self.clock())

    def _announce(self, now: float) -> None:
        """Tell every peer this node's interest, under a new version. Under ``_lock``
        (or at recovery)."""
        patterns = {p for q in self._queues.values() for p in q.config.subscriptions}
        self._interest_version = max(self._interest_version + 1, int(now * 1e6))
        version = self._interest_version
        self._spread(self._routing.set_interest(patterns, version, self._queues))
        batch = RowBatch()
        batch.set_meta("interest_version", str(self._interest_version))
        self._queue_write(batch)

    def _spread(self, updates: list[Update]) -> None:
        """Queue route changes for the peers connected now, and wake their connections
        (the others hear the whole table when they connect). Under ``_lock``."""
        for u in updates:
            link = self._links.get(u.neighbour)
            if link is not None and link.connected and link.wake is not None:
                link.updates.append(u)
                link.wake()

    def _forward(self, routes: set[tuple[Destination, ...]]) -> None:
        woken = set()
        for route in routes:
            for d in route:
                if isinstance(d, HopRoute) and d.link.wake is not None and d.link not in woken:
                    woken.add(d.link)
                    d.link.wake()

    def _hops(self, topic: str) -> tuple[Destination, ...]:
        """The routes out a message of ``topic`` published here takes: toward each
        next hop whose link carries the topic. Under ``_lock``."""
        hops = []
        for hop, targets in self._routing.targets(topic).items():
            link = self._links.get(hop)
            if link is None:
                continue
            if link.allows(topic):
                hops.append(self._hop(link, targets))
        return tuple(hops)

    def _hop(self, link: LinkState, targets: frozenset[str]) -> HopRoute:
        """The route out over ``link`` to ``targets``, made if new (saved with the next
        batch staged: :meth:`_save_routes`). Under ``_lock``."""
        hop = link.routes.get(targets)
        if hop is None:
            hop = HopRoute(self._next_route, link, targets)
            self._next_route -= 1
            link.routes[targets] = hop
            self._route_ids[hop.id] = hop
            self._unsaved_routes[hop.id] = hop
        return hop

    def _save_routes(self, batch: RowBatch) -> None:  # see NodeState
        """Add the routes made since the last durable batch to ``batch`` (idempotent:
        saved again until a batch holding them commits)."""
        if not self._unsaved_routes:
            return
        unsaved = dict(self._unsaved_routes)
        for route_id, hop in unsaved.items():
            key = f"link/{hop.link.config.peer}/route/{route_id}"
            batch.set_meta(key, json.dumps(sorted(hop.targets)))
        batch.set_meta("route_next", str(self._next_route))

        def saved() -> None:
            with self._lock:
                for route_id in unsaved:
                    self._unsaved_routes.pop(route_id, None)

        batch.after_commit(saved)

    def _lowest_link_pending(self) -> int | None:
        """The lowest seq any link still owes (the log keeps it). Under ``_lock``."""
        lows = [low for link in self._links.values() if (low := link.outbox.lowest()) is not None]
        return min(lows, default=None)


def _batch(
    origin: str,
    rows: Sequence[MessageRow | None],
    now_us: int,
    routes: tuple[tuple[str, ...], ...],
    route_of: list[int] | None,
) -> Batch:
    """A frame's messages from their log rows, as columns: one transposition, and a
    look at each message only for what some have (a time to live, headers, an origin
    elsewhere — where the node that sent it here put it in its headers)."""
    seqs, topics, ids, _, expires, texts, payloads = zip(*rows, strict=True)
    n = len(seqs)
    ttls = None
    if expires.count(None) != n:
        ttls = tuple(None if e is None else max(e - now_us, 1000) / US for e in expires)
    headers = sources = None
    if texts.count(None) != n:
        each: list[dict[str, str]] = []
        came: list[tuple[str, str] | None] = []
        for text in texts:
            h = json.loads(text) if text else {}
            came.append(
                (h.pop(ORIGIN), h.pop(ORIGIN_SEQ)) if ORIGIN in h and ORIGIN_SEQ in h else None
            )
            each.append(h)
        headers = tuple(each) if any(each) else None
        sources = tuple(came) if came.count(None) != n else None
    if not all(type(p) is bytes for p in payloads):
        payloads = tuple(bytes(p) for p in payloads)
    return Batch(
        origin, seqs, topics, payloads, ids, ttls, headers, sources, routes,
        None if route_of is None else tuple(route_of),
    )  # fmt: skip


def _route_json(r: Route) -> list[Any]:
    return [r.node, r.version, sorted(r.patterns), list(r.path), sorted(r.queues)]


def _route(data: list[Any]) -> Route:
    node, version, patterns, path, *queues = data  # (routes kept before queues: none)
    return Route(node, int(version), frozenset(patterns), tuple(path), frozenset(*queues))
