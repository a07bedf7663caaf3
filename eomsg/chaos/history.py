"""A history: what every client of a fault-injection run did and what it saw, as events
in the order they happened (Jepsen's model). An operation records when it was invoked
and when it completed, and its outcome — ok, failed (it certainly changed nothing) or
unknown (a lost reply, a killed node): the checker (:mod:`eomsg.chaos.check`) holds each
outcome to exactly what it promises.

Times are seconds on one machine's monotonic clock (``time.monotonic`` is system-wide
on Linux), so two processes' events can be ordered in real time: an operation that
completed before another was invoked happened before it.

A history is kept as JSON lines, one event each, so a run killed half-way still leaves
every line it wrote, and a history is read back with :func:`read`."""

from __future__ import annotations

import enum
import json
import os
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, TextIO

from eomsg.errors import InvalidInput


class Outcome(enum.Enum):
    """What a client knows of an operation it ran."""

    OK = "ok"  # done, durably
    FAILED = "failed"  # refused: it changed nothing
    UNKNOWN = "unknown"  # no answer: it may have happened, once at most

    @classmethod
    def of(cls, text: str) -> Outcome:
        try:
            return cls(text)
        except ValueError as e:
            raise InvalidInput(f"outcome {text!r} is not ok, failed or unknown") from e


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a history."""

    KIND: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.KIND}
        for name, value in asdict(self).items():
            out[name] = value.value if isinstance(value, Outcome) else value
        return out


@dataclass(frozen=True, slots=True)
class QueueDeclared(Event):
    """A queue of the run. ``exclusive``: one active consumer at a time, so a flow's
    epoch fences the one before it; ``ordered``: what it delivers and what is applied
    from it must follow its order (what eomsg promises of it)."""

    KIND: ClassVar[str] = "queue"
    queue: str
    exclusive: bool
    ordered: bool


@dataclass(frozen=True, slots=True)
class Published(Event):
    """A publish of the message ``id`` on ``node`` (``origin`` of per-origin order),
    which the queues ``expect`` are subscribed to."""

    KIND: ClassVar[str] = "publish"
    id: str
    node: str
    expect: tuple[str, ...]
    outcome: Outcome
    invoked: float
    completed: float


@dataclass(frozen=True, slots=True)
class Received(Event):
    """A delivery handed to ``consumer``: the message ``id`` at ``seq`` of ``queue``, its
    ``attempt``, in the flow of ``epoch`` (0 without one), at time ``at``."""

    KIND: ClassVar[str] = "receive"
    consumer: str
    queue: str
    id: str
    seq: int
    attempt: int
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class Settled(Event):
    """A delete of the delivery ``(seq, attempt)`` of ``queue`` in ``epoch``, and what
    the node answered."""

    KIND: ClassVar[str] = "settle"
    consumer: str
    queue: str
    seq: int
    attempt: int
    epoch: int
    outcome: Outcome
    invoked: float
    completed: float


@dataclass(frozen=True, slots=True)
class Activity(Event):
    """``consumer`` was told its flow on ``queue`` became active (or inactive) in
    ``epoch``, at time ``at``."""

    KIND: ClassVar[str] = "activity"
    consumer: str
    queue: str
    epoch: int
    active: bool
    at: float


@dataclass(frozen=True, slots=True)
class Applied(Event):
    """The message ``id`` of ``queue`` is in the application database ``app``; the
    events of one ``app`` come in the order it applied them (read back after the run)."""

    KIND: ClassVar[str] = "apply"
    app: str
    queue: str
    id: str


@dataclass(frozen=True, slots=True)
class Transacted(Event):
    """``consumer`` ran the transaction ``txid`` and was told ``outcome`` of its commit
    (ok: committed; failed: rolled back, nothing took effect; unknown: no answer)."""

    KIND: ClassVar[str] = "txn"
    consumer: str
    txid: str
    outcome: Outcome
    invoked: float
    completed: float


@dataclass(frozen=True, slots=True)
class Resolved(Event):
    """Where the transaction ``txid`` stands once the run has healed and drained:
    ``committed``, ``aborted``, or ``prepared`` — still in doubt."""

    KIND: ClassVar[str] = "resolved"
    txid: str
    state: str


KINDS: dict[str, type[Event]] = {
    cls.KIND: cls
    for cls in (
        QueueDeclared,
        Published,
        Received,
        Settled,
        Activity,
        Applied,
        Transacted,
        Resolved,
    )
}


def from_json(line: dict[str, Any]) -> Event:
    """The event a history line holds; InvalidInput, naming what is wrong, otherwise."""
    if not isinstance(line, dict):
        raise InvalidInput("a history line must be a JSON object")
    cls = KINDS.get(line.get("kind"))  # type: ignore[arg-type]
    if cls is None:
        raise InvalidInput(f"unknown history event kind {line.get('kind')!r}")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in line:
            raise InvalidInput(f"history event {cls.KIND!r} lacks {f.name!r}")
        value = line[f.name]
        if f.name == "outcome":
            value = Outcome.of(value)
        elif f.name == "expect":
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


def read(path: Path) -> list[Event]:
    """Every event of the history file ``path``; a last line cut short by a kill is
    left out (every line before it was whole when written)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out = []
    for number, text in enumerate(lines, 1):
        if not text:
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as e:
            if number == len(lines):  # written half when its writer was killed
                break
            raise InvalidInput(f"{path}:{number}: not a JSON line: {e}") from e
        try:
            out.append(from_json(line))
        except InvalidInput as e:
            raise InvalidInput(f"{path}:{number}: {e.message}") from e
    return out


class Recorder:
    """Appends events to a history file, a whole line at a time; thread-safe. The file
    is its owner's alone."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        _cut_torn_line(fd)
        self._file: TextIO = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, *events: Event) -> None:
        text = "".join(json.dumps(e.to_json(), separators=(",", ":")) + "\n" for e in events)
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _cut_torn_line(fd: int) -> None:
    """Cut the file back to its last whole line: one cut short when its writer was
    killed would otherwise end up in the middle of the history, once a restarted writer
    appends after it."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - 4096)
        chunk = os.pread(fd, end - start, start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            end = start + at + 1
            break
        end = start
    if end != size:
        os.ftruncate(fd, end)
