"""How eomsg scales with the size of its data (scripts/bench.py's ``scale`` and
``restart``), on a temporary data directory under the system's temp dir.

  scale    one embedded node (a long retention, maintenance on demand) whose log grows
           to each of ``--sizes`` in turn (default 10^4, 10^5, 10^6, 10^7 messages), the
           fill published 10,000 per call (pipelined), consumed and compacted so that
           it is retained but not pending. At each size, each of ``--rounds`` rounds
           publishes ``--n`` messages in batches of 256 (pipelined, as ``publish
           --stdin``), then fetches them 256 at a time and deletes them; the median
           µs/msg of both, by size, and the ratio of the largest size's to the smallest's
           (the target: flat within 15 %). A plot of the table goes to ``--plot``
           (default docs/img/scale.png; log-scale x axis). The measured messages stay
           in the log too: a size smaller than what the sizes before it left there is
           measured where the log stands (``log_size``; ``requested_size`` is the size
           asked for).
  restart  a data directory holding ``--retained`` messages (default 10^7) of which
           ``--pending`` (default 10^6) are still pending in a queue, filled embedded;
           then served (``python -m eomsg serve --json``). Each of ``--rounds`` rounds
           publishes a burst through the node (50,000 messages, 1,000 per call,
           pipelined), SIGKILLs it at the burst's last acknowledgement — so its journal
           holds records DuckDB has not applied — and starts ``serve`` again, timed to
           its ``ready`` line and to the first answer of ``stats()`` from a client that
           connects then. Reported per round with the median (the target: under 5 s),
           what the journal held at the kill, and what the node printed. Finally one more
           burst and kill, and a profile (cProfile) of ``Node.open`` on that directory in
           this process: the functions that take its time; then another, and
           ``Node.open`` timed phase by phase without the profiler (``open_phases_s``).

Messages are 256 bytes (``--payload``) with ids unless ``--no-ids``; payloads are random
bytes (incompressible), each different from its neighbours (slices of a 64 MiB block), so
that the log takes its real size on disk: one payload repeated would be compressed away
by DuckDB. Progress, and the warnings the node logs (also counted in the result), go to
stderr.
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import importlib.util
import inspect
import io
import json
import logging
import os
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import bench_fill
import duckdb

import eomsg
from eomsg.client.broker import Broker
from eomsg.core.idruns import RetainedIds
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.embedded import LocalClient
from eomsg.node.node import Node, NodeSettings
from eomsg.store import journal, opening, recovery
from eomsg.store.checkpoints import Checkpoints
from eomsg.store.store import Store
from eomsg.store.writer import RowBatch, applied_lsn

SCENARIOS = ("scale", "restart")
SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
TOPIC = "bench/orders/eu"
FILL_BATCH = 10_000  # messages per publish call while filling
FILL_CHUNK = 1_000_000  # published, then consumed and compacted, before the next
MEASURED_BATCH = 256
BURST = 50_000  # restart: messages published just before each kill
BURST_BATCH = 1_000
FLAT_TARGET = 0.15
RESTART_TARGET_S = 5.0
# Long retention and rare GC: the log must stay for the measurements.
SETTINGS = NodeSettings(tick=None, retention=10 * 86400, gc_interval=10 * 86400)
POOL_BYTES = 64 << 20


class Payloads:
    """``size``-byte payloads: slices of a block of random bytes, message ``i`` the
    ``i``-th slice round the block (so no two within ``slots`` messages are alike)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots = max(1, POOL_BYTES // max(size, 1))
        self._pool = os.urandom(self.slots * size)

    def __getitem__(self, i: int) -> bytes:
        at = (i % self.slots) * self.size
        return self._pool[at : at + self.size]


class Warnings(logging.Handler):
    """Counts what eomsg logs at WARNING and above (by message), and shows it on stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}
        self._show = logging.StreamHandler(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.levelname} {record.name}: {record.getMessage()}"
        self.counts[text] = self.counts.get(text, 0) + 1
        self._show.emit(record)

    def __enter__(self) -> Warnings:
        logging.getLogger("eomsg").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("eomsg").removeHandler(self)


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _messages(n: int, payload: Payloads, start: int, ids: bool, prefix: str) -> list[Outgoing]:
    if not ids:
        return [Outgoing(TOPIC, payload[i]) for i in range(start, start + n)]
    return [Outgoing(TOPIC, payload[i], f"{prefix}{i}") for i in range(start, start + n)]


def _publish(
    broker: Broker, n: int, payload: Payloads, batch: int, start: int, ids: bool, prefix: str = "m"
) -> None:
    bench_fill.publish_all(
        broker,
        (_messages(min(batch, n - i), payload, start + i, ids, prefix) for i in range(0, n, batch)),
    )


def _fill(client: LocalClient, n: int, payload: Payloads, start: int, ids: bool) -> None:
    """Add ``n`` consumed messages to the log, a chunk at a time: published, consumed,
    compacted (as the ticker would), so the hot tables never hold more than a chunk."""
    t0 = time.perf_counter()
    for lo in range(0, n, FILL_CHUNK):
        chunk = min(FILL_CHUNK, n - lo)
        _publish(client, chunk, payload, FILL_BATCH, start + lo, ids)
        drained = bench_fill.drain(client, FILL_BATCH)
        assert drained == chunk, f"drained {drained} of {chunk}"
        client.node.maintenance.maintain()
        if n > FILL_CHUNK:
            done = lo + chunk
            rate = done / (time.perf_counter() - t0)
            _progress(f"filled {start + done:,} ({rate:,.0f} msgs/s)")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _rss_mb() -> float:
    """This process's peak resident memory (Linux: KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# -- scale ---------------------------------------------------------------------------


def run_scale(
    sizes: Sequence[int],
    n: int,
    payload_size: int,
    rounds: int,
    ids: bool,
    tmp: Path,
    plot: Path | None,
) -> dict[str, object]:
    if plot is not None and importlib.util.find_spec("matplotlib") is None:  # not at the end
        raise SystemExit("error: --plot needs matplotlib (pip install -e '.[bench]'), or --plot ''")
    data = tmp / "data"
    payload = Payloads(payload_size)
    table: list[dict[str, Any]] = []
    fill_total = 0.0
    logged = 0  # messages in the log so far
    with Warnings() as warned, LocalClient.open(data, SETTINGS) as client:
        client.create_queue(QueueConfig.create("bench", ["bench/>"]))
        for size in sorted(sizes):
            t0 = time.perf_counter()
            if size > logged:
                _fill(client, size - logged, payload, logged, ids)
                logged = size
            fill_s = time.perf_counter() - t0
            fill_total += fill_s
            at = logged
            publish: list[float] = []
            consume: list[float] = []
            for _ in range(rounds):
                t = time.perf_counter()
                _publish(client, n, payload, MEASURED_BATCH, logged, ids)
                publish.append(time.perf_counter() - t)
                t = time.perf_counter()
                consumed = bench_fill.drain(client, MEASURED_BATCH)
                consume.append(time.perf_counter() - t)
                assert consumed == n, f"consumed {consumed} of {n}"
                client.node.maintenance.maintain()
                logged += n
            row: dict[str, Any] = {
                "log_size": at,
                "requested_size": size,
                "publish_us_per_msg": round(statistics.median(publish) / n * 1e6, 2),
                "consume_us_per_msg": round(statistics.median(consume) / n * 1e6, 2),
                "rounds_publish_us": [round(t / n * 1e6, 2) for t in publish],
                "rounds_consume_us": [round(t / n * 1e6, 2) for t in consume],
                "fill_s": round(fill_s, 1),
                "data_mb": round(_du(data) / (1 << 20), 1),
                "peak_rss_mb": _rss_mb(),
                "load_1m": round(os.getloadavg()[0], 2),
            }
            table.append(row)
            _progress(
                f"log {at:,}: publish {row['publish_us_per_msg']} us/msg, consume "
                f"{row['consume_us_per_msg']} us/msg (fill {fill_s:.0f} s, "
                f"{row['data_mb']} MiB on disk)"
            )
    first, last = table[0], table[-1]
    result: dict[str, object] = {
        "scenario": "scale",
        "n": n,
        "batch": MEASURED_BATCH,
        "rounds": rounds,
        "payload_bytes": payload_size,
        "ids": ids,
        "table": table,
        "publish_ratio": _ratio(last["publish_us_per_msg"], first["publish_us_per_msg"]),
        "consume_ratio": _ratio(last["consume_us_per_msg"], first["consume_us_per_msg"]),
        "flat_target": 1 + FLAT_TARGET,
        "fill_s": round(fill_total, 1),
        "fill_msgs_per_s": round(max(sizes) / fill_total) if fill_total else None,
        "warnings": warned.counts,
    }
    if plot is not None:
        _plot(table, plot, n)
        result["plot"] = str(plot)
    return result


def _ratio(a: object, b: object) -> float:
    assert isinstance(a, float) and isinstance(b, float)
    return round(a / b, 3)


def _plot(table: list[dict[str, Any]], path: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["log_size"] for row in table]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    top = 0.0
    for key, label in (("publish_us_per_msg", "publish"), ("consume_us_per_msg", "consume+delete")):
        values = [row[key] for row in table]
        top = max(top, *values)
        ax.plot(sizes, values, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_ylim(0, top * 1.3)
    ax.set_xlabel("messages retained in the log")
    ax.set_ylabel("µs per message")
    ax.set_title(f"eomsg: cost per message as the log grows\n({n:,} messages, batches of 256)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- restart --------------------------------------------------------------------------


class _Serve:
    """``python -m eomsg serve --data DIR --json``, started and timed to its ready line;
    what it writes to stderr is collected."""

    def __init__(self, data: Path) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.printed: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(10)
                self._reader.join(5)
                raise SystemExit(f"bench: eomsg serve did not start: {' | '.join(self.printed)}")
            if json.loads(line).get("event") == "ready":
                break
            self.printed.append(line.strip())
        self.ready_s = time.perf_counter() - self.started

    def _read(self, stream: io.TextIOBase) -> None:
        for line in stream:
            self.printed.append(line.rstrip())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)
        self._reader.join(5)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(300)
        self._reader.join(5)


def _journal_state(data: Path) -> dict[str, object]:
    """What the journal held when the node died, and how much of it DuckDB lacked."""
    directory = data / journal.DIR_NAME
    files = journal.segments(directory)
    state: dict[str, object] = {"segments": len(files)}
    try:
        with contextlib.closing(duckdb.connect(str(data / "eomsg.duckdb"), read_only=True)) as db:
            applied = applied_lsn(db)
    except duckdb.Error as e:  # the report says so; the restart is timed all the same
        state["error"] = str(e).splitlines()[0]
        return state
    found = journal.scan(directory, applied)
    rows = sum(RowBatch.decode(r.payload).size for r in found.records)
    state.update(
        applied_lsn=applied,
        last_lsn=found.last_lsn,
        unapplied_records=len(found.records),
        unapplied_rows=rows,
        unapplied_kb=round(sum(len(r.payload) for r in found.records) / 1024, 1),
    )
    return state


def _burst_and_kill(node: _Serve, data: Path, payload: Payloads, ids: bool, prefix: str) -> None:
    client = eomsg.connect(data)
    try:
        _publish(client, BURST, payload, BURST_BATCH, 0, ids, prefix)
        node.kill()  # at the last acknowledgement: the applier is behind the journal
    finally:
        with contextlib.suppress(Exception):  # its node is gone
            client.close()


def _depth(data: Path) -> tuple[float, int]:
    """Seconds until a client that connects now has the node's stats, and the pending
    depth of queue bench."""
    t = time.perf_counter()
    with eomsg.connect(data) as client:
        stats = client.stats()
    elapsed = time.perf_counter() - t
    return elapsed, next(s.depth for s in stats if s.name == "bench")


# What :func:`_phases` times in Node.open: (class, method, name in the report).
PHASES: tuple[tuple[Any, str, str], ...] = (
    (Store, "__init__", "store_open"),
    (opening, "_replay_journal", "journal_replay"),
    (Checkpoints, "checkpoint", "checkpoint"),
    (Node, "_recover", "recover"),
    (recovery, "publish_id_runs", "publish_ids_query"),  # the generators the Store's
    (recovery, "load_pending", "pending_rows"),  # methods return (timed a step at a time)
)


def _phases(data: Path) -> dict[str, float]:
    """Open the node of ``data`` (no profiler) with a timer round each of :data:`PHASES`
    (a generator's time is that of its steps; ``publish_ids_query`` is the whole load of
    the dedup window, which arrives sorted). Seconds; ``recover_rest`` is what recovery
    spends besides its two reads (the loops in Python)."""
    spent: dict[str, float] = dict.fromkeys([name for _, _, name in PHASES], 0.0)
    ids: list[RetainedIds] = []
    originals = [(cls, attr, getattr(cls, attr)) for cls, attr, _ in PHASES]

    def timed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def steps(*args: Any, **kwargs: Any) -> Iterator[Any]:
                it = fn(*args, **kwargs)
                while True:
                    t = time.perf_counter()
                    try:
                        item = next(it)
                    except StopIteration:
                        spent[name] += time.perf_counter() - t
                        return
                    spent[name] += time.perf_counter() - t
                    if name == "publish_ids_query":
                        ids.append(item)  # RetainedIds: loaded sorted, nothing to rebuild
                    yield item

            return steps

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t
            return result

        return call

    for (cls, attr, name), (_, _, fn) in zip(PHASES, originals, strict=True):
        setattr(cls, attr, timed(fn, name))
    try:
        t = time.perf_counter()
        node = Node.open(data, NodeSettings())
        spent["open"] = time.perf_counter() - t
    finally:
        for cls, attr, fn in originals:
            setattr(cls, attr, fn)
    node.close()
    spent["recover_rest"] = spent["recover"] - spent["publish_ids_query"] - spent["pending_rows"]
    spent["publish_ids"] = sum(len(retained) for retained in ids)
    return {k: round(v, 3) for k, v in spent.items()}


def _profile_open(data: Path, top: int = 20) -> tuple[float, list[str]]:
    """Open the node of ``data`` in this process under cProfile: the seconds it took
    and the ``top`` functions by cumulative time."""
    profiler = cProfile.Profile()
    t = time.perf_counter()
    profiler.enable()
    node = Node.open(data, NodeSettings())
    profiler.disable()
    elapsed = time.perf_counter() - t
    node.close()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative")
    lines = []
    for func, (_cc, ncalls, tottime, cumtime, _callers) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][3],
        reverse=True,
    )[:top]:
        filename, line, name = func
        where = f"{_short(filename)}:{line}({name})" if line else name
        lines.append(f"{cumtime:8.3f} s cum {tottime:8.3f} s own {ncalls:>9} calls  {where}")
    return elapsed, lines


