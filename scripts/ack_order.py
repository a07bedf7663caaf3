"""Prove from a real run, traced by strace, that the node acknowledges no publish before
the fdatasync of the journal record holding it.

Runs ``python -m eomsg serve`` on a fresh data directory under
``strace -f -ttt -yy -xx``, publishes ``--messages`` messages through the Python client
(from a few connections at once, pipelined ``publish_async`` with a one-at-a-time
``publish`` every so often, then a few ids again, which come back as duplicates), stops
the node with SIGTERM and reads the trace:

* every ``pwrite64`` to a journal segment (``DIR/journal/<lsn>.seg``) is laid into an
  image of that segment (past its header, written before the segment has its name); a
  record is *written* by the pwrite that completes it (its header, CRCs and lsn are
  checked, its payload decoded: the rows of table ``messages`` give the seqs it holds,
  with their ids; a seal holds none);
* a record is *synced* by the first successful ``fdatasync`` of its segment that began
  after that pwrite returned; a segment's name is durable after the first ``fsync`` of
  the journal directory that began after the segment got its name (the ``rename`` of
  the file it was made in);
* every ``write``/``writev``/``sendmsg``/``sendto`` to a client connection (a socket
  accepted on ``DIR/eomsg.sock``, as ``-yy`` names it) is laid into that connection's
  stream and cut into frames (4-byte big-endian length, msgpack body); a Published frame
  (type 4) acknowledges the seqs of its results, and is *sent* when the first syscall
  carrying a byte of it began.

The property checked, for every acknowledged seq: the record holding it was written,
then synced, and its segment's name made durable, each completed before the syscall
that began sending the acknowledgement; and the ack names the id the record holds. The
acknowledgements found in the trace must be exactly those the client received, so that
none escapes the check.

Order is the order of the lines in the trace. A traced thread stops at each syscall's
entry, before the kernel runs it, and at its exit, after it returned, and stays stopped
until strace has printed the line; with ``-f`` strace serialises every thread's stops
into one file. So when the exit of A is printed before the entry of B, A had completed
before B began. (A call that another thread's interrupts is printed as
``<unfinished ...>`` at its entry and ``<... resumed>`` at its exit.)

Exit 0 with a one-line summary; 1 naming the first violation (with the syscall lines
that show it); 2 when the run or the trace cannot be checked (no strace, the node
failed, a record or frame that does not decode). ``--check LOG`` checks an existing
trace instead of making one.

  python scripts/ack_order.py                 # 2000 messages
  python scripts/ack_order.py -n 300 --keep   # keep the data directory and the trace
  python scripts/ack_order.py --check strace.log
"""

from __future__ import annotations

import argparse
import bisect
import collections
import concurrent.futures
import contextlib
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

import eomsg
from eomsg.core.queues import QueueConfig
from eomsg.errors import EomsgError

STRING_LIMIT = 1 << 24  # strace -s: no traced buffer may be cut short
TRACED = "fdatasync,fsync,pwrite64,write,writev,sendmsg,sendto,rename,renameat,renameat2"
SOCKET_WRITES = ("write", "writev", "sendmsg", "sendto")
SOCKET_NAME = "eomsg.sock"
PUBLISHED = 4  # eomsg.wire.events.Published.TYPE
# eomsg.store.journal's: header crc, kind, length, lsn, payload crc; after a segment header
RECORD_HEADER = struct.Struct("<I4sIQI")
SEGMENT_HEADER_SIZE = 32
SEAL = b"eoS1"
FRAME_HEADER = struct.Struct(">I")  # eomsg.wire.protocol._HEADER

# -- reading an strace log ------------------------------------------------------------------

_LINE = re.compile(r"(\d+) +(\d+(?:\.\d+)?) (.*)")
_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"<\.\.\. (\w+) resumed>(.*)", re.S)
_CALL = re.compile(r"(\w+)\((.*)\) += (.*)", re.S)
_FD = re.compile(r"(-?\d+)<(.*?)>(?:, |$)", re.S)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\.\.\.)?', re.S)
_IOV = re.compile(r'iov_base="((?:[^"\\]|\\.)*)"(\.\.\.)?', re.S)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)", re.S)
_SIMPLE = {"n": 10, "t": 9, "r": 13, "v": 11, "f": 12, "a": 7, "b": 8, "e": 27}
_SEGMENT = re.compile(r"/journal/(\d{20})\.seg$")
_SOCKET = re.compile(r"(UNIX-STREAM|TCP|TCPv6):\[")


