"""The journal: records read back whole or not at all, a torn tail recovers to a prefix
holding every acknowledged write, damage is reported and never served, and a process
killed at every step of append, apply and segment deletion loses and repeats nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.core.queues import QueueConfig
from eomsg.embedded import LocalClient
from eomsg.errors import DataDirDamaged, InvalidDuration, NodeClosed, StorageError, WriteFailed
from eomsg.node.node import Node, NodeSettings
from eomsg.store import journal, salvage
from eomsg.store.journal import HEADER, SEGMENT_HEADER, Journal, read_segment, scan
from eomsg.store.writer import RowBatch


def write_journal(directory: Path, payloads: list[bytes], segment: int = 1 << 20) -> Journal:
    j = Journal.start(directory, 0, segment)
    for p in payloads:
        j.append(p)
    j.close(applied=0)  # nothing applied: every segment stays
    return j


PAYLOADS = [os.urandom(n) for n in (0, 1, 7, 100, 33, 512, 1500, 20)]


def starts(payloads: list[bytes]) -> list[int]:
    """The offset at which each record starts in one segment, and where the last ends."""
    at = [SEGMENT_HEADER.size]
    for p in payloads:
        at.append(at[-1] + HEADER.size + len(p))
    return at


def one_segment(tmp_path: Path, payloads: list[bytes] = PAYLOADS) -> tuple[Path, bytes]:
    """A journal of ``payloads`` in one segment: the segment's path and bytes."""
    write_journal(tmp_path / "whole", payloads)
    ((_, path),) = journal.segments(tmp_path / "whole")
    return path, path.read_bytes()


def variant(tmp_path: Path, name: str, path: Path, data: bytes) -> Path:
    """A journal directory holding ``data`` as the segment ``path``."""
    d = tmp_path / name
    d.mkdir()
    (d / path.name).write_bytes(data)
    return d


def test_records_read_back_in_order(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS)
    found = scan(tmp_path)
    assert [r.payload for r in found.records] == PAYLOADS
    assert [r.lsn for r in found.records] == list(range(1, len(PAYLOADS) + 1))
    assert (found.torn, found.damage, found.last_lsn, found.holes) == ("", "", len(PAYLOADS), [])
    assert scan(tmp_path, after=4).records == found.records[4:]


def test_a_segment_is_allocated_whole_with_its_size_in_its_header(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS[:2], segment=1 << 16)
    ((_, path),) = journal.segments(tmp_path)
    assert path.stat().st_size == 1 << 16
    assert path.read_bytes()[: len(journal.MAGIC)] == journal.MAGIC
    assert not list(tmp_path.glob("*.making"))


