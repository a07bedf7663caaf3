"""The journal: records read back whole or not at all, a torn tail recovers to a prefix
holding every acknowledged write, damage is reported and never served, and a process
killed at every step of append, apply and segment deletion loses and repeats nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.core.queues import QueueConfig
from eomsg.embedded import LocalClient
from eomsg.errors import DataDirDamaged, InvalidDuration, NodeClosed, StorageError, WriteFailed
from eomsg.node.node import Node, NodeSettings
from eomsg.store import journal, salvage
from eomsg.store.journal import HEADER, Journal, read_segment, scan
from eomsg.store.writer import RowBatch


def write_journal(directory: Path, payloads: list[bytes], segment: int = 1 << 20) -> Journal:
    j = Journal(directory, 0, segment)
    for p in payloads:
        j.append(p)
    j.close(applied=0)  # nothing applied: every segment stays
    return j


PAYLOADS = [os.urandom(n) for n in (0, 1, 7, 100, 33, 512)]


def boundaries(payloads: list[bytes]) -> list[int]:
    """The offsets at which each record ends, in one segment."""
    ends, pos = [], 0
    for p in payloads:
        pos += HEADER.size + len(p)
        ends.append(pos)
    return ends


def test_records_read_back_in_order(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS)
    found = scan(tmp_path)
    assert [r.payload for r in found.records] == PAYLOADS
    assert [r.lsn for r in found.records] == list(range(1, len(PAYLOADS) + 1))
    assert (found.torn, found.damage, found.last_lsn) == ("", "", len(PAYLOADS))
    assert scan(tmp_path, after=4).records == found.records[4:]


@pytest.mark.parametrize("rest", ["cut off", "zeros"])
def test_a_torn_tail_at_every_byte_recovers_the_whole_records_before_it(
    tmp_path: Path, rest: str
) -> None:
    """A write cut at any byte: the file ends there, or (a segment is allocated whole)
    zeros follow."""
    ends = boundaries(PAYLOADS)
    write_journal(tmp_path / "whole", PAYLOADS, segment=ends[-1])
    ((_, path),) = journal.segments(tmp_path / "whole")
    data = path.read_bytes()
    assert len(data) == ends[-1]
    for cut in range(len(data) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        torn = data[:cut] if rest == "cut off" else data[:cut] + bytes(len(data) - cut + 64)
        (d / path.name).write_bytes(torn)
        found = scan(d)
        # The records whose bytes are all there (zeros in place of a record's own zero
        # bytes are its bytes); what follows them is reported unless it is only zeros.
        starts = [0, *ends]
        whole = max(k for k, e in enumerate(starts) if torn[:e] == data[:e])
        assert [r.payload for r in found.records] == PAYLOADS[:whole], cut
        assert not found.damage, (cut, found.damage)
        assert bool(found.torn) == bool(torn[starts[whole] :].strip(b"\0")), cut


def test_a_flipped_bit_is_reported_and_never_served(tmp_path: Path) -> None:
    write_journal(tmp_path / "whole", PAYLOADS, segment=boundaries(PAYLOADS)[-1])
    ((_, path),) = journal.segments(tmp_path / "whole")
    data = path.read_bytes()
    starts = [0, *boundaries(PAYLOADS)[:-1]]
    for i, start in enumerate(starts):
        end = start + HEADER.size + len(PAYLOADS[i])
        for offset in sorted({start, start + 4, start + 8, start + 12, end - 1}):
            for bit in (0, 7):
                d = tmp_path / f"r{i}-{offset}-{bit}"
                d.mkdir()
                bad = bytearray(data)
                bad[offset] ^= 1 << bit
                (d / path.name).write_bytes(bytes(bad))
                found = scan(d)
                assert [r.payload for r in found.records] == PAYLOADS[:i], (i, offset)
                if i < len(PAYLOADS) - 1:
                    assert found.damage and not found.torn, (i, offset, found)
                    assert found.damaged_lsn == i + 1
                else:  # the last record: a write cut off looks the same; dropped, said
                    assert found.torn or found.damage, (i, offset)


def test_records_follow_across_segments_and_a_gap_is_damage(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS, segment=20)
    files = journal.segments(tmp_path)
    assert len(files) > 2
    assert [r.payload for r in scan(tmp_path).records] == PAYLOADS
    files[1][1].unlink()  # a segment lost in the middle
    found = scan(tmp_path)
    assert found.damage and "starts at" in found.damage


def test_a_bad_tail_before_a_later_segment_is_damage(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS, segment=64)
    first = journal.segments(tmp_path)[0][1]
    end = read_segment(first, 1).end
    first.write_bytes(first.read_bytes()[: end - 1])
    assert scan(tmp_path).damage


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=1, max_value=1 << 40))
def test_any_bytes_read_as_records_or_stop(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, first: int
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "x.seg"
    path.write_bytes(data)
    segment = read_segment(path, first)
    assert segment.end <= len(data)
    # Reading stops at the end, at zeros (the unused rest), or says why it stopped.
    assert bool(segment.why) == bool(data[segment.end :].strip(b"\0"))


def test_a_damaged_journal_is_refused_named_and_salvaged(data_dir: Path) -> None:
    with LocalClient.open(data_dir) as client:
        client.create_queue(QueueConfig.create("q", ["a/>"]))
        client.publish("a/b", b"kept")
        client.node.store.writer.sync()
        applied = client.node.store.writer.applied
    directory = data_dir / journal.DIR_NAME
    j = Journal(directory, applied)  # acknowledged writes DuckDB does not hold yet
    for i in range(3):
        batch = RowBatch()
        batch.add("messages", 10 + i, "a/b", f"j{i}", 0, None, None, b"j%d" % i)
        batch.add("destinations", 10 + i, 1)
        j.append(batch.encode())
    j.close(applied=0)
    ((_, path),) = journal.segments(directory)
    data = bytearray(path.read_bytes())
    second = read_segment(path, applied + 1).records[1]
    data[data.index(second.payload) + 3] ^= 1  # the middle record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(DataDirDamaged, match="journal is damaged") as refused:
        LocalClient.open(data_dir)
    assert "eomsg salvage" in refused.value.message
    p = salvage.plan(data_dir)
    assert p.journal_lost == applied + 2 and "journal" in p.problem
    salvage.execute(p)
    with LocalClient.open(data_dir) as client:  # the record before the damage is kept
        assert [m.payload for m in client.node.log()] == [b"kept", b"j0"]
    assert journal.segments(next(data_dir.glob("damaged-*")) / journal.DIR_NAME)


def test_missing_journal_records_are_damage(data_dir: Path) -> None:
    with LocalClient.open(data_dir) as client:
        client.publish("a/b", b"x")
        client.node.store.writer.sync()
        applied = client.node.store.writer.applied
    j = Journal(data_dir / journal.DIR_NAME, applied + 5)  # 5 records gone
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
                client.node.maintain()  # jobs (compaction) between journaled writes
    """
)

