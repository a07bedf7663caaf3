"""``eomsg spark-replay``: replay a slice of the log through Spark into a sink, exactly once."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    SEQ_MAX,
    DataOption,
    Globals,
    JsonOption,
    handles_errors,
    open_broker,
)
from eomsg.cli.output import console, print_json, say, shown
from eomsg.core.replay import Action
from eomsg.errors import Interrupted, ReplayFailed


@handles_errors
def spark_replay(
    sink: Annotated[
        str,
        typer.Option(
            help="Where the output goes: parquet:DIR, duckdb:PATH:TABLE or topic:NAME.",
            show_default=False,
        ),
    ],
    topic: Annotated[
        str | None, typer.Option(help="Topic pattern(s) to replay, comma-separated.")
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Replay what this queue subscribes to.")] = None,
    from_seq: Annotated[
        int | None, typer.Option(min=0, max=SEQ_MAX, help="First sequence number.")
    ] = None,
    to_seq: Annotated[
        int | None, typer.Option(min=1, max=SEQ_MAX, help="Last sequence number (inclusive).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Published at or after: ISO date/time (UTC unless given) or 2d ago."),
    ] = None,
    until: Annotated[str | None, typer.Option(help="Published before (as --since).")] = None,
    transform: Annotated[
        str | None,
        typer.Option(
            metavar="MODULE:FUNCTION",
            help="Python function over each row (dict) or, if its argument is annotated "
            "DataFrame, over the DataFrame.",
        ),
    ] = None,
    sql: Annotated[
        str | None, typer.Option(help="A SQL query over the view 'messages' instead.")
    ] = None,
    decode: Annotated[
        str, typer.Option(help="Payload as text, json (parsed, for row functions) or binary.")
    ] = "text",
    job_id: Annotated[
        str | None,
        typer.Option(help="Names the job (default: derived from the options)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Run a job again even if it is done.")
    ] = False,
    allow_fewer: Annotated[
        bool,
        typer.Option(
            "--allow-fewer",
            help="With --force: replace the job's output even by fewer rows than it holds.",
        ),
    ] = False,
    partitions: Annotated[
        int | None, typer.Option(help="Spark partitions (default: one per 100,000 seqs).")
    ] = None,
    master: Annotated[str, typer.Option(help="Spark master URL.")] = "local[*]",
    conf: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="Spark configuration; repeatable."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; change nothing.")
    ] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Replay messages from the log through Spark into a sink; a re-run never duplicates
    output (a finished job does nothing unless --force).

    \b
    Examples:
      eomsg spark-replay --topic 'orders/>' --sink parquet:out/orders
      eomsg spark-replay --queue audit --since 2d --sink duckdb:app.duckdb:audit --dry-run
    """
    from eomsg.spark.job import ReplaySpec
    from eomsg.spark.session import check_master, java_version, parse_conf

    spec = ReplaySpec(
        sink, topic, queue, from_seq, to_seq, since, until, transform, sql, decode, job_id,
        partitions,
    )  # fmt: skip
    settings = parse_conf(conf or [])
    _catch_signals()
    if not dry_run:
        java_version()  # before anything is recorded: a missing Java changes nothing
        check_master(master)  # … nor does a cluster that cannot be reached
    p = _planned(spec, data, force, json)
    if dry_run:
        _say_plan(p, json)
    elif p.action is Action.SKIP:
        _say_skipped(p, json)
    else:
        result = _run(p, data, master, settings, allow_fewer, json)
        if json:
            print_json(result.to_json())
        else:
            say(f"replayed {result.rows} rows into {p.sink.text} (job {result.job_id})")


def _catch_signals() -> None:
    """From now on, SIGINT and SIGTERM stop this run as Ctrl-C does (:func:`_interrupt`);
    a signal an earlier run in this process had is forgotten."""
    _signalled.clear()  # a signal to an earlier run in this process is not this run's
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGTERM stops a run as Ctrl-C does
        signal.signal(signum, _interrupt)


def _say_plan(p: Any, json: bool) -> None:
    """--dry-run: the plan ``p``, as JSON or lines."""
    if json:
        print_json(p.to_json())
    else:
        for line in p.lines():
            say(line)


def _say_skipped(p: Any, json: bool) -> None:
    """The job of plan ``p`` is done already: nothing to do, said."""
    assert p.previous is not None
    if json:
        print_json({"job_id": p.job_id, "status": "skipped", "rows": p.previous.rows})
    else:
        say(
            f"job {p.job_id} is already done ({p.previous.rows} rows): nothing to do "
            "(use --force to run it again)"
        )


