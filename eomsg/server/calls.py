"""The node operations a client runs with a Call frame: queue admin, inspection and
settings. Each takes the Call's arguments (plain data, checked here) and returns plain
data; the client turns it back into the same values the embedded node returns."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Callable
from typing import Any

from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.core.replay import JobEvent, JobRecord, Selection
from eomsg.errors import InvalidInput, ProtocolError
from eomsg.node.node import Node
from eomsg.wire.arrowipc import to_ipc
from eomsg.wire.events import message_to_wire, outgoing_from_wire

MAX_LOG_CHUNK = 64 << 20  # bytes of log one read_log answer carries at most

Args = dict[str, Any]


def _arg(args: Args, name: str, kind: type, *, optional: bool = False) -> Any:
    value = args.get(name)
    if value is None and optional:
        return None
    if kind is float and type(value) is int:
        return float(value)
    if type(value) is not kind:
        raise InvalidInput(f"argument {name!r} must be {kind.__name__}")
    return value


def _cell(value: Any) -> Any:
    """A query result cell as plain data: times as ISO text, other exotic values as text."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID | dt.timedelta):
        return str(value)
    if isinstance(value, list | tuple):
        return [_cell(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _cell(v) for k, v in value.items()}
    return str(value)


def _create_queue(node: Node, args: Args) -> Any:
    config = _arg(args, "config", dict)
    try:
        parsed = QueueConfig.from_json(config)
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidInput(f"malformed queue config: {e}") from e
    return node.create_queue(parsed)


def _query(node: Node, args: Args) -> Any:
    columns, rows = node.query(_arg(args, "sql", str))
    return {"columns": columns, "rows": [[_cell(v) for v in row] for row in rows]}


def _selection(args: Args) -> Selection:
    return Selection.from_json(_arg(args, "selection", dict))


def _read_log(node: Node, args: Args) -> Any:
    table, next_seq = node.read_log(
        _selection(args),
        _arg(args, "lo", int),
        _arg(args, "hi", int),
        min(_arg(args, "max_bytes", int), MAX_LOG_CHUNK),
    )
    return {"arrow": to_ipc(table), "next": next_seq}


def _record_replay(node: Node, args: Args) -> Any:
    try:
        event = JobEvent(_arg(args, "event", str))
    except ValueError as e:
        raise InvalidInput(f"unknown replay job event: {e}") from e
    return node.record_replay(JobRecord.from_json(_arg(args, "record", dict)), event).to_json()


def txn_messages(args: Args) -> list[Outgoing]:
    """A transaction's messages: ``[[topic, payload, id, ttl, headers], …]``."""
    try:
        return [outgoing_from_wire(m) for m in _arg(args, "messages", list)]
    except ProtocolError as e:
        raise InvalidInput(f"malformed transaction message: {e}") from e


def txn_deletes(args: Args) -> list[tuple[str, int, int, int]]:
    """A transaction's deletes: ``[[queue, seq, epoch, attempt], …]``."""
    out = []
    for item in _arg(args, "deletes", list):
        if (
            type(item) is not list
            or len(item) != 4
            or type(item[0]) is not str
            or any(type(x) is not int for x in item[1:])
        ):
            raise InvalidInput("a transaction delete is [queue, seq, epoch, attempt]")
        out.append((item[0], item[1], item[2], item[3]))
    return out


def _results(results: list[Any]) -> list[list[Any]]:
    return [[r.seq, r.id, r.duplicate, r.queues] for r in results]


OWNED_CALLS: dict[str, Callable[[Node, Args, str, int], Any]] = {
    "txn_prepare": lambda n, a, owner, holder: n.prepare_txn(
        _arg(a, "txid", str),
        coordinator=_arg(a, "coordinator", str),
        messages=txn_messages(a),
        deletes=txn_deletes(a),
        owner=owner,
        holder=holder,
    ),
    "txn_transact": lambda n, a, owner, holder: _results(
        n.transact(txn_messages(a), txn_deletes(a), holder=holder)
    ),
}
"""Calls that settle the session's deliveries (``holder``: only the session they were
made to may) and hold messages for it: the session takes them out of its prefetch
windows, and a prepared transaction is in doubt once its session is gone."""

CALLS: dict[str, Callable[[Node, Args], Any]] = {
    "create_queue": _create_queue,
    "delete_queue": lambda n, a: n.delete_queue(
        _arg(a, "name", str), force=bool(_arg(a, "force", bool, optional=True))
    ),
    "subscribe": lambda n, a: n.subscribe(_arg(a, "name", str), _arg(a, "pattern", str)),
    "unsubscribe": lambda n, a: n.unsubscribe(_arg(a, "name", str), _arg(a, "pattern", str)),
    "purge": lambda n, a: n.purge(_arg(a, "name", str)),
    "queue_config": lambda n, a: n.queue_config(_arg(a, "name", str)).to_json(),
    "queue_names": lambda n, a: n.queue_names(),
    "stats": lambda n, a: [s.to_json() for s in n.stats()],
    "log": lambda n, a: [
        message_to_wire(m)
        for m in n.log(
            _arg(a, "pattern", str, optional=True),
            _arg(a, "from_seq", int),
            _arg(a, "limit", int),
        )
    ],
    "configure": lambda n, a: n.configure(_arg(a, "name", str), _arg(a, "value", str)),
    "saved_settings": lambda n, a: n.saved_settings(),
    "query": _query,
    "flows": lambda n, a: [f.to_json() for f in n.flows(_arg(a, "queue", str, optional=True))],
    "unbind": lambda n, a: n.unbind(_arg(a, "queue", str), _arg(a, "flow", int), admin=True),
    "txn_commit": lambda n, a: _results(n.commit_txn(_arg(a, "txid", str))),
    "txn_abort": lambda n, a: n.abort_txn(
        _arg(a, "txid", str), force=bool(_arg(a, "force", bool, optional=True))
    ),
    "txns": lambda n, a: [t.to_json() for t in n.txns()],
    "log_bounds": lambda n, a: n.log_bounds(_selection(a)),
    "log_horizon": lambda n, a: list(n.log_horizon()),
    "read_log": _read_log,
    "replay_jobs": lambda n, a: [
        j.to_json() for j in n.replay_jobs(_arg(a, "job_id", str, optional=True))
    ],
    "record_replay": _record_replay,
}