STEPS = [
    "journal.append.before",
    "journal.append.before_sync",
    "store.commit.after",
    "journal.apply.before_commit",
    "journal.apply.after_commit",
    "journal.forget.before",
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
        log = client.node.log(limit=1_000_000)
        ids = [m.id for m in log]
        assert len(ids) == len(set(ids)), "a message stored twice"
        assert {f"m{i}" for i in acked} <= set(ids), "an acknowledged message lost"
        waiting = []
        while taken := client.fetch("q", 500):
            waiting.extend(d.message.id for d in taken)
            client.delete("q", [d.key for d in taken])
        assert not deleted & set(waiting), "a deleted message delivered again"
    assert not journal.pending(data_dir)  # closed cleanly: DuckDB holds everything


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
    assert journal.pending(data_dir)  # DuckDB never held a row of these
    acked = {f"m{i}" for i in map(int, filter(str.isdigit, proc.stdout.split()))}
    with LocalClient.open(data_dir, NodeSettings(tick=None)) as client:
        stored = {m.id for m in client.node.log(limit=1000)}
        assert acked <= stored
        _, ((count, distinct),) = client.node.query(
            "SELECT count(*), count(DISTINCT id) FROM messages"
        )
        assert count == distinct == len(stored)


# -- what review found --------------------------------------------------------------------


def test_damage_among_records_duckdb_holds_does_not_matter(tmp_path: Path) -> None:
    write_journal(tmp_path, PAYLOADS, segment=1 << 20)
    ((_, path),) = journal.segments(tmp_path)
    data = bytearray(path.read_bytes())
    data[boundaries(PAYLOADS)[1] + 20] ^= 1  # inside record 3
    path.write_bytes(bytes(data))
    assert scan(tmp_path).damage  # for a reader that needs record 3
    found = journal.check(tmp_path, applied=3)  # DuckDB holds 1-3: 4 on are read
    assert not found.damage and [r.lsn for r in found.records] == [4, 5, 6]


def test_several_records_garbled_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    payloads = [os.urandom(20) for _ in range(10)]
    write_journal(tmp_path, payloads, segment=1 << 20)
    ((_, path),) = journal.segments(tmp_path)
    data = bytearray(path.read_bytes())
    ends = boundaries(payloads)
    for i in range(ends[3], ends[6]):  # records 5, 6 and 7 garbled; 8-10 intact
        data[i] = 0xA5
    path.write_bytes(bytes(data))
    found = scan(tmp_path)
    assert found.damage and not found.torn and found.damaged_lsn == 5


def test_a_bad_last_record_before_a_later_empty_segment_is_damage(tmp_path: Path) -> None:
    j = Journal(tmp_path, 0, 64)
    for p in PAYLOADS[:4]:
        j.append(p)
    j.close(applied=0)
    first = journal.segments(tmp_path)[0][1]
    end = read_segment(first, 1).end
    data = bytearray(first.read_bytes())
    data[end - 1] ^= 1  # its last record, acknowledged: a later segment was started
    first.write_bytes(bytes(data))
    last = journal.segments(tmp_path)[-1]
    (tmp_path / f"{last[0] + 5:020d}.seg").write_bytes(bytes(64))  # started, empty
    assert scan(tmp_path).damage


def test_a_value_the_journal_cannot_hold_fails_the_write_and_never_hangs(
    data_dir: Path,
) -> None:
    node = Node.open(data_dir, NodeSettings(tick=None))
    batch = RowBatch()
    batch.add("messages", 1 << 70, "t", None, 0, None, None, b"x")
    with pytest.raises(WriteFailed):
        node.store.writer.write(batch).result(timeout=10)
    with pytest.raises(StorageError):
        node.publish("t", b"y")
    node.close()
    with LocalClient.open(data_dir) as client:  # nothing of it was stored
        assert client.node.log() == []


def test_a_ttl_past_what_the_store_can_hold_is_refused(data_dir: Path) -> None:
    with LocalClient.open(data_dir) as client, pytest.raises(InvalidDuration, match="at most"):
        client.publish("t", b"y", ttl=1e13)


def test_sync_after_close_says_so(data_dir: Path) -> None:
    node = Node.open(data_dir, NodeSettings(tick=None))
    node.publish("t", b"x")
    writer = node.store.writer
    node.close()
    writer.sync()  # DuckDB holds everything: at once
    with pytest.raises(NodeClosed):
        writer.write(RowBatch())
