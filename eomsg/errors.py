"""The one error hierarchy of eomsg.

Every error a user can meet is an :class:`EomsgError` with a stable ``code`` (for
scripts and the wire protocol), an :class:`ExitCode` (for the CLI) and a one-line message
that says what went wrong and what to do about it. Raising one of these never leaves
state half-changed: validation happens before anything is written.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of the ``eomsg`` command; scripts may rely on them."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    INVALID_INPUT = 3
    NOT_FOUND = 4
    CONFLICT = 5
    DATA_DIR = 6
    STORAGE = 7
    HANDLER_FAILED = 8
    UNAVAILABLE = 9
    AUTH = 10
    UNBOUND = 11
    IN_DOUBT = 12
    DAMAGED = 13
    FULL = 14
    INTERRUPTED = 130


class EomsgError(Exception):
    """Base class for every error eomsg raises on purpose."""

    code = "error"
    exit_code = ExitCode.FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(EomsgError):
    """The command or call cannot work this way (for example it needs a running node)."""

    code = "usage"
    exit_code = ExitCode.USAGE


# -- bad input --------------------------------------------------------------------------


class InvalidInput(EomsgError):
    """A value given by the caller is malformed; nothing was changed."""

    code = "invalid_input"
    exit_code = ExitCode.INVALID_INPUT


class InvalidTopic(InvalidInput):
    """A topic name is empty, has an empty level, a wildcard or a bad character."""

    code = "invalid_topic"


class InvalidPattern(InvalidInput):
    """A subscription pattern is malformed (for example ``>`` not in last place)."""

    code = "invalid_pattern"


class InvalidQueueName(InvalidInput):
    """A queue name uses characters or a length eomsg does not accept."""

    code = "invalid_queue_name"


class InvalidDuration(InvalidInput):
    """A duration such as ``30s`` or ``1h`` could not be parsed or is out of range."""

    code = "invalid_duration"


class InvalidHeader(InvalidInput):
    """A message header is not a ``name=value`` pair of text."""

    code = "invalid_header"


class PayloadTooLarge(InvalidInput):
    """A payload exceeds the node's maximum payload size."""

    code = "payload_too_large"


class Unprintable(InvalidInput):
    """A message cannot be written whole in the chosen output format; it was given back."""

    code = "unprintable"


class InvalidConfig(InvalidInput):
    """A queue or node setting is out of range or contradicts another setting."""

    code = "invalid_config"


# -- state of the node -----------------------------------------------------------------


class QueueNotFound(EomsgError):
    """The named queue does not exist."""

    code = "queue_not_found"
    exit_code = ExitCode.NOT_FOUND


class ContextNotFound(EomsgError):
    """No context of that name is in the user's contexts file (``eomsg context``)."""

    code = "context_not_found"
    exit_code = ExitCode.NOT_FOUND


class LinkNotFound(EomsgError):
    """No link to the named node exists."""

    code = "link_not_found"
    exit_code = ExitCode.NOT_FOUND


class QueueExists(EomsgError):
    """A queue with that name already exists with a different configuration."""

    code = "queue_exists"
    exit_code = ExitCode.CONFLICT


class QueueNotEmpty(EomsgError):
    """A queue still holds messages and the operation would drop them."""

    code = "queue_not_empty"
    exit_code = ExitCode.CONFLICT


class NotInFlight(EomsgError):
    """A delete or release names a message this queue has not delivered."""

    code = "not_in_flight"
    exit_code = ExitCode.CONFLICT


class StaleDelivery(EomsgError):
    """A settlement names a delivery that is over (timed out and delivered again, taken
    back, or held by another consumer): its message must not be applied."""

    code = "stale_delivery"
    exit_code = ExitCode.CONFLICT


class StaleEpoch(StaleDelivery):
    """A delete or release comes from an epoch that is over: the consumer was deposed and
    its messages belong to the active flow now, so it must not apply them."""

    code = "stale_epoch"


