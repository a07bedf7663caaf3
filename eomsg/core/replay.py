"""The rules of a replay: which messages it selects, how their sequence range splits into
Spark partitions, the ids re-published messages carry, a job's digest and its life.

Pure: no I/O, no clock. Exactly-once across retries rests on three facts kept here —
a job's range is fixed once planned (the log below its end never changes), a partition
is a half-open sequence range read the same way every time, and every output is named by
(job id, source seq), so writing it again finds it already there.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from eomsg.core.durations import parse_duration
from eomsg.core.topics import pattern_regex, validate_pattern
from eomsg.errors import IllegalMove, InvalidInput, LogCollected, SinkConflict

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_job_id(job_id: str) -> str:
    """``job_id`` if it is 1-128 letters, digits, ``.``, ``_`` or ``-`` (it names files)."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InvalidInput(
            f"job id {job_id!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return job_id


def parse_time(text: str, now: float) -> float:
    """Seconds since the epoch for ``--since``/``--until``: an ISO 8601 date or time
    (UTC unless it names an offset) or a duration meaning that long before ``now``."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return now - parse_duration(text)
        except InvalidInput:
            raise InvalidInput(
                f"time {text!r} is not understood: use an ISO date or time "
                "(2026-11-01, 2026-11-01T08:00:00+01:00) or a duration ago (90m, 2d)"
            ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True)
class Selection:
    """The messages a replay reads: topics matching any of ``patterns`` (all topics when
    empty), with ``from_seq <= seq <= to_seq`` and ``since <= published_at < until``
    (times in microseconds since the epoch). Immutable, so a plan can be shipped to
    executors and recorded with its job."""

    patterns: tuple[str, ...] = ()
    from_seq: int = 1
    to_seq: int | None = None
    since_us: int | None = None
    until_us: int | None = None

    def __post_init__(self) -> None:
        for pattern in self.patterns:
            validate_pattern(pattern)
        if self.from_seq < 1:
            raise InvalidInput("--from-seq must be 1 or more")
        if self.to_seq is not None and self.to_seq < self.from_seq:
            raise InvalidInput("--to-seq must not be below --from-seq")
        if None not in (self.since_us, self.until_us) and self.until_us <= self.since_us:  # type: ignore[operator]
            raise InvalidInput("--until must be later than --since")

    def regex(self) -> str | None:
        """One regular expression for the topics, or None for every topic."""
        if not self.patterns:
            return None
        return "|".join(f"(?:{pattern_regex(p)})" for p in self.patterns)

    def to_json(self) -> dict[str, Any]:
        return {
            "patterns": list(self.patterns),
            "from_seq": self.from_seq,
            "to_seq": self.to_seq,
            "since_us": self.since_us,
            "until_us": self.until_us,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Selection:
        try:
            patterns = obj.get("patterns") or []
            if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
                raise TypeError("patterns must be a list of strings")
            ints = {k: obj.get(k) for k in ("from_seq", "to_seq", "since_us", "until_us")}
            for name, value in ints.items():
                if value is not None and type(value) is not int:
                    raise TypeError(f"{name} must be an integer")
            return cls(
                tuple(patterns),
                ints["from_seq"] if ints["from_seq"] is not None else 1,
                ints["to_seq"],
                ints["since_us"],
                ints["until_us"],
            )
        except (AttributeError, TypeError) as e:
            raise InvalidInput(f"malformed log selection: {e}") from e


@dataclass(frozen=True, slots=True)
class SeqRange:
    """The half-open sequence range ``[lo, hi)``: one Spark partition's share."""

    lo: int
    hi: int

    def __len__(self) -> int:
        return max(0, self.hi - self.lo)


def split(lo: int, hi: int, parts: int) -> list[SeqRange]:
    """``[lo, hi)`` cut into at most ``parts`` contiguous ranges of near-equal width, in
    order; none empty, none overlapping, together exactly ``[lo, hi)``."""
    if hi <= lo:
        return []
    parts = max(1, min(parts, hi - lo))
    width, extra = divmod(hi - lo, parts)
    out, start = [], lo
    for i in range(parts):
        end = start + width + (1 if i < extra else 0)
        out.append(SeqRange(start, end))
        start = end
    return out


