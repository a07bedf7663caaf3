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

This module keeps the links, their settings and the routes (:class:`Links`); a link's
connection and what it sends are :mod:`eomsg.node.transfer`'s, what it receives
:mod:`eomsg.node.intake`'s, the runtime state they share :mod:`eomsg.node.linkstate`'s.

Under the lock discipline of :mod:`eomsg.node.state`. Link settings change under
``admin_lock``; everything else under ``lock``. A link's ``wake`` (the server's
connection: "there is work") only schedules work on the server's loop and never calls
the node, so it may be called under ``lock``.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

from eomsg.core.access import OWNER, Grant, link_grants, link_principal
from eomsg.core.links import DEFAULT_HOLD, LinkConfig, LinkInfo, check_node_name
from eomsg.core.rates import Rates, Totals
from eomsg.core.routing import Routes, Update
from eomsg.core.transfer import Outbox, Receiver
from eomsg.errors import InvalidConfig, LinkNotFound
from eomsg.node.access import grant_record, granted, together
from eomsg.node.linkstate import HopRoute, LinkState, route_of_json
from eomsg.node.state import AuditRow, Destination, Shared
from eomsg.store import secrets as link_secrets
from eomsg.store.store import Store
from eomsg.store.writer import RowBatch

if TYPE_CHECKING:
    from eomsg.node.access import Access
    from eomsg.node.intake import Intake

LINK_TOTALS = "\0link:"  # rates' key prefix of a link's totals
REMOVED = "links_removed"  # node_meta: the peers whose link was removed here, and when
MADE = ("read", "offers", "taken")  # node_meta entries a link has once it was made


class Kernel(Shared, Protocol):
    """What :class:`Links` needs of the node besides :class:`~eomsg.node.state.Shared`."""

    access: Access
    intake: Intake
    admin_lock: threading.Lock
    rates: Rates
    later: dict[str, str]
    routes: dict[str, tuple[Destination, ...]]
    settled_since_compaction: int

    def totals(self) -> Totals: ...


