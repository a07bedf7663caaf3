"""Frozen values made a column at a time: for the paths that make one per message.

A frozen dataclass costs about a microsecond a field to make — its ``__init__`` sets
each through ``object.__setattr__`` — and a consumer's take, the log's read and a
Deliver frame's decoding each make two per message. :class:`Columns` makes many at once
from columns of their fields, with no Python call per value: each field's slot is set
for all of them by one ``map`` of its descriptor. The values are the same as the
class's own ``__init__`` makes (equal, of the same class, as frozen): so only a class
whose ``__init__`` does nothing but set its fields is accepted.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from itertools import repeat
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Columns(Generic[T]):
    """A maker of values of the frozen, slotted dataclass ``cls`` from columns of its
    fields, in the order the class declares them (TypeError for any other class)."""

    __slots__ = ("_cls", "_setters")

    def __init__(self, cls: type[T]) -> None:
        params = getattr(cls, "__dataclass_params__", None)
        names = tuple(f.name for f in dataclasses.fields(cls)) if params is not None else ()  # type: ignore[arg-type]
        if (
            params is None
            or not params.frozen
            or hasattr(cls, "__post_init__")
            or names != getattr(cls, "__slots__", None)
        ):
            raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass of fields only")
        self._cls = cls
        self._setters = [getattr(cls, name).__set__ for name in names]

    def make(self, n: int, *columns: Iterable[Any]) -> list[T]:
        """``n`` values, ``[cls(*fields) for fields in zip(*columns)]`` without a call
        per value: one column per field (a field with a default too), each giving at
        least ``n`` (``itertools.repeat(x)``: ``x`` for every value). The columns are
        not checked: the caller has checked them, a column at a time."""
        made: list[T] = list(map(object.__new__, repeat(self._cls, n)))
        if len(columns) != len(self._setters):
            raise TypeError(f"{self._cls.__name__} has {len(self._setters)} fields")
        for set_field, column in zip(self._setters, columns, strict=True):
            deque(map(set_field, made, column), maxlen=0)
        return made
