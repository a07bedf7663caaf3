"""The replay job behind ``eomsg spark-replay``: a plan computed first (printed by
``--dry-run``), then carried out.

Carrying it out: record the job as running in the log's store; Spark reads the planned
range through the ``eomsg`` source, decodes, transforms and stages the output; the sink
commits it atomically; the job is recorded done with its rows and digest. A run that dies
anywhere is safe to start again: the range was fixed when the job was first recorded,
staging starts afresh, and each sink's commit notices output already in place.

A job's record describes its output: it is recorded done only with output its own run
made (the sink says which run made what it holds), and a run that fails before its sink
took anything puts back the record it found (``core.replay.after_failure``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from eomsg.client.broker import Broker
from eomsg.core.replay import (
    Action,
    JobEvent,
    JobRecord,
    JobStatus,
    Output,
    Selection,
    SeqRange,
    after_failure,
    check_output,
    check_retained,
    default_job_id,
    parse_time,
    plan_action,
    split,
    validate_job_id,
)
from eomsg.errors import (
    DataDirLocked,
    EomsgError,
    Interrupted,
    InvalidInput,
    ReplayFailed,
    SinkConflict,
    TransformError,
    one_line,
)
from eomsg.failpoints import failpoint
from eomsg.spark.sinks import Sink, Staged, empty, parse_sink, stage
from eomsg.spark.source import NAME, ROWS_PER_PARTITION, Route
from eomsg.spark.transform import Transform

T = TypeVar("T")
OpenBroker = Callable[[], contextlib.AbstractContextManager[Broker]]
Report = Callable[[str], None]


@dataclass(frozen=True)
class ReplaySpec:
    """A replay as the user asked for it (times as given, not yet resolved)."""

    sink: str
    topic: str | None = None
    queue: str | None = None
    from_seq: int | None = None
    to_seq: int | None = None
    since: str | None = None
    until: str | None = None
    transform: str | None = None
    sql: str | None = None
    decode: str = "text"
    job_id: str | None = None
    partitions: int | None = None

    def identity(self) -> dict[str, Any]:
        """What names the job: everything but its id and how it is split."""
        return {k: v for k, v in asdict(self).items() if k not in ("job_id", "partitions")}


@dataclass(frozen=True)
class ReplayPlan:
    """What a run will do, decided before anything is written."""

    job_id: str
    action: Action
    spec: ReplaySpec
    selection: Selection
    lo: int
    hi: int
    parts: list[SeqRange]
    route: Route
    sink: Sink
    transform: Transform
    staging: Path
    previous: JobRecord | None = None
    committed: Output | None = field(default=None)  # what the sink holds for the job
    data: Path = Path()  # the log's data directory, and the token and TLS CA of its
    token: str | None = None  # node: for the route, decided again when the run starts
    tls_ca: str | None = None

    def lines(self) -> list[str]:
        """The plan for people (``--dry-run``)."""
        sel = self.selection
        what = ", ".join(sel.patterns) if sel.patterns else "every topic"
        times = ""
        if sel.since_us is not None or sel.until_us is not None:
            times = f", published {_iso(sel.since_us)} .. {_iso(sel.until_us)}"
        state = self.previous.status.value if self.previous else "new"
        return [
            f"job        {self.job_id} ({state}): {_ACTIONS[self.action]}",
            f"select     {what}{times}",
            f"range      seq {self.lo} .. {self.hi - 1} ({len(self.parts)} partitions)"
            if self.hi > self.lo
            else "range      empty (no message matches)",
            f"read from  {self.route.describe()}",
            f"transform  {self.transform.describe()}",
            f"stage in   {self.staging}",
            f"sink       {self.sink.text}",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "action": self.action.value,
            "status": self.previous.status.value if self.previous else None,
            "selection": self.selection.to_json(),
            "lo": self.lo,
            "hi": self.hi,
            "partitions": len(self.parts),
            "read_from": self.route.describe(),
            "transform": self.transform.describe(),
            "sink": self.sink.text,
        }


_ACTIONS = {
    Action.RUN: "will run",
    Action.RESUME: "an earlier run did not finish; will run again",
    Action.RECORD: "output already committed; will record the job done",
    Action.SKIP: "already done; nothing to do (use --force to run again)",
}


def _iso(us: int | None) -> str:
    if us is None:
        return "…"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us / 1_000_000))


@dataclass(frozen=True)
class ReplayResult:
    job_id: str
    status: str  # "done" (ran now) or "skipped" (was done already)
    rows: int
    digest: str | None

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "status": self.status, "rows": self.rows}


def _route(node: Broker, data: Path, token: str | None, tls_ca: str | None) -> Route:
    """How Spark's executors read the log: from the store file when the node was
    embedded here (it is closed by then), else through the running node — wherever it
    is, with the token and TLS CA this command was given."""
    if node.embedded:
        return Route(data=str(data.resolve()))
    return Route(broker=node.address, token=token, tls_ca=tls_ca)


def plan(
    spec: ReplaySpec,
    node: Broker,
    *,
    data: Path,
    force: bool = False,
    token: str | None = None,
    tls_ca: str | None = None,
    now: float | None = None,
) -> ReplayPlan:
    """Decide what running ``spec`` does, reading the log's store through ``node`` and
    writing nothing. A job seen before keeps the range it was first planned with, forced
    or not (only new options, with --force, plan it anew). LogCollected if any of that
    range — or of an explicit --from-seq or --since — is no longer in the log; a record
    and sink that disagree are refused as ``core.replay.check_output`` says."""
    now = time.time() if now is None else now
    if spec.topic and spec.queue:
        raise InvalidInput("give --topic or --queue, not both")
    if spec.partitions is not None and spec.partitions < 1:
        raise InvalidInput("--partitions must be 1 or more")
    sink = parse_sink(spec.sink)
    transform = Transform.load(spec.transform, spec.sql, spec.decode)
    job_id = validate_job_id(spec.job_id) if spec.job_id else default_job_id(spec.identity())
    if spec.queue:
        patterns = node.queue_config(spec.queue).subscriptions
    else:
        patterns = tuple(p.strip() for p in (spec.topic or "").split(",") if p.strip())
    sel = Selection(
        patterns,
        spec.from_seq or 1,
        spec.to_seq,
        None if spec.since is None else int(parse_time(spec.since, now) * 1_000_000),
        None if spec.until is None else int(parse_time(spec.until, now) * 1_000_000),
    )
    known = node.replay_jobs(job_id)
    previous = known[0] if known else None
    if previous is not None and not force and previous.spec != spec.identity():
        raise InvalidInput(
            f"job {job_id} was run with other options; give another --job-id "
            "(or --force to run it anew with these)"
        )
    if previous is not None and previous.spec == spec.identity():
        lo, hi = previous.lo, previous.hi
    else:
        found = node.log_bounds(sel)
        lo, hi = (found[0], found[1] + 1) if found else (0, 0)
    check_retained(f"job {job_id}", sel, lo, hi, node.log_horizon())
    count = spec.partitions or max(1, -(-(hi - lo) // ROWS_PER_PARTITION))
    sink.check(patterns)  # before Spark: a sink that cannot take the output changes nothing
    committed = sink.committed(job_id)
    attempt = JobRecord(job_id, JobStatus.RUNNING, spec.identity(), lo, hi)
    check_output(sink.text, previous, attempt, committed, ledger=sink.ledger, force=force)
    action = plan_action(
        previous.status if previous else None,
        sink_committed=committed is not None and committed.made_by(attempt),
        force=force,
    )
    return ReplayPlan(
        job_id,
        action,
        spec,
        sel,
        lo,
        hi,
        split(lo, hi, count),
        _route(node, data, token, tls_ca),
        sink,
        transform,
        sink.staging(job_id, data.resolve() if node.embedded or data.is_dir() else Path.cwd()),
        previous,
        committed,
        data,
        token,
        tls_ca,
    )


# Java exceptions whose message is the cause a person can act on, deepest first.
_CAUSE = re.compile(
    r"^(?:Caused by: )?((?:java|javax|org|py4j|scala)\.[\w.$]+(?:Exception|Error)\b.*)$"
)


def _spark_error(e: BaseException) -> EomsgError:
    """A Spark failure as one line naming its cause: a transform's own error keeps its
    type; else the deepest ``Caused by`` of the Java trace (an unknown host, a refused
    connection), not the trace's last frame."""
    text = str(e)
    marker = "TransformError: "
    if marker in text:
        said = text[text.rindex(marker) + len(marker) :].splitlines()[0]
        return TransformError(re.sub(r"\s+SQLSTATE: \w+$", "", said))
    causes = [m.group(1).strip() for line in text.splitlines() if (m := _CAUSE.match(line.strip()))]
    if causes:
        return ReplayFailed(f"the Spark job failed: {causes[-1]}")
    for line in text.strip().splitlines():
        if line.strip() and not line.startswith((" ", "\t")):
            return ReplayFailed(f"the Spark job failed: {line.strip()}")
    return ReplayFailed(f"the Spark job failed: {one_line(e)}")