class Links:
    """Linked peers: their settings, the node's interest and the routes — the table of
    links the node's other link components (:class:`~eomsg.node.transfer.Transfer`,
    :class:`~eomsg.node.intake.Intake`) look a peer up in."""

    # Set by load, at recovery.
    _node_name: str
    _incarnation: str
    routing: Routes
    _removed: dict[str, float]  # the peers whose link was removed here, and when
    _next_route: int
    _interest_version: int

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._links_ready = False  # until load
        self._links: dict[str, LinkState] = {}
        self._links_listeners: list[Callable[[], None]] = []
        self._removed_dials: dict[str, int] = {}  # removed peers' dials refused since open
        self.route_ids: dict[int, HopRoute] = {}  # every route out, by its id
        self._unsaved_routes: dict[int, HopRoute] = {}

    @property
    def node_name(self) -> str:
        return self._node_name

    @property
    def incarnation(self) -> str:
        return self._incarnation

    def load(self, name: str | None) -> None:
        """At recovery: the node's name (``name``, else the one kept, else a new one),
        its links, what they owe and have taken, and the routes the peers offered.

        A node is renamed only while none of its links was ever made (no peer took
        anything from it, or told it anything): once one was, the peer knows the node by
        its name — its read sequence, its routes and the messages' origins say it — and
        another name is refused (InvalidConfig)."""
        k = self._kernel
        store = k.store
        kept = store.meta("node_name")
        meta = store.meta_prefixed("link/")
        if name is not None:
            check_node_name(name)
            made = sorted({key.split("/")[1] for key in meta if key.split("/", 2)[2] in MADE})
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
            k.store.writer.write(batch).result()
        self.routing = Routes(self._node_name)
        self._removed = json.loads(store.meta(REMOVED) or "{}")
        self._next_route = int(store.meta("route_next") or -1)
        now = k.clock()
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
                self.routing.restore(peer, [route_of_json(r) for r in json.loads(value)])
            elif what.startswith("route/"):
                route_id = int(what.removeprefix("route/"))
                hop = HopRoute(route_id, link, frozenset(json.loads(value)))
                link.routes[hop.targets] = hop
                self.route_ids[route_id] = hop
        for peer in self._links:
            self.routing.restore(peer, self.routing.offers(peer))
        self._interest_version = int(store.meta("interest_version") or 0)
        self._announce(now)
        self._links_ready = True

    def restore_pending(self, runs: dict[int, list[tuple[int, int]]]) -> None:
        """At recovery: what each route still owes, from its runs of seqs (by route id,
        ascending): those past what its peer took."""
        k = self._kernel
        by_link: dict[str, dict[int, list[int]]] = {}
        for route_id, route_runs in runs.items():
            hop = self.route_ids.get(route_id)
            if hop is not None:
                taken = hop.link.taken_through
                owed = (range(max(lo, taken + 1), hi + 1) for lo, hi in route_runs)
                by_link.setdefault(hop.link.config.peer, {})[route_id] = [*chain(*owed)]
                k.settled_since_compaction += sum(  # settled, not compacted yet
                    min(hi, taken) - lo + 1 for lo, hi in route_runs if lo <= taken
                )
        for peer, routes in by_link.items():
            self._links[peer].outbox.restore(routes)

    def _new_link(self, config: LinkConfig) -> LinkState:
        k = self._kernel
        link = LinkState(config, Outbox(0, k.clock()), Receiver(0))
        link.carries = config.carries()
        return link

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
        k = self._kernel
        config = LinkConfig.make(peer, address, token, peer_ca)
        if peer == self._node_name:
            raise InvalidConfig(f"{peer!r} is this node's own name: link it to another node")
        with k.admin_lock:
            existing = self._links.get(peer)
            if existing is not None:
                kept = existing.config  # its egress is set apart (set_link_egress)
                if (kept.dialling(), kept.accepts) == (config.dialling(), config.accepts):
                    return False
                raise InvalidConfig(
                    f"a link to {peer!r} exists with other settings; remove it first "
                    f"(`eomsg link remove {peer}`)"
                )
            k.check_open()
            self._keep_secrets(peer, config.secrets())  # first: a link is never kept without
            saved = Store.save_meta_job(f"link/{peer}/config", json.dumps(config.to_json()))
            removed = {p: at for p, at in self._removed.items() if p != peer}
            jobs = [saved, Store.save_meta_job(REMOVED, json.dumps(removed))]
            entry = k.audit_entry(by, "add-link", peer, address or "(dialled by the peer)")
            job = Store.audited(together(jobs), entry)
            grants: frozenset[Grant] = frozenset()
            if not k.access.policy.holds_any(link_principal(peer)):
                grants = link_grants(peer)
                job = granted(job, grants, grant_record(k.audit_entry, by, "(with the link)"))
            k.store.writer.run(job).result()
            with k.lock:
                self._links[peer] = self._new_link(config)
                self.routing.restore(peer, ())
                self._removed = removed
                self._removed_dials.pop(peer, None)
                k.access.in_force(grants)
        self._links_changed()
        return True

    def set_link_egress(
        self, peer: str, egress: str, hold: float = DEFAULT_HOLD, *, by: str = OWNER
    ) -> bool:
        """What this node does with the messages ``peer`` sends for its own queues:
        ``store`` them, or hold them in ``memory`` for up to ``hold`` seconds (see
        :mod:`eomsg.node.egress`; to ``store``, what is held is stored at once).
        Idempotent: False if the link does so already. LinkNotFound; InvalidConfig."""
        k = self._kernel
        written: list[Future[None] | None] = []

        def apply(link: LinkState, config: LinkConfig) -> None:
            link.config = config  # messages held already keep their hold…
            if egress == "store":  # … unless they are to be stored: now, then
                written.append(k.intake.write_held(k.clock(), link=link, every=True))

        entry = k.audit_entry(by, "set-link-egress", peer, f"{egress} (hold {hold:g} s)")
        changed = self._reconfigure(peer, lambda c: c.with_egress(egress, hold), apply, entry)
        for future in written:
            k.await_commit(future)
        return changed

    def set_link_topics(self, peer: str, topics: list[str] | None, *, by: str = OWNER) -> bool:
        """The topics the link to ``peer`` may carry, either way: only those matching
        ``topics`` (None: every topic). A message of another topic is not sent over it,
        and one the peer sends is passed over (both counted as ``withheld``). Messages
        owed already go as they are. Idempotent: False if it carries those already.
        LinkNotFound; InvalidPattern."""
        k = self._kernel

        def apply(link: LinkState, config: LinkConfig) -> None:
            link.config, link.carries = config, config.carries()
            k.routes.clear()

        said = "every topic" if topics is None else " ".join(topics)
        entry = k.audit_entry(by, "set-link-topics", peer, said)
        return self._reconfigure(peer, lambda c: c.with_topics(topics), apply, entry)

    def _reconfigure(
        self,
        peer: str,
        change: Callable[[LinkConfig], LinkConfig],
        apply: Callable[[LinkState, LinkConfig], None],
        entry: AuditRow,
    ) -> bool:
        """Save the link's config as ``change`` makes it, with its audit record
        ``entry``, then ``apply`` it (under ``lock``); False if it was so already."""
        k = self._kernel
        with k.admin_lock:
            with k.lock:
                link = self.link(peer)
            config = change(link.config)
            if config == link.config:
                return False
            k.check_open()
            job = Store.save_meta_job(f"link/{peer}/config", json.dumps(config.to_json()))
            k.store.writer.run(Store.audited(job, entry)).result()
            with k.lock:
                apply(link, config)
        return True

    def remove_link(self, peer: str, *, by: str = OWNER) -> int:
        """Remove the link to ``peer`` and forget what it owed (returns how many
        messages that was) and what the peer offered; routes through it go. It leaves
        memory first, so no publish routes to it after its records are dropped. It stays
        removed, across restarts, until it is added again: the peer dialling this node
        is refused, whatever token it presents (see :meth:`dialled_after_removal`)."""
        k = self._kernel
        with k.admin_lock:
            k.check_open()
            with k.lock:
                link = self.link(peer)
                del self._links[peer]
                route_ids = [hop.id for hop in link.routes.values()]
                for route_id in route_ids:
                    self.route_ids.pop(route_id, None)
                    self._unsaved_routes.pop(route_id, None)
                k.later.pop(f"link/{peer}/taken", None)  # its records go (below)
                owed = link.outbox.sender.pending
                self.spread(self.routing.unlink(peer))
                k.routes.clear()
                # With the link gone, at once: a dial taken on meanwhile is refused.
                removed = self._removed = {**self._removed, peer: k.clock()}
            jobs = [
                Store.drop_link_job(f"link/{peer}/", route_ids),
                Store.save_meta_job(REMOVED, json.dumps(removed)),
            ]
            entry = k.audit_entry(by, "remove-link", peer, f"{owed} messages owed" if owed else "")
            k.store.writer.run(Store.audited(together(jobs), entry)).result()
            self._keep_secrets(peer, None)
        self._links_changed()
        return owed

    def _keep_secrets(self, peer: str, kept: dict[str, Any] | None) -> None:
        """Keep (None: forget) ``peer``'s link secrets in the data directory's secrets
        file, apart from the store (:mod:`eomsg.store.secrets`). Under ``admin_lock``."""
        k = self._kernel
        found = link_secrets.load(k.store.data_dir)
        if kept is None:
            if found.pop(peer, None) is None:
                return
        else:
            found[peer] = kept
        link_secrets.save(k.store.data_dir, found)

    def add_links_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after a link is added or removed (on the thread that did
        it; it must be quick and must not call the node)."""
        self._links_listeners.append(callback)

    def _links_changed(self) -> None:
        for callback in list(self._links_listeners):
            callback()

    def link_configs(self) -> list[LinkConfig]:
        k = self._kernel
        with k.lock:
            return [self._links[p].config for p in sorted(self._links)]

    def link_info(self) -> list[LinkInfo]:
        k = self._kernel
        now = k.clock()
        with k.lock:
            known = self.routing.known()
            rates = k.rates.rates(now, k.totals())
            removed = dict(self._removed_dials)
            rows = []
            for peer in sorted(self._links):
                link = self._links[peer]
                sender = link.outbox.sender
                rows.append((link, sender.pending, sender.in_flight if link.connected else 0,
                             link.outbox.lowest(), sender.resends, len(link.held)))  # fmt: skip
        published = k.store.published_at([r[3] for r in rows if r[3] is not None])
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

    def totals(self) -> Totals:
        """Each link's totals (messages taken from the peer, and by it) under
        ``LINK_TOTALS`` and its name, which no queue's name can be. Under ``lock``."""
        return {LINK_TOTALS + p: (link.received, link.taken) for p, link in self._links.items()}

    def find(self, peer: str) -> LinkState | None:
        """The link to ``peer``, if there is one. Under ``lock``."""
        return self._links.get(peer)

    def link(self, peer: str) -> LinkState:
        """The link to ``peer``; LinkNotFound if there is none. Under ``lock``."""
        link = self._links.get(peer)
        if link is None:
            raise LinkNotFound(f"no link to {peer!r}; see `eomsg link list`")
        return link

    def links_waiting(self) -> list[tuple[str, str]]:
        """The links that wait to be dialled with a token of their own and are not up:
        (peer, the token's hash), those never made first, then by name."""
        k = self._kernel
        with k.lock:
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
        k = self._kernel
        with k.lock:
            if peer in self._links or peer not in self._removed:
                return False
            self._removed_dials[peer] = self._removed_dials.get(peer, 0) + 1
            return True

    def routes_taken(self) -> dict[int, int]:
        """Per route, the seq up to which its messages are settled (the peer took them).
        For compaction, which runs after every write queued before it, so the numbers it
        is given are durable by then. Under ``lock``."""
        return {
            route_id: hop.link.taken_through
            for route_id, hop in self.route_ids.items()
            if hop.link.taken_through
        }

    def elsewhere(self, queue: str) -> str | None:
        """The linked node that holds ``queue``, if another does. Under ``lock``."""
        if not self._links_ready:
            return None
        holder = self.routing.locate(queue)
        return None if holder == self._node_name else holder

    def locate_queue(self, name: str) -> str | None:
        """The node that holds queue ``name``: this one, a linked node (the nearest if
        several announce it), or None if no node is known to."""
        k = self._kernel
        with k.lock:
            return self.routing.locate(name)

    def link_hop(self, node: str) -> str | None:
        """The linked peer a connection to ``node`` goes through (``node`` itself when
        it is a neighbour), or None if no route reaches it."""
        k = self._kernel
        with k.lock:
            return self.routing.hop(node)

    def interest_changed(self) -> None:
        """The topics this node's queues want changed: the peers are told (a subscriber
        of ``NodeState.interest_changed``). Under ``lock``."""
        if self._links_ready:
            self._announce(self._kernel.clock())

    def _announce(self, now: float) -> None:
        """Tell every peer this node's interest, under a new version. Under ``lock``
        (or at recovery)."""
        k = self._kernel
        patterns = {p for q in k.queues.values() for p in q.config.subscriptions}
        self._interest_version = max(self._interest_version + 1, int(now * 1e6))
        version = self._interest_version
        self.spread(self.routing.set_interest(patterns, version, k.queues))
        batch = RowBatch()
        batch.set_meta("interest_version", str(self._interest_version))
        k.queue_write(batch)

    def spread(self, updates: list[Update]) -> None:
        """Queue route changes for the peers connected now, and wake their connections
        (the others hear the whole table when they connect). Under ``lock``."""
        for u in updates:
            link = self._links.get(u.neighbour)
            if link is not None and link.connected and link.wake is not None:
                link.updates.append(u)
                link.wake()

    def hops(self, topic: str) -> tuple[Destination, ...]:
        """The routes out a message of ``topic`` published here takes: toward each
        next hop whose link carries the topic. Under ``lock``."""
        hops = []
        for hop, targets in self.routing.targets(topic).items():
            link = self._links.get(hop)
            if link is None:
                continue
            if link.allows(topic):
                hops.append(self.hop(link, targets))
        return tuple(hops)

    def hop(self, link: LinkState, targets: frozenset[str]) -> HopRoute:
        """The route out over ``link`` to ``targets``, made if new (saved with the next
        batch staged: :meth:`save_routes`). Under ``lock``."""
        hop = link.routes.get(targets)
        if hop is None:
            hop = HopRoute(self._next_route, link, targets)
            self._next_route -= 1
            link.routes[targets] = hop
            self.route_ids[hop.id] = hop
            self._unsaved_routes[hop.id] = hop
        return hop

    def save_routes(self, batch: RowBatch) -> None:
        """Add the routes made since the last durable batch to ``batch`` (idempotent:
        saved again until a batch holding them commits). Under ``lock``."""
        if not self._unsaved_routes:
            return
        k = self._kernel
        unsaved = dict(self._unsaved_routes)
        for route_id, hop in unsaved.items():
            key = f"link/{hop.link.config.peer}/route/{route_id}"
            batch.set_meta(key, json.dumps(sorted(hop.targets)))
        batch.set_meta("route_next", str(self._next_route))

        def saved() -> None:
            with k.lock:
                for route_id in unsaved:
                    self._unsaved_routes.pop(route_id, None)

        batch.after_commit(saved)

    def lowest_pending(self) -> int | None:
        """The lowest seq any link still owes (the log keeps it). Under ``lock``."""
        lows = [low for link in self._links.values() if (low := link.outbox.lowest()) is not None]
        return min(lows, default=None)