class Undecodable(Exception):
    """The trace cannot be checked: a record, frame or buffer that does not decode."""


def unescape(text: str) -> bytes:
    """The bytes of an strace string (its C escapes: ``\\xHH`` from ``-xx``, and the
    ``\\n``, octal and the like that plain strace prints)."""
    if len(text) == 4 * text.count("\\x"):  # -xx: every byte as \xHH
        return bytes.fromhex(text.replace("\\x", ""))
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        out += text[pos : m.start()].encode("latin-1")
        e = m[1]
        if e[0] == "x" and len(e) == 3:
            out.append(int(e[1:], 16))
        elif e[0] in "01234567":
            out.append(int(e, 8) & 0xFF)
        else:
            out.append(_SIMPLE.get(e, ord(e)))
        pos = m.end()
    out += text[pos:].encode("latin-1")
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Call:
    """One syscall: ``line`` the line of its entry, ``end`` of its exit (the same line
    when strace printed it whole)."""

    line: int
    end: int
    pid: int
    time: float
    name: str
    args: str
    ret: str

    @property
    def value(self) -> int | None:
        m = re.match(r"-?\d+", self.ret)
        return int(m[0]) if m else None

    def fd(self) -> tuple[int, str] | None:
        """The first argument's fd and what ``-y`` says it is (decoded)."""
        m = _FD.match(self.args)
        if m is None:
            return None
        return int(m[1]), unescape(m[2]).decode("utf-8", "replace")

    def after_fd(self) -> str:
        """The arguments after the first (an fd, whose annotation may hold a quoted path)."""
        m = _FD.match(self.args)
        return self.args if m is None else self.args[m.end() :]

    def show(self, limit: int = 200) -> str:
        """The call for a reader: where it is in the trace, its thread and time, its fd
        as a path, buffers as their sizes."""
        args = self.args
        m = _FD.match(args)
        if m is not None:
            rest = _STRING.sub(lambda s: _brief(unescape(s[1])), args[m.end() :])
            name = unescape(m[2]).decode("utf-8", "replace")
            args = f"{m[1]}<{name}>{', ' if m[0].endswith(', ') else ''}{rest}"
        text = f"{self.name}({args}) = {self.ret}"
        if len(text) > limit:
            text = text[: limit - 3] + "..."
        where = f"line {self.line}" if self.line == self.end else f"lines {self.line}-{self.end}"
        return f"{where} [{self.pid}] {self.time:.6f} {text}"


def _brief(data: bytes) -> str:
    return repr(data)[1:] if len(data) <= 16 else f"<{len(data)} bytes>"


def read_calls(lines: Iterable[str]) -> list[Call]:
    """The syscalls of an ``strace -f -ttt`` log, in the order their exits were printed;
    a call split by another thread's (``<unfinished ...>``, ``<... resumed>``) is made
    whole again."""
    started: dict[int, tuple[int, float, str]] = {}
    calls: list[Call] = []
    for number, raw in enumerate(lines, 1):
        m = _LINE.fullmatch(raw.rstrip("\n"))
        if m is None:
            continue
        pid, when, rest = int(m[1]), float(m[2]), m[3]
        if rest.endswith(_UNFINISHED):
            started[pid] = (number, when, rest[: -len(_UNFINISHED)])
            continue
        resumed = _RESUMED.fullmatch(rest)
        if resumed is not None:
            entry = started.pop(pid, None)
            if entry is None:
                continue  # began before the trace did
            line, when, head = entry
            text = head + resumed[2]
        else:
            line, text = number, rest
        c = _CALL.fullmatch(text)
        if c is not None:
            calls.append(Call(line, number, pid, when, c[1], c[2], c[3]))
    return calls


