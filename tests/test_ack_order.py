"""scripts/ack_order.py: from a real node traced by strace, every acknowledgement of a
publish is sent after the fdatasync of the journal record holding it; and the checker
catches an acknowledgement that is not (synthetic traces, and a real one tampered with),
so that it cannot pass vacuously."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from eomsg.core.message import PublishResult
from eomsg.store.journal import encode
from eomsg.wire.events import Published
from scripts.ack_order import Received, Report, Undecodable, check, compare
from tests.conftest import missing_service

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ack_order.py"
SUMMARY = re.compile(
    r"(\d+) acknowledgements, each after the fdatasync of its journal record; (\d+) fdatasyncs"
)


def strace_or_skip() -> None:
    """strace, able to trace here (ptrace may be forbidden in a container)."""
    strace = shutil.which("strace")
    if strace is None:
        missing_service("strace is not installed: run scripts/strace.sh")
    probe = subprocess.run(
        [strace, "-f", "-o", "/dev/null", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        missing_service(f"strace cannot trace here: {probe.stderr.strip()}")


def run_script(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- a real run ---------------------------------------------------------------------------------


def test_a_real_node_acknowledges_only_after_the_fdatasync(tmp_path: Path) -> None:
    strace_or_skip()
    trace = tmp_path / "strace.log"
    started = time.monotonic()
    done = run_script("-n", "400", "--single-every", "10", "--trace", trace)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    m = SUMMARY.fullmatch(done.stdout.strip())
    assert m is not None, done.stdout
    assert int(m[1]) == 410  # 400 publishes and 10 ids again (duplicates)
    assert int(m[2]) >= 10  # one-at-a-time publishes make records of their own
    assert took < 120

    # The same trace, with one acknowledgement moved before the fdatasync of its record:
    # the checker must name it.
    lines = trace.read_text(encoding="latin-1").splitlines(keepends=True)
    report = check(lines)
    assert not report.violations
    ack_line, sync_line, seq = _movable_ack(report)
    tampered = [*lines]
    moved = tampered.pop(ack_line - 1)
    tampered.insert(sync_line - 1, moved)
    bad = tmp_path / "tampered.log"
    bad.write_text("".join(tampered), encoding="latin-1")
    done = run_script("--check", bad)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"VIOLATION: seq {seq} " in done.stderr
    assert "before the fdatasync of the journal record holding it" in done.stderr


def _movable_ack(report: Report) -> tuple[int, int, int]:
    """An acknowledgement, printed on one line, whose record's fdatasync was too and came
    before it with no other write to its connection between: (its line, the fdatasync's
    line, the seq)."""
    sends = {a.sent.line for a in report.acks}
    for ack in report.acks:
        synced = report.records[ack.seq].synced
        assert synced is not None
        if ack.sent.line != ack.sent.end or synced.line != synced.end:
            continue
        between = [line for line in sends if synced.line < line < ack.sent.line]
        if not between and not ack.duplicate:
            return ack.sent.line, synced.line, ack.seq
    raise AssertionError("no acknowledgement to move in the trace")


# -- synthetic traces ------------------------------------------------------------------------------

SEGMENT = "/d/journal/00000000000000000001.seg"
SOCKET = '7<UNIX-STREAM:[101->100,"/d/eomsg.sock"]>'


def hexed(data: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in data)


def record(lsn: int, *seqs: int) -> bytes:
    rows = [[s, "t/a", f"m{s}", 0, None, None, b"x"] for s in seqs]
    return encode(lsn, msgpack.packb({"messages": rows}, use_bin_type=True))


def frame(rid: int, *seqs: int) -> bytes:
    results = tuple(PublishResult(s, f"m{s}", False, 1) for s in seqs)
    body = msgpack.packb(Published(rid, results).to_wire(), use_bin_type=True)
    return struct.pack(">I", len(body)) + body


R1, R2 = record(1, 1, 2), record(2, 3)
OPEN = f'11 1.000001 rename("{SEGMENT}.making", "{SEGMENT}") = 0'  # made, then named
NAME = "11 1.000002 fsync(6</d/journal>) = 0"
WRITE1 = f'11 1.000003 pwrite64(5<{SEGMENT}>, "{hexed(R1)}", {len(R1)}, 32) = {len(R1)}'
SYNC1 = f"11 1.000004 fdatasync(5<{SEGMENT}>) = 0"
WRITE2 = f'11 1.000005 pwrite64(5<{SEGMENT}>, "{hexed(R2)}", {len(R2)}, {32 + len(R1)}) = {len(R2)}'
SYNC2 = f"11 1.000006 fdatasync(5<{SEGMENT}>) = 0"
F1, F2 = frame(1, 1, 2), frame(2, 3)
ACK1 = f'10 1.000007 write({SOCKET}, "{hexed(F1)}", {len(F1)}) = {len(F1)}'
ACK2 = f'10 1.000008 write({SOCKET}, "{hexed(F2)}", {len(F2)}) = {len(F2)}'


def checked(*lines: str) -> Report:
    return check(line + "\n" for line in lines)


def test_in_order_passes() -> None:
    report = checked(OPEN, NAME, WRITE1, SYNC1, ACK1, WRITE2, SYNC2, ACK2)
    assert report.violations == []
    assert report.summary() == (
        "3 acknowledgements, each after the fdatasync of its journal record; 2 fdatasyncs"
    )


def test_a_later_record_unsynced_while_an_ack_goes_out_is_fine() -> None:
    """Record 2 written but not synced yet when record 1's seqs are acknowledged: allowed
    (the check ties each ack to the record holding its seq)."""
    report = checked(OPEN, NAME, WRITE1, SYNC1, WRITE2, ACK1, SYNC2, ACK2)
    assert report.violations == []


def test_an_ack_before_the_fdatasync_is_caught(tmp_path: Path) -> None:
    report = checked(OPEN, NAME, WRITE1, ACK1, SYNC1, WRITE2, SYNC2, ACK2)
    assert len(report.violations) == 2  # seqs 1 and 2; seq 3 was in order
    first = report.violations[0]
    assert first.startswith("seq 1 (id 'm1', Published rid 1) was acknowledged before the ")
    assert "fdatasync of the journal record holding it completed" in first
    assert "line 4 " in first and "line 5 " in first  # the ack, and the fdatasync after it

    log = tmp_path / "strace.log"
    log.write_text("\n".join([OPEN, NAME, WRITE1, ACK1, SYNC1]) + "\n")
    done = run_script("--check", log, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "ack_order: VIOLATION: seq 1 " in done.stderr


def test_an_ack_while_the_fdatasync_is_still_running_is_caught() -> None:
    """The fdatasync began before the ack but returned after it (another thread's
    syscall split its line): not durable yet when the ack went out."""
    report = checked(
        OPEN,
        NAME,
        WRITE1,
        f"11 1.000004 fdatasync(5<{SEGMENT}> <unfinished ...>",
        ACK1,
        "11 1.000009 <... fdatasync resumed>) = 0",
    )
    assert [v.split("\n")[0] for v in report.violations] == [
        f"seq {s} (id 'm{s}', Published rid 1) was acknowledged before the fdatasync of the "
        "journal record holding it completed"
        for s in (1, 2)
    ]


def test_a_failed_fdatasync_does_not_count() -> None:
    failed = f"11 1.000004 fdatasync(5<{SEGMENT}>) = -1 EIO (Input/output error)"
    report = checked(OPEN, NAME, WRITE1, failed, ACK1)
    assert len(report.violations) == 2
    assert "(never synced)" in report.violations[0]


def test_an_ack_whose_frame_began_before_the_fdatasync_is_caught() -> None:
    """The frame's first bytes went out before the fdatasync, the rest after."""
    head = f'10 1.000003 write({SOCKET}, "{hexed(F1[:6])}", 6) = 6'
    rest = f'10 1.000007 write({SOCKET}, "{hexed(F1[6:])}", {len(F1) - 6}) = {len(F1) - 6}'
    report = checked(OPEN, NAME, WRITE1, head, SYNC1, rest)
    assert len(report.violations) == 2
    assert "line 4 " in report.violations[0]  # the write that began sending it


