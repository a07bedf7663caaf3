"""Soak scenarios of scripts/bench.py: what a node process (``python -m eomsg serve``)
holds in memory over a long run, sampled as it runs (issue 35, item 15).

soak          one producer process publishes at a steady ``--rate`` for ``--seconds``,
              an id on every message unless ``--no-ids``: pipelined (``publish_async``,
              at most ``--inflight`` unacknowledged), paced by the clock — it catches up
              when it fell behind, never by more than one second's worth at once (a
              schedule further behind slips, and the messages it let go are counted as
              ``slipped``); one consumer process keeps the queue empty (``--prefetch``,
              deleting each message)
soak-backlog  one producer process publishes ``--n`` messages as fast as the node takes
              them, as ``eomsg publish --stdin`` does (``--batch`` a call, ``--inflight``
              calls unacknowledged), with no consumer; ``--drain`` then consumes them all

Both then sample the idle node for ``--idle`` seconds, if given. Every ``--sample``
seconds the bench reads the node's ``/proc/PID/status`` (VmRSS, RssAnon, RssFile,
VmHWM, threads) and ``/proc/PID/stat`` (CPU time), asks it for the queue's depth, adds
up the data directory's disk use (the DuckDB file, its WAL, the journal) and reads what
the producer and the consumer did from counters they share with it; ``eomsg inspect
memory`` is asked too when the node has that command. Producer and consumer are
processes of their own, so the bench's interpreter limits neither.

The node is started with ``--memory-limit`` when given (its peak RSS, VmHWM, is
checked against it) and with each ``--serve-arg``. It runs in a session of its own and
the workers ignore SIGINT: Ctrl-C (or SIGTERM) reaches the bench alone, which stops the
producer, the consumer and the node in that order, kills what has not stopped, and
still reports what it sampled. A node or worker that dies ends the run with its exit
code (and the node's last lines of stderr) in the report; the bench then exits 1 (130
when interrupted).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

import eomsg
from eomsg.core.limits import parse_size
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import EomsgError

SCENARIOS = ("soak", "soak-backlog")
QUEUE, TOPIC = "soak", "soak/orders/eu"
MIB = 1 << 20
WARMUP_SHARE, WARMUP_MAX = 0.2, 120.0  # a phase's warm-up: 20 % of it, at most 2 minutes
FLAT = 0.10  # "flat": every RSS after warm-up within ± 10 % of their median
STALL = 120.0  # seconds without a message consumed before a drain is given up
START_TIMEOUT = 120.0  # seconds for the node's ready line and the consumer's binding
STOP_TIMEOUT = 60.0  # seconds a process has to stop before it is killed
POLL = 0.2  # seconds between checks that every process still runs
CHUNK = 1000  # the most messages the paced producer queues between looks at the clock
RATE_SPAN = 0.5  # the shortest time a sample's rates are measured over
STDERR_TAIL = 20  # lines of a dead node's stderr shown


# -- what the run saw ------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """The node and the workers at ``t`` seconds after the node was ready."""

    t: float
    phase: str
    rss_mib: float
    rss_anon_mib: float = 0.0
    rss_file_mib: float = 0.0
    rss_peak_mib: float = 0.0  # VmHWM: the most the node has held so far
    threads: int = 0
    cpu_s: float = 0.0  # the node's user + system time so far
    cpu_pct: float = 0.0  # of one core, since the last sample
    published: int = 0  # acknowledged to the producer
    failed: int = 0  # publishes the node refused
    consumed: int = 0  # deleted by the consumer
    publish_rate: float = 0.0  # acknowledged per second since the last sample
    consume_rate: float = 0.0
    depth: int = 0
    in_flight: int = 0
    disk_mib: dict[str, float] = field(default_factory=dict)  # duckdb, wal, journal, other
    memory: Any = None  # what `eomsg inspect memory --json` said, if the node has it


@dataclass(frozen=True)
class Phase:
    """A part of the run: when it began and ended (seconds after the node was ready)
    and the producer's and the consumer's counts then."""

    name: str
    start: float
    end: float
    published: tuple[int, int]
    consumed: tuple[int, int]

    @property
    def seconds(self) -> float:
        return self.end - self.start


def warmup_end(phase: Phase, warmup: float | None = None) -> float:
    """When ``phase`` counts as warm: after ``warmup`` seconds when given (say, the time
    the dedup window takes to reach its share of the memory), else after the first
    20 % of it or 2 minutes, whichever is less."""
    if warmup is not None:
        return phase.start + min(warmup, phase.seconds)
    return phase.start + min(WARMUP_SHARE * phase.seconds, WARMUP_MAX)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The least-squares slope of ``ys`` over ``xs``; None without two distinct xs."""
    if len(set(xs)) < 2:
        return None
    return statistics.linear_regression(xs, ys).slope


