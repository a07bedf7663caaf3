"""The replay rules (core.replay), reading the log as Arrow from a file or through a node,
and the job records — everything of spark-replay that needs no Spark."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eomsg.client.sync import connect
from eomsg.core.replay import (
    Action,
    JobEvent,
    JobRecord,
    JobStatus,
    Output,
    Selection,
    after_failure,
    check_output,
    default_job_id,
    digest,
    job_transition,
    parse_time,
    plan_action,
    replay_id,
    split,
    validate_job_id,
)
from eomsg.errors import DataDirLocked, IllegalMove, InvalidInput, InvalidPattern, SinkConflict
from eomsg.node.node import Node, NodeSettings
from eomsg.server import calls
from eomsg.store.logread import FileLog
from eomsg.store.schema import arrow_schema
from tests.conftest import FakeClock, NodeFactory


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 50))
def test_split_covers_the_range_exactly_once_in_order(lo: int, width: int, parts: int) -> None:
    ranges = split(lo, lo + width, parts)
    seqs = [s for r in ranges for s in range(r.lo, r.hi)]
    assert seqs == list(range(lo, lo + width))
    assert all(len(r) > 0 for r in ranges) and len(ranges) <= parts
    if ranges:
        widths = [len(r) for r in ranges]
        assert max(widths) - min(widths) <= 1


def test_replay_ids_are_deterministic_and_distinct() -> None:
    assert replay_id("j", 7) == replay_id("j", 7) == "replay:j:7"
    assert len({replay_id("j", 7), replay_id("j", 7, 1), replay_id("k", 7), replay_id("j", 8)}) == 4


def test_digest_ignores_the_order_parts_finish_in() -> None:
    parts = [(0, 10, "aa"), (1, 5, "bb"), (2, 0, "")]
    assert digest(parts) == digest(list(reversed(parts)))
    assert digest(parts) != digest([(0, 10, "aa"), (1, 5, "bc"), (2, 0, "")])


def test_default_job_id_names_the_request_not_the_log() -> None:
    a = default_job_id({"sink": "parquet:x", "topic": "a/>"})
    assert a == default_job_id({"topic": "a/>", "sink": "parquet:x"})
    assert a != default_job_id({"sink": "parquet:y", "topic": "a/>"})
    assert validate_job_id(a) == a


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a/b", "x" * 129, "ü"])
def test_job_ids_must_be_file_safe(bad: str) -> None:
    with pytest.raises(InvalidInput, match="job id"):
        validate_job_id(bad)


@pytest.mark.parametrize(
    ("status", "committed", "force", "action"),
    [
        (None, False, False, Action.RUN),
        (JobStatus.RUNNING, False, False, Action.RESUME),
        (JobStatus.FAILED, False, False, Action.RESUME),
        (JobStatus.RUNNING, True, False, Action.RECORD),
        (JobStatus.DONE, True, False, Action.SKIP),
        (JobStatus.DONE, False, False, Action.SKIP),
        (JobStatus.DONE, True, True, Action.RUN),
        (JobStatus.RUNNING, True, True, Action.RESUME),
    ],
)
def test_plan_action(
    status: JobStatus | None, committed: bool, force: bool, action: Action
) -> None:
    assert plan_action(status, sink_committed=committed, force=force) is action


WIDE = {"sink": "parquet:o", "topic": "a/>"}
NARROW = {"sink": "parquet:o", "topic": "a/b"}
DONE = JobRecord("j", JobStatus.DONE, WIDE, 1, 308, 307, "d")
ITS_OUTPUT = Output(307, "d", WIDE, 1, 308)


@pytest.mark.parametrize(
    ("previous", "attempt", "output", "force", "refused"),
    [
        (DONE, DONE, ITS_OUTPUT, False, None),  # a skip
        (DONE, DONE, Output(307, "d"), False, None),  # an older eomsg's, the same digest
        (DONE, DONE, None, False, "no longer holds that output"),
        (DONE, DONE, Output(7, "e", NARROW, 301, 308), False, "no longer holds that output"),
        (DONE, DONE, None, True, None),
        (None, DONE, ITS_OUTPUT, False, None),  # committed, then the record was lost
        (None, DONE, Output(7, "e", NARROW, 301, 308), False, "that another run made"),
        (None, DONE, Output(307, "d"), False, "that another run made"),
        (None, DONE, Output(7, "e", NARROW, 301, 308), True, None),
        # a forced run of NARROW killed before its commit: carried on, not refused
        (
            JobRecord("j", JobStatus.RUNNING, NARROW, 301, 308),
            JobRecord("j", JobStatus.RUNNING, NARROW, 301, 308),
            ITS_OUTPUT,
            False,
            None,
        ),
    ],
)
def test_a_record_and_a_sink_that_disagree_are_refused(
    previous: JobRecord | None,
    attempt: JobRecord,
    output: Output | None,
    force: bool,
    refused: str | None,
) -> None:
    def check() -> None:
        check_output("parquet:o", previous, attempt, output, ledger=True, force=force)

    if refused is None:
        check()
    else:
        with pytest.raises(SinkConflict, match=refused):
            check()


def test_a_topic_keeps_the_options_that_published_into_it() -> None:
    published = JobRecord("t", JobStatus.DONE, {"sink": "topic:x", "topic": "a/>"}, 1, 5, 4, "d")
    other = JobRecord("t", JobStatus.RUNNING, {"sink": "topic:x", "topic": "a/b"}, 1, 5)
    with pytest.raises(InvalidInput, match="cannot take back what it was given"):
        check_output("topic:x", published, other, None, ledger=False, force=True)
    check_output("topic:x", published, published, None, ledger=False, force=True)


def test_a_run_that_fails_puts_back_the_record_it_found() -> None:
    attempt = JobRecord("j", JobStatus.RUNNING, NARROW, 301, 308)
    died = JobRecord("j", JobStatus.RUNNING, WIDE, 1, 308)
    assert after_failure(None, attempt, output_touched=False) == (attempt, JobEvent.FAIL)
    assert after_failure(DONE, attempt, output_touched=False) == (DONE, JobEvent.REVERT)
    assert after_failure(died, attempt, output_touched=False) == (died, JobEvent.FAIL)
    assert after_failure(DONE, attempt, output_touched=True) == (attempt, JobEvent.FAIL)
    assert job_transition(JobStatus.RUNNING, JobEvent.REVERT, "j") is JobStatus.DONE


def test_illegal_job_moves_name_job_event_and_status() -> None:
    assert job_transition(None, JobEvent.START, "j") is JobStatus.RUNNING
    with pytest.raises(IllegalMove, match="replay job j: cannot finish in status new"):
        job_transition(None, JobEvent.FINISH, "j")
    with pytest.raises(IllegalMove, match="cannot fail in status done"):
        job_transition(JobStatus.DONE, JobEvent.FAIL, "j")


def test_selection_checks_its_input() -> None:
    with pytest.raises(InvalidInput, match="--to-seq"):
        Selection(from_seq=5, to_seq=4)
    with pytest.raises(InvalidInput, match="--until"):
        Selection(since_us=10, until_us=10)
    with pytest.raises(InvalidPattern):
        Selection(("a/>/b",))
    with pytest.raises(InvalidInput, match="malformed log selection"):
        Selection.from_json({"patterns": "a/>"})
    sel = Selection(("a/>", "b/*"), 3, 9, 1, 2)
    assert Selection.from_json(sel.to_json()) == sel


def test_parse_time() -> None:
    assert parse_time("2026-11-01", 0) == 1793491200.0
    assert parse_time("2026-11-01T01:00:00+01:00", 0) == 1793491200.0
    assert parse_time("2h", 10_000.0) == 10_000.0 - 7200
    with pytest.raises(InvalidInput, match="time 'soon' is not understood"):
        parse_time("soon", 0)


# -- reading the log ----------------------------------------------------------------------


def _fill(node: Node, clock: FakeClock) -> None:
    for i in range(1, 301):
        topic = "orders/eu/new" if i % 3 else "billing/x"
        node.ingress.publish(topic, f"m{i}".encode() * (1 + i % 7), id=f"id-{i}")
        clock.advance(1)


def _rows(batches: object) -> list[dict[str, object]]:
    return pa.Table.from_batches(list(batches), schema=arrow_schema("messages")).to_pylist()  # type: ignore[arg-type]


def test_file_log_reads_a_slice_in_order_and_refuses_a_held_directory(
    open_node: NodeFactory, clock: FakeClock, data_dir: object
) -> None:
    node = open_node()
    _fill(node, clock)
    start = clock.now - 300
    with pytest.raises(DataDirLocked, match=r"is in use by pid .*: read through its node"):
        FileLog(node.store.data_dir)  # at once: no wait asked for
    expected = [m for m in node.inspection.log("orders/>", 1, 1000) if 10 <= m.seq <= 200]
    node.close()
    sel = Selection(("orders/>",), 10, 200)
    with FileLog(node.store.data_dir) as log, FileLog(node.store.data_dir) as other:
        assert log.bounds(sel) == (10, 200) == other.bounds(sel)
        rows = _rows(log.batches(sel, 1, 1000))
        assert [r["seq"] for r in rows] == [m.seq for m in expected]
        assert [r["payload"] for r in rows] == [m.payload for m in expected]
        assert _rows(log.batches(sel, 50, 60)) == [r for r in rows if 50 <= r["seq"] < 60]  # type: ignore[operator]
        timed = Selection((), since_us=int((start + 100) * 1e6), until_us=int((start + 110) * 1e6))
        assert [r["seq"] for r in _rows(log.batches(timed, 1, 1000))] == list(range(101, 111))
        assert log.bounds(Selection(("nothing/>",))) is None
        with pytest.raises(DataDirLocked):
            Node.open(node.store.data_dir, NodeSettings(tick=None))


def test_reading_through_a_served_node_equals_reading_the_file(
    open_node: NodeFactory, clock: FakeClock, serve: object, data_dir: object
) -> None:
    node = open_node()
    _fill(node, clock)
    node.close()
    sel = Selection(("orders/>",), 5)
    with FileLog(node.store.data_dir) as log:
        from_file = _rows(log.batches(sel, 1, 301))
    proc = serve()  # type: ignore[operator]
    with connect(node.store.data_dir) as client:
        assert client.log_bounds(sel) == (5, 299)
        chunks, lo = [], 1
        while lo < 301:
            table, lo = client.read_log(sel, lo, 301, max_bytes=2000)  # many small answers
            assert table.num_rows >= 1 or lo == 301
            chunks.append(table)
        assert len(chunks) > 5
        assert pa.concat_tables(chunks).to_pylist() == from_file
    proc.kill()


def test_bad_read_log_calls_are_typed_errors(node: Node) -> None:
    op = calls.operation("read_log")
    caller = calls.Caller("session-1", 1, "owner", 1 << 20)

    def read_log(args: dict[str, Any]) -> Any:
        return calls.run(node, op, calls.decode(op, args, caller))

    with pytest.raises(InvalidInput, match="malformed log selection"):
        read_log({"sel": {"patterns": 3}, "lo": 1, "hi": 2, "max_bytes": 10})
    with pytest.raises(InvalidInput, match="read_log: argument 'lo': an integer expected"):
        read_log({"sel": {}, "lo": "1", "hi": 2, "max_bytes": 10})
    with pytest.raises(InvalidInput, match="max_bytes"):
        read_log({"sel": {}, "lo": 1, "hi": 2, "max_bytes": 0})


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("spec", {"sink": b"bytes"}, "only JSON values"),
        ("spec", {"n": float("nan")}, "only JSON values"),
        ("spec", ["a"], "is an object"),
        ("digest", 7, "a digest is text"),
    ],
)
def test_a_job_record_from_a_client_holds_only_what_the_store_keeps(
    field: str, value: object, says: str
) -> None:
    """What a client sends as a job record (over the wire, JSON-like but not JSON: bytes,
    NaN) is refused with a typed error, not stored half-way (found by fuzzing)."""
    good = JobRecord("j1", JobStatus.RUNNING, {"sink": "parquet:x"}, 1, 101).to_json()
    with pytest.raises(InvalidInput, match=f"malformed replay job record: .*{says}"):
        JobRecord.from_json({**good, field: value})


def test_job_records_follow_the_job_table(open_node: NodeFactory, clock: FakeClock) -> None:
    node = open_node()
    rec = JobRecord("j1", JobStatus.RUNNING, {"sink": "parquet:x"}, 1, 101)
    node.inspection.record_replay(rec, JobEvent.START)
    clock.advance(1)
    with pytest.raises(IllegalMove, match="replay job j2: cannot finish in status new"):
        node.inspection.record_replay(JobRecord("j2", JobStatus.DONE, {}, 1, 2), JobEvent.FINISH)
    done = JobRecord("j1", JobStatus.DONE, {"sink": "parquet:x"}, 1, 101, 100, "d")
    node.inspection.record_replay(done, JobEvent.FINISH)
    node.close()
    node = open_node()
    [found] = node.inspection.replay_jobs("j1")
    assert (found.status, found.rows, found.digest, found.lo, found.hi) == (
        JobStatus.DONE, 100, "d", 1, 101,
    )  # fmt: skip
    assert node.inspection.replay_jobs("j2") == []
    node.ingress.publish("a/b", b"x")
    assert node.inspection.replay_jobs()[0].job_id == "j1"
    assert JobRecord.from_json(found.to_json()) == found


def test_a_jobs_record_is_its_latest_row_whole(open_node: NodeFactory) -> None:
    """Every field of a job's record is its latest row's — a failed run after a done one
    has no rows or digest, not the done run's — and the latest row is the last recorded
    even when the clock has not moved (the fake clock stands still here)."""
    node = open_node()
    spec = {"sink": "parquet:x"}
    node.inspection.record_replay(JobRecord("j", JobStatus.RUNNING, spec, 1, 101), JobEvent.START)
    node.inspection.record_replay(
        JobRecord("j", JobStatus.DONE, spec, 1, 101, 100, "d"), JobEvent.FINISH
    )
    node.inspection.record_replay(
        JobRecord("j", JobStatus.RUNNING, {"other": 1}, 5, 9), JobEvent.START
    )
    node.inspection.record_replay(
        JobRecord("j", JobStatus.RUNNING, {"other": 1}, 5, 9), JobEvent.FAIL
    )
    [found] = node.inspection.replay_jobs("j")
    assert (found.status, found.spec, found.lo, found.hi, found.rows, found.digest) == (
        JobStatus.FAILED, {"other": 1}, 5, 9, None, None,
    )  # fmt: skip