def test_writev_sendmsg_and_short_writes_are_followed() -> None:
    """A frame sent by a writev that wrote only part of what it was given, then by a
    sendmsg of the rest (as strace -xx prints them)."""
    a, b = F1[:3], F1[3:10]
    iovs = f'[{{iov_base="{hexed(a)}", iov_len=3}}, {{iov_base="{hexed(b)}", iov_len=7}}]'
    short = f"10 1.000007 writev({SOCKET}, {iovs}, 2) = 8"  # 2 of b's bytes not written
    rest = F1[8:]
    msg = (
        f'{{msg_name=NULL, msg_namelen=0, msg_iov=[{{iov_base="{hexed(rest)}", '
        f"iov_len={len(rest)}}}], msg_iovlen=1, msg_controllen=0, msg_flags=0}}"
    )
    sent = f"10 1.000008 sendmsg({SOCKET}, {msg}, MSG_NOSIGNAL) = {len(rest)}"
    report = checked(OPEN, NAME, WRITE1, SYNC1, short, sent)
    assert [(a.seq, a.id, a.sent.line) for a in report.acks] == [(1, "m1", 5), (2, "m2", 5)]
    assert report.violations == []


def test_an_ack_before_the_segment_name_is_durable_is_caught() -> None:
    late_name = "11 1.000008 fsync(6</d/journal>) = 0"
    report = checked(OPEN, WRITE1, SYNC1, ACK1, late_name)
    assert len(report.violations) == 2
    assert "before the name of its journal segment was durable" in report.violations[0]


def test_an_ack_of_a_seq_no_record_holds_is_caught() -> None:
    report = checked(OPEN, NAME, WRITE1, SYNC1, ACK2)
    assert len(report.violations) == 1
    assert report.violations[0].startswith(
        "seq 3 (id 'm3', Published rid 2) was acknowledged, but no journal record in the "
        "trace holds it\n  ack:       line 5 [10] 1.000008 write(7<UNIX-STREAM:"
    )


def test_a_trace_without_acknowledgements_cannot_pass() -> None:
    with pytest.raises(Undecodable, match="no client connection"):
        checked(OPEN, NAME, WRITE1, SYNC1)
    hello = f'10 1.000007 write({SOCKET}, "\\x00\\x00\\x00\\x01\\xc0", 5) = 5'
    with pytest.raises(Undecodable, match="no acknowledgement"):
        checked(OPEN, NAME, WRITE1, SYNC1, hello)


def test_a_damaged_record_cannot_be_checked() -> None:
    damaged = WRITE1.replace(hexed(R1[-4:]), hexed(b"zzzz"))
    with pytest.raises(Undecodable, match="fails its CRC"):
        checked(OPEN, NAME, damaged, SYNC1, ACK1)


def test_acks_the_client_received_must_all_be_in_the_trace() -> None:
    report = checked(OPEN, NAME, WRITE1, SYNC1, ACK1)
    assert compare(report, Received([(1, "m1", False), (2, "m2", False)])) == []
    [differs] = compare(report, Received([(1, "m1", False), (2, "m2", False), (3, "m3", False)]))
    assert differs == (
        "the trace shows 2 acknowledgements, the client received 3: missing from the trace "
        "[(3, 'm3', False)], not received []"
    )
