"""Values made a column at a time (eomsg.core.columns) are the values the class makes,
and the log's rows read that way are the messages read one by one."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eomsg.core.columns import Columns
from eomsg.core.message import Delivered, Message, Outgoing
from eomsg.store.messages import message, messages_of

texts = st.text(max_size=8)
rows = st.tuples(
    st.integers(0, 2**62),
    texts,
    st.none() | texts,
    st.integers(0, 2**50),
    st.none() | st.integers(0, 2**50),
    st.none()
    | st.dictionaries(texts, texts, max_size=2).map(
        lambda d: __import__("json").dumps(d) if d else None
    ),
    st.binary(max_size=16),
)


@given(st.lists(rows, max_size=20))
def test_the_log_rows_made_a_column_at_a_time_are_the_messages_made_one_by_one(
    log_rows: list[tuple[object, ...]],
) -> None:
    made = messages_of(log_rows)
    assert made == [message(r) for r in log_rows]
    assert all(type(m) is Message for m in made)


def test_values_made_by_columns_are_equal_frozen_and_of_their_class() -> None:
    m = Message(1, "t", b"x")
    made = Columns(Delivered).make(3, repeat("q"), [m, m, m], [1, 2, 3], [0.5] * 3, repeat(7))
    assert made == [Delivered("q", m, a, 0.5, 7) for a in (1, 2, 3)]
    assert made[0].key == (1, 1)
    with pytest.raises(AttributeError):
        made[0].attempt = 9  # type: ignore[misc]


def test_only_a_frozen_slotted_dataclass_of_fields_is_taken() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            assert self.n >= 0

    @dataclass(slots=True)
    class Mutable:
        n: int

    for cls in (Checked, Mutable, int):
        with pytest.raises(TypeError):
            Columns(cls)
    Columns(Outgoing)  # frozen, slotted, fields only
    with pytest.raises(TypeError):
        Columns(Message).make(1, [1])  # a column per field