def _short(filename: str) -> str:
    for marker in ("/eomsg/", "/site-packages/", "/lib/python"):
        if marker in filename:
            return filename[filename.index(marker) + 1 :]
    return filename


def run_restart(
    retained: int, pending: int, rounds: int, payload_size: int, ids: bool, tmp: Path
) -> dict[str, object]:
    data = tmp / "data"
    payload = Payloads(payload_size)
    t0 = time.perf_counter()
    with Warnings() as warned, LocalClient.open(data, SETTINGS) as client:
        client.create_queue(QueueConfig.create("bench", ["bench/>"]))
        _fill(client, retained - pending, payload, 0, ids)
        _progress(f"{retained - pending:,} consumed; publishing {pending:,} to stay pending")
        _publish(client, pending, payload, FILL_BATCH, retained - pending, ids)
    fill_s = time.perf_counter() - t0
    _progress(f"filled in {fill_s:.0f} s; {_du(data) / (1 << 20):,.0f} MiB on disk")
    node = _Serve(data)
    clean_start = node.ready_s
    _progress(f"serving after a clean close: ready in {clean_start:.2f} s")
    per_round: list[dict[str, object]] = []
    try:
        for r in range(rounds):
            _burst_and_kill(node, data, payload, ids, f"k{r}-")
            held = _journal_state(data)
            load = os.getloadavg()[0]
            node = _Serve(data)
            stats_s, depth = _depth(data)
            one: dict[str, object] = {
                "ready_s": round(node.ready_s, 3),
                "stats_s": round(time.perf_counter() - node.started, 3),
                "stats_call_s": round(stats_s, 3),
                "pending": depth,
                "journal_at_kill": held,
                "printed": list(node.printed),
                "load_1m": round(load, 2),
            }
            per_round.append(one)
            _progress(f"restart {r + 1}: ready {one['ready_s']} s, stats {one['stats_s']} s")
        _burst_and_kill(node, data, payload, ids, "p-")
        held = _journal_state(data)
        open_s, top = _profile_open(data)
        _progress(f"Node.open under cProfile: {open_s:.2f} s")
        node = _Serve(data)  # another kill after a burst, for the phases
        _burst_and_kill(node, data, payload, ids, "q-")
        phases = _phases(data)
        _progress(f"Node.open phases: {phases}")
    finally:
        if node.proc.poll() is None:
            node.stop()
    ready = [float(one["ready_s"]) for one in per_round]  # type: ignore[arg-type]
    stats = [float(one["stats_s"]) for one in per_round]  # type: ignore[arg-type]
    return {
        "scenario": "restart",
        "retained": retained,
        "pending": pending,
        "burst": BURST,
        "payload_bytes": payload_size,
        "ids": ids,
        "fill_s": round(fill_s, 1),
        "fill_warnings": warned.counts,
        "data_mb": round(_du(data) / (1 << 20), 1),
        "clean_start_ready_s": round(clean_start, 3),
        "rounds": per_round,
        "ready_s": round(statistics.median(ready), 3),
        "stats_s": round(statistics.median(stats), 3),
        "target_s": RESTART_TARGET_S,
        "profile": {"journal_at_kill": held, "open_s": round(open_s, 3), "top": top},
        "open_phases_s": phases,
    }