# -- flows: consumers bound to a queue (seed 002) ------------------------------------------


class FlowNotFound(EomsgError):
    """No flow with that id is bound to the queue (it was unbound, or never existed)."""

    code = "flow_not_found"
    exit_code = ExitCode.NOT_FOUND


class NotActive(EomsgError):
    """The queue limits its active consumers, and the caller is not one of them."""

    code = "not_active"
    exit_code = ExitCode.CONFLICT


class IllegalMove(EomsgError):
    """The election tried a move its transition table forbids: a bug in eomsg, not input."""

    code = "illegal_move"


class Unbound(EomsgError):
    """An administrator unbound this consumer's flow from its queue."""

    code = "unbound"
    exit_code = ExitCode.UNBOUND


# -- transactions (seed 000) ---------------------------------------------------------------


class TxnNotFound(EomsgError):
    """The node knows no transaction with that id (never prepared, or long forgotten)."""

    code = "txn_not_found"
    exit_code = ExitCode.NOT_FOUND


class TxnConflict(EomsgError):
    """The transaction cannot do that in its state (say, commit what was aborted)."""

    code = "txn_conflict"
    exit_code = ExitCode.CONFLICT


class HeldByTransaction(EomsgError):
    """The message is held by a prepared transaction: only its outcome settles it."""

    code = "held_by_txn"
    exit_code = ExitCode.CONFLICT


class TxnAborted(EomsgError):
    """The transaction was rolled back: nothing it did took effect."""

    code = "txn_aborted"
    exit_code = ExitCode.CONFLICT


class HeuristicOutcome(EomsgError):
    """A participant decided on its own (a person forced it), against the coordinator."""

    code = "heuristic_outcome"
    exit_code = ExitCode.IN_DOUBT


class InDoubt(EomsgError):
    """Transactions are prepared and their outcome cannot be read: a person must decide."""

    code = "in_doubt"
    exit_code = ExitCode.IN_DOUBT


# -- the data directory and storage ----------------------------------------------------


class DataDirError(EomsgError):
    """The data directory cannot be used: missing rights, not a directory, or in use."""

    code = "data_dir"
    exit_code = ExitCode.DATA_DIR


class DataDirLocked(DataDirError):
    """Another process holds the data directory."""

    code = "data_dir_locked"


class DataDirDamaged(DataDirError):
    """The data directory lost acknowledged writes or cannot be read: `eomsg salvage`."""

    code = "data_dir_damaged"
    exit_code = ExitCode.DAMAGED


class SchemaTooNew(DataDirError):
    """The data directory was written by a newer eomsg than this one."""

    code = "schema_too_new"


class StorageError(EomsgError):
    """The database refused a write or a read; the node stops accepting work."""

    code = "storage"
    exit_code = ExitCode.STORAGE


class WriteFailed(StorageError):
    """A write failed and nothing of it was stored: it may be retried as it was."""

    code = "write_failed"


class WriteUnknown(StorageError):
    """The node cannot tell whether a write was stored: retry it idempotently."""

    code = "write_unknown"


class DiskFull(StorageError):
    """The node's disk has less free space than its reserve: publishes wait for room."""

    code = "disk_full"


class MemoryFull(StorageError):
    """The node's queues hold all the memory their share of its limit allows: publishes
    wait until consumers take them back under it (a producer retries)."""

    code = "memory_full"


class QueueFull(EomsgError):
    """A queue holds as many messages as its ``max-messages`` allows and its overflow
    policy refuses more: nothing of the publish was stored (retry it, with its ids, once
    consumers made room)."""

    code = "queue_full"
    exit_code = ExitCode.FULL


class InvalidQuery(InvalidInput):
    """A query given to ``inspect sql`` is malformed, or tried to change data or files."""

    code = "invalid_query"


