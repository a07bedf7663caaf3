"""Fuzzing a running node with what no well-behaved client sends.

Sessions that said a valid hello send frames of four kinds: requests of every type the
protocol lets a client send — every :data:`~eomsg.core.operations.OPERATIONS` among the
calls — with values of the declared types drawn to hurt (names at and past their limits,
markup, paths, hostile SQL, numbers at the edges, sequences and attempts of real
deliveries); bodies of those types whose fields hold values of any kind; well-formed
frames with bytes flipped; and random bytes. Whatever comes, the node must answer, or
hang up on that one client, and go on serving everyone: after every session a fresh
client must get a welcome and a pong.

Counted: **crashes** (the node's process ended; it is started again and the frames that
did it are kept in ``crash-N.txt``), **unresponsive** (no pong within a minute: a
generous bound, never the verdict on a slow machine alone), **internal errors** (an
answer saying ``internal error``: a handler raised what it should have refused with a
typed error — each kept with the frame that caused it) and **escapes** (a file written
outside the data directory by a query). The drawing is seeded: a run is reproducible up
to the timing of the node's answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import random
import socket
import struct
import sys
import time
import types
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from eomsg.chaos.process import Node
from eomsg.core.message import Key
from eomsg.core.operations import OPERATIONS, Operation
from eomsg.errors import EomsgError, ProtocolError
from eomsg.wire import events as ev
from eomsg.wire.calls import encode_args
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role

REQUESTS: tuple[type[Event], ...] = (
    ev.Publish, ev.Fetch, ev.Subscribe, ev.Cancel, ev.Delete, ev.Release, ev.Call,
    ev.FlowAck, ev.Ping, ev.Pong, ev.Hello, ev.Goodbye,
)  # fmt: skip
"""What a client may send (and, to test the table, two it may not send here)."""


@dataclass
class Findings:
    """What a fuzzing run did and found."""

    seconds: float = 0.0
    sessions: int = 0
    frames: Counter[str] = field(default_factory=Counter)  # sent, by kind
    crashes: list[str] = field(default_factory=list)  # files holding the frames sent
    unresponsive: int = 0
    internal: list[str] = field(default_factory=list)  # "internal error" answers
    tracebacks: list[str] = field(default_factory=list)  # in the node's log: what was raised
    escapes: list[str] = field(default_factory=list)  # files written outside the data

    @property
    def failed(self) -> bool:
        return bool(
            self.crashes or self.unresponsive or self.internal or self.tracebacks or self.escapes
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "sessions": self.sessions,
            "frames": sum(self.frames.values()),
            "frames_by_kind": dict(sorted(self.frames.items())),
            "crashes": len(self.crashes),
            "unresponsive": self.unresponsive,
            "internal_errors": len(self.internal),
            "tracebacks": len(self.tracebacks),
            "escapes": len(self.escapes),
        }


class Values:
    """Values of a declared type, drawn to hurt. ``seen`` holds what the node said that
    is worth sending back (sequences, attempts, epochs, flows, transaction ids)."""

    def __init__(self, rng: random.Random, outside: Path) -> None:
        self.rng = rng
        self.seen: dict[str, list[Any]] = {"seq": [1], "attempt": [1], "epoch": [1], "flow": [1]}
        name = "x" * 255
        self.texts = [
            "", "q", "s", "t/x", "t/>", "t/*", "#", ">", "t//x", "/", name, name + "y",
            "[bold red]markup[/]", "\x00", "\x1b[2J", "é\u200bü", "../../etc/passwd",
            "'; DROP TABLE messages; --", "tcp://127.0.0.1:1", "unix:/nonexistent",
            "tls://[::1]:0", "store", "memory", "ack_timeout", "max_payload", "-1", "nan",
            "SELECT * FROM messages", "DROP TABLE messages", "DELETE FROM messages",
            f"COPY (SELECT 42) TO '{outside}/copied.csv'", "INSTALL httpfs", "LOAD httpfs",
            f"ATTACH '{outside}/attached.db' AS x", "SELECT * FROM read_csv('/etc/passwd')",
            "SELECT * FROM duckdb_settings()", "PRAGMA database_list", "SET threads = 1",
            "CALL pragma_version()", "SELECT 1; SELECT 2", "SELECT sum(range) FROM range(1e12)",
        ]  # fmt: skip

    def draw(self, hint: Any, name: str = "", depth: int = 0) -> Any:
        """A value of type ``hint`` (``name``: the field's, to send known numbers;
        ``depth``: how deep in containers, where it stops nesting)."""
        r = self.rng
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Annotated:
            return self.draw(args[0], name, depth)
        if origin in (types.UnionType, typing.Union):
            options = [a for a in args if a is not type(None)]
            if len(options) < len(args) and r.random() < 0.3:
                return None
            return self.draw(r.choice(options), name, depth)
        if hint == Key:  # a delivery: of a seq and attempt the node handed out, mostly
            return (self.number("seq"), self.number("attempt"))
        if origin in (list, tuple, Sequence) or hint in (list, tuple):
            if origin is tuple and args and args[-1] is not Ellipsis:
                return tuple(self.draw(a, "", depth + 1) for a in args)
            item = args[0] if args else Any
            count = r.choice((0, 1, 1, 2, 5, 40))
            return [self.draw(item, name, depth + 1) for _ in range(count)]
        if origin is dict or hint is dict:
            value = args[1] if args else Any
            return {self.text(): self.draw(value, "", depth + 1) for _ in range(r.randint(0, 3))}
        if hint is Any:
            kinds = (int, float, str, bytes, bool, None, list[Any], dict[str, Any])
            return self.draw(r.choice(kinds[: 6 if depth > 2 else 8]), name, depth)
        if hint is None or hint is type(None):
            return None
        if hint is bool:
            return r.random() < 0.5
        if hint is int:
            return self.number(name)
        if hint is float:
            edges = (0.0, -1.0, 0.001, 1e12, math.inf, -math.inf, math.nan)
            return r.choice((*edges, r.random() * 60))
        if hint is str:
            return self.text()
        if hint is bytes:
            return r.choice((b"", b"x", r.randbytes(r.randint(0, 64)), b"y" * 100_000))
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return r.choice(list(hint))
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            return self.build(hint)
        raise TypeError(f"no values for {hint!r}")

    def build(self, cls: type) -> Any:
        """An instance of dataclass ``cls`` with drawn fields (its defaults, sometimes);
        the fields alone when it refuses them (the wire carries them as they are)."""
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if not f.init or (f.default is not dataclasses.MISSING and self.rng.random() < 0.3):
                continue
            if f.default_factory is not dataclasses.MISSING and self.rng.random() < 0.3:
                continue
            kwargs[f.name] = self.draw(hints[f.name], f.name)
        try:
            return cls(**kwargs)
        except (EomsgError, TypeError, ValueError):  # it checks itself: send its fields
            return kwargs

    def number(self, name: str) -> int:
        r = self.rng
        for key, known in self.seen.items():
            if key in name and known and r.random() < 0.7:
                # One draw, whatever the node has said so far: the frames that follow
                # stay those of the seed, however the answers were timed.
                return int(known[int(r.random() * len(known))]) + r.choice((0, 0, 0, 1, -1))
        return r.choice((0, 1, -1, 2, 7, 255, 4096, 2**31, 2**63 - 1, -(2**63), r.randint(0, 99)))

    def text(self) -> str:
        r = self.rng
        if r.random() < 0.8:
            return r.choice(self.texts)
        chars = (r.choice((r.randint(32, 126), r.randint(0x80, 0xD7FF))) for _ in range(12))
        return "".join(map(chr, chars))[: r.randint(1, 12)]


class Frames:
    """The frames of one session, drawn from ``values``."""

    def __init__(self, values: Values) -> None:
        self.values = values
        self.rng = values.rng
        self.ops: list[Operation[Any, Any]] = sorted(OPERATIONS.values(), key=lambda o: o.name)

    def next(self) -> tuple[str, bytes]:
        """One frame: its kind (for the counts) and its bytes, length prefix included."""
        roll = self.rng.random()
        if roll < 0.75:
            kind, body = self.request()
            try:
                return kind, _frame(body)
            except (TypeError, ValueError, OverflowError):  # not even msgpack can carry it
                roll = 0.99
        if roll < 0.88:
            cls = self.rng.choice(REQUESTS)
            count = self.rng.randint(0, 6)
            body = [cls.TYPE, *(self.values.draw(Any) for _ in range(count))]
            return f"{cls.__name__} (wrong values)", _frame(body)
        if roll < 0.97:
            _, body = self.request()
            data = bytearray(_frame(body))
            for _ in range(self.rng.randint(1, 4)):
                at = self.rng.randrange(len(data))
                data[at] = self.rng.randrange(256)
            return "flipped bytes", bytes(data)
        return "random bytes", self.rng.randbytes(self.rng.randint(1, 64))

    def request(self) -> tuple[str, list[Any]]:
        """A request of the right shape; a call names an operation and its arguments."""
        cls = self.rng.choice(REQUESTS[:8] + (ev.Call,) * 4)
        if cls is ev.Call:
            op = self.rng.choice(self.ops)
            hints = _arguments(op)
            args = {k: self.values.draw(h, k) for k, h in hints.items() if self.rng.random() < 0.9}
            try:
                wire_args = encode_args(op, args)
            except (EomsgError, TypeError, ValueError, AttributeError):
                wire_args = {k: _plain(v) for k, v in args.items()}
            return f"call {op.name}", [ev.Call.TYPE, self.values.number("rid"), op.name, wire_args]
        event = self.values.build(cls)
        try:
            return cls.__name__, event.to_wire()
        except (TypeError, ValueError, AttributeError):
            return f"{cls.__name__} (unpackable)", [cls.TYPE]


def _arguments(op: Operation[Any, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(op.signature, include_extras=True)
    hints.pop("return", None)
    return hints


def _plain(value: Any) -> Any:
    """``value`` as msgpack can carry it (dataclasses as their fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _frame(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


class Session:
    """One connection to the node's Unix socket, past its hello."""

    def __init__(self, sock_path: Path, timeout: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(sock_path))
        self.conn = Connection(Role.CLIENT)
        self.sock.sendall(self.conn.send(ev.Hello(ev.PROTOCOL_VERSION, "fuzz")))
        welcome = self.read_one()
        if not isinstance(welcome, ev.Welcome):
            raise EomsgError(f"the node did not welcome a client: {welcome!r}")
        self.raw = b""  # what came that the client's connection could not follow

    def read_one(self) -> Event | None:
        while True:
            event = self.conn.next_event()
            if event is PEER_CLOSED:
                return None
            if event is not NEED_DATA:
                assert isinstance(event, Event)
                return event
            data = self.sock.recv(1 << 16)
            self.conn.receive_data(data)
            if not data:
                return None

    def send_raw(self, data: bytes) -> bool:
        """Send bytes the client's own state machine does not see; False once the node
        hung up."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def drain(self, wait: float) -> list[Event]:
        """What the node sent within ``wait`` seconds of silence (it may hang up)."""
        self.sock.settimeout(wait)
        out: list[Event] = []
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                self.raw += data
                out.extend(_events(self))
        except (TimeoutError, BlockingIOError, OSError):
            pass
        return out

    def close(self) -> None:
        self.sock.close()


def _events(session: Session) -> list[Event]:
    """The server's events in ``session.raw`` (frames whose bodies fail to decode as a
    server's are skipped: this client sent frames its state machine never saw)."""
    out: list[Event] = []
    raw = session.raw
    while len(raw) >= 4:
        (size,) = struct.unpack(">I", raw[:4])
        if len(raw) < 4 + size:
            break
        body, raw = raw[4 : 4 + size], raw[4 + size :]
        try:
            decoded = ev.decode_event(msgpack.unpackb(body, raw=False))
        except (ProtocolError, ValueError, msgpack.UnpackException):
            continue
        out.append(decoded)
    session.raw = raw
    return out


def remember(values: Values, events: Sequence[Event]) -> None:
    """Keep what the node said that is worth sending back to it."""
    for e in events:
        if isinstance(e, ev.Deliver):
            for d in e.deliveries:
                values.seen["seq"].append(d.seq)
                values.seen["attempt"].append(d.attempt)
        if isinstance(e, ev.FlowChanged):
            values.seen["flow"].append(e.flow)
            values.seen["epoch"].append(e.epoch)
    for known in values.seen.values():
        del known[:-64]


def run_sessions(
    sock_path: Path,
    values: Values,
    limit: tuple[float, int | None],
    alive: Callable[[], bool],
    restart: Callable[[], None],
    workdir: Path,
    say: Callable[[str], None] = lambda _: None,
) -> Findings:
    """Sessions of fuzzed frames until ``limit`` (seconds, and sessions if not None);
    after each, the node must answer."""
    seconds, sessions = limit
    found = Findings()
    frames = Frames(values)
    started = time.monotonic()
    while time.monotonic() - started < seconds and (sessions is None or found.sessions < sessions):
        found.sessions += 1
        sent: list[tuple[str, bytes]] = []
        try:
            session = Session(sock_path, 60.0)
        except (OSError, EomsgError) as e:
            found.unresponsive += 1
            say(f"no session: {e}")
            restart()
            continue
        answers: list[Event] = []
        try:
            for _ in range(values.rng.randint(1, 40)):
                kind, data = frames.next()
                sent.append((kind, data))
                found.frames[kind.split(" (")[0] if kind.startswith("call") else kind] += 1
                if not session.send_raw(data):
                    break
                new = session.drain(0.002)
                remember(values, new)
                answers += new
            answers += session.drain(0.05)
        finally:
            session.close()
        found.internal += _internal(answers, sent)
        if not alive():
            found.crashes.append(_keep(workdir, len(found.crashes), sent))
            say(f"the node died: the frames are in {found.crashes[-1]}")
            restart()
        elif not _answers(sock_path):
            found.unresponsive += 1
            say("the node did not answer within a minute")
            restart()
    found.seconds = time.monotonic() - started
    return found


def _internal(answers: Sequence[Event], sent: Sequence[tuple[str, bytes]]) -> list[str]:
    """The answers saying ``internal error``, each with the frames of the rid it names
    (a session may send several with one rid: each is named; "?" when none had it)."""
    by_rid: dict[int, list[tuple[str, bytes]]] = {}
    for kind, data in sent:
        with contextlib.suppress(Exception):  # a broken frame has no rid to name
            body = msgpack.unpackb(data[4:], raw=False)
            if type(body) is list and len(body) > 1 and type(body[1]) is int:
                by_rid.setdefault(body[1], []).append((kind, data))
    out = []
    for a in answers:
        if isinstance(a, ev.Error) and "internal error" in a.message:
            frames = by_rid.get(a.rid, [("?", b"")])
            kinds = " or ".join(dict.fromkeys(kind for kind, _ in frames))
            sent_as = " / ".join(repr(data[:200]) for _, data in frames)
            out.append(f"{kinds} (rid {a.rid}): {a.message[:300]} after {sent_as}")
    return out


def _answers(sock_path: Path) -> bool:
    """Whether a fresh client gets a welcome and a pong (within a minute)."""
    try:
        session = Session(sock_path, 60.0)
        try:
            session.sock.sendall(session.conn.send(ev.Ping(1)))
            while (event := session.read_one()) is not None:
                if isinstance(event, ev.Pong):
                    return True
            return False
        finally:
            session.close()
    except (OSError, EomsgError):
        return False


def _keep(workdir: Path, n: int, sent: list[tuple[str, bytes]]) -> str:
    path = workdir / f"crash-{n}.txt"
    path.write_text("".join(f"{kind}\t{data.hex()}\n" for kind, data in sent))
    path.chmod(0o600)
    return str(path)


def fuzz(
    workdir: Path,
    seconds: float,
    seed: int,
    say: Callable[[str], None] = lambda _: None,
    sessions: int | None = None,
) -> Findings:
    """Start a node on ``workdir/node`` (queues ``q`` and ``s``, messages in them) and
    fuzz it for ``seconds`` (or ``sessions``, if that comes first) from ``seed``; what
    was found."""
    import eomsg
    from eomsg.core.message import Outgoing
    from eomsg.core.queues import QueueConfig

    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    outside = workdir / "outside"  # where hostile queries try to write
    outside.mkdir(mode=0o700, exist_ok=True)
    data = workdir / "node"
    node = Node(
        "node", [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json"], workdir
    )

    def start() -> None:
        node.kill()
        node.start()
        with eomsg.connect(data) as client:
            names = client.queue_names()
            for name, active in (("q", 1), ("s", 0)):  # q exclusive, s shared
                if name not in names:
                    client.create_queue(QueueConfig(name, ("t/>",), max_active=active))
            client.publish_batch([Outgoing("t/x", b"m%d" % i) for i in range(100)])

    start()
    try:
        found = run_sessions(
            data / "eomsg.sock", Values(random.Random(seed), outside), (seconds, sessions),
            lambda: node.alive, start, workdir, say,
        )  # fmt: skip
    finally:
        node.stop()
    found.escapes = [str(p) for p in outside.iterdir()]
    found.tracebacks = _raised(workdir / "node.log")
    return found


def _raised(log: Path) -> list[str]:
    """The last line of each traceback in a node's log: what a handler raised."""
    out, inside = [], False
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("Traceback (most recent call last)"):
            inside = True
        elif inside and line and not line.startswith((" ", "\t")):
            if not line.startswith(("The above exception", "During handling")):
                out.append(line)
            inside = False
    return out
