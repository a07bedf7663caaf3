"""Who may do what: principals, the rights they are granted, and the right every request
needs. Pure rules; the node keeps the principals and grants (:mod:`eomsg.node.access`),
the server checks each request against them (:mod:`eomsg.server.guard`).

A *principal* is a name with a token of its own. A *grant* gives one principal one right
on one target:

* ``publish`` on a topic pattern (``orders/>``) — publishing, alone or in a transaction;
* ``consume`` on a queue — fetching, subscribing, deleting, giving back, and deleting in
  a transaction;
* ``inspect`` on a queue — reading its settings, its waiting messages and its flows;
* ``admin`` on a queue — creating, deleting, (un)subscribing, purging, requeueing it and
  unbinding its consumers;

or any of them on the whole ``node``: every queue and topic, and what concerns the node
itself (``inspect``: the log, stats, links, transactions, SQL; ``admin``: links,
settings, principals and grants). Rights do not imply one another.

**Deny by default**: a principal may do only what it is granted. The node's *owner* — a
client presenting the node's own token, or one on its owner-only Unix socket without a
token — is never limited: it can read the data directory anyway. A client of another
node that reaches this one through a link acts as the principal ``@PEER``, which is
granted when the link is made what a linked node's clients could always do — every right
on the node (:func:`link_grants`), unless it holds grants already — and may be granted
more narrowly then (revoke those, grant others). A grant to another principal never
changes what ``@PEER`` may do; and whatever it holds, a client through a link runs no
operation that changes this node's set-up (the server's rule): ``admin`` reaches, through
a link, only settling another principal's transaction — a transactional consumer whose
route here changed since it prepared one comes through another node, as another
principal — forcing an abort, and recording a replay job.

A client may always settle its own transactions (the principal that prepared one may
commit or abort it); another's needs ``admin`` on the node.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eomsg.core.links import check_node_name
from eomsg.core.queues import QueueConfig, validate_queue_name
from eomsg.core.topics import pattern_regex, validate_pattern
from eomsg.errors import InvalidConfig, NotAllowed

OWNER = "owner"
"""The principal of the node's owner: never limited."""

ALL_QUEUES = "*"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class Right(enum.Enum):
    PUBLISH = "publish"
    CONSUME = "consume"
    INSPECT = "inspect"
    ADMIN = "admin"


class Kind(enum.Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    NODE = "node"


@dataclass(frozen=True)
class Target:
    """What a grant covers, or what a request touches: a queue (by name; a grant may say
    ``*`` for every queue), a topic (a grant holds a pattern), or the node."""

    kind: Kind
    name: str = ""

    def __str__(self) -> str:
        return self.kind.value if self.kind is Kind.NODE else f"{self.kind.value} {self.name}"

    @staticmethod
    def queue(name: str) -> Target:
        return Target(Kind.QUEUE, name)

    @staticmethod
    def topic(name: str) -> Target:
        return Target(Kind.TOPIC, name)


NODE = Target(Kind.NODE)


@dataclass(frozen=True)
class Grant:
    """``principal`` may exercise ``right`` on ``target``."""

    principal: str
    right: Right
    target: Target

    def __str__(self) -> str:
        return f"{self.principal} {self.right.value} on {self.target}"

    def sort_key(self) -> tuple[str, str, str, str]:
        return (self.principal, self.right.value, self.target.kind.value, self.target.name)

    def to_json(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "right": self.right.value,
            "kind": self.target.kind.value,
            "name": self.target.name,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Grant:
        return make_grant(data["principal"], data["right"], data["kind"], data["name"])

    def covers(self, right: Right, target: Target) -> bool:
        """Whether this grant gives ``right`` on ``target`` (a queue, a topic, the node)."""
        if right is not self.right:
            return False
        if self.target.kind is Kind.NODE:
            return True
        if self.target.kind is not target.kind:
            return False
        if target.kind is Kind.QUEUE:
            return self.target.name in (ALL_QUEUES, target.name)
        return (
            target.kind is Kind.TOPIC
            and _topic_regex(self.target.name).fullmatch(target.name) is not None
        )


@dataclass(frozen=True)
class PrincipalInfo:
    """A principal as ``eomsg user list`` shows it (never its token)."""

    name: str
    created_at: float
    grants: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "created_at": self.created_at, "grants": self.grants}

    @staticmethod
    def from_json(data: dict[str, Any]) -> PrincipalInfo:
        return PrincipalInfo(str(data["name"]), float(data["created_at"]), int(data["grants"]))


@dataclass(frozen=True)
class AuditEntry:
    """One change and who made it: ``action`` (create-queue, purge, grant, …) on
    ``target`` (a queue, a link, a principal, a setting), with what it was given."""

    at: float
    principal: str
    action: str
    target: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "principal": self.principal,
            "action": self.action,
            "target": self.target,
            "detail": self.detail,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> AuditEntry:
        return AuditEntry(
            float(data["at"]),
            str(data["principal"]),
            str(data["action"]),
            str(data["target"]),
            str(data["detail"]),
        )


@lru_cache(maxsize=1024)
def _topic_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern_regex(pattern))