LOCK_WAIT = 60.0  # seconds a replay waits for a data directory another command holds


def on_store(
    open_broker: OpenBroker, work: Callable[[Broker], T], waiting: Callable[[], None] = lambda: None
) -> T:
    """``work`` done on the log's node, opened for a moment. Another command holding the
    data directory — for a moment of its own (``eomsg inspect jobs``), or lending it for
    looking only while it runs — is waited for, up to LOCK_WAIT, and ``work`` done again
    (each step of a replay may be: its records and commits are idempotent); a replay is
    not lost to a look at it. ``waiting()`` is called once, when the wait begins."""
    deadline = time.monotonic() + LOCK_WAIT
    delay = 0.05
    while True:
        try:
            with open_broker() as node:
                return work(node)
        except DataDirLocked:
            if time.monotonic() + delay > deadline:
                raise
            if delay == 0.05:
                waiting()
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


WAITING = f"waiting for the data directory, which another command holds (at most {LOCK_WAIT:g} s)"


def execute(
    p: ReplayPlan,
    open_broker: OpenBroker,
    spark: Callable[[], Any],
    report: Report = lambda _: None,
    *,
    allow_fewer: bool = False,
    interrupted: Callable[[], bool] = lambda: False,
) -> ReplayResult:
    """Carry out ``p``. ``open_broker`` opens the log's node for a moment (an embedded
    node must not be open while Spark reads its file); ``spark`` gives the session.
    Output the sink already holds for the job is replaced by fewer rows only with
    ``allow_fewer`` (else SinkConflict, the old output and the job's record kept).

    However the run ends short of done — an error, Spark failing, a refusal, Ctrl-C or
    SIGTERM (KeyboardInterrupt) — its staging is removed and the job recorded before the
    error is raised (``core.replay.after_failure``: as it was, if the sink took nothing of
    this run; else ``failed``), so no run leaves its job ``running`` and nothing is left
    behind; an interruption is raised as Interrupted, as is any error once
    ``interrupted()`` says a signal came (a library may turn the KeyboardInterrupt into an
    error of its own)."""
    if p.action is Action.SKIP:
        assert p.previous is not None
        return ReplayResult(p.job_id, "skipped", p.previous.rows or 0, p.previous.digest)
    record = JobRecord(p.job_id, JobStatus.RUNNING, p.spec.identity(), p.lo, p.hi)

    def begin(node: Broker) -> Route:
        node.record_replay(record, JobEvent.START)
        return _route(node, p.data, p.token, p.tls_ca)

    # The route as the run finds the log: planned through a command that lent the
    # directory for looking, it is read from the file or a node once that is gone.
    p = replace(p, route=on_store(open_broker, begin, lambda: report(WAITING)))
    sessions: list[Any] = []
    touched: list[bool] = []  # once the sink may hold some of this run's output

    def started() -> Any:
        sessions.append(spark())
        return sessions[-1]

    try:
        output = _carry_out(p, record, open_broker, started, report, allow_fewer, touched)
        done = replace(record, rows=output.rows, digest=output.digest)
        on_store(
            open_broker,
            lambda node: node.record_replay(done, JobEvent.FINISH),
            lambda: report(WAITING),
        )
    except BaseException as e:
        for session in sessions:  # its tasks stop writing before their staging goes
            with contextlib.suppress(Exception):
                session.sparkContext.cancelAllJobs()
        shutil.rmtree(p.staging, ignore_errors=True)
        back, event = after_failure(p.previous, record, output_touched=bool(touched))
        recorded = _record_failed(open_broker, back, event, interrupted)
        if isinstance(e, KeyboardInterrupt) or interrupted():
            left = "recorded failed" if event is JobEvent.FAIL else "left done, as it was"
            raise Interrupted(
                f"interrupted: job {p.job_id} was "
                + (left if recorded else "left running (its store was busy)")
                + "; run the same command again to redo it"
            ) from e
        if isinstance(e, EomsgError):
            raise
        if isinstance(e, Exception):
            raise _spark_error(e) from e
        raise
    return ReplayResult(p.job_id, "done", output.rows, output.digest)


