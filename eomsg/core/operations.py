"""The node operations a client runs by name, declared once.

Each operation is a signature — its name, its typed arguments, its result type — and a
docstring that says what it does and which errors it raises. Everything else is derived
from it: the server's call table (:mod:`eomsg.server.calls`), the argument and result
codecs of the Call frame (:mod:`eomsg.wire.calls`), and the methods of every client,
which inherit :class:`Operations`: an :class:`Operation` is a descriptor that becomes,
on a synchronous client, a method returning the result and, on an asyncio client, a
coroutine method — mypy sees both with the declared arguments.

A declaration's body is its docstring and ``raise Declaration``: it is never called. A client
implements one hook: ``run_operation(op, args)`` (synchronous) or ``async
run_operation_async(op, args)``, given the arguments by name. The node itself implements
each operation as a method of the same name that accepts the declared arguments
(``tests/test_operations.py`` holds it to that), plus the ``node_args`` an operation fixes
for every caller.

Publishing, fetching, deleting and releasing are not operations: they have frames of
their own (batches, pushed deliveries) in :mod:`eomsg.wire.events`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, ParamSpec, Protocol, TypeVar, overload

from eomsg.core.access import AuditEntry, Grant, PrincipalInfo
from eomsg.core.election import FlowInfo
from eomsg.core.links import DEFAULT_HOLD, LinkInfo
from eomsg.core.memory import MemoryUse
from eomsg.core.message import Message, Outgoing, PublishResult
from eomsg.core.nodeinfo import NodeInfo
from eomsg.core.queues import REFUSE, QueueConfig, QueueStats
from eomsg.core.replay import JobEvent, JobRecord, Selection
from eomsg.core.txn import TxnInfo

P = ParamSpec("P")
R = TypeVar("R")

ARROW = "arrow"
ArrowTable = Annotated[Any, ARROW]
"""A ``pyarrow.Table``, declared without importing pyarrow, so that declaring the
operations loads none of it: a client, and every command through a running node, imports
pyarrow only when a table is carried (``eomsg.wire.arrowipc``: as Arrow IPC). Other
modules of core do import it (``core.dedup``'s runs are NumPy and Arrow columns)."""

TxnDelete = tuple[str, int, int, int]
"""A delivery a transaction deletes: ``(queue, seq, epoch, attempt)``."""


class SyncRunner(Protocol):
    def run_operation(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any: ...


class AsyncRunner(Protocol):
    async def run_operation_async(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any: ...


@dataclass(eq=False)
class Operation(Generic[P, R]):
    """One declared operation; see the module's docstring."""

    signature: Callable[P, R]
    caller: tuple[str, ...] = ()
    node_args: Mapping[str, Any] = field(default_factory=dict)
    sized_by: str | None = None
    reads_only: bool = False
    admin: bool = False

    @property
    def name(self) -> str:
        return self.signature.__name__

    @functools.cached_property
    def _inspected(self) -> inspect.Signature:
        return inspect.signature(self.signature)

    @property
    def parameters(self) -> Mapping[str, inspect.Parameter]:
        return self._inspected.parameters

    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The arguments of one call, by name, defaults filled in; TypeError as a
        function of this signature would raise."""
        bound = self._inspected.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    @overload
    def __get__(self, obj: None, owner: type) -> Operation[P, R]: ...
    @overload
    def __get__(self, obj: AsyncRunner, owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __get__(self, obj: SyncRunner, owner: type) -> Callable[P, R]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        op = self
        if hasattr(obj, "run_operation_async"):

            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await obj.run_operation_async(op, op.bind(*args, **kwargs))

            return functools.update_wrapper(call_async, self.signature)

        def call(*args: Any, **kwargs: Any) -> Any:
            return obj.run_operation(op, op.bind(*args, **kwargs))

        return functools.update_wrapper(call, self.signature)


def operation(
    *,
    caller: tuple[str, ...] = (),
    node_args: Mapping[str, Any] | None = None,
    sized_by: str | None = None,
    reads_only: bool = False,
    admin: bool = False,
) -> Callable[[Callable[P, R]], Operation[P, R]]:
    """Declare an operation from a signature.

    ``caller``: the node method's arguments that say who calls — ``holder`` (the
    deliveries it may settle are those made to the caller) and ``owner`` (the
    transaction is the caller's, in doubt once it goes away) and ``by`` (the principal
    calling: the audit log names it, and a transaction is settled by its own principal
    only); the server fills them in from the connection. ``node_args``: arguments the
    node's method gets on every call.
    ``sized_by``: the argument that bounds the answer's size (None: as much as one
    answer may carry), which the server caps at what one frame carries. ``reads_only``:
    it changes nothing (a data directory lent for looking serves only these). ``admin``:
    it changes how the node is set up (queues, links, settings, flows), which a client
    that reached the node through a link from another node may not do."""

    def declare(signature: Callable[P, R]) -> Operation[P, R]:
        return Operation(signature, caller, dict(node_args or {}), sized_by, reads_only, admin)

    return declare


class Declaration(AssertionError):
    """A declaration's body ran: operations run through a client's ``run_operation``."""


class Operations(Protocol):
    """Every operation; clients inherit it (see the module's docstring). A protocol, so
    that :class:`~eomsg.client.broker.Broker` can extend it; its bodies raise, rather
    than being empty, so that mypy does not take them for abstract methods."""

    # -- queues -----------------------------------------------------------------------

    @operation(admin=True, caller=("by",))
    def create_queue(config: QueueConfig) -> bool:
        """Create ``config.name`` (and its dead-letter queue, if missing). Idempotent:
        False if it exists with the same settings; QueueExists if with others."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def delete_queue(name: str, *, force: bool = False) -> int:
        """Delete a queue and its records; how many messages it still held.
        QueueNotEmpty unless ``force``; QueueNotFound."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def subscribe(name: str, pattern: str) -> bool:
        """Route topics matching ``pattern`` into the queue from now on; False if it
        was subscribed already. InvalidPattern, QueueNotFound."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def unsubscribe(name: str, pattern: str) -> bool:
        """Stop routing ``pattern`` to the queue; False if it was not subscribed."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def limit_queue(
        name: str,
        max_messages: int | None = None,
        overflow: str = REFUSE,
        max_bytes: int | None = None,
    ) -> QueueConfig:
        """Set the queue's max-messages and max-bytes of payload (None: none) and what
        a publish past one does (``refuse``: QueueFull; ``dead-letter-oldest``); its
        settings. InvalidConfig, QueueNotFound."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def purge(name: str) -> int:
        """Settle every message in the queue as purged; how many. QueueNotFound."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def requeue(
        name: str, to: str | None = None, max_messages: int | None = None
    ) -> tuple[int, str]:
        """Move up to ``max_messages`` (None: all) of the messages waiting in a queue —
        a dead-letter queue, usually — into ``to`` (default: the one queue that
        dead-letters into it), atomically: each is published again into that queue
        alone and leaves this one in the same commit. Messages in flight stay. How
        many moved, and where. QueueNotFound; InvalidConfig when ``to`` is this queue
        or cannot be told."""
        raise Declaration

    @operation(reads_only=True)
    def browse(name: str, from_seq: int = 0, limit: int = 20) -> list[Message]:
        """Messages waiting in the queue (in flight included) from ``from_seq``, oldest
        first, without taking them. QueueNotFound."""
        raise Declaration

    @operation(reads_only=True)
    def queue_config(name: str) -> QueueConfig:
        """The queue's settings. QueueNotFound."""
        raise Declaration

    @operation(reads_only=True)
    def queue_names() -> list[str]:
        """Every queue's name, sorted."""
        raise Declaration

    @operation(reads_only=True)
    def stats() -> list[QueueStats]:
        """A snapshot of every queue, by name."""
        raise Declaration

    @operation(reads_only=True)
    def memory() -> MemoryUse:
        """Where the node's memory goes: its limit, and what each part takes of its share
        (DuckDB, the dedup window in memory and on disk, the queues)."""
        raise Declaration

    @operation(reads_only=True)
    def node_info() -> NodeInfo:
        """Who the node is and how it stands: name, version, uptime, data directory,
        addresses, links, disk (``eomsg node info``)."""
        raise Declaration

    # -- links ------------------------------------------------------------------------

    @operation(admin=True, caller=("by",))
    def add_link(
        peer: str,
        address: str | None = None,
        token: str | None = None,
        peer_ca: str | None = None,
    ) -> bool:
        """Link this node to node ``peer``: dialling ``address`` with ``token`` (the
        peer's node token, or one the peer made for this link; kept in this node's data
        directory) and, for tls://, checking its certificate against ``peer_ca`` (PEM;
        None: the system's CAs); or, without an address, waiting for the peer to dial
        with ``token`` (kept hashed; None: this node's own token).
        Idempotent: False if the same link exists; InvalidConfig if with others."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def set_link_egress(peer: str, egress: str, hold: float = DEFAULT_HOLD) -> bool:
        """What this node does with the messages ``peer`` sends for its own queues:
        ``store`` them, or hold them in ``memory`` — settled here within ``hold``
        seconds, they are never written; else written then. False if it does so
        already. LinkNotFound; InvalidConfig."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def set_link_topics(peer: str, topics: list[str] | None) -> bool:
        """The topics the link to ``peer`` may carry either way (None: every topic);
        others are not sent over it, nor taken from it. False if it carries those
        already. LinkNotFound; InvalidPattern."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def remove_link(peer: str) -> int:
        """Remove the link to ``peer``: how many messages it still owed the peer
        (forgotten). LinkNotFound."""
        raise Declaration

    @operation(reads_only=True)
    def link_info() -> list[LinkInfo]:
        """Every link: its state, what it owes and has taken, the nodes it reaches."""
        raise Declaration

    @operation(reads_only=True)
    def locate_queue(name: str) -> str | None:
        """The node that holds queue ``name``: this one, a linked node (the nearest, if
        several announce it), or None if no node is known to."""
        raise Declaration

    # -- flows (seed 002) ---------------------------------------------------------------

    @operation(reads_only=True)
    def flows(queue: str | None = None) -> list[FlowInfo]:
        """The flows bound to ``queue`` (or to every queue), best-ranked first."""
        raise Declaration

    @operation(node_args={"admin": True}, admin=True, caller=("by",))
    def unbind(queue: str, flow: int) -> int:
        """An administrator unbinds a flow: its consumer is told it is inactive and what
        it held goes to the next active one; how many messages that released.
        FlowNotFound."""
        raise Declaration

    # -- the log, settings and inspection --------------------------------------------------

    @operation(reads_only=True)
    def log(
        pattern: str | None = None,
        from_seq: int = 0,
        limit: int = 20,
        newest: bool = False,
        to_seq: int | None = None,
        until: float | None = None,
    ) -> list[Message]:
        """Messages still in the retained log from ``from_seq`` (to ``to_seq``, published
        before ``until``, seconds since the epoch, when given), oldest first: the first
        ``limit`` of them, or with ``newest`` the last ``limit``."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def configure(name: str, value: str) -> str:
        """Save a node setting and apply it now; its value in canonical form.
        InvalidConfig."""
        raise Declaration

    @operation(reads_only=True)
    def saved_settings() -> dict[str, str]:
        """Every setting and its value, saved or default, in canonical form."""
        raise Declaration

    @operation(reads_only=True)
    def query(sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One plain read-only SELECT on the store: column names and rows (exotic
        values as text over the wire). InvalidInput for anything else."""
        raise Declaration

    # -- replay (eomsg.spark reads the log through these) -----------------------------------

    @operation(reads_only=True)
    def log_bounds(sel: Selection) -> tuple[int, int] | None:
        """The first and last committed seq that ``sel`` selects, or None."""
        raise Declaration

    @operation(reads_only=True)
    def log_horizon() -> tuple[int, int | None]:
        """The first seq the log still holds, and the latest publish time (µs) of what
        garbage collection dropped (None if nothing)."""
        raise Declaration

    @operation(sized_by="max_bytes", reads_only=True)
    def read_log(
        sel: Selection, lo: int, hi: int, max_bytes: int | None = None
    ) -> tuple[ArrowTable, int]:
        """Committed messages of ``sel`` in ``[lo, hi)`` as an Arrow table of at most
        about ``max_bytes`` (one row at least; None, or over the wire anything larger:
        as much as one answer carries), and the seq to read on from."""
        raise Declaration

    @operation(reads_only=True)
    def replay_jobs(job_id: str | None = None) -> list[JobRecord]:
        """The replay jobs recorded against this log (or the one named), newest first."""
        raise Declaration

    @operation(caller=("by",))
    def record_replay(record: JobRecord, event: JobEvent) -> JobRecord:
        """Durably move a replay job by ``event``; its new record. IllegalMove."""
        raise Declaration

    # -- transactions (seed 000; the coordinator is eomsg.client.transaction) ---------------

    @operation(caller=("owner", "holder", "by"))
    def prepare_txn(
        txid: str,
        *,
        coordinator: str,
        messages: Sequence[Outgoing] = (),
        deletes: Sequence[TxnDelete] = (),
    ) -> None:
        """Vote yes: make the transaction's publishes and the deletes of deliveries made
        to the caller durable without applying them. StaleDelivery (a vote no). The
        transaction is in doubt if the caller goes away before its outcome."""
        raise Declaration

    @operation(caller=("by",))
    def commit_txn(txid: str) -> list[PublishResult]:
        """Apply a prepared transaction; its publish results ([] if committed already).
        TxnConflict if it was aborted, TxnNotFound."""
        raise Declaration

    @operation(caller=("by",))
    def abort_txn(txid: str, *, force: bool = False) -> bool:
        """Drop a prepared transaction; True if this call aborted it. TxnConflict if it
        committed."""
        raise Declaration

    @operation(caller=("holder",))
    def transact(
        messages: Sequence[Outgoing] = (), deletes: Sequence[TxnDelete] = ()
    ) -> list[PublishResult]:
        """Publish and delete deliveries made to the caller in one atomic step (a
        one-phase commit). StaleDelivery, and nothing changed."""
        raise Declaration

    @operation(reads_only=True, caller=("by",))
    def txns() -> list[TxnInfo]:
        """The prepared transactions, oldest first: those the caller prepared, or all if
        it may inspect the node."""
        raise Declaration

    # -- principals, grants and the audit log (eomsg.core.access) --------------------------

    @operation(admin=True, caller=("by",))
    def add_principal(name: str) -> str:
        """Add principal ``name`` with a new token, returned this once (the node keeps
        only its digest). PrincipalExists; InvalidConfig."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def remove_principal(name: str) -> int:
        """Remove principal ``name`` and its grants; how many grants it held.
        PrincipalNotFound."""
        raise Declaration

    @operation(reads_only=True)
    def principals() -> list[PrincipalInfo]:
        """Every principal, by name, with how many grants it holds (never a token)."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def grant(principal: str, right: str, kind: str, name: str = "") -> bool:
        """Give ``principal`` ``right`` (publish, consume, inspect, admin) on a ``kind``
        (queue, topic, node) ``name``; False if it holds it already. From the first
        grant on, principals may do only what they are granted. PrincipalNotFound;
        InvalidConfig."""
        raise Declaration

    @operation(admin=True, caller=("by",))
    def revoke(principal: str, right: str, kind: str, name: str = "") -> bool:
        """Take back a grant; False if it was not given."""
        raise Declaration

    @operation(reads_only=True)
    def grants(principal: str | None = None) -> list[Grant]:
        """The grants in force (of ``principal``, if given), sorted."""
        raise Declaration

    @operation(reads_only=True)
    def audit(limit: int = 50, before: float | None = None) -> list[AuditEntry]:
        """Up to ``limit`` audit records — who created, deleted, purged, unbound,
        granted… — newest first; ``before`` (seconds since the epoch) pages back."""
        raise Declaration


OPERATIONS: dict[str, Operation[Any, Any]] = {
    op.name: op for op in vars(Operations).values() if isinstance(op, Operation)
}
"""Every operation by name: what a Call frame may name."""
