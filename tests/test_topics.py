import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eomsg.core.topics import Matcher, pattern_regex, validate_pattern, validate_topic
from eomsg.errors import InvalidPattern, InvalidTopic


def reference_match(pattern: str, topic: str) -> bool:
    """The specification, level by level, with no cleverness."""
    p, t = pattern.split("/"), topic.split("/")
    for i, level in enumerate(p):
        if level == ">":
            return len(t) > i
        if i >= len(t) or (level != "*" and level != t[i]):
            return False
    return len(p) == len(t)


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("orders/>", "orders/eu/new", True),
        ("orders/>", "orders/eu", True),
        ("orders/>", "orders", False),
        ("orders/*", "orders/eu", True),
        ("orders/*", "orders/eu/new", False),
        ("orders/*/new", "orders/us/new", True),
        ("*/>", "a/b", True),
        (">", "a", True),
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
    ],
)
def test_match_examples(pattern: str, topic: str, expected: bool) -> None:
    m: Matcher[str] = Matcher()
    m.add(pattern, "q")
    assert (m.match(topic) == {"q"}) is expected
    assert bool(re.fullmatch(pattern_regex(pattern), topic)) is expected


@pytest.mark.parametrize("bad", ["", "a//b", "/a", "a/", "a b", "a/*", "a/>", "ord*ers", "x\x00"])
def test_invalid_topics(bad: str) -> None:
    with pytest.raises(InvalidTopic):
        validate_topic(bad)


@pytest.mark.parametrize("bad", ["", "a//b", ">/a", "a/b*", "a/>>", "a/ b", "/>"])
def test_invalid_patterns(bad: str) -> None:
    with pytest.raises(InvalidPattern):
        validate_pattern(bad)


def test_length_limits() -> None:
    with pytest.raises(InvalidTopic, match="longer than 255"):
        validate_topic("a" * 256)
    with pytest.raises(InvalidTopic, match="more than 32 levels"):
        validate_topic("/".join(["a"] * 33))


LEVELS = st.sampled_from(["a", "b", "c"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
PATTERNS = st.builds(
    lambda levels, tail: "/".join(levels + ([">"] if tail else [])),
    st.lists(st.sampled_from(["a", "b", "*"]), min_size=0, max_size=3),
    st.booleans(),
).filter(bool)


@given(
    subs=st.lists(st.tuples(PATTERNS, st.integers(0, 5)), max_size=25),
    removed=st.lists(st.tuples(PATTERNS, st.integers(0, 5)), max_size=10),
    topics=st.lists(TOPICS, min_size=1, max_size=10),
)
def test_matcher_agrees_with_reference(
    subs: list[tuple[str, int]], removed: list[tuple[str, int]], topics: list[str]
) -> None:
    m: Matcher[int] = Matcher()
    live = set()
    for pattern, key in subs:
        m.add(pattern, key)
        live.add((pattern, key))
    for topic in topics:  # populate the cache before removals
        m.match(topic)
    for pattern, key in removed:
        m.remove(pattern, key)
        live.discard((pattern, key))
    assert len(m) == len(live)
    for topic in topics:
        expected = {k for p, k in live if reference_match(p, topic)}
        assert m.match(topic) == expected
        for p, _ in live:
            assert bool(re.fullmatch(pattern_regex(p), topic)) == reference_match(p, topic)


def test_matcher_prunes_after_removal() -> None:
    m: Matcher[str] = Matcher()
    for i in range(100):
        m.add(f"a/{i}/>", "q")
    for i in range(100):
        m.remove(f"a/{i}/>", "q")
    assert m._root.empty()


def test_many_subscriptions_match_by_walking_levels() -> None:
    m: Matcher[int] = Matcher()
    for i in range(5000):
        m.add(f"tenant{i}/orders/>", i)
    m.add("*/orders/eu/*", -1)
    assert m.match("tenant42/orders/eu/new") == {42, -1}
    assert m.match("tenant9999/orders/x") == frozenset()