def _carry_out(
    p: ReplayPlan,
    record: JobRecord,
    open_broker: OpenBroker,
    spark: Callable[[], Any],
    report: Report,
    allow_fewer: bool,
    touched: list[bool],
) -> Output:
    """Stage the job's output with Spark and commit it to the sink (or, when the sink
    holds this run's output already, only say so): what the sink then holds. ``touched``
    is appended to once the sink may hold any of this run's output."""
    if p.action is Action.RECORD:
        assert p.committed is not None
        report(f"output already committed ({p.committed.rows} rows)")
        return p.committed
    staged = _run_spark(p, spark(), report) if p.hi > p.lo else empty(p.staging)
    failpoint("replay.staged")
    if p.committed is not None and staged.rows < p.committed.rows and not allow_fewer:
        raise SinkConflict(
            f"{p.sink.text} holds {p.committed.rows} rows of job {p.job_id}; this run made "
            f"{staged.rows}: the output was left as it was (--allow-fewer replaces it)"
        )
    report(f"staged {staged.rows} rows; committing to {p.sink.text}")
    try:
        on_store(
            open_broker,
            lambda node: p.sink.commit(staged, record, node=node),
            lambda: report(WAITING),
        )
    except SinkConflict:
        raise  # the sink refused it, and so changed nothing
    except BaseException:
        touched.append(True)  # a topic may hold part of it
        raise
    touched.append(True)
    failpoint("replay.committed")
    return Output(staged.rows, staged.digest, record.spec, record.lo, record.hi)


