"""The operations declared once in eomsg.core.operations: the node implements each, the
clients' methods are the declarations, and every argument and result survives the Call
frame exactly; bad arguments are typed errors naming the operation."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from eomsg.client.aio import AsyncClient
from eomsg.client.sync import Client
from eomsg.core.access import OWNER, AuditEntry, PrincipalInfo, make_grant
from eomsg.core.election import FlowInfo
from eomsg.core.links import LinkInfo
from eomsg.core.memory import MemoryUse
from eomsg.core.message import Message, Outgoing, PublishResult
from eomsg.core.nodeinfo import NodeInfo
from eomsg.core.operations import OPERATIONS, Operation, Operations
from eomsg.core.queues import QueueConfig, QueueStats
from eomsg.core.replay import JobEvent, JobRecord, JobStatus, Selection
from eomsg.core.txn import TxnInfo, TxnState
from eomsg.embedded import LocalClient
from eomsg.errors import InvalidConfig, InvalidInput, RemoteProtocolError
from eomsg.node.node import Node, NodeSettings
from eomsg.server import calls
from eomsg.wire.calls import decode_args, decode_result, encode_args, encode_result

SEL = Selection(("orders/>",), 5, 900, None, 1_700_000_000_000_000)
JOB = JobRecord("j1", JobStatus.DONE, {"sink": "parquet:x"}, 1, 101, 100, "ab12", 1.5)
MSG = Message(7, "t/x", b"\x00\xff", "id-7", 2.5, None, {"h": "v"})
OUT = Outgoing("t/y", b"p", "id-8", 3.0, {"k": "v"})
RESULTS = [PublishResult(9, "id-8", False, 2), PublishResult(3, None, True, None)]
CONFIG = QueueConfig("q", ("t/>", "u/*"), 5, "q-dlq", 30.0, 1, False, 1000, "dead-letter-oldest")

# For every operation: the arguments of one call, by name, and one result.
SAMPLES: dict[str, tuple[dict[str, Any], Any]] = {
    "create_queue": ({"config": CONFIG}, True),
    "delete_queue": ({"name": "q", "force": True}, 12),
    "subscribe": ({"name": "q", "pattern": "a/>"}, False),
    "unsubscribe": ({"name": "q", "pattern": "a/>"}, True),
    "limit_queue": (
        {"name": "q", "max_messages": 1000, "overflow": "dead-letter-oldest", "max_bytes": 2**30},
        CONFIG,
    ),
    "purge": ({"name": "q"}, 0),
    "requeue": ({"name": "q-dlq", "to": None, "max_messages": 10}, (3, "q")),
    "browse": ({"name": "q", "from_seq": 2, "limit": 5}, [MSG]),
    "queue_config": ({"name": "q"}, CONFIG),
    "queue_names": ({}, ["a", "q"]),
    "stats": (
        {},
        [QueueStats("q", ("t/>",), 3, 1, 5, 0, 1, 0, 2.5, "q-dlq", 5, 1, 2, 1, 768, 12.5, None)],
    ),
    "memory": (
        {},
        MemoryUse(1 << 30, 3 << 27, 1 << 20, 1 << 28, 4096, 10, 2000, 8192, 512, 0, 64, 1 << 16),
    ),
    "node_info": (
        {},
        NodeInfo(
            *("a", "0.1.0", 4242, 1.7e9, 12.5, "/srv/eomsg", ("unix:///srv/eomsg/eomsg.sock",)),
            *(7, 5, 3, 2, 1, 0, 10 << 30, 256 << 20),
        ),
    ),
    "add_link": (
        {"peer": "b", "address": "tls://10.0.0.2:7501", "token": "s3cret", "peer_ca": "PEM"},
        True,
    ),
    "remove_link": ({"peer": "b"}, 3),
    "locate_queue": ({"name": "billing"}, "b"),
    "set_link_egress": ({"peer": "b", "egress": "memory", "hold": 0.5}, True),
    "set_link_topics": ({"peer": "b", "topics": ["orders/>"]}, False),
    "link_info": (
        {},
        [
            LinkInfo(
                "b",
                None,
                False,
                3,
                2,
                1.5,
                1,
                40,
                12,
                99,
                ("b", "c"),
                12.5,
                None,
                "refused",
                2,
                1,
                "memory",
                7,
            )
        ],
    ),
    "flows": ({"queue": None}, [FlowInfo("q", 4, "c:1", -2, True, 77, 1.5, 3)]),
    "unbind": ({"queue": "q", "flow": 4}, 3),
    "log": (
        {"pattern": "t/>", "from_seq": 2, "limit": 5, "newest": True, "to_seq": 9, "until": 1.7e9},
        [MSG],
    ),
    "configure": ({"name": "retention", "value": "1d"}, "86400"),
    "saved_settings": ({}, {"retention": "86400"}),
    "query": ({"sql": "SELECT 1"}, (["a", "b"], [(1, "x"), (None, b"\x01")])),
    "log_bounds": ({"sel": SEL}, (5, 299)),
    "log_horizon": ({}, (1, None)),
    "read_log": (
        {"sel": SEL, "lo": 1, "hi": 9, "max_bytes": None},
        (pa.table({"seq": [1, 2]}), 9),
    ),
    "replay_jobs": ({"job_id": None}, [JOB]),
    "record_replay": ({"record": JOB, "event": JobEvent.FINISH}, JOB),
    "prepare_txn": (
        {"txid": "t1", "coordinator": "duckdb:x", "messages": [OUT], "deletes": [("q", 3, 7, 2)]},
        None,
    ),
    "commit_txn": ({"txid": "t1"}, RESULTS),
    "abort_txn": ({"txid": "t1", "force": False}, True),
    "transact": ({"messages": [OUT], "deletes": [("q", 3, 7, 2)]}, RESULTS),
    "txns": ({}, [TxnInfo("t1", TxnState.PREPARED, "duckdb:x", 1.5, False, 1, 2)]),
    "add_principal": ({"name": "alice"}, "tok3n"),
    "remove_principal": ({"name": "alice"}, 2),
    "principals": ({}, [PrincipalInfo("alice", 1.5, 2)]),
    "grant": ({"principal": "alice", "right": "publish", "kind": "topic", "name": "a/>"}, True),
    "revoke": ({"principal": "alice", "right": "admin", "kind": "node", "name": ""}, False),
    "grants": ({"principal": None}, [make_grant("alice", "consume", "queue", "q")]),
    "audit": ({"limit": 5, "before": None}, [AuditEntry(1.5, "owner", "purge", "q", "3")]),
}


def over_the_wire(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


def test_every_operation_has_samples() -> None:
    assert set(SAMPLES) == set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_arguments_and_results_survive_the_call_frame(name: str) -> None:
    op = OPERATIONS[name]
    args, result = SAMPLES[name]
    assert op.bind(**args) == args  # the samples name every argument
    assert decode_args(op, over_the_wire(encode_args(op, args))) == args
    back = decode_result(op, over_the_wire(encode_result(op, result)), RemoteProtocolError)
    if name == "read_log":
        assert back[0].equals(result[0]) and back[1] == result[1]
    else:
        assert back == result


def test_the_components_named_are_the_components_built(tmp_path: Path) -> None:
    """``Node.COMPONENTS`` (where an operation is looked for) and what a node builds are
    one list; each operation is found on one component (or the node) only."""
    with Node.open(tmp_path / "d", NodeSettings(tick=None)) as node:
        for attribute, component in Node.COMPONENTS.items():
            assert type(getattr(node, attribute)) is component, attribute
    for name in OPERATIONS:
        homes = [a for a, c in Node.COMPONENTS.items() if callable(getattr(c, name, None))]
        assert len(homes) + callable(getattr(Node, name, None)) == 1, (name, homes)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_node_implements_every_operation(name: str) -> None:
    """The node's method of the same name takes the declared arguments, those the
    declaration fixes and the caller's identity."""
    op = OPERATIONS[name]
    _, method = Node.implementation(name)
    names = [*op.parameters, *op.node_args, *op.caller]
    inspect.signature(method).bind(None, **dict.fromkeys(names))
    for pname, param in op.parameters.items():
        assert inspect.signature(method).parameters[pname].default == param.default, pname