def _buffer(call: Call) -> bytes:
    """The bytes a write-like call handed the kernel (all of them: strace must not have
    cut the string short), trimmed to what it returned as written."""
    if call.name in ("writev", "sendmsg"):
        found = _IOV.findall(call.after_fd())
    else:  # write, pwrite64, sendto: the first string after the fd
        found = _STRING.findall(call.after_fd())[:1]
    if not found:
        raise Undecodable(f"no buffer in {call.show()}")
    if any(cut for _, cut in found):
        raise Undecodable(f"strace cut the buffer short (raise -s): {call.show()}")
    data = b"".join(unescape(s) for s, _ in found)
    return data[: max(call.value or 0, 0)]


# -- the journal ------------------------------------------------------------------------------


@dataclass(eq=False)
class Record:
    segment: Segment
    lsn: int
    offset: int
    ids: dict[int, str | None]  # seq -> publish id, of its "messages" rows
    written: Call  # the pwrite that completed it
    synced: Call | None = None  # the first fdatasync of its segment begun after that


@dataclass(eq=False)
class Segment:
    path: str
    first_lsn: int
    created: Call | None = None  # the rename that named it (None: named before the trace)
    named: Call | None = None  # the journal directory's fsync that made its name durable
    image: bytearray = field(default_factory=bytearray)
    base: int = -1  # the file offset of image[0] (set by the first write seen)
    parsed: int = 0  # offset in image of the next record
    count: int = 0  # records in it so far
    unsynced: list[Record] = field(default_factory=list)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)


# -- checking ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """One result of a Published frame: ``seq`` acknowledged as ``id``."""

    seq: int
    id: str | None
    duplicate: bool
    rid: int
    sent: Call  # the syscall that began sending the frame


@dataclass
class Report:
    acks: list[Ack] = field(default_factory=list)
    records: dict[int, Record] = field(default_factory=dict)  # seq -> its record
    record_count: int = 0
    segments: int = 0
    fdatasyncs: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.acks)} acknowledgements, each after the fdatasync of its journal "
            f"record; {self.fdatasyncs} fdatasyncs"
        )