def summarize(
    samples: Sequence[Sample],
    phase: Phase,
    per_second: float | None = None,
    warmup: float | None = None,
) -> dict[str, Any]:
    """The figures of one phase from its samples: its counts and rates; the RSS after
    warm-up (min, median, max, the spread (max - min) / median, whether every value is
    within ± 10 % of the median, the least-squares slope in MiB a minute and in bytes a
    message published); the RSS it began and ended with and what it grew by a message
    published; the deepest queue seen and — given ``per_second``, the rate published
    at — whether the consumer kept up (never more than one second's worth of messages
    in the queue at a sample)."""
    mine = [s for s in samples if s.phase == phase.name]
    warm = warmup_end(phase, warmup)
    steady = [s for s in mine if s.t >= warm]
    published = phase.published[1] - phase.published[0]
    consumed = phase.consumed[1] - phase.consumed[0]
    out: dict[str, Any] = {
        "seconds": round(phase.seconds, 1),
        "published": published,
        "consumed": consumed,
        "publish_rate": round(published / phase.seconds, 1) if phase.seconds > 0 else None,
        "consume_rate": round(consumed / phase.seconds, 1) if phase.seconds > 0 else None,
        "warmup_end_s": round(warm, 1),
        "samples": len(mine),
        "steady_samples": len(steady),
    }
    if mine:
        out["rss_start_mib"] = mine[0].rss_mib
        out["rss_end_mib"] = mine[-1].rss_mib
        out["rss_max_mib"] = max(s.rss_mib for s in mine)
        grown = (mine[-1].rss_mib - mine[0].rss_mib) * MIB
        moved = mine[-1].published - mine[0].published
        out["rss_growth_bytes_per_message"] = round(grown / moved, 1) if moved else None
        out["max_depth"] = max(s.depth for s in mine)
        if per_second is not None:
            out["kept_up"] = out["max_depth"] <= per_second
    if steady:
        rss = [s.rss_mib for s in steady]
        median = statistics.median(rss)
        low, high = min(rss), max(rss)
        slope = _slope([s.t / 60 for s in steady], rss)
        per_message = _slope([float(s.published) for s in steady], [r * MIB for r in rss])
        out["steady"] = {
            "rss_min_mib": low,
            "rss_median_mib": round(median, 1),
            "rss_max_mib": high,
            "spread": round((high - low) / median, 4) if median else None,
            "flat": bool(median) and (1 - FLAT) * median <= low and high <= (1 + FLAT) * median,
            "slope_mib_per_min": None if slope is None else round(slope, 3),
            "bytes_per_message": None if per_message is None else round(per_message, 1),
            "max_depth": max(s.depth for s in steady),
        }
    return out