class Recorder(Operations):
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run_operation(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any:
        self.calls.append((op.name, args))
        return 3


class AsyncRecorder(Recorder):
    async def run_operation_async(self, op: Operation[Any, Any], args: dict[str, Any]) -> Any:
        self.calls.append((op.name, args))
        return 3


def test_a_client_method_is_its_declaration() -> None:
    r = Recorder()
    assert r.unbind("q", 4) == 3
    assert r.calls == [("unbind", {"queue": "q", "flow": 4})]
    with pytest.raises(TypeError):
        r.unbind("q")  # type: ignore[call-arg]
    assert inspect.signature(r.delete_queue) == inspect.signature(Operations.delete_queue.signature)
    a = AsyncRecorder()
    assert asyncio.run(a.delete_queue("q")) == 3  # a coroutine method on an asyncio client
    assert a.calls == [("delete_queue", {"name": "q", "force": False})]
    assert all(isinstance(vars(Operations)[n], Operation) for n in OPERATIONS)
    for cls in (Client, AsyncClient, LocalClient):
        assert Operations in cls.__mro__
        assert not set(OPERATIONS) & set(vars(cls)), "a client redefines an operation"


def test_bad_arguments_are_typed_errors_naming_the_operation() -> None:
    op = OPERATIONS["delete_queue"]
    with pytest.raises(InvalidInput, match="delete_queue: argument 'name' is missing"):
        decode_args(op, {})
    with pytest.raises(InvalidInput, match="delete_queue: unknown argument 'nmae'"):
        decode_args(op, {"nmae": "q"})
    with pytest.raises(InvalidInput, match="delete_queue: argument 'force': true or false"):
        decode_args(op, {"name": "q", "force": 1})
    with pytest.raises(InvalidInput, match="create_queue: argument 'config': malformed"):
        decode_args(OPERATIONS["create_queue"], {"config": {"name": 3}})
    with pytest.raises(InvalidInput, match="transact: argument 'deletes'"):
        decode_args(OPERATIONS["transact"], {"deletes": [["q", 1, 2]]})
    with pytest.raises(InvalidConfig, match="unknown operation 'nope'; known: create_queue"):
        calls.operation("nope")


def test_the_server_fills_in_the_caller_and_caps_answers() -> None:
    caller = calls.Caller("session-9", 9, "alice", 1000)
    prepare = calls.decode(
        calls.operation("prepare_txn"), {"txid": "t", "coordinator": "c"}, caller
    )
    assert (prepare["owner"], prepare["holder"], prepare["by"]) == ("session-9", 9, "alice")
    assert calls.decode(calls.operation("purge"), {"name": "q"}, caller)["by"] == "alice"
    assert calls.decode(calls.operation("unbind"), {"queue": "q", "flow": 1}, caller)["admin"]
    read = calls.operation("read_log")
    sel = SEL.to_json()
    assert calls.decode(read, {"sel": sel, "lo": 1, "hi": 2}, caller)["max_bytes"] == 1000
    assert (
        calls.decode(read, {"sel": sel, "lo": 1, "hi": 2, "max_bytes": 10}, caller)["max_bytes"]
        == 10
    )


class NodeRecorder:
    """Stands in for a node: records the keyword arguments each method gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def add_listener(self, callback: Any) -> None:
        pass

    def operation(self, name: str) -> Any:
        def method(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return 3

        return method


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_local_client_runs_each_operation_as_the_server_does(name: str) -> None:
    """On an embedded node an operation is the node's method with the same arguments the
    server would pass: the declared ones, those the declaration fixes, and the caller."""
    node = NodeRecorder()
    local = LocalClient(node, name="me")  # type: ignore[arg-type]
    args, _ = SAMPLES[name]
    assert getattr(local, name)(**args) == 3
    caller = calls.Caller("me", local.holder, OWNER, calls.MAX_ANSWER)
    op = OPERATIONS[name]
    served = calls.decode(op, over_the_wire(encode_args(op, args)), caller)
    (called,) = node.calls
    if name == "read_log":  # the server caps an answer at a frame; in-process, no cap
        served["max_bytes"] = args["max_bytes"]
    assert called == (name, served)