def validate_principal(name: str) -> str:
    """``name`` if it is a principal's name: 1-64 of ``a-z 0-9 . _ -``, starting with a
    letter or digit, and not the owner's; else InvalidConfig."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidConfig(
            f"principal name {name!r} is not valid: use 1-64 lower-case letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    if name == OWNER:
        raise InvalidConfig(f"{OWNER!r} is the node's owner, who needs no grants")
    return name


def link_principal(peer: str) -> str:
    """The principal a client that came through the link to ``peer`` acts as."""
    return f"@{peer}"


LINK_RIGHTS = tuple(Right)
"""What ``@PEER`` is granted on the node when a link to ``PEER`` is made: every right,
as a linked node's clients always had — they never run an operation that changes this
node's set-up anyway (see the module's docstring)."""


def link_grants(peer: str) -> frozenset[Grant]:
    """The grants a new link to ``peer`` gives ``@PEER`` (see :data:`LINK_RIGHTS`)."""
    return frozenset(Grant(link_principal(peer), right, NODE) for right in LINK_RIGHTS)


def who(principal: str) -> str:
    """``principal`` as a denial names it: ``@PEER`` says whose clients it stands for."""
    if principal.startswith("@"):
        return f"{principal} (clients through node {principal[1:]!r})"
    return principal


def make_grant(principal: str, right: str, kind: str, name: str = "") -> Grant:
    """A grant from its parts as a user gives them; InvalidConfig (saying what is
    allowed) if they do not make one: publish goes with a topic pattern or the node, the
    other rights with a queue (``*``: every queue) or the node."""
    if principal.startswith("@"):
        check_node_name(principal[1:])
    else:
        validate_principal(principal)
    try:
        r = Right(right)
    except ValueError as e:
        known = ", ".join(x.value for x in Right)
        raise InvalidConfig(f"unknown right {right!r}; rights: {known}") from e
    try:
        k = Kind(kind)
    except ValueError as e:
        known = ", ".join(x.value for x in Kind)
        raise InvalidConfig(f"unknown target {kind!r}; targets: {known}") from e
    if k is Kind.NODE:
        if name:
            raise InvalidConfig("a grant on the node names no queue or topic")
    elif k is Kind.TOPIC:
        if r is not Right.PUBLISH:
            raise InvalidConfig(f"{r.value} is granted on a queue or the node, not a topic")
        validate_pattern(name)
    else:
        if r is Right.PUBLISH:
            raise InvalidConfig("publish is granted on a topic pattern or the node, not a queue")
        if name != ALL_QUEUES:
            validate_queue_name(name)
    return Grant(principal, r, Target(k, name))


@dataclass(frozen=True)
class Need:
    """What one request needs: any one of ``rights`` on ``target``."""

    rights: tuple[Right, ...]
    target: Target

    def __str__(self) -> str:
        return f"{' or '.join(r.value for r in self.rights)} on {self.target}"

    def grant_args(self) -> str:
        """The arguments of the ``eomsg grant`` that would meet this need (its first
        right): ``consume --queue q``."""
        on = {Kind.NODE: "--node", Kind.QUEUE: "--queue", Kind.TOPIC: "--topic"}
        where = on[self.target.kind] + (f" {self.target.name}" if self.target.name else "")
        return f"{self.rights[0].value} {where}"


ADMINISTERS_NODE = Need((Right.ADMIN,), NODE)
INSPECTS_NODE = Need((Right.INSPECT,), NODE)


@dataclass(frozen=True)
class Policy:
    """The grants in force: a snapshot, replaced whole when they change."""

    grants: frozenset[Grant] = frozenset()

    def allows(self, principal: str, need: Need) -> bool:
        if principal == OWNER:
            return True
        return any(
            g.principal == principal and g.covers(r, need.target)
            for g in self.grants
            for r in need.rights
        )

    def holds_any(self, principal: str) -> bool:
        """Whether some grant names ``principal``."""
        return any(g.principal == principal for g in self.grants)

    def check(self, principal: str, needs: Iterable[Need], doing: str) -> None:
        """NotAllowed unless every need is granted, naming the first that is not, what
        was being done (as a user says it: ``consume queue q``, never an operation's
        name) and the grant that would allow it."""
        for need in needs:
            if not self.allows(principal, need):
                raise NotAllowed(
                    f"{who(principal)} may not {doing}: it needs {need} (an administrator "
                    f"grants it: eomsg grant {principal} {need.grant_args()})"
                )

    def check_settle(self, principal: str, prepared_by: str | None, txid: str) -> None:
        """NotAllowed unless ``principal`` may settle transaction ``txid``, which
        ``prepared_by`` prepared (None: before principals existed, the owner): its own
        principal may, and an administrator of the node."""
        if principal == (prepared_by or OWNER) or self.allows(principal, ADMINISTERS_NODE):
            return
        raise NotAllowed(
            f"{principal} may not settle transaction {txid!r}: {prepared_by or OWNER} prepared "
            "it (only it, or admin on the node, may)"
        )


# -- the right each request needs ------------------------------------------------------


def publishing(topics: Iterable[str]) -> list[Need]:
    return [Need((Right.PUBLISH,), Target.topic(t)) for t in dict.fromkeys(topics)]


def consuming(queue: str) -> list[Need]:
    return [Need((Right.CONSUME,), Target.queue(queue))]


def admin_of(queue: str) -> list[Need]:
    return [Need((Right.ADMIN,), Target.queue(queue))]


def _on_queue(*rights: Right, arg: str = "name") -> Callable[[Mapping[str, Any]], list[Need]]:
    return lambda args: [Need(rights, Target.queue(args[arg]))]


def _on_node(right: Right) -> Callable[[Mapping[str, Any]], list[Need]]:
    return lambda args: [Need((right,), NODE)]


def _creating(args: Mapping[str, Any]) -> list[Need]:
    config: QueueConfig = args["config"]
    names = [config.name] + ([config.dead_letter] if config.dead_letter else [])
    return [Need((Right.ADMIN,), Target.queue(n)) for n in names]


def _requeueing(args: Mapping[str, Any]) -> list[Need]:
    names = [args["name"]] + ([args["to"]] if args.get("to") else [])
    return [Need((Right.ADMIN,), Target.queue(n)) for n in names]


def _flows(args: Mapping[str, Any]) -> list[Need]:
    queue = args.get("queue")
    return [Need((Right.INSPECT,), NODE if queue is None else Target.queue(queue))]


def _transacting(args: Mapping[str, Any]) -> list[Need]:
    messages: Sequence[Any] = args.get("messages", ())
    deletes: Sequence[tuple[str, int, int, int]] = args.get("deletes", ())
    queues = dict.fromkeys(d[0] for d in deletes)
    return publishing(m.topic for m in messages) + [n for q in queues for n in consuming(q)]


def _own(args: Mapping[str, Any]) -> list[Need]:
    # The session checks whose transaction it is (see OWN_TXN); a forced abort is a
    # person's heuristic decision, for an administrator of the node only.
    return [ADMINISTERS_NODE] if args.get("force") else []


OPERATION_NEEDS: dict[str, Callable[[Mapping[str, Any]], list[Need]]] = {
    "create_queue": _creating,
    "delete_queue": _on_queue(Right.ADMIN),
    "subscribe": _on_queue(Right.ADMIN),
    "unsubscribe": _on_queue(Right.ADMIN),
    "limit_queue": _on_queue(Right.ADMIN),
    "purge": _on_queue(Right.ADMIN),
    "requeue": _requeueing,
    "browse": _on_queue(Right.INSPECT),
    # A consumer reads its queue's settings (is it exclusive?) and where it lives.
    "queue_config": _on_queue(Right.CONSUME, Right.INSPECT, Right.ADMIN),
    "locate_queue": _on_queue(Right.CONSUME, Right.INSPECT),
    "queue_names": _on_node(Right.INSPECT),
    "stats": _on_node(Right.INSPECT),
    "memory": _on_node(Right.INSPECT),
    "node_info": _on_node(Right.INSPECT),
    "add_link": _on_node(Right.ADMIN),
    "set_link_egress": _on_node(Right.ADMIN),
    "set_link_topics": _on_node(Right.ADMIN),
    "remove_link": _on_node(Right.ADMIN),
    "link_info": _on_node(Right.INSPECT),
    "flows": _flows,
    "unbind": _on_queue(Right.ADMIN, arg="queue"),
    "log": _on_node(Right.INSPECT),
    "configure": _on_node(Right.ADMIN),
    "saved_settings": _on_node(Right.INSPECT),
    "query": _on_node(Right.INSPECT),
    "log_bounds": _on_node(Right.INSPECT),
    "log_horizon": _on_node(Right.INSPECT),
    "read_log": _on_node(Right.INSPECT),
    "replay_jobs": _on_node(Right.INSPECT),
    "record_replay": _on_node(Right.ADMIN),
    "prepare_txn": _transacting,
    "commit_txn": _own,
    "abort_txn": _own,
    "transact": _transacting,
    "txns": _own,  # each principal sees its own; inspect on the node sees all
    "add_principal": _on_node(Right.ADMIN),
    "remove_principal": _on_node(Right.ADMIN),
    "principals": _on_node(Right.INSPECT),
    "grant": _on_node(Right.ADMIN),
    "revoke": _on_node(Right.ADMIN),
    "grants": _on_node(Right.INSPECT),
    "audit": _on_node(Right.INSPECT),
}
"""For each operation a client runs by name: what a call with these (decoded) arguments
needs. Every operation has an entry (a test holds it to that), so none goes unchecked."""


def _queue(text: str, arg: str = "name") -> Callable[[Mapping[str, Any]], str]:
    return lambda args: text.replace("QUEUE", f"queue {args[arg]}")


def _plain(text: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda args: text


OPERATION_DOING: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "create_queue": lambda args: f"create queue {args['config'].name}",
    "delete_queue": _queue("delete QUEUE"),
    "subscribe": _queue("subscribe QUEUE to a pattern"),
    "unsubscribe": _queue("unsubscribe QUEUE from a pattern"),
    "limit_queue": _queue("set the limit of QUEUE"),
    "purge": _queue("purge QUEUE"),
    "requeue": _queue("requeue the messages of QUEUE"),
    "browse": _queue("browse QUEUE"),
    "queue_config": _queue("read the settings of QUEUE"),
    "locate_queue": _queue("find which node holds QUEUE"),
    "queue_names": _plain("list the queues"),
    "stats": _plain("read the queues' statistics"),
    "memory": _plain("read where the node's memory goes"),
    "node_info": _plain("read who the node is and how it stands"),
    "add_link": lambda args: f"add a link to {args['peer']}",
    "set_link_egress": lambda args: f"set the link to {args['peer']}",
    "set_link_topics": lambda args: f"set the link to {args['peer']}",
    "remove_link": lambda args: f"remove the link to {args['peer']}",
    "link_info": _plain("look at the links"),
    "flows": lambda args: (
        "look at the consumers"
        + ("" if args.get("queue") is None else f" of queue {args['queue']}")
    ),
    "unbind": _queue("unbind a consumer of QUEUE", arg="queue"),
    "log": _plain("read the log"),
    "configure": lambda args: f"change setting {args['name']}",
    "saved_settings": _plain("read the node's settings"),
    "query": _plain("run SQL on the store"),
    "log_bounds": _plain("read the log"),
    "log_horizon": _plain("read the log"),
    "read_log": _plain("read the log"),
    "replay_jobs": _plain("look at the replay jobs"),
    "record_replay": _plain("record a replay job"),
    "prepare_txn": _plain("run a transaction"),
    "commit_txn": lambda args: f"commit transaction {args['txid']}",
    "abort_txn": lambda args: f"abort transaction {args['txid']}",
    "transact": _plain("run a transaction"),
    "txns": _plain("look at the transactions"),
    "add_principal": lambda args: f"add principal {args['name']}",
    "remove_principal": lambda args: f"remove principal {args['name']}",
    "principals": _plain("list the principals"),
    "grant": _plain("grant rights"),
    "revoke": _plain("revoke rights"),
    "grants": _plain("look at the grants"),
    "audit": _plain("read the audit log"),
}
"""For each operation a client runs by name: what running it with these (decoded)
arguments is, as a user says it — what a denial names, never the operation's name.
Every operation has an entry (a test holds it to that)."""


def doing(op: str, args: Mapping[str, Any]) -> str:
    """What running operation ``op`` with ``args`` is, in a user's words; KeyError for an
    unknown one."""
    return OPERATION_DOING[op](args)


OWN_TXN = frozenset({"commit_txn", "abort_txn"})
"""Operations on a transaction that its own principal may run, and others only with
``admin`` on the node (a forced abort: only with it)."""


def operation_needs(op: str, args: Mapping[str, Any]) -> list[Need]:
    """What running operation ``op`` with ``args`` needs; KeyError for an unknown one."""
    return OPERATION_NEEDS[op](args)