def _some(value: Any, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def text(result: dict[str, Any]) -> str:
    """The run's outcome in a few lines (its samples were printed as they came)."""
    lines = []
    for name, p in result["phases"].items():
        line = (
            f"{name}: {p['seconds']} s, published {p['published']:,} "
            f"({_some(p['publish_rate'], ',.0f')}/s), consumed {p['consumed']:,} "
            f"({_some(p['consume_rate'], ',.0f')}/s), max depth {_some(p.get('max_depth'), ',')}"
        )
        if "kept_up" in p:
            line += f" (kept up: {'yes' if p['kept_up'] else 'no'})"
        if "rss_start_mib" in p:
            line += f"; RSS {p['rss_start_mib']} -> {p['rss_end_mib']} MiB (max {p['rss_max_mib']})"
        if p.get("rss_growth_bytes_per_message") is not None:
            line += f", {p['rss_growth_bytes_per_message']:+,.0f} B a message published"
        lines.append(line)
        if p["steady_samples"] >= 2:
            s = p["steady"]
            lines.append(
                f"  after warm-up (from {p['warmup_end_s']} s): RSS {s['rss_min_mib']} / "
                f"{s['rss_median_mib']} / {s['rss_max_mib']} MiB (min / median / max), spread "
                f"{_some(s['spread'], '.1%')}, flat within ±10 %: {'yes' if s['flat'] else 'no'}, "
                f"slope {_some(s['slope_mib_per_min'], '+.1f', ' MiB/min')}, "
                f"{_some(s['bytes_per_message'], '+,.0f', ' B a message')}"
            )
    limit = result["memory_limit"]
    under = {True: "yes", False: "NO", None: "not known"}[result["under_limit"]]
    lines.append(
        f"RSS at most {_some(result['rss_max_mib'], '.1f', ' MiB')} at a sample, "
        f"{_some(result['rss_peak_mib'], '.1f', ' MiB')} at its peak (VmHWM)"
        + (f" (limit {limit}, under it: {under})" if limit else "")
        + f"; slipped {result['slipped']:,}, failed {result['failed']:,}; "
        f"node exit {result['node_exit']}"
    )
    return "\n".join(lines)


def line(s: Sample) -> str:
    """One sample as a line of text."""
    disk = s.disk_mib
    return (
        f"{s.t:7.0f}s {s.phase:<8} rss {s.rss_mib:8.1f} MiB (anon {s.rss_anon_mib:.1f}, "
        f"file {s.rss_file_mib:.1f})  cpu {s.cpu_pct:3.0f}%  published {s.published:,} "
        f"({s.publish_rate:,.0f}/s)  consumed {s.consumed:,} ({s.consume_rate:,.0f}/s)  "
        f"depth {s.depth:,}  disk {sum(disk.values()):.1f} MiB (db {disk.get('duckdb', 0):.1f}, "
        f"wal {disk.get('wal', 0):.1f}, journal {disk.get('journal', 0):.1f})"
        + (f"  failed {s.failed:,}" if s.failed else "")
    )


# -- the workers (processes of their own) ------------------------------------------------


class Counters:
    """What the workers did so far, in memory shared with the bench; each count has one
    writer. ``producing`` says the producer has begun; ``stop`` asks the workers to end."""

    def __init__(self, ctx: SpawnContext) -> None:
        self.published = ctx.RawValue("q", 0)  # acknowledged
        self.failed = ctx.RawValue("q", 0)  # refused by the node
        self.slipped = ctx.RawValue("q", 0)  # let go by a schedule more than 1 s behind
        self.consumed = ctx.RawValue("q", 0)
        self.producing = ctx.Event()  # the producer is connected and starts its clock
        self.stop = ctx.Event()


def run_worker(name: str, target: Callable[..., None], *args: Any) -> None:
    """A worker process: ``target(*args)``; an error of eomsg (the node gone, most
    often, which the bench reports itself) ends it with one line and exit code 1."""
    try:
        target(*args)
    except EomsgError as e:
        print(f"bench: the {name} stopped: {e}", file=sys.stderr)
        sys.exit(1)


def _id(prefix: str, i: int) -> str:
    """A message id of 36 characters, as long as a UUID's text."""
    return f"{prefix}{i:024d}"


def _settle(acks: deque[tuple[int, Any]], counts: Counters, block: bool) -> None:
    """Take the acknowledgements that came (all of them with ``block``), oldest first:
    each adds its messages to ``published``, or to ``failed`` if the node refused them."""
    while acks and (block or acks[0][1].done()):
        n, ack = acks.popleft()
        try:
            ack.result()
        except EomsgError as e:
            if not counts.failed.value:
                print(f"bench: a publish failed: {e}", file=sys.stderr)
            counts.failed.value += n
        else:
            counts.published.value += n


def produce_paced(
    data: str, counts: Counters, rate: float, seconds: float, ids: bool, payload: bytes,
    inflight: int,
) -> None:  # fmt: skip
    """Publish ``rate`` messages a second for ``seconds``, one ``publish_async`` each,
    at most ``inflight`` unacknowledged. Paced by the clock: what is owed at a moment
    is what the schedule has reached less what was sent, at most one second's worth —
    a schedule further behind slips, counting the messages it let go."""
    prefix = os.urandom(6).hex()
    acks: deque[tuple[int, Any]] = deque()
    sent = 0
    with eomsg.connect(data, window=inflight) as client:

        def publish(k: int) -> None:
            nonlocal sent
            for _ in range(k):
                msg_id = _id(prefix, sent) if ids else None
                acks.append((1, client.publish_async(TOPIC, payload, id=msg_id)))
                sent += 1

        counts.producing.set()
        origin = time.monotonic()
        end = origin + seconds
        while not counts.stop.is_set() and (now := time.monotonic()) < end:
            owed = rate * (now - origin) - sent
            if owed > rate:
                counts.slipped.value += int(owed - rate)
                origin += (owed - rate) / rate
                owed = rate
            if owed < 1:
                time.sleep(max(0.001, (1 - owed) / rate))
                continue
            publish(min(int(owed), CHUNK))
            _settle(acks, counts, block=False)
        if not counts.stop.is_set():
            publish(int(rate * (end - origin)) - sent)  # what the schedule reached at its end
        _settle(acks, counts, block=True)


def produce_flat_out(
    data: str, counts: Counters, n: int, ids: bool, payload: bytes, batch: int, inflight: int
) -> None:
    """Publish ``n`` messages as fast as the node takes them: ``batch`` a call, the next
    call made while at most ``inflight`` are unacknowledged."""
    prefix = os.urandom(6).hex()
    acks: deque[tuple[int, Any]] = deque()
    with eomsg.connect(data) as client:
        counts.producing.set()
        for start in range(0, n, batch):
            if counts.stop.is_set():
                break
            k = min(batch, n - start)
            messages = [
                Outgoing(TOPIC, payload, _id(prefix, start + i) if ids else None) for i in range(k)
            ]
            acks.append((k, client.publish_batch_async(messages)))
            if len(acks) >= inflight:
                _settle(acks, counts, block=False)
                while len(acks) >= inflight:
                    acks[0][1].exception()  # wait for the oldest
                    _settle(acks, counts, block=False)
        _settle(acks, counts, block=True)


def consume(data: str, counts: Counters, prefetch: int) -> None:
    """Take every message of the queue as it comes and delete it, until asked to stop;
    every delete is durable when this returns."""
    with (
        eomsg.connect(data) as client,
        client.consumer(QUEUE, prefetch=prefetch, idle_timeout=POLL) as consumer,
    ):
        while not counts.stop.is_set():
            for msg in consumer:  # ends after POLL seconds without a message
                msg.delete()
                counts.consumed.value += 1
                if counts.consumed.value % 256 == 0 and counts.stop.is_set():
                    break
        consumer.flush()


# -- the run -------------------------------------------------------------------------------


class Stopped(Exception):
    """The run cannot go on: a process died, or nothing moved for too long."""


@dataclass
class Settings:
    """What a soak run does, from the command line."""

    scenario: str
    seconds: float
    rate: float
    n: int
    ids: bool
    payload: bytes
    batch: int
    inflight: int
    prefetch: int
    sample: float
    drain: bool
    idle: float
    memory_limit: str | None
    serve_args: list[str]
    warmup: float | None
    plot: Path | None
    as_json: bool


class Node:
    """``python -m eomsg serve --data DATA --json`` with the extra options, in a session
    of its own (Ctrl-C at the terminal reaches the bench, not the node); its stdout and
    stderr go to files beside the data directory."""

    def __init__(self, data: Path, extra: Sequence[str]) -> None:
        self.data = data
        self.command = [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json"]
        self.command += extra
        self.out, self.err = data.parent / "serve.out", data.parent / "serve.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self.pid = self.proc.pid

    def wait_ready(self) -> None:
        """Wait for the node's ready line; Stopped if it ends or says nothing for
        START_TIMEOUT."""
        deadline = time.monotonic() + START_TIMEOUT
        while (ready := self._ready()) is None:
            self.check()
            if time.monotonic() > deadline:
                raise Stopped(f"the node printed no ready line in {START_TIMEOUT:.0f} s")
            time.sleep(0.05)
        self.pid = ready["pid"]

    def _ready(self) -> dict[str, Any] | None:
        for text_line in self.out.read_text().splitlines():
            if text_line.endswith("}"):
                event: dict[str, Any] = json.loads(text_line)
                if event.get("event") == "ready":
                    return event
        return None

    def check(self) -> None:
        """Stopped, with the exit code and the last lines of stderr, if the node ended."""
        code = self.proc.poll()
        if code is not None:
            tail = self.err.read_text(errors="replace").splitlines()[-STDERR_TAIL:]
            raise Stopped(
                f"the node exited with code {code}; its stderr ends:\n"
                + ("\n".join(f"  {t}" for t in tail) if tail else "  (nothing)")
            )

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it has not stopped in STOP_TIMEOUT; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def _proc_status(pid: int) -> dict[str, int]:
    """The numbers of /proc/PID/status (kB values in bytes)."""
    out = {}
    for text_line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = text_line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time (/proc/PID/stat, after its name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk_use(data: Path) -> dict[str, float]:
    """MiB allocated on disk under ``data``: the DuckDB file, its WAL, the journal, and
    the rest."""
    use = {"duckdb": 0, "wal": 0, "journal": 0, "other": 0}
    for path in data.rglob("*"):
        try:
            st = path.lstat()
        except FileNotFoundError:  # a file replaced or removed meanwhile
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if path.name == "eomsg.duckdb":
            kind = "duckdb"
        elif path.name == "eomsg.duckdb.wal":
            kind = "wal"
        elif "journal" in path.relative_to(data).parts[:1]:
            kind = "journal"
        else:
            kind = "other"
        use[kind] += st.st_blocks * 512
    return {k: round(v / MIB, 1) for k, v in use.items()}


def has_inspect_memory() -> bool:
    """Whether this eomsg has ``inspect memory`` (not yet on main)."""
    probe = [sys.executable, "-m", "eomsg", "inspect", "memory", "--help"]
    return subprocess.run(probe, capture_output=True, check=False, timeout=60).returncode == 0


def inspect_memory(data: Path) -> Any:
    """What ``eomsg inspect memory --json`` says of the node — one JSON document, or a
    list of its JSON lines — or, if it failed, its error."""
    command = [sys.executable, "-m", "eomsg", "inspect", "memory", "--data", str(data), "--json"]
    try:
        r = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    except subprocess.TimeoutExpired:
        return {"error": "no answer in 60 s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    try:
        return json.loads(r.stdout)
    except ValueError:
        pass
    try:
        return [json.loads(text_line) for text_line in r.stdout.splitlines() if text_line]
    except ValueError:
        return {"error": f"not JSON: {r.stdout[:200]!r}"}


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a worker starts: the interpreter it runs leaves an ignored
    SIGINT ignored, so Ctrl-C reaches the bench alone, which stops the workers itself."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


class Soak:
    """One run: the node, its workers, the samples and the phases."""

    def __init__(self, settings: Settings, tmp: Path) -> None:
        self.s = settings
        self.data = tmp / "data"
        self.ctx = multiprocessing.get_context("spawn")
        self.counts = Counters(self.ctx)
        self.workers: dict[str, SpawnProcess] = {}
        self.samples: list[Sample] = []
        self.phases: list[Phase] = []
        self.node: Node | None = None
        self.client: eomsg.Client | None = None
        self.memory = False
        self.t0 = 0.0
        self.next_sample = 0.0

    # -- processes

    def start_worker(self, name: str, target: Callable[..., None], *args: Any) -> SpawnProcess:
        proc = self.ctx.Process(
            target=run_worker, args=(name, target, str(self.data), self.counts, *args), name=name
        )
        with _sigint_ignored():
            proc.start()
        self.workers[name] = proc
        return proc

    def check(self) -> None:
        """Stopped if the node or a worker died."""
        assert self.node is not None
        self.node.check()
        for name, proc in self.workers.items():
            if proc.exitcode not in (None, 0):
                raise Stopped(f"the {name} exited with code {proc.exitcode} (its stderr is above)")

    def stop_workers(self) -> None:
        """Ask every worker to stop; kill those that do not within STOP_TIMEOUT."""
        self.counts.stop.set()
        for _name, proc in sorted(self.workers.items(), key=lambda w: w[0] != "producer"):
            proc.join(STOP_TIMEOUT)
            if proc.exitcode is None:
                proc.kill()
                proc.join()

    # -- sampling

    def now(self) -> float:
        return time.monotonic() - self.t0

    def take(self, phase: str) -> Sample:
        """Sample the node now, print the sample's line and keep it."""
        assert self.node is not None and self.client is not None
        t = self.now()
        status = _proc_status(self.node.pid)
        cpu = _cpu_seconds(self.node.pid)
        published, consumed = self.counts.published.value, self.counts.consumed.value
        stats = next(q for q in self.client.stats() if q.name == QUEUE)
        cpu_pct = publish_rate = consume_rate = 0.0
        # rates since the last sample at least RATE_SPAN earlier (a phase's boundaries
        # are sampled moments apart)
        ref = next((x for x in reversed(self.samples) if x.t <= t - RATE_SPAN), None)
        if ref is not None:
            dt = t - ref.t
            cpu_pct = (cpu - ref.cpu_s) / dt * 100
            publish_rate = (published - ref.published) / dt
            consume_rate = (consumed - ref.consumed) / dt
        sample = Sample(
            t=round(t, 2),
            phase=phase,
            rss_mib=round(status.get("VmRSS", 0) / MIB, 1),
            rss_anon_mib=round(status.get("RssAnon", 0) / MIB, 1),
            rss_file_mib=round(status.get("RssFile", 0) / MIB, 1),
            rss_peak_mib=round(status.get("VmHWM", 0) / MIB, 1),
            threads=status.get("Threads", 0),
            cpu_s=round(cpu, 2),
            cpu_pct=round(cpu_pct, 1),
            published=published,
            failed=self.counts.failed.value,
            consumed=consumed,
            publish_rate=round(publish_rate, 1),
            consume_rate=round(consume_rate, 1),
            depth=stats.depth,
            in_flight=stats.in_flight,
            disk_mib=disk_use(self.data),
            memory=inspect_memory(self.data) if self.memory else None,
        )
        self.samples.append(sample)
        # the next sample on the run's grid, skipping one within half an interval of this
        while self.next_sample <= t + self.s.sample / 2:
            self.next_sample += self.s.sample
        print(line(sample), file=sys.stderr if self.s.as_json else sys.stdout, flush=True)
        return sample

    def phase(
        self, name: str, done: Callable[[], bool], begin: Callable[[], object] | None = None
    ) -> None:
        """Sample as phase ``name`` until ``done()``: at its start (then ``begin()``, if
        given), every ``--sample`` seconds of the run's clock, and at its end; stop if a
        process dies. A phase cut short (a death, an interrupt) is kept as far as it went."""
        start = self.now()
        published, consumed = self.counts.published.value, self.counts.consumed.value
        try:
            self.take(name)
            if begin is not None:
                begin()
            while not done():
                self.check()
                if self.now() >= self.next_sample:
                    self.take(name)
                time.sleep(max(0.0, min(POLL, self.next_sample - self.now())))
            self.take(name)
        finally:
            self.phases.append(
                Phase(
                    name,
                    round(start, 2),
                    round(self.now(), 2),
                    (published, self.counts.published.value),
                    (consumed, self.counts.consumed.value),
                )
            )

    # -- conditions that end a phase

    def worker_done(self, name: str) -> Callable[[], bool]:
        def done() -> bool:
            self.check()
            return self.workers[name].exitcode == 0

        return done

    def drained(self) -> Callable[[], bool]:
        """Done once the consumer has deleted all the producer published and the node
        says the queue is empty; Stopped if nothing was consumed for STALL seconds."""
        moved = [self.counts.consumed.value, time.monotonic()]

        def done() -> bool:
            consumed = self.counts.consumed.value
            if consumed != moved[0]:
                moved[:] = [consumed, time.monotonic()]
            elif time.monotonic() - moved[1] > STALL:
                raise Stopped(f"nothing was consumed for {STALL:.0f} s")
            if consumed < self.counts.published.value:
                return False
            assert self.client is not None
            stats = next(q for q in self.client.stats() if q.name == QUEUE)
            return stats.depth == 0 and stats.in_flight == 0

        return done

    def for_seconds(self, seconds: float) -> Callable[[], bool]:
        end = time.monotonic() + seconds
        return lambda: time.monotonic() >= end

    # -- the scenarios

    def run(self) -> None:
        extra = list(self.s.serve_args)
        if self.s.memory_limit is not None:
            extra.append(f"--memory-limit={self.s.memory_limit}")
        self.memory = has_inspect_memory()
        self.node = Node(self.data, extra)
        self.node.wait_ready()
        self.t0 = time.monotonic()
        self.next_sample = self.s.sample
        self.client = eomsg.connect(self.data)
        self.client.create_queue(QueueConfig.create(QUEUE, [TOPIC]))
        if self.s.scenario == "soak":
            self.start_worker("consumer", consume, self.s.prefetch)
            self.until_bound()
            self.start_producer(
                produce_paced, self.s.rate, self.s.seconds, self.s.ids,
                self.s.payload, self.s.inflight,
            )  # fmt: skip
            self.phase("soak", self.worker_done("producer"))
            self.phase("drain", self.drained())
        else:
            self.start_producer(
                produce_flat_out, self.s.n, self.s.ids, self.s.payload,
                self.s.batch, self.s.inflight,
            )  # fmt: skip
            self.phase("backlog", self.worker_done("producer"))
            if self.s.drain:
                self.phase(
                    "drain",  # from the consumer's start
                    self.drained(),
                    lambda: self.start_worker("consumer", consume, self.s.prefetch),
                )
        if self.s.idle:
            self.phase("idle", self.for_seconds(self.s.idle))

    def start_producer(self, target: Callable[..., None], *args: Any) -> None:
        """Start the producer and wait until it has connected and begins."""
        proc = self.start_worker("producer", target, *args)
        while not self.counts.producing.wait(POLL):
            self.check()
            if proc.exitcode == 0:
                raise Stopped("the producer ended before it began")

    def until_bound(self) -> None:
        """Wait for the consumer's flow to be bound to the queue."""
        assert self.client is not None
        deadline = time.monotonic() + START_TIMEOUT
        while not next(q.flows for q in self.client.stats() if q.name == QUEUE):
            self.check()
            if time.monotonic() > deadline:
                raise Stopped(f"the consumer did not bind in {START_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def explain(self, error: EomsgError) -> str:
        """Why a request of the bench to the node failed: the node's end, if it ended."""
        if self.node is not None:
            try:
                self.node.proc.wait(5)
                self.node.check()
            except subprocess.TimeoutExpired:
                pass
            except Stopped as e:
                return str(e)
        return f"the node did not answer the bench: {error}"

    def close(self) -> int | None:
        """Stop the producer, the consumer and the node, in that order (killing what
        does not stop); the node's exit code."""
        self.stop_workers()
        if self.client is not None:
            self.client.close()
        return None if self.node is None else self.node.stop()

    def result(self, node_exit: int | None, error: str | None) -> dict[str, Any]:
        s = self.s
        limit = _limit_bytes(s.memory_limit)
        rss_max = max((x.rss_mib for x in self.samples), default=None)
        peak = max((x.rss_peak_mib for x in self.samples), default=None)
        result: dict[str, Any] = {
            "scenario": s.scenario,
            "ids": s.ids,
            "id_chars": 36 if s.ids else 0,
            "payload_bytes": len(s.payload),
            "inflight": s.inflight,
            "sample_s": s.sample,
            "memory_limit": s.memory_limit,
            "serve_command": self.node.command if self.node is not None else None,
            "inspect_memory": self.memory,
        }
        if s.scenario == "soak":
            result.update(seconds=s.seconds, rate=s.rate, prefetch=s.prefetch)
        else:
            result.update(n=s.n, batch=s.batch, drain=s.drain)
            if s.drain:
                result["prefetch"] = s.prefetch
        rate = s.rate if s.scenario == "soak" else None
        result.update(
            published=self.counts.published.value,
            failed=self.counts.failed.value,
            slipped=self.counts.slipped.value,
            consumed=self.counts.consumed.value,
            rss_max_mib=rss_max,
            rss_peak_mib=peak,
            under_limit=None if limit is None or peak is None else peak * MIB <= limit,
            node_exit=node_exit,
            error=error,
            phases={
                p.name: summarize(
                    self.samples, p, rate if p.name == "soak" else None, self.s.warmup
                )
                for p in self.phases
            },
            phase_times={p.name: [p.start, p.end] for p in self.phases},
            samples=[asdict(x) for x in self.samples],
        )
        return result


def _limit_bytes(limit: str | None) -> int | None:
    """``--memory-limit`` in bytes, when it is a size this bench reads (else the RSS is
    not checked against it)."""
    if limit is None:
        return None
    try:
        return parse_size(limit, high=1 << 60)
    except EomsgError:
        return None


def plot(result: dict[str, Any], path: Path) -> None:
    """RSS (MiB) and the queue's depth over the run's minutes, the phases marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    minutes = [x["t"] / 60 for x in samples]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(minutes, [x["rss_mib"] for x in samples], color="tab:blue", label="RSS")
    ax.set_xlabel("minutes")
    ax.set_ylabel("node RSS, MiB")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    limit = _limit_bytes(result["memory_limit"])
    if limit is not None:
        ax.axhline(limit / MIB, color="tab:red", linestyle="--", label="memory limit")
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.05 * limit / MIB))  # the limit in view
    for name, (start, _end) in result["phase_times"].items():
        ax.axvline(start / 60, color="grey", linewidth=0.6)
        ax.annotate(name, (start / 60, 0), xytext=(2, 2), textcoords="offset points", fontsize=8)
        warm = result["phases"][name]["warmup_end_s"]
        if warm > start:
            ax.axvline(warm / 60, color="grey", linestyle=":", linewidth=0.6)
    depth_ax = ax.twinx()
    depth_ax.plot(minutes, [x["depth"] for x in samples], color="tab:orange", label="depth")
    depth_ax.set_ylabel("queue depth, messages")
    depth_ax.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    more = depth_ax.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left")
    rate = f"{result['rate']:,.0f}/s" if "rate" in result else f"{result['n']:,} flat out"
    ids = "with ids" if result["ids"] else "without ids"
    ax.set_title(f"eomsg serve: {result['scenario']}, {rate}, {ids}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the soak scenarios."""
    group = parser.add_argument_group("soak, soak-backlog (scripts/bench_soak.py)")
    group.add_argument(
        "--seconds", type=float, default=1800.0, help="soak: seconds publishing (1800)"
    )
    group.add_argument(
        "--rate", type=float, default=10_000.0, help="soak: messages a second (10000)"
    )
    group.add_argument("--sample", type=float, default=5.0, help="seconds between samples (5)")
    group.add_argument(
        "--drain", action="store_true", help="soak-backlog: then consume every message"
    )
    group.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="seconds sampled at the end with nothing running (0)",
    )
    group.add_argument(
        "--memory-limit",
        default=None,
        help="passed to `eomsg serve --memory-limit` (only when given); the RSS is checked "
        "against it",
    )
    group.add_argument(
        "--warmup",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds of each phase left out of its steady figures (default: 20 %% of it, "
        "at most 120)",
    )
    group.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for `eomsg serve` (repeatable; write --serve-arg=--flag=V)",
    )


def main(
    parser: argparse.ArgumentParser, args: argparse.Namespace, machine: dict[str, object]
) -> int:
    """Run the soak scenario ``args`` ask for; print its samples and its outcome."""
    if args.seconds <= 0 or args.rate <= 0 or args.sample <= 0 or args.idle < 0:
        parser.error("--seconds, --rate and --sample must be positive, --idle not negative")
    if args.drain and args.scenario != "soak-backlog":
        parser.error("--drain applies to soak-backlog only")
    if args.inflight < 1 or args.prefetch < 1:
        parser.error("--inflight and --prefetch must be positive")
    plot_to = Path(args.plot) if args.plot else None
    if plot_to is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib (pip install 'eomsg[bench]')")
    settings = Settings(
        scenario=args.scenario,
        seconds=args.seconds,
        rate=args.rate,
        n=args.n,
        ids=not args.no_ids,
        payload=os.urandom(args.payload // 2 + 1).hex().encode()[: args.payload],
        batch=args.batch,
        inflight=args.inflight,
        prefetch=args.prefetch,
        sample=args.sample,
        drain=args.drain,
        idle=args.idle,
        memory_limit=args.memory_limit,
        serve_args=args.serve_arg,
        warmup=args.warmup,
        plot=plot_to,
        as_json=args.json,
    )
    on_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    error, code = None, 0
    with tempfile.TemporaryDirectory(prefix="eomsg-soak-") as tmp:
        soak = Soak(settings, Path(tmp))
        try:
            soak.run()
        except Stopped as e:
            error, code = str(e), 1
        except EomsgError as e:  # an answer the bench waited for failed
            error, code = soak.explain(e), 1
        except KeyboardInterrupt:
            error, code = "interrupted", 130
        finally:
            # a second Ctrl-C must not leave processes behind: the stops are bounded
            on_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            node_exit = soak.close()
            signal.signal(signal.SIGINT, on_int)
            signal.signal(signal.SIGTERM, on_term)
        result = soak.result(node_exit, error)
    result["machine"] = machine
    if plot_to is not None and result["samples"]:
        plot(result, plot_to)
        result["plot"] = str(plot_to)
    print(json.dumps(result) if settings.as_json else text(result))
    if error is not None:
        print(f"bench: {error}", file=sys.stderr)
    return code