def check_retained(
    what: str, sel: Selection, lo: int, hi: int, horizon: tuple[int, int | None]
) -> None:
    """Raise LogCollected unless everything ``what`` (a job, a stream's batch) reads is
    still in the log: its range ``[lo, hi)``, the seqs it names from ``sel.from_seq``
    on, and the messages published since ``sel.since_us``. ``horizon`` is the log's
    first kept seq (1 when nothing was ever collected) and the latest publish time among
    the messages collected (None when none was)."""
    first, collected_until = horizon
    if first <= 1:
        return
    gone = f"the log keeps seq {first} and later (older messages were collected)"
    if hi > lo and lo < first:
        raise LogCollected(f"{what} reads seq {lo} .. {hi - 1}, but {gone}")
    if sel.from_seq < first and sel.from_seq > 1:
        raise LogCollected(f"{what} starts at seq {sel.from_seq}, but {gone}")
    if sel.since_us is not None and collected_until is not None and sel.since_us <= collected_until:
        raise LogCollected(
            f"{what} reads messages published since {_iso_us(sel.since_us)}, but {gone}"
        )


def _iso_us(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1_000_000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def replay_id(job_id: str, seq: int, ordinal: int = 0) -> str:
    """The id a replay into a topic gives the ``ordinal``-th output row of source message
    ``seq``: the same on every run of the job, so the node's dedup drops repeats."""
    return f"replay:{job_id}:{seq}" if ordinal == 0 else f"replay:{job_id}:{seq}.{ordinal}"


def default_job_id(spec: Mapping[str, Any]) -> str:
    """A job id derived from what the user asked for (not from what the log holds now),
    so running the same command again names the same job."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return "replay-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def digest(parts: Iterable[tuple[int, int, str]]) -> str:
    """The output digest of a job from its parts' ``(index, rows, sha256)``: equal for
    equal output however the parts were scheduled."""
    h = hashlib.sha256()
    for index, rows, part_hash in sorted(parts):
        h.update(f"{index}:{rows}:{part_hash}\n".encode())
    return h.hexdigest()


class JobStatus(StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class JobEvent(StrEnum):
    START = "start"
    FINISH = "finish"
    FAIL = "fail"
    REVERT = "revert"  # a forced run that changed no output: the done job it was, again


# (status before or None for a new job, event) -> status after. A finished job starts
# again only when forced; that rule lives in plan_action, which is the only caller.
JOB_TRANSITIONS: dict[tuple[JobStatus | None, JobEvent], JobStatus] = {
    (None, JobEvent.START): JobStatus.RUNNING,
    (JobStatus.RUNNING, JobEvent.START): JobStatus.RUNNING,  # a run that died: again
    (JobStatus.FAILED, JobEvent.START): JobStatus.RUNNING,
    (JobStatus.DONE, JobEvent.START): JobStatus.RUNNING,  # --force
    (JobStatus.RUNNING, JobEvent.FINISH): JobStatus.DONE,
    (JobStatus.RUNNING, JobEvent.FAIL): JobStatus.FAILED,
    (JobStatus.RUNNING, JobEvent.REVERT): JobStatus.DONE,
}


def job_transition(status: JobStatus | None, event: JobEvent, job_id: str) -> JobStatus:
    """The status after ``event``; IllegalMove names the job, event and status."""
    try:
        return JOB_TRANSITIONS[(status, event)]
    except KeyError:
        raise IllegalMove(
            f"replay job {job_id}: cannot {event.value} in status "
            f"{status.value if status else 'new'}"
        ) from None


class Action(StrEnum):
    """What running a job does now."""

    RUN = "run"  # a new job, or --force
    RESUME = "resume"  # an earlier attempt died or failed: run it again from the start
    RECORD = "record"  # the sink committed but the job was not marked done: mark it
    SKIP = "skip"  # done: nothing to do


def plan_action(status: JobStatus | None, *, sink_committed: bool, force: bool) -> Action:
    """The one rule that makes a re-run safe: a done job is skipped unless forced, and a
    job whose sink already holds its output — the output of this run's options and range
    (:meth:`Output.made_by`), not merely of its job id — only needs its record finished."""
    if status is JobStatus.DONE:
        return Action.RUN if force else Action.SKIP
    if sink_committed and not force:
        return Action.RECORD
    return Action.RUN if status is None else Action.RESUME


@dataclass(frozen=True)
class JobRecord:
    """A replay job as the log's store records it. ``lo``/``hi`` are the planned
    half-open sequence range; ``rows`` and ``digest`` are set once it is done."""

    job_id: str
    status: JobStatus
    spec: dict[str, Any]
    lo: int
    hi: int
    rows: int | None = None
    digest: str | None = None
    recorded_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status.value,
            "spec": self.spec,
            "lo": self.lo,
            "hi": self.hi,
            "rows": self.rows,
            "digest": self.digest,
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> JobRecord:
        try:
            return cls(
                validate_job_id(obj["job_id"]),
                JobStatus(obj["status"]),
                _json_object(obj["spec"]),
                int(obj["lo"]),
                int(obj["hi"]),
                None if obj.get("rows") is None else int(obj["rows"]),
                _opt_text(obj.get("digest")),
                float(obj.get("recorded_at") or 0.0),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(f"malformed replay job record: {e}") from e


def _json_object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object (as a job's spec is stored); ValueError if not."""
    if not isinstance(value, Mapping):
        raise ValueError(f"a spec is an object, not {type(value).__name__}")
    try:
        return dict(json.loads(json.dumps(value, allow_nan=False)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"a spec holds only JSON values ({e})") from e


def _opt_text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"a digest is text, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Output:
    """What a sink holds for a job, as its manifest or ledger says: rows and digest, and
    the options (``spec``) and range of the run that made them. ``spec`` is None for
    output committed by an eomsg that did not record them: it is no run's output here."""

    rows: int
    digest: str
    spec: dict[str, Any] | None = None
    lo: int | None = None
    hi: int | None = None

    def made_by(self, record: JobRecord) -> bool:
        """Whether this is the output of ``record``'s options and range."""
        return self.spec is not None and (self.spec, self.lo, self.hi) == (
            record.spec,
            record.lo,
            record.hi,
        )

    def describes(self, record: JobRecord) -> bool:
        """Whether ``record`` (a done job) describes this output: its options and range,
        rows and digest (an output that does not say what made it: rows and digest)."""
        made = self.spec is None or self.made_by(record)
        return made and (self.rows, self.digest) == (record.rows, record.digest)


def check_output(
    sink: str,
    previous: JobRecord | None,
    attempt: JobRecord,
    output: Output | None,
    *,
    ledger: bool,
    force: bool,
) -> None:
    """Refuse a run whose job record and sink disagree in a way only the user can settle,
    before anything is recorded. ``previous`` is the job's record, ``attempt`` what this
    run would record (``running``, its options and range), ``output`` what ``sink`` holds
    for the job id; ``ledger`` says whether the sink can say (a topic cannot).

    - A done job, not forced, whose sink no longer holds the output its record describes
      (removed, or replaced by another run): SinkConflict, not a skip that claims it.
    - Output of this job id that another run made (other options or range, another log,
      an eomsg that did not say), unless forced, or unless this run carries on the
      record's own unfinished run (which was forced over it): SinkConflict.
    - Other options for a job that published into a topic: a topic cannot take back what
      it was given, so the record could no longer describe it — InvalidInput, forced or
      not (another job id runs them)."""
    job = attempt.job_id
    if previous is not None and previous.spec != attempt.spec:
        published = previous.spec.get("sink")
        if isinstance(published, str) and published.startswith("topic:"):
            raise InvalidInput(
                f"job {job} publishes its output to {published}, which cannot take back what "
                "it was given: run these options under another --job-id"
            )
    if not ledger:
        return
    if previous is not None and previous.status is JobStatus.DONE and not force:
        if output is None or not output.describes(previous):
            raise SinkConflict(
                f"job {job} is recorded done ({previous.rows} rows), but {sink} no longer "
                "holds that output (removed, or replaced by another run): --force runs it again"
            )
        return
    carries_on = previous is not None and (previous.spec, previous.lo, previous.hi) == (
        attempt.spec,
        attempt.lo,
        attempt.hi,
    )
    if output is not None and not output.made_by(attempt) and not force and not carries_on:
        raise SinkConflict(
            f"{sink} holds output of job {job} that another run made (other options, another "
            "log, or an older eomsg): give another --job-id, or --force to replace it"
        )


def after_failure(
    previous: JobRecord | None, attempt: JobRecord, *, output_touched: bool
) -> tuple[JobRecord, JobEvent]:
    """What a run that ends short of done records, and by which event: the job's record
    describes its output, so a run that never reached its sink puts back the record it
    found (a done job reverts to done; an unfinished one stays what it was, failed); a new
    job, or a run whose sink may hold some of its output (a topic takes it message by
    message), is recorded failed."""
    if output_touched or previous is None:
        return attempt, JobEvent.FAIL
    return previous, JobEvent.REVERT if previous.status is JobStatus.DONE else JobEvent.FAIL