class _Stream:
    """Bytes the node sent on one client connection, cut into frames."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.base = 0  # stream offset of data[0]
        self.starts: list[int] = []  # stream offset where each call's bytes begin
        self.calls: list[Call] = []

    def add(self, call: Call, data: bytes) -> list[tuple[Call, Any]]:
        """Append what ``call`` sent; the frames it completed, each with the call that
        began sending it."""
        if not data:
            return []
        self.starts.append(self.base + len(self.data))
        self.calls.append(call)
        self.data += data
        frames = []
        pos = 0
        while len(self.data) - pos >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(self.data, pos)
            end = pos + FRAME_HEADER.size + size
            if end > len(self.data):
                break
            first = self.calls[bisect.bisect_right(self.starts, self.base + pos) - 1]
            try:
                body = msgpack.unpackb(bytes(self.data[pos + FRAME_HEADER.size : end]), raw=False)
            except Exception as e:
                raise Undecodable(f"a frame sent from {first.show()} does not decode: {e}") from e
            frames.append((first, body))
            pos = end
        del self.data[:pos]
        self.base += pos
        return frames


def check(lines: Iterable[str]) -> Report:
    """Check a trace: the report of what it holds, with its violations (empty: none).
    Raises Undecodable when it cannot be checked."""
    report = Report()
    segments: dict[str, Segment] = {}
    streams: dict[str, _Stream] = {}

    def segment(path: str, lsn: str) -> Segment:
        s = segments.get(path)
        if s is None:
            s = segments[path] = Segment(path, int(lsn))
        return s

    for call in read_calls(lines):  # in the order they completed
        if call.name.startswith("rename"):
            named = [unescape(n).decode("utf-8", "replace") for n, _ in _STRING.findall(call.args)]
            seg = _SEGMENT.search(named[-1]) if named and call.value == 0 else None
            if seg:
                segment(named[-1], seg[1]).created = call
            continue
        fd = call.fd()
        if fd is None:
            continue
        path = fd[1]
        seg = _SEGMENT.search(path)
        if call.name == "fsync" and call.value == 0:
            for s in segments.values():
                if s.directory == path and s.created and not s.named and s.created.end < call.line:
                    s.named = call
        elif call.name == "pwrite64" and seg:
            _journal_write(segment(path, seg[1]), call, report)
        elif call.name == "fdatasync" and seg and call.value == 0:
            report.fdatasyncs += 1
            s = segment(path, seg[1])
            for r in [r for r in s.unsynced if r.written.end < call.line]:
                r.synced = call
                s.unsynced.remove(r)
        elif call.name in SOCKET_WRITES and _client(path):
            stream = streams.setdefault(path, _Stream())  # -yy: one name per connection
            for sent, body in stream.add(call, _buffer(call)):
                if isinstance(body, list) and len(body) == 3 and body[0] == PUBLISHED:
                    for seq, msg_id, duplicate, _ in body[2]:
                        report.acks.append(Ack(seq, msg_id, bool(duplicate), body[1], sent))
    report.segments = len(segments)
    if not streams:
        raise Undecodable(
            f"the trace shows no client connection (a socket on {SOCKET_NAME}, or TCP): "
            "does strace -yy decode sockets here?"
        )
    if not report.acks:
        raise Undecodable("the trace shows no acknowledgement (Published frame) to check")
    for ack in sorted(report.acks, key=lambda a: a.sent.line):
        report.violations.extend(_judge(ack, report.records.get(ack.seq)))
    return report


def _client(path: str) -> bool:
    """Whether ``-yy`` describes a client connection: accepted on the node's Unix socket
    (the annotation names its path), or TCP."""
    m = _SOCKET.match(path)
    if m is None:
        return False
    return m[1] != "UNIX-STREAM" or path.endswith(f'/{SOCKET_NAME}"]')


def _journal_write(s: Segment, call: Call, report: Report) -> None:
    """Lay a pwrite into the segment's image; note the records it completed."""
    offset = int(re.findall(r"-?\d+", call.args)[-1])
    data = _buffer(call)
    if not data:
        return
    if s.base < 0:  # its first write: past the header (or where a segment reused went on)
        s.base = SEGMENT_HEADER_SIZE if s.created is not None else offset
    if offset != s.base + len(s.image):
        raise Undecodable(
            f"a journal write at offset {offset} of {s.path}, which holds "
            f"{s.base + len(s.image)} bytes so far (a gap or a rewrite: a failed append cut "
            f"back?): {call.show()}"
        )
    s.image += data
    while len(s.image) - s.parsed >= RECORD_HEADER.size:
        crc, kind, length, lsn, payload_crc = RECORD_HEADER.unpack_from(s.image, s.parsed)
        end = s.parsed + RECORD_HEADER.size + length
        if end > len(s.image):
            break
        at = f"the record at offset {s.base + s.parsed} of {s.path} (written by {call.show()})"
        payload = bytes(s.image[s.parsed + RECORD_HEADER.size : end])
        rest = bytes(s.image[s.parsed + 4 : s.parsed + RECORD_HEADER.size])
        if crc != zlib.crc32(rest) or payload_crc != zlib.crc32(payload):
            raise Undecodable(f"{at} fails its CRC")
        if kind == SEAL:
            s.parsed = end
            continue
        if lsn != s.first_lsn + s.count:
            raise Undecodable(f"{at} is numbered {lsn}, not {s.first_lsn + s.count}")
        try:
            tables = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            ids = {row[0]: row[2] for row in tables.get("messages", [])}
        except Exception as e:
            raise Undecodable(f"{at} does not decode: {e}") from e
        record = Record(s, lsn, s.base + s.parsed, ids, call)
        s.count += 1
        report.record_count += 1
        for seq in ids:
            if seq in report.records:
                raise Undecodable(f"{at} holds seq {seq}, which an earlier record holds too")
            report.records[seq] = record
        s.unsynced.append(record)
        s.parsed = end


