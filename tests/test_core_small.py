import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eomsg.core.dedup import DedupWindow
from eomsg.core.durations import format_duration, parse_duration
from eomsg.core.limits import Limits, check_outgoing
from eomsg.core.message import ORIGIN, ORIGIN_SEQ, Carried, Outgoing, headers_json
from eomsg.core.queues import QueueConfig
from eomsg.errors import (
    InvalidConfig,
    InvalidDuration,
    InvalidHeader,
    InvalidInput,
    InvalidQueueName,
    PayloadTooLarge,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30),
        ("1.5", 1.5),
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("1h30m", 5400),
        ("7d", 604800),
        ("2w", 1209600),
        (" 1H ", 3600),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "1x", "h", "-5s", "0", "nan", "1h 30m", "1000000w"])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(InvalidDuration):
        parse_duration(bad)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.25, 42, 192, 18240, 183600)] == [
        "250ms",
        "42s",
        "3m12s",
        "5h04m",
        "2d03h",
    ]


def test_dedup_window_follows_message_lifetime() -> None:
    w = DedupWindow()
    w.remember("a", 1, expires_at=100.0)
    w.remember("b", 2, expires_at=None)
    assert w.lookup("a", 99.0) == 1
    assert w.lookup("a", 100.0) is None  # expired messages can publish anew
    assert w.expire(100.0) == 1
    w.remember("a", 7, expires_at=200.0)  # republished after expiry
    assert w.expire(150.0) == 0
    assert w.lookup("a", 150.0) == 7
    assert w.forget_below(2) == 0 and w.lookup("b", 1e12) == 2
    assert w.forget_below(3) == 1 and w.lookup("b", 0) is None
    assert len(w) == 1


def test_queue_config_rules() -> None:
    q = QueueConfig.create("orders", ["orders/>"], dead_letter="orders-dlq")
    assert q.max_redeliveries == 5
    assert QueueConfig.from_json(q.to_json()) == q
    with pytest.raises(InvalidConfig, match="needs --dead-letter"):
        QueueConfig.create("orders", max_redeliveries=3)
    with pytest.raises(InvalidConfig, match="own dead-letter"):
        QueueConfig.create("orders", dead_letter="orders")
    with pytest.raises(InvalidQueueName):
        QueueConfig.create("bad name")
    with pytest.raises(InvalidConfig, match="twice"):
        QueueConfig.create("q", ["a", "a"])


def test_outgoing_checks() -> None:
    limits = Limits(max_payload=10)
    check_outgoing(Outgoing("a/b", b"0123456789", "id", 5.0, {"k": "v"}), limits)
    with pytest.raises(PayloadTooLarge):
        check_outgoing(Outgoing("a/b", b"x" * 11), limits)
    with pytest.raises(InvalidHeader):
        check_outgoing(Outgoing("a/b", b"", headers={"bad name": "v"}), limits)
    with pytest.raises(InvalidDuration):
        check_outgoing(Outgoing("a/b", b"", ttl=-1), limits)
    with pytest.raises(InvalidInput):
        check_outgoing(Outgoing("a/b", b"", id=""), limits)
    with pytest.raises(InvalidInput):
        check_outgoing(Outgoing("a/b", "text"), limits)  # type: ignore[arg-type]


def test_rates_are_the_change_since_the_oldest_note_within_a_minute() -> None:
    from eomsg.core.rates import WINDOW, Rates

    r = Rates()
    assert r.rates(0.0, {"a": (0, 0)}) == {}  # nothing noted yet
    r.note(0.0, {"a": (0, 0)})
    r.note(0.5, {"a": (50, 0)})  # within a second of the last note: not kept
    assert r.rates(0.5, {"a": (50, 0)}) == {}  # no note a second old yet
    # b, lacking from the note of 0.0, was made since: all it took counts, over 10 s
    assert r.rates(10.0, {"a": (100, 40), "b": (5, 5)}) == {"a": (10.0, 4.0), "b": (0.5, 0.5)}
    for t in range(1, 200):
        r.note(float(t), {"a": (t * 3, t)})
    assert r.rates(200.0, {"a": (600, 200)}) == {"a": (3.0, 1.0)}
    assert r.rates(200.0 + WINDOW + 5, {"a": (600, 200)}) == {}  # every note too old now
    later = Rates()  # a queue made after the first note: from the last note without it
    later.note(0.0, {"a": (0, 0)})
    later.note(2.0, {"a": (0, 0), "b": (2003, 2003)})  # made and filled within a tick
    assert later.rates(4.0, {"a": (8, 0), "b": (2003, 2003)}) == {
        "a": (2.0, 0.0),
        "b": (2003 / 4, 2003 / 4),  # not 0.0: what passed before its first note counts
    }
    assert later.rates(1.5, {"b": (10, 0)}) == {"b": (10 / 1.5, 0.0)}
    assert later.rates(0.5, {"b": (10, 0)}) == {}  # no note a second old yet
    again = Rates()  # deleted and made again under its name: from the note that lacks it
    again.note(0.0, {"q": (500, 500)})
    again.note(2.0, {})
    again.note(3.0, {"q": (0, 0)})
    assert again.rates(6.0, {"q": (12, 0)}) == {"q": (3.0, 0.0)}


@given(st.dictionaries(st.text(), st.text(), min_size=1))
def test_headers_are_stored_as_json_dumps_makes_them(headers: dict[str, str]) -> None:
    assert headers_json(headers) == json.dumps(headers)


@given(st.dictionaries(st.text(), st.text()), st.text(), st.text())
def test_a_carried_message_is_stored_with_where_it_came_from_as_json_dumps_makes_it(
    headers: dict[str, str], origin: str, origin_seq: str
) -> None:
    m = Carried(1, "t", b"", None, None, headers, ("b",), origin, origin_seq)
    shown = m.all_headers()
    assert shown == {**headers, ORIGIN: origin, ORIGIN_SEQ: origin_seq}
    assert m.log_headers == json.dumps(shown)
    assert m.headers == headers  # the publisher's own, unchanged