class NodeClosed(EomsgError):
    """The node was closed (or failed) and accepts no more requests."""

    code = "node_closed"
    exit_code = ExitCode.STORAGE


class HandlerFailed(EomsgError):
    """A consumer's handler command failed; its message was released for redelivery."""

    code = "handler_failed"
    exit_code = ExitCode.HANDLER_FAILED


# -- talking to a node -------------------------------------------------------------------


class ProtocolError(EomsgError):
    """The wire protocol was broken; that connection cannot be trusted again."""

    code = "protocol"
    exit_code = ExitCode.FAILURE


class RemoteProtocolError(ProtocolError):
    """The peer broke the wire protocol (a bad frame, a move out of turn); the connection
    is closed."""


class LocalProtocolError(ProtocolError):
    """This side tried to do what the protocol does not allow now: a bug here, not the
    peer's; nothing was sent."""

    code = "protocol_local"


class FrameTooLarge(ProtocolError):
    """A frame exceeds its receiver's limit: refused from its length prefix before its
    body was read, or, sending, before anything was sent."""

    code = "frame_too_large"


class AuthenticationFailed(EomsgError):
    """The node refused the client's token (or the client sent none where one is needed)."""

    code = "authentication_failed"
    exit_code = ExitCode.AUTH


class NotAllowed(EomsgError):
    """The client's rights do not reach this operation on this node."""

    code = "not_allowed"
    exit_code = ExitCode.AUTH


class PrincipalNotFound(EomsgError):
    """The node knows no principal of that name (see `eomsg user list`)."""

    code = "principal_not_found"
    exit_code = ExitCode.NOT_FOUND


class PrincipalExists(EomsgError):
    """A principal of that name exists already: remove it first to give it a new token."""

    code = "principal_exists"
    exit_code = ExitCode.CONFLICT


class Unavailable(EomsgError):
    """No node answers at the address, or the connection to it was lost.

    A publish or delete that was in flight when the connection dropped may or may not
    have committed: retry it — a publish with an ``id`` is deduplicated, a delete is
    idempotent."""

    code = "unavailable"
    exit_code = ExitCode.UNAVAILABLE


class Overloaded(EomsgError):
    """The node refused a connection or request because a limit was reached; retry later."""

    code = "overloaded"
    exit_code = ExitCode.UNAVAILABLE


# -- replay through Spark -----------------------------------------------------------------


class SparkUnavailable(EomsgError):
    """Spark cannot run here: PySpark is not installed or no Java 17+ is found."""

    code = "spark_unavailable"
    exit_code = ExitCode.UNAVAILABLE


class TransformError(InvalidInput):
    """A replay's transform cannot be loaded, or its output lacks what a sink needs."""

    code = "transform_error"


class ReplayFailed(EomsgError):
    """The Spark job of a replay failed; its sink holds nothing of this attempt."""

    code = "replay_failed"
    exit_code = ExitCode.FAILURE


class LogCollected(EomsgError):
    """A replay's range reaches below what log garbage collection kept: those messages
    are gone, and its output is left as it was."""

    code = "log_collected"
    exit_code = ExitCode.NOT_FOUND


class Interrupted(EomsgError):
    """Ctrl-C or SIGTERM stopped the command; what it had done is as it says."""

    code = "interrupted"
    exit_code = ExitCode.INTERRUPTED


class SinkConflict(EomsgError):
    """A replay's sink already holds output that is not this job's; nothing was written."""

    code = "sink_conflict"
    exit_code = ExitCode.CONFLICT


def _subclasses(cls: type[EomsgError]) -> list[type[EomsgError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def from_code(code: str, message: str) -> EomsgError:
    """The error a node reported in an error frame, as the class its ``code`` names (the
    base class for a code this version does not know)."""
    for cls in _subclasses(EomsgError):
        if cls.code == code:
            return cls(message)
    return EomsgError(message)


def one_line(e: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none): what a
    one-line report of a foreign error (a database's, say) shows."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
