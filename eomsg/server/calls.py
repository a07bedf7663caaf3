"""The node runs a client's Call frame: the operation it names, as declared in
:mod:`eomsg.core.operations`, on the node method of the same name.

Arguments are decoded and checked against the declaration (InvalidInput, nothing run),
and the result is encoded for the Result frame by :mod:`eomsg.wire.calls`. Nothing here
is written per operation except what only the server knows: who the caller is (for the
operations that settle the caller's own deliveries) and how much one answer may carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eomsg.core.operations import OPERATIONS, Operation
from eomsg.errors import InvalidConfig
from eomsg.node.node import Node
from eomsg.wire.calls import decode_args, encode_result

MAX_ANSWER = 64 << 20  # bytes one answer sized by its caller carries at most


@dataclass(frozen=True, slots=True)
class Caller:
    """The session a call comes from: its transactions' ``owner``, the ``holder`` its
    deliveries were made to, the principal it authenticated as (``by``), and the bytes
    one answer may carry (its frame limit less the frame's own overhead)."""

    owner: str
    holder: int
    by: str
    answer_budget: int


def operation(name: str) -> Operation[Any, Any]:
    """The operation a Call names; InvalidConfig, listing the known ones, if none."""
    op = OPERATIONS.get(name)
    if op is None:
        raise InvalidConfig(f"unknown operation {name!r}; known: {', '.join(OPERATIONS)}")
    return op


def decode(op: Operation[Any, Any], args: Mapping[str, Any], caller: Caller) -> dict[str, Any]:
    """The node method's arguments for one call: checked, defaults filled in, plus what
    the declaration fixes and who the caller is; an answer's size capped."""
    out = decode_args(op, args) | dict(op.node_args)
    out |= {name: getattr(caller, name) for name in op.caller}
    if op.sized_by is not None:
        budget = min(caller.answer_budget, MAX_ANSWER)
        asked = out[op.sized_by]
        out[op.sized_by] = budget if asked is None else min(asked, budget)
    return out


def run(node: Node, op: Operation[Any, Any], args: Mapping[str, Any]) -> Any:
    """Run ``op`` on ``node`` with decoded ``args``; the result as a Result frame
    carries it. Blocking: the session runs it on the server's thread pool."""
    return encode_result(op, node.operation(op.name)(**args))