def _judge(ack: Ack, record: Record | None) -> list[str]:
    """What is wrong with one acknowledgement (nothing: it came after its record's
    fdatasync, and after its segment's name was durable)."""
    what = f"seq {ack.seq} (id {ack.id!r}, Published rid {ack.rid}) was acknowledged"
    sent = f"  ack:       {ack.sent.show()}"
    if record is None:
        return [f"{what}, but no journal record in the trace holds it\n{sent}"]
    wrote = f"  pwrite64:  {record.written.show()}"
    if record.written.end >= ack.sent.line:
        return [f"{what} before the journal record holding it was written\n{sent}\n{wrote}"]
    found = []
    if record.synced is None or record.synced.end >= ack.sent.line:
        synced = f"  fdatasync: {record.synced.show()}" if record.synced else "  (never synced)"
        found.append(
            f"{what} before the fdatasync of the journal record holding it completed\n"
            f"{wrote}\n{sent}\n{synced}"
        )
    s = record.segment
    if s.created is not None and (s.named is None or s.named.end >= ack.sent.line):
        named = f"  fsync:     {s.named.show()}" if s.named else "  (never fsynced)"
        found.append(
            f"{what} before the name of its journal segment was durable (an fsync of the "
            f"journal directory after the segment was created)\n"
            f"  rename:    {s.created.show()}\n{sent}\n{named}"
        )
    if ack.id != record.ids[ack.seq]:
        found.append(
            f"{what}, but its journal record holds id {record.ids[ack.seq]!r} for that seq\n{sent}"
        )
    return found


# -- a traced run -----------------------------------------------------------------------------


class CannotRun(Exception):
    """The traced run could not be made (no strace, the node did not start or stop)."""


@dataclass
class Received:
    """What the client received: (seq, id, duplicate) of every publish."""

    results: list[tuple[int, str | None, bool]] = field(default_factory=list)


def strace_command(log: Path, command: list[str]) -> list[str]:
    strace = shutil.which("strace")
    if strace is None:
        raise CannotRun("strace is not installed (bash scripts/strace.sh installs it)")
    return [
        strace,
        "-f",  # every thread: the journal's writer, the event loop
        "-ttt",
        "-yy",  # fds as paths and sockets (a journal segment, the client's connection)
        "-xx",  # every byte of a buffer as \xHH
        "-s",
        str(STRING_LIMIT),
        "-e",
        f"trace={TRACED}",
        "-e",
        "signal=none",
        "-o",
        str(log),
        "--",
        *command,
    ]


@dataclass(frozen=True)
class Plan:
    """What to publish: ``n`` messages of ``payload`` bytes, spread over ``connections``
    clients publishing at once (so that one connection's acknowledgement goes out while
    another's record is being written), each pipelined with at most ``window``
    unacknowledged but every ``single_every``-th message one at a time (its client waits
    for the acknowledgement); then ``again`` of their ids once more, which come back as
    duplicates acknowledged with the original seq."""

    n: int = 2000
    payload: int = 100
    connections: int = 4
    single_every: int = 50
    again: int = 10
    window: int = 64


