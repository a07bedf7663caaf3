"""A Call frame's arguments and its Result's value, for every declared operation.

Codecs are derived from the types in :mod:`eomsg.core.operations`, so a new operation
needs no code here unless it brings a new kind of value. Decoding is strict: every value
is checked against its declared type, and anything else raises ``error`` — InvalidInput
when the node decodes a client's arguments, RemoteProtocolError when a client decodes
the node's answer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eomsg.core.message import Message, Outgoing, PublishResult
from eomsg.core.operations import ARROW, Operation
from eomsg.errors import EomsgError, InvalidInput, ProtocolError
from eomsg.wire.arrowipc import from_ipc, to_ipc
from eomsg.wire.events import (
    message_from_wire,
    message_to_wire,
    outgoing_from_wire,
    outgoing_to_wire,
)


class _Bad(Exception):
    """A value does not have its declared type (turned into the caller's error)."""


@dataclasses.dataclass(frozen=True)
class Codec:
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _check(kind: type | tuple[type, ...], what: str) -> Callable[[Any], Any]:
    def decode(value: Any) -> Any:
        if type(value) not in (kind if isinstance(kind, tuple) else (kind,)):
            raise _Bad(f"{what} expected, not {type(value).__name__}")
        return value

    return decode


def _plain(value: Any) -> Any:
    """A value of unknown type (a query's cell) as plain data: times as ISO text, other
    exotic values as text."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID | dt.timedelta):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _float(value: Any) -> float:
    if type(value) is int:
        return float(value)
    return float(_check(float, "a number")(value))


def _from_json(cls: Any) -> Callable[[Any], Any]:
    def decode(value: Any) -> Any:
        if type(value) is not dict:
            raise _Bad(f"{cls.__name__} expected, not {type(value).__name__}")
        try:
            return cls.from_json(value)
        except (KeyError, TypeError, ValueError, EomsgError) as e:
            raise _Bad(f"malformed {cls.__name__}: {e}") from e

    return decode


def _wire_of(to_wire: Callable[[Any], Any], from_wire: Callable[[Any], Any], what: str) -> Codec:
    def decode(value: Any) -> Any:
        try:
            return from_wire(value)
        except ProtocolError as e:
            raise _Bad(f"malformed {what}: {e}") from e

    return Codec(to_wire, decode)


def _publish_result(value: Any) -> PublishResult:
    if type(value) is not list or len(value) != 4:
        raise _Bad("a publish result is [seq, id, duplicate, queues]")
    seq, id, duplicate, queues = value
    return PublishResult(
        _check(int, "seq")(seq),
        None if id is None else _check(str, "id")(id),
        _check(bool, "duplicate")(duplicate),
        None if queues is None else _check(int, "queues")(queues),
    )


_IDENTITY = lambda value: value  # noqa: E731

_LEAVES: dict[Any, Codec] = {
    bool: Codec(_IDENTITY, _check(bool, "true or false")),
    int: Codec(_IDENTITY, _check(int, "an integer")),
    str: Codec(_IDENTITY, _check(str, "text")),
    bytes: Codec(_IDENTITY, _check(bytes, "bytes")),
    float: Codec(_IDENTITY, _float),
    type(None): Codec(_IDENTITY, _check(type(None), "nothing")),
    Any: Codec(_plain, _IDENTITY),
    Message: _wire_of(message_to_wire, message_from_wire, "message"),
    Outgoing: _wire_of(outgoing_to_wire, outgoing_from_wire, "message"),
    PublishResult: Codec(lambda r: [r.seq, r.id, r.duplicate, r.queues], _publish_result),
}


@functools.cache
def codec(tp: Any) -> Codec:
    """The codec of values of type ``tp`` (a declared argument or result type)."""
    if tp in _LEAVES:
        return _LEAVES[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated and args[1:] == (ARROW,):
        return Codec(to_ipc, lambda v: from_ipc(_check(bytes, "Arrow IPC bytes")(v)))
    if origin in (types.UnionType, typing.Union):
        if len(args) == 2 and type(None) in args:
            inner = codec(next(a for a in args if a is not type(None)))
            return Codec(
                lambda v: None if v is None else inner.encode(v),
                lambda v: None if v is None else inner.decode(v),
            )
    elif origin in (list, Sequence):
        item = codec(args[0])
        return Codec(
            lambda v: [item.encode(x) for x in v],
            lambda v: [item.decode(x) for x in _check(list, "a list")(v)],
        )
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = codec(args[0])
        return Codec(
            lambda v: [item.encode(x) for x in v],
            lambda v: tuple(item.decode(x) for x in _check(list, "a list")(v)),
        )
    elif origin is tuple:
        items = [codec(a) for a in args]

        def decode_tuple(v: Any) -> tuple[Any, ...]:
            if type(v) is not list or len(v) != len(items):
                raise _Bad(f"a list of {len(items)} expected")
            return tuple(c.decode(x) for c, x in zip(items, v, strict=True))

        return Codec(lambda v: [c.encode(x) for c, x in zip(items, v, strict=True)], decode_tuple)
    elif origin in (dict, Mapping) and args[0] is str:
        value = codec(args[1])

        def decode_map(v: Any) -> dict[str, Any]:
            if type(v) is not dict or any(type(k) is not str for k in v):
                raise _Bad("a map with text keys expected")
            return {k: value.decode(x) for k, x in v.items()}

        return Codec(lambda v: {k: value.encode(x) for k, x in v.items()}, decode_map)
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):

        def decode_enum(v: Any) -> Any:
            try:
                return tp(v)
            except ValueError as e:
                raise _Bad(f"unknown {tp.__name__}: {v!r}") from e

        return Codec(lambda v: v.value, decode_enum)
    elif isinstance(tp, type) and hasattr(tp, "from_json"):
        return Codec(lambda v: v.to_json(), _from_json(tp))
    raise TypeError(f"no wire codec for {tp!r}")  # an operation declared a new kind


@functools.cache
def _hints(op: Operation[Any, Any]) -> dict[str, Any]:
    return typing.get_type_hints(op.signature, include_extras=True)


def encode_args(op: Operation[Any, Any], args: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments (all of them, by name) as a Call frame carries them."""
    hints = _hints(op)
    return {name: codec(hints[name]).encode(value) for name, value in args.items()}


def decode_args(
    op: Operation[Any, Any],
    args: Mapping[str, Any],
    error: Callable[[str], EomsgError] = InvalidInput,
) -> dict[str, Any]:
    """A Call frame's arguments, checked against the declaration; missing ones take
    their declared default, unknown ones are refused."""
    hints = _hints(op)
    out: dict[str, Any] = {}
    unknown = set(args) - set(op.parameters)
    if unknown:
        raise error(f"{op.name}: unknown argument {sorted(unknown)[0]!r}")
    for name, param in op.parameters.items():
        if name not in args or (args[name] is None and param.default is None):
            if param.default is param.empty:
                raise error(f"{op.name}: argument {name!r} is missing")
            out[name] = param.default
            continue
        try:
            out[name] = codec(hints[name]).decode(args[name])
        except _Bad as e:
            raise error(f"{op.name}: argument {name!r}: {e}") from e
    return out


def encode_result(op: Operation[Any, Any], value: Any) -> Any:
    """An operation's result as a Result frame carries it."""
    return codec(_hints(op)["return"]).encode(value)


def listed_result(op: Operation[Any, Any]) -> bool:
    """Whether ``op`` answers with a list: an answer too large for one Result frame may
    then take several, each a run of its items (see :class:`~eomsg.wire.events.Result`)."""
    return typing.get_origin(_hints(op)["return"]) in (list, Sequence)


def decode_result(op: Operation[Any, Any], value: Any, error: Callable[[str], EomsgError]) -> Any:
    """A Result frame's value as the declared result type."""
    try:
        return codec(_hints(op)["return"]).decode(value)
    except _Bad as e:
        raise error(f"{op.name}: malformed result: {e}") from e
