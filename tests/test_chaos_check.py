"""The history checker (eomsg.chaos.check) passes a history with no violation, catches
each kind of violation fed to it alone, and calls nothing a violation that concurrency
allows; histories survive the file they are kept in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.chaos.check import VIOLATIONS, check
from eomsg.chaos.history import (
    Activity,
    Applied,
    Event,
    Outcome,
    Published,
    QueueDeclared,
    Received,
    Recorder,
    Resolved,
    Settled,
    Transacted,
    read,
)
from eomsg.errors import InvalidInput

OK, FAILED, UNKNOWN = Outcome.OK, Outcome.FAILED, Outcome.UNKNOWN


def clean() -> list[Event]:
    """Two producers on node a, one on b; an ordered queue q whose flow moved from
    consumer c1 (epoch 1) to c2 (epoch 2); a shared queue s; one transaction."""
    return [
        QueueDeclared("q", True, True),
        QueueDeclared("s", False, False),
        Published("m1", "a", ("q", "s"), OK, 1.0, 2.0),
        Published("m2", "a", ("q", "s"), OK, 2.5, 3.0),
        Published("m3", "a", ("q",), UNKNOWN, 3.5, 9.0),  # lost reply: may be applied once
        Published("m4", "a", ("q",), FAILED, 3.6, 3.7),  # refused: never applied
        Published("m5", "a", ("q",), UNKNOWN, 4.0, 5.0),
        Published("m5", "a", ("q",), OK, 5.5, 6.0),  # its retry, acknowledged
        Published("n1", "b", ("q",), OK, 0.5, 8.0),  # another node: no order with a's
        Activity("c1", "q", 1, True, 1.5),
        Received("c1", "q", "m1", 1, 1, 1, 2.1),
        Settled("c1", "q", 1, 1, 1, OK, 2.2, 2.3),
        Received("c1", "q", "m2", 2, 1, 1, 3.1),
        Activity("c1", "q", 1, False, 3.2),  # c1 paused past its keep-alive
        Activity("c2", "q", 2, True, 3.4),
        Settled("c1", "q", 2, 1, 1, FAILED, 3.5, 3.6),  # refused: its epoch is over
        Received("c2", "q", "m2", 2, 2, 2, 3.5),
        Settled("c2", "q", 2, 2, 2, OK, 3.6, 3.7),
        Received("c2", "q", "m5", 5, 1, 2, 6.5),
        Settled("c2", "q", 5, 1, 2, OK, 6.6, 6.7),
        Received("c2", "q", "n1", 6, 1, 2, 8.5),
        Settled("c2", "q", 6, 1, 2, OK, 8.6, 8.7),
        Applied("app1", "q", "m1"),
        Applied("app2", "q", "m2"),
        Applied("app2", "q", "m5"),
        Applied("app2", "q", "n1"),
        Applied("app3", "s", "m2"),  # a shared queue: any order
        Applied("app3", "s", "m1"),
        Transacted("c2", "t1", OK, 9.0, 9.1),
        Transacted("c2", "t2", UNKNOWN, 9.2, 9.3),
        Transacted("c2", "t3", FAILED, 9.4, 9.5),
        Resolved("t1", "committed"),
        Resolved("t2", "aborted"),
        Resolved("t3", "aborted"),
    ]


def test_a_clean_history_passes() -> None:
    report = check(clean())
    assert report.ok, str(report)
    assert str(report) == "ok"
    assert report.to_json()["violations"] == dict.fromkeys(VIOLATIONS, 0)
    assert report.checked["publishes"] == 7 and report.checked["applied"] == 6


VIOLATING: dict[str, list[Event]] = {
    "lost": [Published("m6", "a", ("q",), OK, 10.0, 10.5)],
    "duplicated": [Applied("app1", "q", "m2")],  # also applied by app2
    "unexpected": [Applied("app3", "s", "m5")],  # m5 was for q only
    "queue_order": [
        Received("c2", "q", "m9", 7, 1, 2, 9.0),
        Received("c2", "q", "m8", 6, 1, 2, 9.1),  # the two others are redeliveries
    ],
    "origin_order": [
        Published("m7", "a", ("q",), OK, 9.0, 9.1),
        Published("m8", "a", ("q",), OK, 9.2, 9.3),  # sent after m7 was acknowledged
        Applied("app2", "q", "m8"),
        Applied("app2", "q", "m7"),
    ],
    "stale_attempt": [
        Received("c2", "q", "m5", 5, 2, 2, 6.62),
        Settled("c2", "q", 5, 1, 2, OK, 6.65, 6.68),  # m5's attempt 2 was out already
    ],
    "stale_epoch": [Settled("c1", "q", 7, 1, 1, OK, 3.5, 3.55)],  # after epoch 2 active
    "overlapping_flows": [
        # a flow of epoch 3 settled before epoch 2 did, never announced to anyone
        Settled("c3", "q", 3, 1, 3, OK, 6.0, 6.61),
    ],
    "in_doubt": [Transacted("c1", "t4", UNKNOWN, 9.6, 9.7), Resolved("t4", "prepared")],
    "txn_outcome": [Transacted("c1", "t5", OK, 9.6, 9.7), Resolved("t5", "aborted")],
}


@pytest.mark.parametrize("kind", VIOLATIONS)
def test_each_kind_of_violation_is_caught_alone(kind: str) -> None:
    report = check(clean() + VIOLATING[kind])
    assert report.counts() == {k: int(k == kind) for k in VIOLATIONS}, str(report)
    assert not report.ok
    assert kind.replace("_", " ") in str(report)


def test_an_unknown_outcome_may_be_applied_once_but_not_twice() -> None:
    once = [*clean(), Applied("app2", "q", "m3")]
    assert check(once).ok
    twice = [*once, Applied("app1", "q", "m3")]
    assert check(twice).counts()["duplicated"] == 1


def test_concurrent_publishes_may_be_applied_in_either_order() -> None:
    """Two publishes whose calls overlapped in time were never ordered."""
    events = [
        QueueDeclared("q", True, True),
        Published("x", "a", ("q",), OK, 1.0, 3.0),
        Published("y", "a", ("q",), OK, 2.0, 4.0),
        Applied("app", "q", "y"),
        Applied("app", "q", "x"),
    ]
    assert check(events).ok


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_histories_of_a_correct_queue_pass_and_a_dropped_or_repeated_apply_is_caught(
    data: st.DataObject,
) -> None:
    """A model of a correct node: publishes get increasing sequence numbers in the order
    they are acknowledged, and one consumer applies them in that order, each once."""
    n = data.draw(st.integers(1, 30))
    events: list[Event] = [QueueDeclared("q", True, True)]
    t = 0.0
    landed = []
    for i in range(n):
        t += data.draw(st.floats(0.01, 1.0))
        outcome = data.draw(st.sampled_from([OK, OK, FAILED, UNKNOWN]))
        events.append(Published(f"m{i}", "a", ("q",), outcome, t, t + 0.005))
        if outcome is OK or (outcome is UNKNOWN and data.draw(st.booleans())):
            landed.append(f"m{i}")
    events += [Applied("app", "q", i) for i in landed]
    assert check(events).ok
    acked = [e for e in events if isinstance(e, Published) and e.outcome is OK]
    if acked:
        victim = data.draw(st.sampled_from(acked)).id
        dropped = [e for e in events if not (isinstance(e, Applied) and e.id == victim)]
        assert check(dropped).counts()["lost"] == 1
        assert check([*events, Applied("app", "q", victim)]).counts()["duplicated"] == 1


def test_a_history_survives_its_file_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with Recorder(path) as record:
        record(*clean())
    assert (path.stat().st_mode & 0o777) == 0o600
    assert read(path) == clean()
    with path.open("a") as f:
        f.write('{"kind":"apply","app":"app1","que')  # the writer was killed mid-line
    assert read(path) == clean()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"kind":"nope"}', "unknown history event kind 'nope'"),
        ('{"kind":"apply","app":"x","queue":"q"}', "history event 'apply' lacks 'id'"),
        (
            '{"kind":"txn","consumer":"c","txid":"t","outcome":"maybe","invoked":1,"completed":2}',
            "outcome 'maybe' is not ok, failed or unknown",
        ),
        ("[1, 2]", "a history line must be a JSON object"),
        ("{", "not a JSON line"),
    ],
)
def test_a_bad_history_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(line + "\n" + json.dumps(clean()[0].to_json()) + "\n")
    with pytest.raises(InvalidInput, match=f"history.jsonl:1: .*{message}"):
        read(path)


def test_a_writer_killed_mid_line_leaves_no_torn_line_inside_the_history(
    tmp_path: Path,
) -> None:
    """A restarted writer appends after the last whole line, not after the torn one."""
    path = tmp_path / "history.jsonl"
    first, second = clean()[:2]
    with Recorder(path) as record:
        record(first)
    with path.open("a") as f:
        f.write('{"kind":"queue","que')  # killed mid-line
    with Recorder(path) as record:
        record(second)
    assert read(path) == [first, second]
