"""Principals, their grants, and the audit log: what :mod:`eomsg.core.access` rules on,
kept — a component of the node (``node.access``) that owns this state alone. The server
asks :attr:`Access.policy` (the grants in force) and :meth:`Access.principal_of` (a
token's principal) for every request; the node itself checks requeues and whose
transaction one settles against the policy.

Every change is an administrative one (under the node's ``admin`` lock) and commits with
its audit record; the tokens' digests are kept apart from the store
(:mod:`eomsg.store.principals`), written before a principal is added and after it is
removed. A link made grants its peer's principal what a linked node's clients may do
(:mod:`eomsg.node.links` commits them with the link, with :func:`granted`, then calls
:meth:`Access.in_force`).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eomsg.core.access import (
    OWNER,
    AuditEntry,
    Grant,
    Policy,
    PrincipalInfo,
    link_grants,
    make_grant,
    validate_principal,
)
from eomsg.errors import InvalidConfig, PrincipalExists, PrincipalNotFound
from eomsg.node.state import AuditRow, Clock, audit_row, to_us
from eomsg.store import principals as digests_file
from eomsg.store.store import US, Store

MAX_AUDIT = 10_000  # records one call returns at most
LINK_GRANTS = "link_grants"  # node_meta: linked nodes' clients have grants of their own

log = logging.getLogger("eomsg.node")


class Access:
    """Principals, grants and the audit log of one node. ``lock`` and ``admin`` are the
    node's (its lock discipline: :mod:`eomsg.node.state`); ``check_open`` raises
    NodeClosed once the node is closed."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        lock: threading.Lock,
        admin: threading.Lock,
        check_open: Callable[[], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self._lock, self._admin, self._check_open = lock, admin, check_open
        # The policy is replaced whole, under ``admin`` and ``lock``: a session reads it
        # without a lock.
        self.policy = Policy()
        self._principals: dict[str, float] = {}  # name -> when added
        self._digests: dict[str, str] = {}  # name -> its token's digest

    def load(self) -> None:
        """At open: the principals the store knows, their digests, the grants."""
        principals, grants = self.store.load_access()
        digests = digests_file.load(self.store.data_dir)
        self._principals = {name: us / US for name, us in principals.items()}
        self._digests = {n: d for n, d in digests.items() if n in self._principals}
        self.policy = Policy(frozenset(make_grant(*g) for g in grants))
        if self.store.meta(LINK_GRANTS) is None:
            self._grant_links_as_before()

    def in_force(self, grants: frozenset[Grant]) -> None:
        """``grants``, committed with another change (a link made), now in force with
        it. Under the node's ``admin`` and ``lock``."""
        self.policy = Policy(self.policy.grants | grants)

    def _audit(self, by: str, action: str, target: str, detail: str = "") -> AuditRow:
        return audit_row(self.clock(), by, action, target, detail)

    def _grant_links_as_before(self) -> None:
        """Once, for a data directory from before a linked node's clients had grants of
        their own (``@PEER``'s, made with the link): they could do everything but admin
        operations while the node had no grant at all, and only what ``@PEER`` held once it had
        one. The first is kept as the grants a link makes now; the second needs none."""
        made: frozenset[Grant] = frozenset()
        if not self.policy.grants:
            peers = {key.split("/")[1] for key in self.store.meta_prefixed("link/")}
            made = made.union(*(link_grants(peer) for peer in sorted(peers)))
        why = "(as before: a linked node's clients while the node had no grant)"
        job = granted(
            Store.save_meta_job(LINK_GRANTS, "1"), made, grant_record(self._audit, OWNER, why)
        )
        self.store.writer.run(job).result()
        self.policy = Policy(self.policy.grants | made)

    def has_principal(self, name: str) -> bool:
        """Whether principal ``name`` exists now (a session's is checked at each request:
        one removed is cut off)."""
        return name in self._principals

    def principal_of(self, token: str) -> str | None:
        """The principal whose token ``token`` is, or None (compared in constant time)."""
        wanted = digests_file.token_digest(token)
        found = None
        for name, digest in list(self._digests.items()):
            if hmac.compare_digest(digest, wanted):
                found = name
        return found

    def add_principal(self, name: str, *, by: str = OWNER) -> str:
        """Add principal ``name`` with a new token, returned here once: only its digest
        is kept. PrincipalExists; InvalidConfig for a name that is not valid."""
        validate_principal(name)
        with self._admin:
            self._check_open()
            if name in self._principals:
                raise PrincipalExists(
                    f"principal {name!r} exists; `eomsg user remove {name}` first to give "
                    "it a new token"
                )
            token = secrets.token_urlsafe(32)
            digest = digests_file.token_digest(token)
            digests_file.save(self.store.data_dir, self._digests | {name: digest})
            now = self.clock()
            job = Store.add_principal_job(name, to_us(now))
            entry = self._audit(by, "add-principal", name)
            self.store.writer.run(Store.audited(job, entry)).result()
            with self._lock:
                self._principals[name] = now
                self._digests = self._digests | {name: digest}
        return token

    def remove_principal(self, name: str, *, by: str = OWNER) -> int:
        """Remove principal ``name`` and its grants (how many): its token no longer
        connects; sessions it has open keep only what the grants left in force allow.
        PrincipalNotFound."""
        with self._admin:
            self._check_open()
            if name not in self._principals:
                raise PrincipalNotFound(f"no principal {name!r}; see `eomsg user list`")
            job = Store.remove_principal_job(name)
            self.store.writer.run(
                Store.audited(job, self._audit(by, "remove-principal", name))
            ).result()
            left = frozenset(g for g in self.policy.grants if g.principal != name)
            removed = len(self.policy.grants) - len(left)
            with self._lock:
                del self._principals[name]
                self._digests = {n: d for n, d in self._digests.items() if n != name}
                self.policy = Policy(left)
            try:  # removed already: a digest left behind is ignored at the next open
                digests_file.save(self.store.data_dir, self._digests)
            except OSError as e:
                log.warning("principal %s removed; its digest stays in the file: %s", name, e)
        return removed

    def principals(self) -> list[PrincipalInfo]:
        """Every principal, by name, with how many grants it holds."""
        held: dict[str, int] = {}
        for g in self.policy.grants:
            held[g.principal] = held.get(g.principal, 0) + 1
        with self._lock:
            known = sorted(self._principals.items())
        return [PrincipalInfo(n, at, held.get(n, 0)) for n, at in known]

    def grant(
        self, principal: str, right: str, kind: str, name: str = "", *, by: str = OWNER
    ) -> bool:
        """Give ``principal`` ``right`` on a ``kind`` (queue, topic, node) ``name``.
        Idempotent: False if it holds it already. PrincipalNotFound; InvalidConfig."""
        return self._change_grant(make_grant(principal, right, kind, name), True, by)

    def revoke(
        self, principal: str, right: str, kind: str, name: str = "", *, by: str = OWNER
    ) -> bool:
        """Take back a grant; False if it was not given. It holds at once: a
        subscription that loses its right ends at its next take."""
        return self._change_grant(make_grant(principal, right, kind, name), False, by)

    def _change_grant(self, grant: Grant, given: bool, by: str) -> bool:
        with self._admin:
            self._check_open()
            if not grant.principal.startswith("@") and grant.principal not in self._principals:
                raise PrincipalNotFound(
                    f"no principal {grant.principal!r}; add it with "
                    f"`eomsg user add {grant.principal}`"
                )
            if (grant in self.policy.grants) == given:
                return False
            row = (grant.principal, grant.right.value, grant.target.kind.value, grant.target.name)
            action = "grant" if given else "revoke"
            detail = f"{grant.right.value} on {grant.target}"
            job = Store.audited(
                Store.grant_job(row, given), self._audit(by, action, grant.principal, detail)
            )
            self.store.writer.run(job).result()
            grants = self.policy.grants | {grant} if given else self.policy.grants - {grant}
            with self._lock:
                self.policy = Policy(grants)
            return True

    def grants(self, principal: str | None = None) -> list[Grant]:
        """The grants in force (of ``principal``, if given), sorted."""
        mine = (g for g in self.policy.grants if principal in (None, g.principal))
        return sorted(mine, key=Grant.sort_key)

    def audit(self, limit: int = 50, before: float | None = None) -> list[AuditEntry]:
        """Up to ``limit`` audit records, newest first (those before ``before``, a time
        in seconds, to page back)."""
        if before is not None and not 0 <= before < 1e11:  # NaN and infinities too
            raise InvalidConfig(f"before must be a time in seconds since the epoch, not {before}")
        limit = max(0, min(limit, MAX_AUDIT))
        rows = self.store.audit_log(limit, None if before is None else to_us(before))
        return [AuditEntry(row[0] / US, *row[1:]) for row in rows]


def grant_record(
    audit: Callable[[str, str, str, str], AuditRow], by: str, why: str
) -> Callable[[Grant], AuditRow]:
    """The audit record (made by ``audit``: :meth:`NodeState.audit_entry`) of a grant made
    ``by`` a principal with another change, which ``why`` names."""
    return lambda g: audit(by, "grant", g.principal, f"{g.right.value} on {g.target} {why}")


def granted(job: Any, grants: Iterable[Grant], audit: Callable[[Grant], AuditRow]) -> Any:
    """A store job: ``job``, then each of ``grants`` added with its audit record, in one
    transaction."""
    jobs = [job]
    for g in sorted(grants, key=Grant.sort_key):
        row = (g.principal, g.right.value, g.target.kind.value, g.target.name)
        jobs.append(Store.audited(Store.grant_job(row, True), audit(g)))
    return together(jobs)


def together(jobs: Sequence[Callable[[Any], Any]]) -> Callable[[Any], None]:
    """One store job running ``jobs`` in order, in its transaction."""

    def job(conn: Any) -> None:
        for each in jobs:
            each(conn)

    return job
