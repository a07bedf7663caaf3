"""The history checker (tests/history.py) catches each kind of violation, and passes a
history that has none."""

from __future__ import annotations

from tests.history import check

PUBLISHED = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2"]}
ACKED = {"a1", "a2", "a3", "b1"}  # b2's outcome is unknown


def test_a_clean_history_passes() -> None:
    report = check(
        PUBLISHED, ACKED, {"x": ["a1", "b1", "a2", "a3"], "y": ["b1", "b2", "a1", "a2", "a3"]}
    )
    assert report.ok and str(report) == "ok"


def test_each_violation_is_caught() -> None:
    report = check(
        PUBLISHED,
        ACKED,
        {
            "lost": ["a1", "a3", "b1"],  # a2 acknowledged, never received
            "twice": ["a1", "a2", "a3", "b1", "b2", "b2"],  # unknown, yet twice
            "order": ["a2", "a1", "a3", "b1"],
            "stray": ["a1", "a2", "a3", "b1", "zz"],
        },
    )
    assert report.lost == {"lost": ["a2"]}
    assert report.duplicated == {"twice": ["b2"]}
    assert report.reordered == {"order": [("a2", "a1")]}
    assert report.unexpected == {"stray": ["zz"]}
    assert report.counts() == {"lost": 1, "duplicated": 1, "reordered": 1, "unexpected": 1}
    assert not report.ok