def _record_failed(
    open_broker: OpenBroker, record: JobRecord, event: JobEvent, interrupted: Callable[[], bool]
) -> bool:
    """Record the job as ``record`` by ``event`` (failed, or back as it was), if its store
    can be had (and no second signal cuts that short); whether it was."""
    try:
        on_store(open_broker, lambda node: node.record_replay(record, event))
    except (EomsgError, KeyboardInterrupt):
        return False
    except Exception:
        if interrupted():
            return False
        raise
    return True


def _run_spark(p: ReplayPlan, spark: Any, report: Report) -> Staged:
    from eomsg.spark.source import register

    register(spark)
    sel = p.selection
    reader = spark.read.format(NAME)
    options = {
        "data": p.route.data,
        "broker": p.route.broker,
        "token": p.route.token,
        "tlsCa": p.route.tls_ca,
        "topic": ",".join(sel.patterns),
        "fromSeq": max(p.lo, 1),
        "toSeq": p.hi - 1,
        "partitions": len(p.parts),
        "since": None if sel.since_us is None else _iso_us(sel.since_us),
        "until": None if sel.until_us is None else _iso_us(sel.until_us),
    }
    for key, value in options.items():
        if value is not None and value != "":
            reader = reader.option(key, str(value))
    report(f"reading seq {p.lo} .. {p.hi - 1} in {len(p.parts)} partitions")
    df = p.transform.apply(spark, reader.load())
    return stage(df, p.staging)


def _iso_us(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + (
        f".{us % 1_000_000:06d}+00:00"
    )