def publish(data: Path, plan: Plan) -> Received:
    """Publish on the node serving ``data`` as ``plan`` says."""
    with eomsg.connect(data, name="ack-order") as c:
        c.create_queue(QueueConfig.create("q", ["t/>"]))
    seen = Received()
    lock = threading.Lock()
    payload = b"x" * plan.payload

    def publisher(k: int) -> None:
        ids = [f"m{i}" for i in range(k, plan.n, plan.connections)]
        if k == 0 and plan.again:  # the same ids again, alternately pipelined and not
            ids += [f"m{i}" for i in range(0, plan.n, max(1, plan.n // plan.again))][: plan.again]
        got: list[tuple[int, str | None, bool]] = []
        pending = []
        with eomsg.connect(data, name=f"ack-order-{k}", window=plan.window) as c:
            for j, msg_id in enumerate(ids):
                if plan.single_every and j % plan.single_every == plan.single_every - 1:
                    r = c.publish("t/ack", payload, id=msg_id)  # those before it pending still
                    got.append((r.seq, r.id, r.duplicate))
                else:
                    pending.append(c.publish_async("t/ack", payload, id=msg_id))
            for p in pending:
                r = p.result(60)
                got.append((r.seq, r.id, r.duplicate))
        with lock:
            seen.results.extend(got)

    with concurrent.futures.ThreadPoolExecutor(plan.connections) as pool:
        for f in [pool.submit(publisher, k) for k in range(plan.connections)]:
            f.result()
    return seen


def _ready(process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The node's "ready" line (JSON), read from its stdout within ``timeout``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffered = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "ready":
                    return event
        elif process.poll() is not None:
            break
    raise CannotRun(f"the node did not say it was ready within {timeout:g} s")


def traced_run(work: Path, plan: Plan, log: Path) -> Received:
    """Serve a fresh data directory in ``work`` under strace (its log: ``log``), publish,
    and stop the node with SIGTERM."""
    data = work / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
    env["EOMSG_INIT"] = "1"
    node = [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json"]
    command = strace_command(log, node)
    with open(work / "node.err", "wb") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env)
    pid = 0
    try:
        try:
            pid = int(_ready(process, 120)["pid"])
        except CannotRun as e:
            why = (work / "node.err").read_text(errors="replace").strip()[-2000:]
            raise CannotRun(f"{e}; its stderr (and strace's):\n{why}") from None
        try:
            seen = publish(data, plan)
        except (EomsgError, TimeoutError) as e:
            raise CannotRun(f"publishing failed: {type(e).__name__}: {e}") from e
        os.kill(pid, signal.SIGTERM)  # strace, given a command and -o, ignores it
        code = process.wait(120)
        if code != 0:
            why = (work / "node.err").read_text(errors="replace").strip()[-2000:]
            raise CannotRun(f"the node exited with {code} after SIGTERM:\n{why}")
        return seen
    finally:
        if process.poll() is None:
            if pid:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                process.wait(10)
            if process.poll() is None:
                process.kill()
                process.wait()


def compare(report: Report, seen: Received) -> list[str]:
    """How the acknowledgements in the trace differ from those the client received
    (nothing: the same, so none escaped the check)."""
    wire = collections.Counter((a.seq, a.id, a.duplicate) for a in report.acks)
    client = collections.Counter(seen.results)
    if wire == client:
        return []
    missing = list((client - wire).elements())[:5]
    extra = list((wire - client).elements())[:5]
    return [
        f"the trace shows {len(report.acks)} acknowledgements, the client received "
        f"{len(seen.results)}: missing from the trace {missing}, not received {extra}"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Plan()
    parser.add_argument("-n", "--messages", type=int, default=d.n, help="messages to publish")
    parser.add_argument("--payload", type=int, default=d.payload, help="bytes per message")
    parser.add_argument(
        "--single-every", type=int, default=d.single_every, help="every Nth one at a time"
    )
    parser.add_argument(
        "--connections", type=int, default=d.connections, help="clients publishing at once"
    )
    parser.add_argument("--again", type=int, default=d.again, help="ids published twice")
    parser.add_argument(
        "--window", type=int, default=d.window, help="unacknowledged publishes at most"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data directory and trace")
    parser.add_argument("--trace", type=Path, metavar="LOG", help="write the strace log here")
    parser.add_argument("--check", type=Path, metavar="LOG", help="check this strace log only")
    args = parser.parse_args(argv)

    if args.check is not None:
        return _verdict(args.check, None)
    work = Path(tempfile.mkdtemp(prefix="eomsg-ack-order-"))
    log = args.trace or work / "strace.log"
    keep = args.keep
    try:
        try:
            plan = Plan(
                args.messages,
                args.payload,
                args.connections,
                args.single_every,
                args.again,
                args.window,
            )
            seen = traced_run(work, plan, log)
        except CannotRun as e:
            print(f"ack_order: cannot run: {e}", file=sys.stderr)
            return 2
        code = _verdict(log, seen)
        keep = keep or code != 0
        return code
    finally:
        if keep:
            print(f"ack_order: kept {work} (data/, and the trace {log})", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _verdict(log: Path, seen: Received | None) -> int:
    try:
        with open(log, encoding="latin-1") as f:
            report = check(f)
    except Undecodable as e:
        print(f"ack_order: cannot check {log}: {e}", file=sys.stderr)
        return 2
    if report.violations:
        print(f"ack_order: VIOLATION: {report.violations[0]}", file=sys.stderr)
        if len(report.violations) > 1:
            print(f"ack_order: ({len(report.violations) - 1} more)", file=sys.stderr)
        return 1
    differs = [] if seen is None else compare(report, seen)
    if differs:
        print(f"ack_order: cannot check {log}: {differs[0]}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
