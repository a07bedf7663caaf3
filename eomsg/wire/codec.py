"""A frame body's shape, for both protocols on the wire (a client's with its node, and
linked nodes'): the :class:`Event` every frame holds, and the checks each event's
``from_wire`` runs on a decoded field — each returns the value, of the type and within
the bound it must have, or raises :class:`RemoteProtocolError`. Used by
:mod:`eomsg.wire.events` and :mod:`eomsg.wire.link_events` alone (hence the leading
underscores)."""

from __future__ import annotations

import abc
import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import repeat
from typing import Any, ClassVar, Generic, TypeVar

from eomsg.core.limits import MAX_FRAME, MIN_FRAME
from eomsg.errors import RemoteProtocolError

MAX_BATCH = 100_000  # items in one publish, deliver or delete frame
MAX_NAME = 1024  # characters in a name, topic, id, op or error code
MAX_ARGS_DEPTH = 8  # nesting of a Call's arguments or a Result's value
ITEM_OVERHEAD = 96  # bytes of one message's fields in a frame besides its text and payload
FRAME_SLACK = 8 << 10  # room in a frame for its own fields, besides the items it carries


# -- field checks: each returns the value or raises RemoteProtocolError ----------------


def _bad(what: str, value: object) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed frame: {what} must not be {type(value).__name__}")


def _int(value: object, what: str) -> int:
    if type(value) is not int:
        raise _bad(what, value)
    return value


def _opt_int(value: object, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _bool(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise _bad(what, value)
    return value


def _num(value: object, what: str) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _bad(what, value)


def _opt_num(value: object, what: str) -> float | None:
    return None if value is None else _num(value, what)


def _str(value: object, what: str, limit: int = MAX_NAME) -> str:
    if type(value) is not str:
        raise _bad(what, value)
    if len(value) > limit:
        raise RemoteProtocolError(f"malformed frame: {what} is longer than {limit} characters")
    return value


def _opt_str(value: object, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise _bad(what, value)
    return value


def _list(value: object, what: str, limit: int = MAX_BATCH) -> list[Any]:
    if type(value) is not list:
        raise _bad(what, value)
    if len(value) > limit:
        raise RemoteProtocolError(f"malformed frame: more than {limit} items in {what}")
    return value


def _frame_limit(value: object) -> int:
    """A frame limit a peer says: at least :data:`MIN_FRAME` (an error must fit), and
    never taken for more than :data:`MAX_FRAME`."""
    limit = _int(value, "max frame")
    if limit < MIN_FRAME:
        raise RemoteProtocolError(
            f"malformed frame: a frame limit of {limit} bytes is below the {MIN_FRAME} "
            "every end must accept"
        )
    return min(limit, MAX_FRAME)


def _headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise _bad("headers", value)
    for k, v in value.items():
        _str(k, "a header name")
        _str(v, "a header value", 1 << 20)
    return value


def _plain(value: object, depth: int = 0) -> Any:
    """A JSON-like value (None, bool, int, float, str, bytes, list, str-keyed map)."""
    if depth > MAX_ARGS_DEPTH:
        raise RemoteProtocolError(f"malformed frame: values nest deeper than {MAX_ARGS_DEPTH}")
    kind = type(value)
    if value is None or kind in (bool, int, float, str, bytes):
        return value
    if kind is list:
        return [_plain(v, depth + 1) for v in value]  # type: ignore[attr-defined]
    if kind is dict:
        return {_str(k, "a key"): _plain(v, depth + 1) for k, v in value.items()}  # type: ignore[attr-defined]
    raise _bad("a value", value)


def _fields(body: list[Any], n: int, name: str) -> list[Any]:
    if len(body) != n + 1:
        raise RemoteProtocolError(f"malformed frame: {name} has {len(body) - 1} fields, not {n}")
    return body


# -- values made a column at a time ----------------------------------------------------

T = TypeVar("T")


class _Columns(Generic[T]):
    """Values of the frozen, slotted dataclass ``cls`` made from columns of their fields
    (in the order the dataclass declares them): ``make(n, *columns)`` is
    ``[cls(*fields) for fields in zip(*columns)]`` — equal values of the same class —
    without a call of ``cls.__init__`` per value: each field's slot is set for all of
    them by one ``map``. For the frames that carry many messages, whose fields were
    checked a column at a time; refused (TypeError) for a class whose ``__init__`` does
    more than set its fields."""

    __slots__ = ("_cls", "_setters")

    def __init__(self, cls: type[T]) -> None:
        params = getattr(cls, "__dataclass_params__", None)
        names = [f.name for f in dataclasses.fields(cls)] if params is not None else []  # type: ignore[arg-type]
        if (
            params is None
            or not params.frozen
            or hasattr(cls, "__post_init__")
            or tuple(names) != getattr(cls, "__slots__", None)
        ):
            raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass of fields only")
        self._cls = cls
        self._setters = [getattr(cls, name).__set__ for name in names]

    def make(self, n: int, *columns: Iterable[Any]) -> list[T]:
        """``n`` values; each column gives at least ``n`` (``repeat(x)``: x for all)."""
        made: list[T] = list(map(object.__new__, repeat(self._cls, n)))
        for set_field, column in zip(self._setters, columns, strict=True):
            deque(map(set_field, made, column), maxlen=0)
        return made


# -- events -------------------------------------------------------------------------------


class Event(abc.ABC):
    """Base class of every protocol event."""

    __slots__ = ()
    TYPE: ClassVar[int]

    @abc.abstractmethod
    def to_wire(self) -> list[Any]:
        """The frame body: ``[TYPE, field, …]``."""

    @classmethod
    @abc.abstractmethod
    def from_wire(cls, body: list[Any]) -> Event:
        """The event a frame body of this TYPE holds, every field checked."""


def _headers_bound(headers: Mapping[str, str]) -> int:
    """At most the bytes ``headers`` take in a frame (text at 4 bytes a character)."""
    return sum(4 * (len(k) + len(v)) + 10 for k, v in headers.items())