def _run(p: Any, data: Path, master: str, settings: Any, allow_fewer: bool, quiet: bool) -> Any:
    """Run plan ``p`` on Spark at ``master`` (configured by ``settings``) with progress
    on stderr unless ``quiet``: its result. Spark's own log is removed once the run
    succeeded, else kept and named in the ReplayFailed; each session is stopped once
    the watch on its tasks has (its classes kept in the user's cache if it ran well)."""
    from eomsg.spark import classes
    from eomsg.spark.job import execute
    from eomsg.spark.session import making_classes, start, stop

    log: list[Path] = []  # Spark's own log, once it started: kept only if the run failed
    sessions: list[Any] = []
    done = False
    try:
        with _progress(quiet=quiet) as (report, spark_started):

            def spark() -> Any:
                report(f"starting Spark on {master}")
                session = start(master, settings, keep_classes=True)
                sessions.append(session)
                signal.signal(signal.SIGINT, _interrupt)  # PySpark's own replaced ours
                log.append(Path(session.eomsg_log))
                spark_started(session)
                return session

            try:
                result = execute(
                    p,
                    lambda: open_broker(data),
                    spark,
                    report,
                    allow_fewer=allow_fewer,
                    interrupted=_signalled.is_set,
                )
            except ReplayFailed as e:
                message = f"{e.message} (Spark's log: {log[0]})" if log else e.message
                raise ReplayFailed(message) from e
            done = True
    finally:  # once the watch on Spark's tasks has stopped
        for session in sessions:
            classes.drop_refused(session.eomsg_classes, Path(session.eomsg_log))
            if making_classes(session):
                if done:
                    report("keeping Spark's classes in the user's cache for faster starts (once)")
                stop(session, ok=done)
    for path in log:
        path.unlink(missing_ok=True)
    return result


def _planned(spec: Any, data: Path, force: bool, json: bool) -> Any:
    """The run's plan (:func:`eomsg.spark.job.plan`), made on the log's node — waiting
    its turn, as each step of the run does, if a command holds the directory (said on
    stderr, unless ``json``). Interrupted if a signal stops it: nothing was recorded."""
    from eomsg.spark.job import WAITING, on_store, plan

    def waiting() -> None:
        if not json:
            console(err=True).print(shown(WAITING))

    try:
        return on_store(
            lambda: open_broker(data),
            lambda broker: plan(
                spec, broker, data=data, force=force, token=Globals.token, tls_ca=Globals.tls_ca
            ),
            waiting,
        )
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) or _signalled.is_set():
            raise Interrupted("interrupted while planning: nothing was recorded") from e
        raise


_signalled = threading.Event()


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM: KeyboardInterrupt in the main thread, and remembered — DuckDB
    turns one raised inside a query into an error of its own (RuntimeError), yet the run
    was still interrupted, not failed."""
    _signalled.set()
    raise KeyboardInterrupt


STARVED = 30.0  # seconds without a running task after which a waiting job says so


@contextmanager
def _progress(quiet: bool) -> Iterator[tuple[Any, Any]]:
    """A report function for the run's steps, and a watch on Spark's tasks once it has
    started, all on stderr (nothing with --json): a bar at a terminal, a line at each
    change of the count elsewhere; a job that no executor takes up says so after
    STARVED seconds (a resource request no worker can meet would wait silently)."""
    if quiet:
        yield (lambda _msg: None), (lambda _session: None)
        return
    start = time.monotonic()
    stop = threading.Event()
    err_console = console(err=True)
    bar_shown = err_console.is_terminal
    progress = _progress_bar(err_console, drawn=bar_shown)
    bar = progress.add_task("Spark tasks", total=None, visible=False)

    def report(message: str) -> None:
        progress.console.print(shown(f"[{time.monotonic() - start:6.1f}s] {message}"))

    def show(done: int, total: int) -> None:
        progress.update(bar, completed=done, total=total, visible=True)

    def spark_started(session: Any) -> None:
        on_bar = show if bar_shown else None
        threading.Thread(target=_watch, args=(session, stop, report, on_bar), daemon=True).start()

    with progress:
        try:
            yield report, spark_started
        finally:
            stop.set()


def _progress_bar(err_console: Any, drawn: bool) -> Any:
    """A transient bar of Spark's tasks on ``err_console``, drawn only if ``drawn``."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not drawn,
    )


def _watch(
    session: Any,
    stop: threading.Event,
    report: Callable[[str], None],
    bar: Callable[[int, int], None] | None,
) -> None:
    """Until ``stop`` is set, every half second: the tasks of Spark's active stages done
    and in all, given to ``bar`` — or, with no bar, reported at each change; and once,
    after STARVED seconds in which no task ran, that no executor takes them up."""
    tracker = session.sparkContext.statusTracker()
    last: tuple[int, int] | None = None
    idle_since, warned = time.monotonic(), False
    while not stop.wait(0.5):
        stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        stages = [s for s in stages if s is not None]
        if not stages:
            idle_since = time.monotonic()
            continue
        done = sum(s.numCompletedTasks for s in stages)
        total = sum(s.numTasks for s in stages)
        running = sum(s.numActiveTasks for s in stages)
        if running or done:
            idle_since = time.monotonic()
        elif not warned and time.monotonic() - idle_since > STARVED:
            warned = True
            report(
                f"no executor has taken a task for {STARVED:g} s: can a worker give what "
                "the job asks (spark.executor.memory, spark.executor.cores)? Ctrl-C stops it"
            )
        if bar is not None:
            bar(done, total)
        elif (done, total) != last:
            report(f"tasks {done}/{total}")
        last = (done, total)