def text(result: dict[str, object]) -> str:
    """The result as lines of text."""
    if result["scenario"] == "scale":
        lines = [f"{'log size':>12}  {'publish us/msg':>14}  {'consume us/msg':>14}"]
        for row in result["table"]:  # type: ignore[attr-defined]
            lines.append(
                f"{row['log_size']:>12,}  {row['publish_us_per_msg']:>14}  "
                f"{row['consume_us_per_msg']:>14}"
            )
        lines.append(
            f"largest/smallest: publish {result['publish_ratio']}, consume "
            f"{result['consume_ratio']} (target <= {result['flat_target']}); fill "
            f"{result['fill_s']} s; plot {result.get('plot', '-')}"
        )
        return "\n".join(lines)
    rounds = result["rounds"]
    each = ", ".join(f"{r['ready_s']}/{r['stats_s']}" for r in rounds)  # type: ignore[attr-defined]
    return (
        f"restart after SIGKILL ({result['retained']:,} retained, {result['pending']:,} "
        f"pending): ready {result['ready_s']} s, stats {result['stats_s']} s (median; each "
        f"ready/stats: {each}; target < {result['target_s']} s); fill {result['fill_s']} s"
    )


BYTES_PER_MESSAGE = 400  # on disk per retained message of 256 bytes with an id, roughly


def check_room(tmp: Path, messages: int, payload: int) -> None:
    """Refuse to start a fill that would not fit on ``tmp``'s disk (with a margin)."""
    need = messages * (BYTES_PER_MESSAGE + max(0, payload - 256)) * 1.5
    free = shutil.disk_usage(tmp).free
    if need > free:
        raise SystemExit(
            f"bench: {messages:,} messages need about {need / (1 << 30):.1f} GiB in {tmp}; "
            f"{free / (1 << 30):.1f} GiB free"
        )