def test_a_crash_inside_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    """A write killed (a prefix reached the file, up to a page's edge) or cut by a power
    loss (some of its sectors reached the disk): the rest of the record reads as zeros.
    (A sector is written whole or not at all: a header half there in one sector is
    damage, refused rather than taken for a crash.)"""
    payloads = [os.urandom(n) for n in (100, 300, 5000)]
    path, data = one_segment(tmp_path, payloads)
    at = starts(payloads)
    last, end = at[-2], at[-1]
    shapes = {  # a killed write stops at a page's edge
        f"prefix{b}": data[:b] + bytes(len(data) - b) for b in range(4096, end, 4096) if b > last
    }
    for k in range(last // 512, end // 512 + 1):  # one sector missing
        lost = bytearray(data)
        lost[k * 512 : (k + 1) * 512] = bytes(512)
        shapes[f"sector{k}"] = bytes(lost)
    for name, torn in shapes.items():
        if torn[last:end] == bytes(end - last) or torn == data:
            continue  # nothing of it (a clean end) or all of it
        found = scan(variant(tmp_path, name, path, torn))
        assert [r.payload for r in found.records] == payloads[:2] or (
            # a lost sector wholly before the record's own: that one's record is damaged
            found.damage
        ), name
        if torn[:last] == data[:last]:
            assert found.torn and not found.damage, (name, found.holes)
            assert [r.payload for r in found.records] == payloads[:2], name


def test_a_torn_first_record_is_written_over_and_the_segment_kept(tmp_path: Path) -> None:
    """A crash inside a segment's first record: the next open makes the segment that
    record would have started anew, under the same name, and goes on writing there (it
    deleted that segment as an older one before)."""
    write_journal(tmp_path, PAYLOADS[:3])
    j = Journal.start(tmp_path, 3)  # DuckDB holds all three: a new segment starts at 4
    j.append(os.urandom(5000))  # the new segment's first record, cut by the crash
    j.close(applied=3)
    ((first, path),) = journal.segments(tmp_path)
    assert first == 4
    data = bytearray(path.read_bytes())
    end = SEGMENT_HEADER.size + HEADER.size + 5000
    data[4096:end] = bytes(end - 4096)  # the power went after its first page
    path.write_bytes(bytes(data))
    found = scan(tmp_path, 3)
    assert found.torn and not found.damage and found.last_lsn == 3
    j = Journal.start(tmp_path, 3, found=found)
    assert j.append(b"kept") == 4
    j.close(applied=3)
    found = scan(tmp_path, 3)
    assert [r.payload for r in found.records] == [b"kept"] and not (found.torn or found.damage)


def test_a_segment_cut_short_anywhere_is_damage_never_a_shorter_journal(tmp_path: Path) -> None:
    """`truncate` is not a crash: a segment is allocated whole before it is named, so a
    shorter one lost what was past the cut — at a record's edge, inside one, inside the
    header, or in the unused rest."""
    path, data = one_segment(tmp_path)
    at = starts(PAYLOADS)
    cuts = {0, 1, SEGMENT_HEADER.size - 1, *at, *(a + 1 for a in at), *(a - 1 for a in at[1:])}
    cuts |= {at[-1] + 100, len(data) - 1}
    for cut in sorted(cuts):
        found = scan(variant(tmp_path, f"cut{cut}", path, data[:cut]))
        assert found.damage and not found.torn, cut
        whole = sum(1 for a in at[1:] if a <= cut)
        assert [r.payload for r in found.records] == PAYLOADS[:whole], cut
        assert found.damaged_lsn == whole + 1, cut
        assert "cut short" in found.damage, (cut, found.damage)


def test_every_flipped_bit_is_refused_or_harmless(tmp_path: Path) -> None:
    """A bit flipped anywhere in a segment: never a record served with other bytes, and a
    record not served is a hole that refuses an open (damage) — unless the flip is in the
    unused rest, which reads as a torn tail holding nothing."""
    payloads = [os.urandom(n) for n in (40, 0, 300, 25)]
    path, data = one_segment(tmp_path, payloads)
    end = starts(payloads)[-1]
    for offset in range(end + HEADER.size + 2):
        bit = offset % 8
        bad = bytearray(data)
        bad[offset] ^= 1 << bit
        found = scan(variant(tmp_path, f"f{offset}", path, bytes(bad)))
        served = [r.payload for r in found.records]
        assert served == payloads[: len(served)] or set(served) <= set(payloads), offset
        if offset >= end:
            assert served == payloads and not found.damage, (offset, found.holes)
            continue
        assert found.damage and not found.torn, (offset, found.holes)
        missing = [i + 1 for i, p in enumerate(payloads) if p not in served]
        if offset < SEGMENT_HEADER.size:  # its size cannot be trusted: where it ended
            assert "header is damaged" in found.damage and not missing, offset
        else:
            assert missing and found.damaged_lsn == missing[0], (offset, missing, found.holes)


def test_a_damaged_payload_is_stepped_over_and_what_follows_is_read(tmp_path: Path) -> None:
    path, data = one_segment(tmp_path)
    at = starts(PAYLOADS)
    bad = bytearray(data)
    bad[at[3] + HEADER.size + 50] ^= 0x10  # inside record 4's payload
    found = scan(variant(tmp_path, "bad", path, bytes(bad)))
    assert [r.lsn for r in found.records] == [1, 2, 3, 5, 6, 7, 8]
    (hole,) = found.holes
    assert (hole.first, hole.last, hole.torn) == (4, 4, False)
    assert not journal.check(found.segments[0].path.parent, applied=4).damage  # DuckDB has it


def test_records_follow_across_sealed_segments(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS, segment=1024)
    files = journal.segments(tmp_path)
    assert len(files) > 2
    found = scan(tmp_path)
    assert [r.payload for r in found.records] == PAYLOADS and not found.holes
    assert all(s.sealed for s in found.segments[:-1]) and not found.segments[-1].sealed


@pytest.mark.parametrize("which", ["first", "middle", "last", "all"])
def test_a_segment_gone_is_damage(tmp_path: Path, which: str) -> None:
    write_journal(tmp_path, PAYLOADS, segment=1024)
    files = journal.segments(tmp_path)
    gone = {"first": files[:1], "middle": files[1:2], "last": files[-1:], "all": files}[which]
    held = read_segment(files[0][1], files[0][0]).last_lsn
    for _, path in gone:
        path.unlink()
    found = journal.check(tmp_path, applied=0)
    assert found.damage and not found.torn, which
    # What DuckDB already holds may go: forgotten segments are deleted in the same way.
    if which == "first":
        assert not journal.check(tmp_path, applied=held).damage


def test_damage_below_the_applied_point_matters_only_where_records_past_it_went(
    tmp_path: Path,
) -> None:
    write_journal(tmp_path, PAYLOADS, segment=1024)
    files = journal.segments(tmp_path)
    first = read_segment(files[0][1], files[0][0])
    data = bytearray(files[0][1].read_bytes())
    data[starts(PAYLOADS)[1] + HEADER.size] ^= 1  # record 2's payload: DuckDB holds it
    files[0][1].write_bytes(bytes(data))
    assert journal.check(tmp_path, applied=1).damage
    assert not journal.check(tmp_path, applied=2).damage
    # The same segment cut short: its later records cannot be known held unless the
    # segment after it says where they end.
    files[0][1].write_bytes(bytes(data[: SEGMENT_HEADER.size + 10]))
    assert not journal.check(tmp_path, applied=first.last_lsn).damage
    files[-1][1].write_bytes(files[-1][1].read_bytes()[:100])  # the last segment cut
    assert journal.check(tmp_path, applied=len(PAYLOADS)).damage  # past it: unknown


def test_a_crash_while_sealing_loses_nothing(tmp_path: Path) -> None:
    """The next segment is made before the seal: a seal cut off (or never written)
    before a successor that holds nothing yet is not damage."""
    payloads = [os.urandom(100) for _ in range(3)]
    write_journal(tmp_path / "whole", payloads, segment=256)  # a record a segment
    files = journal.segments(tmp_path / "whole")
    assert [f for f, _ in files] == [1, 2, 3]
    sealed, successor = files[1][1], files[2][1]
    seal_at = read_segment(sealed, 2).end - HEADER.size
    for name, seal in {"none": bytes(HEADER.size), "half": b"x" * 8 + bytes(16)}.items():
        d = tmp_path / name
        d.mkdir()
        (d / files[0][1].name).write_bytes(files[0][1].read_bytes())
        data = bytearray(sealed.read_bytes())
        data[seal_at : seal_at + HEADER.size] = seal
        (d / sealed.name).write_bytes(bytes(data))
        empty = successor.read_bytes()[: SEGMENT_HEADER.size]
        (d / successor.name).write_bytes(empty + bytes(256 - len(empty)))
        found = scan(d)
        assert not found.damage and [r.payload for r in found.records] == payloads[:2], name
        # With record 3 in the successor the seal was synced before it: a seal damaged
        # since costs nothing, the successor says where the records go on.
        (d / successor.name).write_bytes(successor.read_bytes())
        found = scan(d)
        assert not found.damage and [r.payload for r in found.records] == payloads, name


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=1 << 40))
def test_any_bytes_read_as_records_or_holes(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, first: int
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "x.seg"
    for body in (data, journal.segment_header(first, 4096) + data):
        path.write_bytes(body)
        segment = read_segment(path, first)
        assert segment.end <= len(body) or segment.holes
        # Reading ends cleanly only where the rest is zeros.
        if not segment.holes and not segment.sealed:
            assert not body[segment.end :].strip(b"\0")


@settings(max_examples=300, deadline=None)
@given(
    zeros=st.integers(0, 200_000),
    at=st.integers(0, 200_000),
    start=st.integers(0, 210_000),
    length=st.none() | st.integers(0, 210_000),
    view=st.booleans(),
)
def test_a_run_of_zeros_is_told_as_stripping_it_would(
    zeros: int, at: int, start: int, length: int | None, view: bool
) -> None:
    """The journal's block-wise test for zeros (a segment's room left) answers as
    stripping a copy of the bytes would, wherever a non-zero byte is, or none."""
    data = bytearray(zeros)
    if at < zeros:
        data[at] = 1
    end = None if length is None else start + length
    given_data = memoryview(bytes(data)) if view else bytes(data)
    assert journal._zero(given_data, start, end) == (not bytes(data[start:end]).strip(b"\0"))


def test_a_damaged_journal_is_refused_named_and_salvaged(data_dir: Path) -> None:
    with LocalClient.open(data_dir) as client:
        client.create_queue(QueueConfig.create("q", ["a/>"]))
        client.publish("a/b", b"kept")
        client.node.store.writer.sync()
        applied = client.node.store.writer.applied
    directory = data_dir / journal.DIR_NAME
    # Acknowledged writes DuckDB does not hold yet, in the segment a clean close kept.
    j = Journal.start(directory, applied, found=scan(directory, applied))
    for i in range(3):
        batch = RowBatch()
        batch.add("messages", 2 + i, "a/b", f"j{i}", 0, None, None, b"j%d" % i)
        batch.add("destinations", 2 + i, 1)
        j.append(batch.encode())
    j.close(applied=0)
    ((_, path),) = journal.segments(directory)
    data = bytearray(path.read_bytes())
    second = next(r for r in scan(directory).records if r.lsn == applied + 2)
    data[data.index(second.payload) + 3] ^= 1  # the middle record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(DataDirDamaged, match="journal is damaged") as refused:
        LocalClient.open(data_dir)
    message = refused.value.message
    assert "eomsg salvage" in message and path.name in message
    assert f"the last good record is {applied + 1}" in message
    assert f"record {applied + 2} are lost: the message with seq 3," in message
    p = salvage.plan(data_dir)
    assert p.journal_lost == applied + 2 and "journal" in p.problem and p.journal_keep == 2
    done = salvage.execute(p)
    assert done.journal_kept == 2 and done.log_gaps == [(3, 3)] and done.lost_waiting == {}
    with LocalClient.open(data_dir) as client:  # every readable record is kept
        assert [m.payload for m in client.node.inspection.log()] == [b"kept", b"j0", b"j2"]
        assert [d.message.payload for d in client.fetch("q", 10)] == [b"kept", b"j0", b"j2"]
    assert journal.segments(next(data_dir.glob("damaged-*")) / journal.DIR_NAME)


def test_missing_journal_records_are_damage(data_dir: Path) -> None:
    with LocalClient.open(data_dir) as client:
        client.publish("a/b", b"x")
        client.node.store.writer.sync()
        applied = client.node.store.writer.applied
    j = Journal.start(data_dir / journal.DIR_NAME, applied + 5)  # 5 records gone
    j.append(RowBatch().encode())
    j.close(applied=0)
    with pytest.raises(DataDirDamaged, match="are missing"):
        LocalClient.open(data_dir)


# -- a real process killed at each step -------------------------------------------------

PUBLISHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from eomsg.core.queues import QueueConfig
    from eomsg.embedded import LocalClient
    from eomsg.errors import QueueExists
    from eomsg.node.node import Node, NodeSettings

    data, start, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    settings = NodeSettings(tick=None, journal_segment=2048, compact_every=10)
    with LocalClient.open(data, settings) as client:
        try:
            client.create_queue(QueueConfig.create("q", ["t/>"]))
        except QueueExists:
            pass
        for i in range(start, start + count):
            client.publish("t/x", b"m%d" % i, id=f"m{i}")
            print(i, flush=True)  # acknowledged
            if i % 7 == 0:
                for d in client.fetch("q", 5):
                    client.delete("q", [d.key])
                    print("deleted", d.message.id, flush=True)
            if i % 25 == 0:
                client.node.maintenance.maintain()  # jobs (compaction) between journaled writes
    """
)

STEPS = [
    "journal.append.before",
    "journal.append.before_sync",
    "store.commit.after",
    "journal.apply.before_commit",
    "journal.apply.after_commit",
    "journal.forget.before",
    "journal.seal.before_sync",
    "store.job.before_commit",
]


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_each_step_loses_and_repeats_nothing(data_dir: Path, step: str) -> None:
    acked: list[int] = []
    deleted: set[str] = set()
    start = 0
    for round_, nth in enumerate((2, 4, 6)):  # each round on what the last left
        env = {**os.environ, "EOMSG_FAILPOINTS": f"{step}=crash@{nth}"}
        proc = subprocess.run(
            [sys.executable, "-c", PUBLISHER, str(data_dir), str(start), "200"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for line in proc.stdout.splitlines():
            if line.startswith("deleted"):
                deleted.add(line.split()[1])
            else:
                acked.append(int(line))
        assert proc.returncode == -9, (step, round_, proc.returncode, proc.stderr[-2000:])
        start += 1000
    settings = NodeSettings(tick=None, journal_segment=2048)
    with LocalClient.open(data_dir, settings) as client:
        log = client.node.inspection.log(limit=1_000_000)
        ids = [m.id for m in log]
        assert len(ids) == len(set(ids)), "a message stored twice"
        assert {f"m{i}" for i in acked} <= set(ids), "an acknowledged message lost"
        waiting = []
        while taken := client.fetch("q", 500):
            waiting.extend(d.message.id for d in taken)
            client.delete("q", [d.key for d in taken])
        assert not deleted & set(waiting), "a deleted message delivered again"
    with LocalClient.open(data_dir, settings) as client:  # closed cleanly: nothing to apply
        assert not client.node.store.warnings


def test_a_journal_left_by_a_kill_is_applied_at_the_next_open(data_dir: Path) -> None:
    env = {**os.environ, "EOMSG_FAILPOINTS": "journal.apply.before_commit=crash"}
    proc = subprocess.run(
        [sys.executable, "-c", PUBLISHER, str(data_dir), "0", "50"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert scan(data_dir / journal.DIR_NAME).records  # DuckDB never held a row of these
    acked = {f"m{i}" for i in map(int, filter(str.isdigit, proc.stdout.split()))}
    with LocalClient.open(data_dir, NodeSettings(tick=None)) as client:
        stored = {m.id for m in client.node.inspection.log(limit=1000)}
        assert acked <= stored
        _, ((count, distinct),) = client.node.inspection.query(
            "SELECT count(*), count(DISTINCT id) FROM messages"
        )
        assert count == distinct == len(stored)


# -- what review found --------------------------------------------------------------------


def test_a_value_the_journal_cannot_hold_fails_the_write_and_never_hangs(
    data_dir: Path,
) -> None:
    node = Node.open(data_dir, NodeSettings(tick=None))
    batch = RowBatch()
    batch.add("messages", 1 << 70, "t", None, 0, None, None, b"x")
    with pytest.raises(WriteFailed):
        node.store.writer.write(batch).result(timeout=10)
    with pytest.raises(StorageError):
        node.ingress.publish("t", b"y")
    node.close()
    with LocalClient.open(data_dir) as client:  # nothing of it was stored
        assert client.node.inspection.log() == []


def test_a_ttl_past_what_the_store_can_hold_is_refused(data_dir: Path) -> None:
    with LocalClient.open(data_dir) as client, pytest.raises(InvalidDuration, match="at most"):
        client.publish("t", b"y", ttl=1e13)


def test_sync_after_close_says_so(data_dir: Path) -> None:
    node = Node.open(data_dir, NodeSettings(tick=None))
    node.ingress.publish("t", b"x")
    writer = node.store.writer
    node.close()
    writer.sync()  # DuckDB holds everything: at once
    with pytest.raises(NodeClosed):
        writer.write(RowBatch())


def test_a_waiter_that_gives_up_on_a_write_leaves_the_writer_running(data_dir: Path) -> None:
    """A task awaiting a write's future, cancelled (a session's pump at a shutdown that
    timed out), cannot cancel the writer's own future — which would make its thread fail
    as it resolved it, and with it the store: the write goes through, and the next."""
    import asyncio

    node = Node.open(data_dir, NodeSettings(tick=None))
    try:
        node.admin.create_queue(QueueConfig.create("q", ["t"]))
        batch = RowBatch()
        batch.set_meta("a-test", "1")
        given_up = threading.Event()
        batch.after_commit(lambda: given_up.wait(30))  # resolved only after the cancel

        written = node.store.writer.write(batch)

        async def gives_up() -> None:
            waiting = asyncio.ensure_future(asyncio.wrap_future(written))
            await asyncio.sleep(0)
            assert not written.done()
            waiting.cancel()
            given_up.set()
            with pytest.raises(asyncio.CancelledError):
                await waiting

        asyncio.run(gives_up())
        assert written.result(timeout=30) is None
        assert node.failed is None
        node.ingress.publish("t", b"after")
        node.store.writer.sync()
        assert node.failed is None
        assert [m.payload for m in node.inspection.log()] == [b"after"]
    finally:
        node.close()
